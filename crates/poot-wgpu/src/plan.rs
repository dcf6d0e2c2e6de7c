//! Compiling a graph for wgpu: passes, support checks, weight upload, rope frequencies,
//! pipelines (with the kernel body limit), buffer aliasing and liveness, the artifact bound.
//!
//! Invariants: a `WgpuPlan` holds only supported ops; every weight it reads is on the device
//! (as stored) with the traced dtype and shape; every pipeline it needs is built and within
//! `CompileLimits`; its artifact (peak live activation bytes plus the plan's records) fits
//! `max_artifact_bytes`. Rope positions, the `Sample` node's parameters and the
//! `AdjustLogits` node's lists must be graph inputs: the host computes rope's cos/sin table
//! from the positions and checks and prepares the sampling settings (see `exec::sampling`);
//! without f64 a `Sample` result may only be a graph output (its temperature rows are filled
//! in on the host after readback).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use poot_core::DType;
use poot_graph::{
    run_passes, CompileError, CompileLimits, DeadCodeElimination, FuseWeightCasts, Graph, Op,
};
use poot_runtime::{CompiledPlan, RuntimeError, WeightStore};

use crate::kernels::Kernel;
use crate::rope::{inv_freq, RopeTable};
use crate::weights::GpuWeight;
use crate::WgpuRuntime;

/// A graph ready to run on the wgpu device.
pub struct WgpuPlan {
    pub(crate) graph: Graph,
    /// Device copies of the weights, by value index.
    pub(crate) weights: HashMap<usize, Arc<GpuWeight>>,
    /// Rope inverse frequencies by equation index.
    pub(crate) rope: HashMap<usize, RopeTable>,
    /// The value whose buffer each value uses (itself, or what a reshape aliases).
    pub(crate) root: Vec<usize>,
    /// For each root, the last equation that reads it (usize::MAX for outputs).
    pub(crate) last_use: Vec<usize>,
    pub(crate) artifact_bytes: u64,
    /// Keeps the store alive as long as the plan (the weight cache is keyed by it).
    pub(crate) _store: Arc<dyn WeightStore>,
}

impl std::fmt::Debug for WgpuPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuPlan")
            .field("equations", &self.graph.equations.len())
            .field("artifact_bytes", &self.artifact_bytes)
            .finish()
    }
}

impl CompiledPlan for WgpuPlan {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn artifact_bytes(&self) -> u64 {
        self.artifact_bytes
    }
}

/// Ops with a WGSL kernel: every op of the IR; the sampling step's logit ops only where the
/// adapter has f64 (`f64`; otherwise the engine samples those steps on the host: see
/// `sample.rs`). `top_k` always has a kernel (`top_k.wgsl`, integer comparisons only: a MoE
/// router's expert ids and a vocabulary row's top-20 alike).
pub(crate) fn supports(f64: bool, op: &str) -> bool {
    match op {
        "adjust_logits" | "mask_logits" | "logprobs" => f64,
        _ => true,
    }
}

fn invalid(detail: String) -> RuntimeError {
    CompileError::Invalid(detail).into()
}

fn is_input(graph: &Graph, v: poot_graph::ValueId) -> bool {
    matches!(graph.op(v), Op::Input { .. })
}

