//! The kernels, one module per op family. Each module's docs state its invariants, numerics
//! (the error bound its tests assert) and cost.

pub mod act;
pub(crate) mod act_cache;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_bf16;
pub mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_decode;
mod attention_exact;
mod attention_ggml;
mod attention_grouped;
mod attention_grouped_simd;
mod attention_kv;
mod blocks;
pub mod decode;
pub mod embedding;
#[cfg(target_arch = "x86_64")]
mod fdot16_x86;
#[cfg(target_arch = "x86_64")]
mod fdot_x86;
pub mod ggml;
pub mod matmul;
mod matmul_bf16;
mod matmul_decoded;
mod matmul_dpbf16;
mod matmul_float;
mod matmul_float_ggml;
mod matmul_lanes8;
mod matmul_q8;
mod matmul_r8;
mod matmul_rk;
pub mod norm;
pub mod qact;
mod qdot;
mod qdot_k;
#[cfg(target_arch = "x86_64")]
mod qdot_k_x86;
#[cfg(target_arch = "x86_64")]
mod qdot_r16_x86;
#[cfg(target_arch = "x86_64")]
mod qdot_r8_x86;
#[cfg(target_arch = "x86_64")]
mod qdot_rk16_x86;
#[cfg(target_arch = "x86_64")]
mod qdot_rk_x86;
#[cfg(target_arch = "x86_64")]
mod qdot_x86;
pub mod repack;
pub mod repack_k;
pub mod rope;
mod scratch;
pub mod simd;
#[cfg(target_arch = "x86_64")]
mod simd_decode;

pub use act::{
    add, add_inplace, gelu_erf, gelu_erf_to, gelu_tanh, gelu_tanh_to, mul, mul_inplace, silu,
    silu_mul, silu_to, softmax,
};
pub use attention::{
    paged_attention, paged_attention_numerics, AttentionInputs, AttentionShape, KvCacheMut, KvElem,
};
pub use decode::DECODABLE;
pub use embedding::embedding;
pub use ggml::Numerics;
pub use matmul::{matmul, matmul_numerics, matmul_with, MATMUL_DTYPES};
pub use norm::rms_norm;
pub use rope::{
    rope, rope_angles, rope_with_angles, RopeConfig, RopeScaling, RopeStyle, RopeTable,
};
