//! WGSL kernels: sources from `shaders/wgsl` (entered with `include_str!`), specialization per
//! stored dtype, the kernel body limit, and a pipeline cache.
//!
//! Invariants: a pipeline is built at most once per (kernel, dtype) per runtime; before it is
//! built, its specialized source is measured against `CompileLimits::max_kernel_instructions`
//! (statements, counted as `;`-terminated statements in the body) and `max_kernel_locals`
//! (`let`/`var` declarations), and an excess is `CompileError::BodyLimit`, never a driver
//! failure. Cost: a shader compile per new key (lavapipe: tens of ms); lookups are a hash.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use poot_core::DType;
use poot_graph::{CompileError, CompileLimits};
use poot_runtime::RuntimeError;

use crate::gpu::{Device, Pipeline};

/// A kernel of `shaders/wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    MatMul,
    /// `matmul.wgsl` with its row-dot reduction by subgroup shuffles (raw Vulkan where the
    /// device offers them; see `vk::VkSettings`).
    MatMulSubgroup,
    /// F16 weights with f16 products (adapters with `shader-f16`, opted in).
    MatMulF16,
    /// Integer block dots against Q8 activations (ggml numerics, Q4_0/Q4_1/Q5_0/Q8_0 weights).
    MatMulQ8,
    /// Activation rows to Q8_0/Q8_1 blocks (ggml numerics).
    QuantQ8,
    /// Integer super-block dots against Q8_K activations (ggml numerics, Q4_K/Q6_K weights).
    MatMulQ8K,
    /// Activation rows to Q8_K blocks (ggml numerics).
    QuantQ8K,
    Embedding,
    Dequant,
    RmsNorm,
    Eltwise,
    Softmax,
    Rope,
    KvWrite,
    Attention,
    /// Attention with f16-rounded q and softmax weights (ggml numerics).
    AttentionGgml,
    Copy,
    Gather,
    Argmax,
    /// The sampling step on the device (need `shader-f64`; see `crate::sample`).
    Sample,
    AdjustLogits,
    MaskLogits,
    TopK,
    Logprobs,
    Stall,
    /// Mixture-of-experts matmul over experts packed in place (`moe_matmul.wgsl`).
    MoeMatMul,
    GatherCols,
    MoeCombine,
    /// Broadcasting binaries, permutes and the causal mask of lowered torch graphs.
    Strided,
    Bmm,
    LayerNorm,
    Reduce,
    /// Rows added by id without atomics (`scatter_add.wgsl`): an embedding's gradient.
    ScatterAdd,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::MatMul => "matmul",
            Kernel::MatMulSubgroup => "matmul_subgroup",
            Kernel::MatMulF16 => "matmul_f16",
            Kernel::MatMulQ8 => "matmul_q8",
            Kernel::QuantQ8 => "quant_q8",
            Kernel::MatMulQ8K => "matmul_q8k",
            Kernel::QuantQ8K => "quant_q8k",
            Kernel::Embedding => "embedding",
            Kernel::Dequant => "dequant",
            Kernel::RmsNorm => "rms_norm",
            Kernel::Eltwise => "eltwise",
            Kernel::Softmax => "softmax",
            Kernel::Rope => "rope",
            Kernel::KvWrite => "kv_write",
            Kernel::Attention => "attention",
            Kernel::AttentionGgml => "attention_ggml",
            Kernel::Copy => "copy",
            Kernel::Gather => "gather",
            Kernel::Argmax => "argmax",
            Kernel::Sample => "sample",
            Kernel::AdjustLogits => "adjust_logits",
            Kernel::MaskLogits => "mask_logits",
            Kernel::TopK => "top_k",
            Kernel::Logprobs => "logprobs",
            Kernel::Stall => "stall",
            Kernel::MoeMatMul => "moe_matmul",
            Kernel::GatherCols => "gather_cols",
            Kernel::MoeCombine => "moe_combine",
            Kernel::Strided => "strided",
            Kernel::Bmm => "bmm",
            Kernel::LayerNorm => "layer_norm",
            Kernel::Reduce => "reduce",
            Kernel::ScatterAdd => "scatter_add",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::MatMul => include_str!("../../../shaders/wgsl/matmul.wgsl"),
            Kernel::MatMulSubgroup => include_str!("../../../shaders/wgsl/matmul_subgroup.wgsl"),
            Kernel::MatMulF16 => include_str!("../../../shaders/wgsl/matmul_f16.wgsl"),
            Kernel::MatMulQ8 => include_str!("../../../shaders/wgsl/matmul_q8.wgsl"),
            Kernel::QuantQ8 => include_str!("../../../shaders/wgsl/quant_q8.wgsl"),
            Kernel::MatMulQ8K => include_str!("../../../shaders/wgsl/matmul_q8k.wgsl"),
            Kernel::QuantQ8K => include_str!("../../../shaders/wgsl/quant_q8k.wgsl"),
            Kernel::Embedding => include_str!("../../../shaders/wgsl/embedding.wgsl"),
            Kernel::Dequant => include_str!("../../../shaders/wgsl/dequant.wgsl"),
            Kernel::RmsNorm => include_str!("../../../shaders/wgsl/rms_norm.wgsl"),
            Kernel::Eltwise => include_str!("../../../shaders/wgsl/eltwise.wgsl"),
            Kernel::Softmax => include_str!("../../../shaders/wgsl/softmax.wgsl"),
            Kernel::Rope => include_str!("../../../shaders/wgsl/rope.wgsl"),
            Kernel::KvWrite => include_str!("../../../shaders/wgsl/kv_write.wgsl"),
            Kernel::Attention => include_str!("../../../shaders/wgsl/attention.wgsl"),
            Kernel::AttentionGgml => include_str!("../../../shaders/wgsl/attention_ggml.wgsl"),
            Kernel::Copy => include_str!("../../../shaders/wgsl/copy.wgsl"),
            Kernel::Gather => include_str!("../../../shaders/wgsl/gather.wgsl"),
            Kernel::Argmax => include_str!("../../../shaders/wgsl/argmax.wgsl"),
            Kernel::Sample => include_str!("../../../shaders/wgsl/sample.wgsl"),
            Kernel::AdjustLogits => include_str!("../../../shaders/wgsl/adjust_logits.wgsl"),
            Kernel::MaskLogits => include_str!("../../../shaders/wgsl/mask_logits.wgsl"),
            Kernel::TopK => include_str!("../../../shaders/wgsl/top_k.wgsl"),
            Kernel::Logprobs => include_str!("../../../shaders/wgsl/logprobs.wgsl"),
            Kernel::Stall => include_str!("../../../shaders/wgsl/stall.wgsl"),
            Kernel::MoeMatMul => include_str!("../../../shaders/wgsl/moe_matmul.wgsl"),
            Kernel::GatherCols => include_str!("../../../shaders/wgsl/gather_cols.wgsl"),
            Kernel::MoeCombine => include_str!("../../../shaders/wgsl/moe_combine.wgsl"),
            Kernel::Strided => include_str!("../../../shaders/wgsl/strided.wgsl"),
            Kernel::Bmm => include_str!("../../../shaders/wgsl/bmm.wgsl"),
            Kernel::LayerNorm => include_str!("../../../shaders/wgsl/layer_norm.wgsl"),
            Kernel::Reduce => include_str!("../../../shaders/wgsl/reduce.wgsl"),
            Kernel::ScatterAdd => include_str!("../../../shaders/wgsl/scatter_add.wgsl"),
        }
    }

    /// Shared sources a kernel's body uses, in order, ahead of it.
    fn includes(self) -> &'static [&'static str] {
        match self {
            Kernel::Sample => &[RANK, F64MATH],
            Kernel::TopK => &[RANK],
            Kernel::Logprobs => &[F64MATH],
            Kernel::MatMul | Kernel::MatMulSubgroup => &[MATMUL_LANES],
            _ => &[],
        }
    }

    /// Kernels that read a stored weight and so are specialized per dtype.
    pub fn reads_weights(self) -> bool {
        matches!(
            self,
            Kernel::MatMul
                | Kernel::MatMulSubgroup
                | Kernel::MoeMatMul
                | Kernel::MatMulQ8
                | Kernel::MatMulQ8K
                | Kernel::Embedding
                | Kernel::Dequant
        )
    }
}

