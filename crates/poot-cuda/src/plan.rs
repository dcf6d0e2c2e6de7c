//! Compiling a graph for the CUDA runtime: every value gets a fixed device address (weights
//! as stored, everything else in one arena per plan), so each equation becomes one fully
//! formed kernel launch at compile time and a run only uploads inputs, replays the launches
//! and downloads outputs. This module runs the graph passes first, has `lower` form the
//! launches, then checks the kernels' resources, allocates the arena and fixes the launches'
//! arena addresses.
//!
//! Invariants:
//! - The ops compiled are exactly those `supports` names; any other is refused at compile time
//!   with `CompileError::Unsupported`.
//! - A cast of a weight a matmul or embedding reads is fused into that kernel (it decodes the
//!   stored words; `FuseWeightCasts::MATRIX_READERS`); any other cast runs `cast_f32`.
//! - `sample` runs on the host: the logits rows are read back and each row is drawn by the
//!   CPU's own row function (`poot_runtime::sample::sample_row`), so its semantics are the
//!   CPU's exactly; its token ids may only be graph outputs.
//! - Paged attention is the one step formed at run time (`Step::Attention`): it reads the KV
//!   pool (which `configure_kv` may replace after compiling) and a scratch sized by the step's
//!   block table.
//! - Nothing is allocated on the device until every check has passed: the equation budget,
//!   each kernel's registers against `max_kernel_locals`, and the arena against
//!   `max_artifact_bytes` (weights are checked as they are uploaded).

use std::sync::Arc;

use poot_core::Deadline;
use poot_graph::{
    run_passes, CompileError, CompileLimits, DeadCodeElimination, FuseWeightCasts, Graph,
};
use poot_runtime::{RuntimeError, WeightStore};

use crate::lower::{invalid, Builder, Loc, ARENA_TAG};
use crate::ops;
use crate::steps::{CudaPlan, OutputSlot, Step};
use crate::CudaRuntime;

/// Whether the CUDA runtime compiles graphs holding ops of kind `op` (`Op::name`).
pub fn supports(op: &str) -> bool {
    matches!(
        op,
        "input"
            | "weight"
            | "literal"
            | "cast"
            | "embedding"
            | "rms_norm"
            | "matmul"
            | "add"
            | "mul"
            | "silu"
            | "gelu"
            | "softcap"
            | "rope"
            | "reshape"
            | "gather_rows"
            | "slice"
            | "paged_attention"
            | "sample"
    )
}

/// Compiles `graph` on `rt`: weights uploaded (or shared with live plans), the arena
/// allocated, literals uploaded, launches formed.
pub fn compile(
    rt: &CudaRuntime,
    graph: &Graph,
    store: Arc<dyn WeightStore>,
    limits: &CompileLimits,
) -> Result<CudaPlan, RuntimeError> {
    // Casts of matrices are fused into the kernels that decode them; a half norm weight or
    // bias keeps its cast (these kernels take f32 there).
    let passes: [&dyn poot_graph::Pass; 2] =
        [&FuseWeightCasts::MATRIX_READERS, &DeadCodeElimination];
    let graph = &run_passes(graph, &passes, limits)?;
    if graph.equations.len() > limits.max_equations {
        return Err(CompileError::Expansion {
            pass: "cuda schedule",
            limit: limits.max_equations as u64,
            total: graph.equations.len() as u64,
        }
        .into());
    }
    let mut b = Builder::new(rt, graph, &store);
    for i in 0..graph.equations.len() {
        b.equation(i, limits)?;
    }
    let mut outputs = Vec::new();
    for (name, v) in &graph.outputs {
        let info = graph.info(*v);
        match b.loc[v.index()] {
            Some(Loc::Host(s)) => outputs.push(OutputSlot {
                name: name.clone(),
                sample: Some(s),
                offset: 0,
                dtype: info.dtype,
                shape: info.shape.clone(),
            }),
            Some(Loc::Arena(offset)) => outputs.push(OutputSlot {
                name: name.clone(),
                sample: None,
                offset,
                dtype: info.dtype,
                shape: info.shape.clone(),
            }),
            _ => {
                return Err(invalid(format!(
                    "output {name} is a stored weight, not a computed value"
                )))
            }
        }
    }
    // The kernel body limit, as on wgpu: a kernel needing more registers per thread than
    // `max_kernel_locals` is a typed refusal (`CompileError::BodyLimit`).
    let mut kernels: Vec<&'static str> = Vec::new();
    for step in &b.launches {
        match step {
            Step::Fixed(l) => kernels.push(l.kernel),
            Step::Attention(_) => {
                kernels.extend(["kv_write", "attn_scores", "attn_softmax", "attn_out"])
            }
        }
    }
    for k in kernels {
        let (regs, _) = rt.kernel_resources(k).unwrap_or((0, 0));
        if regs as usize > limits.max_kernel_locals {
            return Err(CompileError::BodyLimit {
                kernel: k.to_owned(),
                what: "registers",
                limit: limits.max_kernel_locals as u64,
                total: u64::from(regs),
            }
            .into());
        }
    }
    if b.arena_bytes > limits.max_artifact_bytes {
        return Err(CompileError::ArtifactTooLarge {
            limit: limits.max_artifact_bytes,
            total: b.arena_bytes,
        }
        .into());
    }
    let arena = rt.alloc(b.arena_bytes)?;
    let base = arena.ptr;
    let fix = |p: &mut u64| {
        if *p & ARENA_TAG != 0 {
            *p = base + (*p & !ARENA_TAG);
        }
    };
    for step in &mut b.launches {
        match step {
            Step::Fixed(l) => l.args.iter_mut().for_each(|a| {
                if let ops::Arg::Ptr(p) = a {
                    fix(p);
                }
            }),
            Step::Attention(a) => a.addrs.iter_mut().for_each(fix),
        }
    }
    for (off, data) in &b.literals {
        let bytes: Vec<u8> = data.iter().flat_map(|f| f.to_le_bytes()).collect();
        rt.upload(base + off, &bytes, Deadline::after(rt.options().timeout))?;
    }
    Ok(CudaPlan {
        graph: graph.clone(),
        arena,
        inputs: b.inputs,
        ropes: b.ropes,
        outputs,
        samples: b.samples,
        steps: b.launches,
        _weights: b.weights,
        _store: store,
    })
}
