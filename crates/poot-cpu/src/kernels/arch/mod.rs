//! Per-ISA inner loops. Each module under `arch/<arch>/` is the SIMD form of a loop whose
//! portable (scalar) form lives in the family that calls it (`matmul/qdot.rs`'s `dot_scalar`
//! beside `arch/x86/qdot.rs`, `decode.rs`'s `decode_run` beside `arch/x86/decode.rs`, and so
//! on); the family picks one with a `simd::Checked` token, so a loop here is only reached on a
//! CPU that has its features ([`crate::CpuFeatures`]). Nothing here imports a family's
//! dispatch: only the bottom modules and a family's shared types.

pub(crate) mod generic;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
