//! Portable (scalar) forms of the per-ISA loops, built on every target: the path a CPU without
//! a SIMD loop takes, the template a new ISA's loop starts from, and the oracle its tests
//! compare with bit for bit. A file here is named as the `arch/x86/` file whose loop it is:
//! - `qdot` - the stored-row integer block dot (`arch/x86/qdot.rs`); the stored-row matmul
//!   runs it without SIMD;
//! - `qdot_r8` - the 8-row interleaved integer dot (`arch/x86/qdot_r8.rs`, `qdot_r16.rs`, both
//!   over `arch/x86/qdot_r.rs`); `matmul_r8` runs it without SIMD;
//! - `qdot_zg` - the grouped Q4_Z dot, one scale and zero point a quantization group
//!   (`arch/x86/qdot_zg.rs`); `matmul_r8` runs it without SIMD;
//! - `zdot` - the zero-point (Q4_Z, Q8_Z) integer block dot (the zero-point arms of
//!   `arch/x86/qdot.rs`);
//! - `f8dot` - the FP8 (F8_S) row dot (`arch/x86/f8dot.rs`);
//! - `fdot` - the one-token float-row lanes (`arch/x86/fdot.rs`'s `lanes8_rows_avx2`,
//!   `lanes32_avx2` / `lanes32_avx512`).
//!
//! The other loops' portable forms still live elsewhere (a move here is the open part of the
//! kernel-tree redesign): `qdot_k`, `qdot_rk` - `matmul::qdot_k::dot_scalar`;
//! `decode` - `kernels::decode::decode_run`; `fdot`'s tiles (`chunk8_avx2`,
//! `fdot16::chunk16`) - `ggml::dot_lanes8`; `attention` - `attention::ggml_heads::head`; `amx`,
//! `amx_bf16` - the VNNI/AVX-512 tiles they stand in for.
//!
//! Invariant: nothing here uses `unsafe` or a target feature, and nothing imports a family's
//! dispatch (only the bottom modules: `format`, `blocks`, `decode`, `ggml`, `qact`).

pub(crate) mod f8dot_generic;
pub(crate) mod f8g_generic;
pub(crate) mod fdot_generic;
pub(crate) mod qdot_generic;
pub(crate) mod qdot_r8_generic;
pub(crate) mod qdot_zg_generic;
pub(crate) mod zdot_generic;