/// The kernels (and weight dtypes) one equation dispatches.
fn kernels_of(rt: &WgpuRuntime, graph: &Graph, op: &Op) -> Vec<(Kernel, DType)> {
    let wdt = |v: poot_graph::ValueId| graph.info(v).dtype;
    let deq = |v: poot_graph::ValueId| match graph.op(v) {
        Op::Weight { .. } => vec![(Kernel::Dequant, wdt(v))],
        _ => vec![],
    };
    match op {
        Op::Embedding { table, .. } => vec![(Kernel::Embedding, wdt(*table))],
        // A cast no reader fused: the stored tensor decoded into an f32 buffer.
        Op::Cast { x, .. } => deq(*x),
        Op::MatMul { w, .. } => {
            let k = graph.info(*w).matrix().1;
            if rt.q8_matmul(wdt(*w), k) {
                vec![(Kernel::QuantQ8, DType::F32), (Kernel::MatMulQ8, wdt(*w))]
            } else if rt.q8k_matmul(wdt(*w), k) {
                vec![(Kernel::QuantQ8K, DType::F32), (Kernel::MatMulQ8K, wdt(*w))]
            } else {
                vec![(rt.matmul_kernel(wdt(*w)), wdt(*w))]
            }
        }
        Op::RmsNorm { weight, .. } => [deq(*weight), vec![(Kernel::RmsNorm, DType::F32)]].concat(),
        Op::Add { b, .. } | Op::Mul { b, .. } => {
            [deq(*b), vec![(Kernel::Eltwise, DType::F32)]].concat()
        }
        Op::Silu { .. }
        | Op::Gelu { .. }
        | Op::Softcap { .. }
        | Op::Unary { .. }
        | Op::Scalar { .. } => {
            vec![(Kernel::Eltwise, DType::F32)]
        }
        Op::Softmax { .. } => vec![(Kernel::Softmax, DType::F32)],
        Op::Rope { .. } => vec![(Kernel::Rope, DType::F32)],
        Op::PagedAttention { .. } => vec![
            (Kernel::KvWrite, DType::F32),
            if rt.ggml() {
                (Kernel::AttentionGgml, DType::F32)
            } else {
                (Kernel::Attention, DType::F32)
            },
        ],
        Op::Slice { .. } | Op::Concat { .. } => vec![(Kernel::Copy, DType::F32)],
        Op::GatherRows { .. } => vec![(Kernel::Gather, DType::F32)],
        Op::ScatterAddRows { src, .. } => {
            [deq(*src), vec![(Kernel::ScatterAdd, DType::F32)]].concat()
        }
        Op::Sample { .. } if rt.samples_on_device() => vec![(Kernel::Sample, DType::F32)],
        Op::Sample { .. } => vec![(Kernel::Argmax, DType::F32)],
        Op::AdjustLogits { .. } => vec![(Kernel::AdjustLogits, DType::F32)],
        Op::MaskLogits { .. } => vec![(Kernel::MaskLogits, DType::F32)],
        Op::TopK { .. } => vec![(Kernel::TopK, DType::F32)],
        Op::Logprobs { .. } => vec![(Kernel::Logprobs, DType::F32)],
        Op::MoeMatMul { w, .. } => vec![(Kernel::MoeMatMul, wdt(*w))],
        Op::GatherCols { .. } => vec![(Kernel::GatherCols, DType::F32)],
        Op::MoeCombine { .. } => vec![(Kernel::MoeCombine, DType::F32)],
        Op::Input { .. } | Op::Weight { .. } | Op::Literal { .. } | Op::Reshape { .. } => vec![],
        Op::Binary { a, b, .. } | Op::BatchMatMul { a, b } => {
            let k = if matches!(op, Op::Binary { .. }) {
                Kernel::Strided
            } else {
                Kernel::Bmm
            };
            [deq(*a), deq(*b), vec![(k, DType::F32)]].concat()
        }
        Op::Permute { x, .. } => [deq(*x), vec![(Kernel::Strided, DType::F32)]].concat(),
        Op::CausalMask { .. } => vec![(Kernel::Strided, DType::F32)],
        Op::Reduce { .. } => vec![(Kernel::Reduce, DType::F32)],
        Op::LayerNorm { weight, bias, .. } => [
            weight.map(deq).unwrap_or_default(),
            bias.map(deq).unwrap_or_default(),
            vec![(Kernel::LayerNorm, DType::F32)],
        ]
        .concat(),
    }
}