const WBYTES: &str = include_str!("../../../shaders/wgsl/wbytes.wgsl");
const RANK: &str = include_str!("../../../shaders/wgsl/rank.wgsl");
const F64MATH: &str = include_str!("../../../shaders/wgsl/f64math.wgsl");
/// The bindings and per-lane row sums the two dense matmuls share; each adds a row's lane sums
/// its own way.
const MATMUL_LANES: &str = include_str!("../../../shaders/wgsl/matmul_lanes.wgsl");

/// The decoder of a stored dtype, or `None` when no WGSL decoder exists for it.
pub(crate) fn decoder(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => include_str!("../../../shaders/wgsl/dec_f32.wgsl"),
        DType::F16 => include_str!("../../../shaders/wgsl/dec_f16.wgsl"),
        DType::BF16 => include_str!("../../../shaders/wgsl/dec_bf16.wgsl"),
        DType::Q8_0 => include_str!("../../../shaders/wgsl/dec_q8_0.wgsl"),
        DType::Q4_0 => include_str!("../../../shaders/wgsl/dec_q4_0.wgsl"),
        DType::Q4_1 => include_str!("../../../shaders/wgsl/dec_q4_1.wgsl"),
        DType::Q5_0 => include_str!("../../../shaders/wgsl/dec_q5_0.wgsl"),
        DType::Q5_1 => include_str!("../../../shaders/wgsl/dec_q5_1.wgsl"),
        DType::Q2_K => include_str!("../../../shaders/wgsl/dec_q2_k.wgsl"),
        DType::Q3_K => include_str!("../../../shaders/wgsl/dec_q3_k.wgsl"),
        DType::Q4_K => include_str!("../../../shaders/wgsl/dec_q4_k.wgsl"),
        DType::Q5_K => include_str!("../../../shaders/wgsl/dec_q5_k.wgsl"),
        DType::Q6_K => include_str!("../../../shaders/wgsl/dec_q6_k.wgsl"),
        DType::Q8_K => include_str!("../../../shaders/wgsl/dec_q8_k.wgsl"),
        DType::Q4_Z => include_str!("../../../shaders/wgsl/dec_q4_z.wgsl"),
        DType::Q8_Z => include_str!("../../../shaders/wgsl/dec_q8_z.wgsl"),
        DType::F8_S => include_str!("../../../shaders/wgsl/dec_f8_s.wgsl"),
        _ => return None,
    })
}

