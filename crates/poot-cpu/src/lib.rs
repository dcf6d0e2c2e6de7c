//! poot-cpu: the CPU compute kernels the CPU runtime calls.
//!
//! Kernels are plain functions over slices: activations are `f32`, weights stay in their stored
//! dtype (`&[u8]` + [`DType`]) and are decoded block by block inside the kernel, never into a
//! whole-tensor `f32` copy. Every kernel validates all lengths, shapes and caller-supplied
//! indices before it writes anything and reports problems as [`KernelError`]; none panics on
//! bad input. Parallel kernels take a [`ThreadPool`] (one per runtime). SIMD paths are chosen
//! at run time from the CPU's features, detected once ([`CpuFeatures`]), capped per runtime
//! ([`CpuOptions::isa`]; [`Isa::detect`] names the path in effect); the portable scalar path
//! always exists and is the reference in tests. Tuning knobs are per runtime too
//! ([`CpuOptions`], read by kernels through [`Tuning`]). The kernels form a one-way tree (see
//! [`kernels`]).
//!
//! Two arithmetics ([`Numerics`], chosen per runtime): `Exact` decodes weights exactly and
//! keeps f32 activations and KV cache; `Ggml` reproduces llama.cpp's CPU backend bit for bit
//! (Q8-quantized activations with integer dots, f16 KV cache, ggml's RoPE, softmax and SiLU),
//! which makes greedy decoding follow llama.cpp's tokens.

pub mod error;
pub mod features;
pub mod hugemem;
pub mod kernels;
pub mod pool;
pub mod runtime;
#[cfg(test)]
mod testutil;
pub mod tuning;

pub use error::KernelError;
pub use features::CpuFeatures;
pub use kernels::simd::Isa;
pub use kernels::Numerics;
pub use pool::{PoolConfig, ThreadPool};
pub use poot_core::DType;
pub use runtime::{CpuOptions, CpuPlan, CpuRuntime};
pub use tuning::Tuning;
