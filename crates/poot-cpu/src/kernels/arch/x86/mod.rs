//! x86-64 loops: AVX2 (+FMA, F16C), AVX-512 (F/BW/VL/VNNI/BF16) and AMX tiles. File names
//! say the loop; a `16` suffix is the 512-bit (16-lane or 16-row) form of the 256-bit file
//! without it (`qdot_r8` / `qdot_r16`, `fdot` / `fdot16`).
//!
//! Register widths: `lanes.rs` makes the width a type ([`lanes::Lanes`]; `lanes_rows.rs`'s
//! [`lanes_rows::RowLanes`] reads the 8-row layout at it;
//! `Ymm` 256 bits, `Zmm` 512). Where the two forms of a loop differ only in width, the body is
//! written once over it (`qdot_r.rs` for `qdot_r8` / `qdot_r16`; `fdot.rs`'s `lanes32`) and each
//! width's `#[target_feature]` entry function monomorphizes it. `fdot16::chunk16` is a different
//! tiling from `fdot::chunk8_avx2` (its module says why). `qdot_rk.rs` writes each k-quant
//! body once over the width and the integer dot (`lanes_k::KLanes`: `maddubs` or `vpdpbusd`,
//! 256 or 512 bits), its entry functions one per ISA.
//!
//! The portable path of each: `qdot_r8`, `qdot_r16` - `arch::generic::qdot_r8_generic`;
//! `qdot_zg` (the grouped Q4_Z layout) - `arch::generic::qdot_zg_generic`; `fdot`'s
//! `lanes8_rows_avx2` and `lanes32_*` - `arch::generic::fdot_generic`; `decode` -
//! `kernels::decode::decode_run`; `qdot` - `arch::generic::qdot_generic` (its zero-point Q4_Z/Q8_Z
//! arms: `arch::generic::zdot_generic`); `qdot_k`, `qdot_rk` (with `qdot_rk_parts`) -
//! `matmul::qdot_k::dot_scalar`; `f8dot` (F8_S rows widened by F16C) -
//! `arch::generic::f8dot_generic`; `fdot`'s and `fdot16`'s tiles - `ggml::dot_lanes8`
//! (`matmul::lanes8`); `amx`, `amx_bf16` - the VNNI/AVX-512 tiles they stand in for;
//! `attention` (the grouped score and V loops) - `attention::ggml_heads::head`.

pub(crate) mod amx;
pub(crate) mod amx_bf16;
pub(crate) mod attention;
pub(crate) mod attention16;
pub(crate) mod decode;
pub(crate) mod f8dot;
pub(crate) mod f8dot_g;
pub(crate) mod f8dot_r8;
pub(crate) mod fdot;
pub(crate) mod fdot16;
pub(crate) mod lanes;
pub(crate) mod lanes_k;
pub(crate) mod lanes_rows;
pub(crate) mod qdot;
pub(crate) mod qdot_k;
pub(crate) mod qdot_r;
pub(crate) mod qdot_r16;
pub(crate) mod qdot_r8;
pub(crate) mod qdot_rk;
pub(crate) mod qdot_rk_parts;
pub(crate) mod qdot_zg;