/// The integer decoder of a stored dtype for `matmul_q8.wgsl` (`qdecode32`: the block's quants
/// as `i32` and its `(d, m)`), or `None` when ggml numerics has no integer dot for it here.
/// These are the dtypes whose ggml `vec_dot_type` is Q8_0/Q8_1 and that the CPU runtime's ggml
/// numerics dots in integers too (Q5_1 keeps the exact matmul there, so it does here).
pub(crate) fn qdecoder(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Q8_0 => include_str!("../../../shaders/wgsl/qdec_q8_0.wgsl"),
        DType::Q4_0 => include_str!("../../../shaders/wgsl/qdec_q4_0.wgsl"),
        DType::Q4_1 => include_str!("../../../shaders/wgsl/qdec_q4_1.wgsl"),
        DType::Q5_0 => include_str!("../../../shaders/wgsl/qdec_q5_0.wgsl"),
        _ => return None,
    })
}

/// The super-block integer dot of a stored dtype for `matmul_q8k.wgsl` (`kdot`: a super-block's
/// exact `(sumi, summ)` against a Q8_K block; `kscales`: its `(d, dmin)`; `KBYTES`), or `None`
/// when ggml numerics has no Q8_K dot for it (the CPU runtime's `qdot_k.rs` has Q4_K and Q6_K).
pub(crate) fn kdecoder(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Q4_K => include_str!("../../../shaders/wgsl/kdot_q4_k.wgsl"),
        DType::Q6_K => include_str!("../../../shaders/wgsl/kdot_q6_k.wgsl"),
        _ => return None,
    })
}