fn check_op(
    f64: bool,
    graph: &Graph,
    i: usize,
    op: &Op,
    used_by: &[Vec<usize>],
) -> Result<(), RuntimeError> {
    match op {
        Op::Rope { positions, cfg, .. } => {
            if !is_input(graph, *positions) {
                return Err(invalid(format!(
                    "wgpu: rope (equation {i}) needs its positions as a graph input"
                )));
            }
            if cfg.rot_dim > cfg.head_dim || cfg.rot_dim % 2 != 0 {
                return Err(invalid(format!(
                    "rope rot_dim {} must be even and at most head_dim {}",
                    cfg.rot_dim, cfg.head_dim
                )));
            }
        }
        Op::PagedAttention { cfg, .. }
            if cfg.head_dim > 256 || cfg.n_kv_heads == 0 || cfg.n_heads % cfg.n_kv_heads != 0 =>
        {
            return Err(invalid(format!(
                "wgpu attention needs head_dim <= 256 and n_heads a multiple of n_kv_heads \
                 (got {}x{}, {} kv heads)",
                cfg.n_heads, cfg.head_dim, cfg.n_kv_heads
            )));
        }
        Op::Sample { params, .. } => {
            let p = [
                params.temperature,
                params.top_k,
                params.top_p,
                params.min_p,
                params.uniform,
            ];
            if !p.iter().all(|&v| is_input(graph, v)) {
                return Err(invalid(
                    "wgpu: the sample node's parameters must be graph inputs".into(),
                ));
            }
            // The host path fills host-sampled rows in after readback.
            if !f64 && !used_by[i].is_empty() {
                return Err(invalid(
                    "wgpu: a sample result may only be a graph output".into(),
                ));
            }
        }
        Op::AdjustLogits { adjust: a, .. } => {
            let p = [
                a.ids,
                a.counts,
                a.bias,
                a.repetition,
                a.presence,
                a.frequency,
            ];
            // The host validates the list and folds each entry (see adjust_logits.wgsl).
            if !p.iter().all(|&v| is_input(graph, v)) {
                return Err(invalid(
                    "wgpu: the adjust_logits node's lists and penalties must be graph inputs"
                        .into(),
                ));
            }
        }
        Op::Input { .. } => {
            let dt = graph.values[i].dtype;
            if dt != DType::F32 && dt != DType::I32 {
                return Err(invalid(format!("input of dtype {dt}")));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks a `gather_cols` whose ids the host knows at compile time (a stored I32 tensor):
/// one row for every row of `x`, or one row per row, and every id within `0..e`. The shader
/// turns an id out of range into NaN (ids made on the device cannot be checked); a stored
/// permutation is checked once here instead, so a bad checkpoint is a typed error.
fn check_gather_ids(
    graph: &Graph,
    store: &dyn WeightStore,
    x: poot_graph::ValueId,
    ids: poot_graph::ValueId,
) -> Result<(), RuntimeError> {
    let (xs, is) = (&graph.info(x).shape, &graph.info(ids).shape);
    if xs.len() != 2 || is.len() != 2 || (is[0] != 1 && is[0] != xs[0]) {
        return Err(invalid(format!(
            "wgpu: gather_cols of x {xs:?} by ids {is:?}: ids need one row or one per row of x"
        )));
    }
    let Op::Weight { name } = graph.op(ids) else {
        return Ok(());
    };
    let gathered;
    let bytes = match store.bytes(name) {
        Some(b) => b,
        None => {
            let missing = || RuntimeError::MissingWeight { name: name.clone() };
            gathered = store.pieces(name).ok_or_else(missing)?.concat();
            &gathered[..]
        }
    };
    let e = xs[1];
    let bad = bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .find(|&id| id < 0 || id as usize >= e);
    if let Some(id) = bad {
        return Err(invalid(format!(
            "wgpu: weight '{name}' holds gather id {id} outside 0..{e}"
        )));
    }
    Ok(())
}

fn value_bytes(graph: &Graph, i: usize) -> u64 {
    match graph.equations[i] {
        Op::Weight { .. } | Op::Reshape { .. } => 0,
        _ => (graph.values[i].numel() as u64).saturating_mul(4),
    }
}

pub(crate) fn compile(
    rt: &WgpuRuntime,
    graph: &Graph,
    store: Arc<dyn WeightStore>,
    limits: &CompileLimits,
) -> Result<WgpuPlan, RuntimeError> {
    let graph = run_passes(
        graph,
        &[&FuseWeightCasts::EVERY_READER, &DeadCodeElimination],
        limits,
    )?;
    let n = graph.equations.len();
    let mut used_by: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, op) in graph.equations.iter().enumerate() {
        for v in op.operands() {
            used_by[v.index()].push(i);
        }
    }
    let mut root: Vec<usize> = (0..n).collect();
    let mut last_use = vec![0usize; n];
    let mut weights = HashMap::new();
    let mut rope = HashMap::new();
    let mut pipelines = HashSet::new();
    for (i, op) in graph.equations.iter().enumerate() {
        if !supports(rt.samples_on_device(), op.name()) {
            return Err(CompileError::Unsupported {
                backend: rt.api().name(),
                op: op.name(),
            }
            .into());
        }
        check_op(rt.samples_on_device(), &graph, i, op, &used_by)?;
        if let Op::Reshape { x, .. } = op {
            root[i] = root[x.index()];
        }
        for v in op.operands() {
            let r = root[v.index()];
            last_use[r] = last_use[r].max(i);
        }
        match op {
            Op::Weight { name } => {
                let (dtype, shape) = store
                    .describe(name)
                    .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })?;
                let info = &graph.values[i];
                if dtype != info.dtype || shape != info.shape {
                    return Err(invalid(format!(
                        "weight '{name}' was traced as {}{:?} but the store has {dtype}{shape:?}",
                        info.dtype, info.shape
                    )));
                }
                // A stored I32 tensor is only ever read as ids (an act-order layer's
                // `input_perm`): bound as stored by `gather_cols`, never decoded.
                let ids_only = dtype == DType::I32
                    && used_by[i].iter().all(|&u| {
                        matches!(graph.equations[u], Op::GatherCols { ids, x } if ids.index() == i && x.index() != i)
                    });
                if crate::kernels::decoder(dtype).is_none() && !ids_only {
                    return Err(invalid(format!(
                        "wgpu: weight '{name}' is stored as {dtype}, which has no WGSL decoder"
                    )));
                }
                weights.insert(i, rt.weight(&store, name)?);
            }
            Op::GatherCols { x, ids } => {
                check_gather_ids(&graph, store.as_ref(), *x, *ids)?;
            }
            Op::Rope { cfg, .. } => {
                rope.insert(i, inv_freq(cfg)?);
            }
            _ => {}
        }
        pipelines.extend(kernels_of(rt, &graph, op));
    }
    for (_, v) in &graph.outputs {
        last_use[root[v.index()]] = usize::MAX;
    }
    for (k, dt) in pipelines {
        rt.pipeline(k, dt, limits)?;
    }
    let records = (n as u64).saturating_mul(std::mem::size_of::<Op>() as u64 + 64);
    let artifact_bytes = graph
        .peak_live_bytes(&last_use, |i| value_bytes(&graph, i))
        .saturating_add(records);
    if artifact_bytes > limits.max_artifact_bytes {
        return Err(CompileError::ArtifactTooLarge {
            limit: limits.max_artifact_bytes,
            total: artifact_bytes,
        }
        .into());
    }
    Ok(WgpuPlan {
        graph,
        weights,
        rope,
        root,
        last_use,
        artifact_bytes,
        _store: store,
    })
}
