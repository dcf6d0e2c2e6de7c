//! The kernels, one module (or folder) per op family. Each module's docs state its invariants,
//! numerics (the error bound its tests assert) and cost.
//!
//! The tree is one-way (`scripts/check_kernel_cycles.py` fails `make lint` on an import cycle,
//! on a module importing its own folder's `mod.rs`, and on `arch/` importing a family's):
//! the families (`matmul/`, `attention/`, `act`, `norm`, `rope`, `embedding`) import the bottom
//! modules below and the per-ISA loops under `arch/`; `arch/` imports only the bottom and a
//! family's bottom (`attention/kv.rs`, `matmul/repack*.rs`); the bottom imports no family. Inside
//! a family, `mod.rs` is the dispatch and its children never import it.
//!
//! Where things go:
//! - a new op: a module here (or a folder, once it has several kernels), with its scalar path
//!   first; the runtime calls it from `runtime/exec.rs`.
//! - a new weight dtype: a variant of `format.rs`'s `Format` (its block shape, its line in
//!   `Format::of`, how its rows are read) and its block decoder in `decode.rs` (every op then
//!   accepts it through the exact path of `matmul/decoded.rs`); for an integer dot, its scalar
//!   dot under `arch/generic/` beside the others of its `Rows`, its x86 loop under `arch/x86/`,
//!   and its `matmul::MatmulPath` follows from its `Rows`; a faster layout in
//!   `matmul/repack*.rs`.
//! - a new ISA path: an [`simd::Isa`] level from [`crate::CpuFeatures`], its loops in
//!   `arch/<arch>/` beside the x86 ones, chosen in the family's dispatch next to the scalar
//!   path.

// The bottom: block formats, activation quantization and its cache, scratch, code-path
// selection and the float helpers ggml's numerics share. They import no kernel family.
pub(crate) mod act_cache;
pub(crate) mod blocks;
pub mod decode;
pub(crate) mod format;
pub mod ggml;
pub mod qact;
pub(crate) mod scratch;
pub mod simd;

// Per-ISA inner loops (`arch/x86/`); each has its portable path in the family that calls it.
pub(crate) mod arch;

// The op families.
pub mod act;
pub mod attention;
pub mod bmm;
pub mod embedding;
pub mod layer_norm;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod scatter;
pub mod tensor;

pub use act::{
    add, add_inplace, gelu_erf, gelu_erf_to, gelu_tanh, gelu_tanh_to, mul, mul_inplace, silu,
    silu_mul, silu_to, softcap, softmax,
};
pub use attention::{
    paged_attention, paged_attention_masked, paged_attention_numerics, AttentionInputs,
    AttentionMask, AttentionShape, KvCacheMut, KvElem,
};
pub use embedding::embedding;
pub use format::DECODABLE;
pub use ggml::Numerics;
pub use matmul::{matmul, matmul_numerics, matmul_with, MATMUL_DTYPES};
pub use norm::rms_norm;
pub use rope::{
    rope, rope_angles, rope_with_angles, RopeConfig, RopeScaling, RopeStyle, RopeTable,
};