/// The full WGSL of `kernel` for weights of `dtype` (ignored by kernels that read none).
pub(crate) fn source(kernel: Kernel, dtype: DType) -> Result<String, CompileError> {
    let body = [kernel.includes(), &[kernel.source()]].concat().join("\n");
    if !kernel.reads_weights() {
        return Ok(body);
    }
    let dec = match kernel {
        Kernel::MatMulQ8 => qdecoder(dtype),
        Kernel::MatMulQ8K => kdecoder(dtype),
        _ => decoder(dtype),
    };
    let dec = dec.ok_or_else(|| {
        CompileError::Invalid(format!(
            "wgpu: no WGSL decoder for stored dtype {dtype} ({})",
            kernel.name()
        ))
    })?;
    // The kernel (or what it includes) declares `wt`; the readers and decoder use it, so they
    // follow it.
    Ok(format!("{body}\n{WBYTES}\n{dec}"))
}

/// Statements and locals of a WGSL body, with `//` comments removed.
pub(crate) fn body_size(src: &str) -> (usize, usize) {
    let mut statements = 0;
    let mut locals = 0;
    for line in src.lines() {
        let code = line.split("//").next().unwrap_or("");
        statements += code.matches(';').count();
        for word in code.split(|c: char| !c.is_alphanumeric() && c != '_') {
            if word == "let" || word == "var" {
                locals += 1;
            }
        }
    }
    (statements, locals)
}

/// Refuses a kernel body over `limits` with the exact resource and total.
pub(crate) fn check_body(
    name: &str,
    src: &str,
    limits: &CompileLimits,
) -> Result<(), CompileError> {
    let (statements, locals) = body_size(src);
    if statements > limits.max_kernel_instructions {
        return Err(CompileError::BodyLimit {
            kernel: name.to_owned(),
            what: "statements",
            limit: limits.max_kernel_instructions as u64,
            total: statements as u64,
        });
    }
    if locals > limits.max_kernel_locals {
        return Err(CompileError::BodyLimit {
            kernel: name.to_owned(),
            what: "locals",
            limit: limits.max_kernel_locals as u64,
            total: locals as u64,
        });
    }
    Ok(())
}

/// Built pipelines by (kernel, weight dtype).
#[derive(Default)]
pub(crate) struct Pipelines {
    map: Mutex<HashMap<(Kernel, DType), Arc<Pipeline>>>,
}

impl std::fmt::Debug for Pipelines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.map.lock().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("Pipelines").field("built", &n).finish()
    }
}

impl Pipelines {
    /// The pipeline of `kernel` for `dtype`, built on first use after the body-limit check.
    pub fn get(
        &self,
        device: &Device,
        kernel: Kernel,
        dtype: DType,
        limits: &CompileLimits,
    ) -> Result<Arc<Pipeline>, RuntimeError> {
        let dtype = if kernel.reads_weights() {
            dtype
        } else {
            DType::F32
        };
        let src = source(kernel, dtype)?;
        let label = format!("{}_{dtype}", kernel.name());
        check_body(&label, &src, limits)?;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&(kernel, dtype)) {
            return Ok(p.clone());
        }
        let pipeline = match device {
            Device::Wgpu(g) => Pipeline::Wgpu(wgpu_pipeline(&g.device, kernel, &label, src)?),
            Device::Vulkan(v) => Pipeline::Vulkan(crate::vk::build_pipeline(v, &label, &src)?),
        };
        let p = Arc::new(pipeline);
        map.insert((kernel, dtype), p.clone());
        Ok(p)
    }
}

