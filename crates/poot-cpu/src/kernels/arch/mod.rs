//! Per-ISA inner loops. `arch/<arch>/` holds an ISA's SIMD loops; `arch/generic/` the portable
//! (scalar) form of each, under the same file name, built everywhere (the no-SIMD path, the
//! template for a new ISA and the oracle its tests compare with bit for bit). Loops whose
//! portable form has not moved here yet keep it in the family that calls them (listed in
//! `generic/mod.rs`). The family picks a loop with a `simd::Checked` token, so an
//! `arch/<arch>/` loop is only reached on a CPU that has its features ([`crate::CpuFeatures`]).
//!
//! Where a new ISA goes: `arch/<arch>/` (e.g. `aarch64/` for NEON), one file per loop it speeds
//! up, named as the generic file it is tested against. Where a new register width goes: an
//! implementation of `x86/lanes.rs`'s traits, the shared bodies unchanged.
//!
//! Invariant: nothing here imports a family's dispatch: only the bottom modules and a family's
//! shared types.

pub(crate) mod generic;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