fn wgpu_pipeline(
    device: &wgpu::Device,
    kernel: Kernel,
    label: &str,
    src: String,
) -> Result<wgpu::ComputePipeline, RuntimeError> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(RuntimeError::Kernel {
            op: kernel.name(),
            detail: format!("WGSL pipeline {label} was refused: {e}"),
        });
    }
    Ok(pipeline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_fits_the_default_body_limits() {
        let limits = CompileLimits::default();
        let dtypes = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::Q8_K,
            DType::Q4_Z,
            DType::Q8_Z,
            DType::F8_S,
        ];
        for k in [
            Kernel::MatMul,
            Kernel::MatMulSubgroup,
            Kernel::MoeMatMul,
            Kernel::GatherCols,
            Kernel::MoeCombine,
            Kernel::Attention,
            Kernel::AttentionGgml,
            Kernel::QuantQ8,
            Kernel::QuantQ8K,
            Kernel::Argmax,
            Kernel::Rope,
            Kernel::Sample,
            Kernel::AdjustLogits,
            Kernel::MaskLogits,
            Kernel::TopK,
            Kernel::Logprobs,
        ] {
            for dt in dtypes {
                let src = source(k, dt).unwrap();
                check_body(k.name(), &src, &limits).unwrap();
            }
        }
    }

    #[test]
    fn both_dense_matmuls_take_their_lane_sums_from_one_source() {
        for k in [Kernel::MatMul, Kernel::MatMulSubgroup] {
            let src = source(k, DType::Q4_K).unwrap();
            assert_eq!(src.matches("fn lane_sums(").count(), 1, "{}", k.name());
            assert_eq!(
                src.matches("lane_sums(n, s, t0, tn)").count(),
                1,
                "{}",
                k.name()
            );
            assert_eq!(src.matches("fn main(").count(), 1, "{}", k.name());
        }
        // The other weight kernels are not given it.
        let src = source(Kernel::MoeMatMul, DType::Q4_K).unwrap();
        assert!(!src.contains("fn lane_sums("));
    }

    #[test]
    fn the_q8_matmul_fits_for_its_dtypes_only() {
        let limits = CompileLimits::default();
        for dt in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0] {
            let src = source(Kernel::MatMulQ8, dt).unwrap();
            check_body("matmul_q8", &src, &limits).unwrap();
        }
        for dt in [DType::Q5_1, DType::Q4_K] {
            assert!(source(Kernel::MatMulQ8, dt).is_err(), "{dt}");
        }
        for dt in [DType::Q4_K, DType::Q6_K] {
            let src = source(Kernel::MatMulQ8K, dt).unwrap();
            check_body("matmul_q8k", &src, &limits).unwrap();
        }
        for dt in [DType::Q5_K, DType::Q8_0] {
            assert!(source(Kernel::MatMulQ8K, dt).is_err(), "{dt}");
        }
    }

    #[test]
    fn a_tight_limit_is_a_typed_body_limit_error() {
        let limits = CompileLimits {
            max_kernel_instructions: 10,
            ..CompileLimits::default()
        };
        let src = source(Kernel::MatMul, DType::Q4_K).unwrap();
        let err = check_body("matmul_Q4_K", &src, &limits).unwrap_err();
        assert!(matches!(
            err,
            CompileError::BodyLimit { what: "statements", limit: 10, total, .. } if total > 10
        ));
    }

    #[test]
    fn unknown_dtypes_have_no_decoder() {
        // Q8_1 is an activation format only (ggml has no dequantizer for it); I8 is no GGUF
        // weight dtype the CPU decodes either.
        for dt in [DType::Q8_1, DType::I8] {
            assert!(decoder(dt).is_none(), "{dt}");
            assert!(source(Kernel::MatMul, dt).is_err(), "{dt}");
        }
    }
}
