//! Running a `CpuPlan`: equations in order, one kernel call each.
//!
//! Invariants: the deadline is checked before every matmul and attention equation and at
//! least every 8 equations (and a late input waits no longer than it); inputs must match the traced
//! dtype and shape exactly; weights are read from the store's mapped bytes (packed blocks are
//! decoded inside the kernels; f32 vectors such as biases and norm weights are read in place,
//! other small float vectors are decoded into a temporary); each activation buffer is returned
//! to the runtime's [`Arena`] after its last reader, so peak memory is the plan's
//! `artifact_bytes`, and buffers are reused across runs: once a plan has run, running it again
//! allocates only its outputs (handed to the caller) and what `Op::Sample` builds.
//!
//! Prefetch in the gaps: after each matmul dispatch the run posts the next dispatch's weights
//! (`CpuPlan::prefetch_next`) as the pool's prefetch hint, so while this thread runs the
//! norms, RoPE, attention and adds in between, each idle worker streams the first
//! `CpuOptions::prefetch_gap` bytes of its own run of those weights (where
//! `ThreadPool::for_each_run` will start it) into its caches instead of leaving the memory bus
//! idle; the last matmul posts the first (the next step's). A hint changes no
//! result, only where the next matmul finds its bytes.

use std::borrow::Cow;

use poot_core::{dequantize, Deadline};
use poot_graph::{Graph, Op, ValueId};
use poot_runtime::{HostTensor, LateInput, RuntimeError};

use super::arena::{for_each_operand, Arena, Buf};

mod matmul;
mod moe;
mod rows;
mod sampling;
mod tensor;
use super::kv::{KvLayers, KvPool};
use super::plan::CpuPlan;
use super::profile::Profile;
use crate::kernels::{self, AttentionInputs, AttentionShape, KvCacheMut};
use crate::{DType, KernelError, ThreadPool};

/// A run's inputs: those given up front and those supplied late (`LateInput`).
pub(crate) type StepInputs<'i> = (&'i [(&'i str, HostTensor)], &'i [(&'i str, LateInput)]);

fn kerr(op: &'static str) -> impl Fn(KernelError) -> RuntimeError {
    move |e| RuntimeError::Kernel {
        op,
        detail: e.to_string(),
    }
}

fn kerr_core(op: &'static str) -> impl Fn(poot_core::QuantError) -> RuntimeError {
    move |e| RuntimeError::Kernel {
        op,
        detail: e.to_string(),
    }
}

struct Exec<'a> {
    plan: &'a CpuPlan,
    bufs: Vec<Buf>,
    pool: &'a ThreadPool,
    arena: &'a mut Arena,
}

impl<'a> Exec<'a> {
    fn graph(&self) -> &'a Graph {
        &self.plan.graph
    }

    fn f32(&self, v: ValueId, op: &'static str) -> Result<&[f32], RuntimeError> {
        match &self.bufs[v.index()] {
            Buf::F32(d) => Ok(d),
            _ => Err(RuntimeError::Kernel {
                op,
                detail: format!("value {} is not an f32 activation", v.0),
            }),
        }
    }

    fn i32(&self, v: ValueId, op: &'static str) -> Result<&[i32], RuntimeError> {
        match &self.bufs[v.index()] {
            Buf::I32(d) => Ok(d),
            _ => Err(RuntimeError::Kernel {
                op,
                detail: format!("value {} is not an i32 tensor", v.0),
            }),
        }
    }

    /// The stored bytes and dtype of a weight value.
    fn weight(&self, v: ValueId, op: &'static str) -> Result<(&'a [u8], DType), RuntimeError> {
        let graph = self.graph();
        match graph.op(v) {
            Op::Weight { name } => {
                let bytes = match self.plan.copy(v.index()) {
                    Some(copy) => copy,
                    None => self
                        .plan
                        .weights
                        .bytes(name)
                        .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })?,
                };
                Ok((bytes, graph.info(v).dtype))
            }
            _ => Err(RuntimeError::Kernel {
                op,
                detail: format!("value {} is not a weight", v.0),
            }),
        }
    }

    /// The stored pieces and dtype of a weight value (`WeightStore::pieces`: one for a stored
    /// tensor, one per expert for a safetensors expert stack).
    fn weight_pieces(
        &self,
        v: ValueId,
        op: &'static str,
    ) -> Result<(Vec<&'a [u8]>, DType), RuntimeError> {
        let graph = self.graph();
        match graph.op(v) {
            Op::Weight { name } => {
                let pieces = match self.plan.copy(v.index()) {
                    Some(copy) => vec![copy],
                    None => self
                        .plan
                        .weights
                        .pieces(name)
                        .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })?,
                };
                Ok((pieces, graph.info(v).dtype))
            }
            _ => Err(RuntimeError::Kernel {
                op,
                detail: format!("value {} is not a weight", v.0),
            }),
        }
    }

    /// A float operand as f32: an activation borrowed, or a small stored vector decoded.
    fn floats(&self, v: ValueId, op: &'static str) -> Result<Cow<'_, [f32]>, RuntimeError> {
        if let Buf::Weight = self.bufs[v.index()] {
            let (bytes, dtype) = self.weight(v, op)?;
            #[cfg(target_endian = "little")]
            if dtype == DType::F32 {
                // SAFETY: every bit pattern is a valid f32; `align_to` only yields the aligned
                // middle part, which is all of it when `prefix` and `suffix` are empty.
                let (prefix, floats, suffix) = unsafe { bytes.align_to::<f32>() };
                if prefix.is_empty() && suffix.is_empty() {
                    return Ok(Cow::Borrowed(floats));
                }
            }
            let mut out = vec![0f32; self.graph().info(v).numel()];
            dequantize(dtype, bytes, &mut out).map_err(|e| RuntimeError::Kernel {
                op,
                detail: e.to_string(),
            })?;
            return Ok(Cow::Owned(out));
        }
        self.f32(v, op).map(Cow::Borrowed)
    }

    fn shape(&self, v: ValueId) -> &'a [usize] {
        &self.graph().info(v).shape
    }

    fn run_op(
        &mut self,
        i: usize,
        op: &Op,
        (inputs, late): StepInputs<'_>,
        kv: Option<&mut KvPool>,
        deadline: Deadline,
    ) -> Result<Buf, RuntimeError> {
        let graph = self.graph();
        let info = &graph.values[i];
        let numel = info.numel();
        Ok(match op {
            Op::Input { name } => {
                let late_tensor;
                let host = match inputs.iter().find(|(n, _)| n == name) {
                    Some((_, t)) => t,
                    None => {
                        let (_, slot) = late
                            .iter()
                            .find(|(n, _)| n == name)
                            .ok_or_else(|| RuntimeError::MissingInput { name: name.clone() })?;
                        late_tensor = slot.wait(name, deadline)?;
                        late_tensor.as_ref()
                    }
                };
                if host.dtype() != info.dtype
                    || host.shape() != info.shape.as_slice()
                    || host.len() != numel
                {
                    return Err(RuntimeError::InputMismatch {
                        name: name.clone(),
                        expected: format!("{}{:?}", info.dtype, info.shape),
                        got: host.describe(),
                    });
                }
                match host {
                    HostTensor::F32 { data, .. } => {
                        let mut v = self.arena.f32s(data.len());
                        v.extend_from_slice(data);
                        Buf::F32(v)
                    }
                    HostTensor::I32 { data, .. } => {
                        let mut v = self.arena.i32s(data.len());
                        v.extend_from_slice(data);
                        Buf::I32(v)
                    }
                }
            }
            Op::Weight { .. } => Buf::Weight,
            // Only a cast no kernel could fuse runs (FuseWeightCasts): the stored words decoded
            // exactly into an f32 activation.
            Op::Cast { x, .. } => {
                let (pieces, dtype) = self.weight_pieces(*x, "cast")?;
                let total: usize = pieces.iter().map(|p| p.len()).sum();
                let mut out = self.arena.zeros(numel);
                let mut at = 0;
                for p in pieces {
                    // Float words are a fixed size, so each piece holds its share of elements.
                    let n = p.len() * numel / total.max(1);
                    dequantize(dtype, p, &mut out[at..at + n]).map_err(kerr_core("cast"))?;
                    at += n;
                }
                Buf::F32(out)
            }
            Op::Literal { data } => {
                let mut v = self.arena.f32s(data.len());
                v.extend_from_slice(data);
                Buf::F32(v)
            }
            Op::Embedding { table, ids } => {
                let (bytes, dtype) = self.weight(*table, "embedding")?;
                let tshape = self.shape(*table);
                let mut out = self.arena.zeros(numel);
                if let Some(rp) = self.plan.repack(table.index()) {
                    let ids = self.i32(*ids, "embedding")?;
                    kernels::embedding::embedding_repacked(rp, ids, &mut out)
                        .map_err(kerr("embedding"))?;
                    return Ok(Buf::F32(out));
                }
                kernels::embedding(
                    bytes,
                    dtype,
                    tshape[0],
                    tshape[1],
                    self.i32(*ids, "embedding")?,
                    &mut out,
                )
                .map_err(kerr("embedding"))?;
                Buf::F32(out)
            }
            Op::RmsNorm { x, weight, eps } => self.rms_norm(*x, *weight, *eps, &info.shape)?,
            Op::MatMul { x, w } => self.matmul(i, *x, *w, numel)?,
            Op::Add { a, b } | Op::Mul { a, b } => self.binary(op, *a, *b, &info.shape)?,
            Op::Silu { x } | Op::Gelu { x } => self.activation(i, op, *x, &info.shape)?,
            Op::Softmax { x } => {
                let mut out = self.arena.f32s(numel);
                out.extend_from_slice(self.f32(*x, "softmax")?);
                kernels::softmax(&mut out, *info.shape.last().unwrap_or(&1))
                    .map_err(kerr("softmax"))?;
                Buf::F32(out)
            }
            Op::GatherCols { x, ids } => self.gather_cols(*x, *ids)?,
            Op::MoeMatMul { x, w, ids } => self.moe_matmul(*x, *w, *ids)?,
            Op::MoeCombine { y, weights } => self.moe_combine(*y, *weights)?,
            Op::Softcap { x, cap } => {
                let mut out = self.arena.f32s(numel);
                out.extend_from_slice(self.f32(*x, "softcap")?);
                kernels::softcap(&mut out, *cap).map_err(kerr("softcap"))?;
                Buf::F32(out)
            }
            Op::Rope { x, positions, cfg } => {
                self.rope(i, *x, *positions, cfg.n_heads as usize, &info.shape)?
            }
            Op::PagedAttention { q, k, v, meta, cfg } => {
                let kv = kv.ok_or(RuntimeError::KvNotConfigured)?;
                let layer = cfg.layer as usize;
                if layer >= kv.layers.n_layers() {
                    return Err(RuntimeError::Kernel {
                        op: "paged_attention",
                        detail: format!(
                            "layer {layer} but the KV pool has {} layers",
                            kv.layers.n_layers()
                        ),
                    });
                }
                let tables_shape = self.shape(meta.block_tables);
                let shape = AttentionShape {
                    n_heads: cfg.n_heads as usize,
                    n_kv_heads: cfg.n_kv_heads as usize,
                    head_dim: cfg.head_dim as usize,
                    block_size: kv.cfg.block_size as usize,
                    num_blocks: kv.cfg.layer_blocks(layer) as usize,
                    max_blocks_per_seq: tables_shape[1],
                    scale: cfg.scale,
                };
                if shape.n_kv_heads != kv.cfg.n_kv_heads as usize
                    || shape.head_dim != kv.cfg.head_dim as usize
                {
                    return Err(RuntimeError::Kernel {
                        op: "paged_attention",
                        detail: format!(
                            "graph has {}x{} kv heads, the pool {}x{}",
                            shape.n_kv_heads, shape.head_dim, kv.cfg.n_kv_heads, kv.cfg.head_dim
                        ),
                    });
                }
                let mut out = self.arena.zeros(numel);
                let attn_inputs = AttentionInputs {
                    q: self.f32(*q, "paged_attention")?,
                    k: self.f32(*k, "paged_attention")?,
                    v: self.f32(*v, "paged_attention")?,
                    slot_mapping: self.i32(meta.slot_mapping, "paged_attention")?,
                    token_seq: self.i32(meta.token_seq, "paged_attention")?,
                    positions: self.i32(meta.positions, "paged_attention")?,
                    block_tables: self.i32(meta.block_tables, "paged_attention")?,
                };

                let numerics = self.plan.numerics;
                let mask = kernels::AttentionMask {
                    window: cfg.window as usize,
                    softcap: cfg.softcap,
                };
                match &mut kv.layers {
                    KvLayers::F32 { k, v } => {
                        let cache = KvCacheMut {
                            k: &mut k[layer],
                            v: &mut v[layer],
                        };
                        kernels::paged_attention_masked(
                            numerics,
                            mask,
                            &shape,
                            &attn_inputs,
                            cache,
                            &mut out,
                            self.pool,
                        )
                    }
                    KvLayers::F16 { k, v } => {
                        let cache = KvCacheMut {
                            k: &mut k[layer],
                            v: &mut v[layer],
                        };
                        kernels::paged_attention_masked(
                            numerics,
                            mask,
                            &shape,
                            &attn_inputs,
                            cache,
                            &mut out,
                            self.pool,
                        )
                    }
                }
                .map_err(kerr("paged_attention"))?;
                Buf::F32(out)
            }
            Op::Reshape { x, .. } => match &self.bufs[x.index()] {
                Buf::F32(d) => {
                    let mut v = self.arena.f32s(d.len());
                    v.extend_from_slice(d);
                    Buf::F32(v)
                }
                Buf::I32(d) => {
                    let mut v = self.arena.i32s(d.len());
                    v.extend_from_slice(d);
                    Buf::I32(v)
                }
                _ => {
                    return Err(RuntimeError::Kernel {
                        op: "reshape",
                        detail: "reshape of a weight".into(),
                    })
                }
            },
            Op::Slice {
                x,
                axis,
                start,
                end,
            } => {
                let s = self.shape(*x);
                let outer: usize = s[..*axis].iter().product();
                let inner: usize = s[axis + 1..].iter().product();
                let (dim, w) = (s[*axis], end - start);
                let pick = |o: usize| (o * dim + start) * inner..(o * dim + start + w) * inner;
                match &self.bufs[x.index()] {
                    Buf::F32(d) => {
                        let mut v = self.arena.f32s(outer * w * inner);
                        (0..outer).for_each(|o| v.extend_from_slice(&d[pick(o)]));
                        Buf::F32(v)
                    }
                    Buf::I32(d) => {
                        let mut v = self.arena.i32s(outer * w * inner);
                        (0..outer).for_each(|o| v.extend_from_slice(&d[pick(o)]));
                        Buf::I32(v)
                    }
                    _ => {
                        return Err(RuntimeError::Kernel {
                            op: "slice",
                            detail: "slice of a weight".into(),
                        })
                    }
                }
            }
            Op::Concat { xs, axis } => {
                let outer: usize = info.shape[..*axis].iter().product();
                let inner: usize = info.shape[axis + 1..].iter().product();
                if info.dtype == DType::I32 {
                    let mut out = self.arena.i32s(numel);
                    for o in 0..outer {
                        for x in xs {
                            let c = self.shape(*x)[*axis] * inner;
                            out.extend_from_slice(&self.i32(*x, "concat")?[o * c..(o + 1) * c]);
                        }
                    }
                    Buf::I32(out)
                } else {
                    let mut out = self.arena.f32s(numel);
                    for o in 0..outer {
                        for x in xs {
                            let c = self.shape(*x)[*axis] * inner;
                            out.extend_from_slice(&self.f32(*x, "concat")?[o * c..(o + 1) * c]);
                        }
                    }
                    Buf::F32(out)
                }
            }
            Op::GatherRows { x, rows } => {
                let d = self.shape(*x)[1];
                let t = self.shape(*x)[0];
                let mut out = self.arena.f32s(numel);
                let xv = self.f32(*x, "gather_rows")?;
                for &r in self.i32(*rows, "gather_rows")? {
                    let r = usize::try_from(r).ok().filter(|&r| r < t).ok_or_else(|| {
                        RuntimeError::Kernel {
                            op: "gather_rows",
                            detail: format!("row {r} of {t}"),
                        }
                    })?;
                    out.extend_from_slice(&xv[r * d..(r + 1) * d]);
                }
                Buf::F32(out)
            }
            Op::Sample { .. }
            | Op::AdjustLogits { .. }
            | Op::MaskLogits { .. }
            | Op::TopK { .. }
            | Op::Logprobs { .. } => self.sampling_op(op, numel)?,
            Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Scalar { .. }
            | Op::LayerNorm { .. }
            | Op::Permute { .. }
            | Op::Reduce { .. }
            | Op::BatchMatMul { .. }
            | Op::CausalMask { .. }
            | Op::ScatterAddRows { .. } => self.tensor_op(op, &info.shape)?,
        })
    }
}

/// Runs every equation of `plan`; see the module docs.
pub(crate) fn execute(
    plan: &CpuPlan,
    (inputs, late): StepInputs<'_>,
    mut kv: Option<&mut KvPool>,
    pool: &ThreadPool,
    deadline: Deadline,
    profile: Option<&Profile>,
    arena: &mut Arena,
) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
    let n = plan.graph.equations.len();
    let run_start = profile.map(Profile::start_run);
    let mut decode = true;
    arena.run = arena.run.wrapping_add(1);
    let mut bufs = std::mem::take(&mut arena.bufs);
    bufs.clear();
    bufs.resize_with(n, || Buf::Empty);
    let mut exec = Exec {
        plan,
        bufs,
        pool,
        arena,
    };
    let result = run_all(
        &mut exec,
        (inputs, late),
        &mut kv,
        deadline,
        profile,
        &mut decode,
    );
    // Every buffer goes back to the arena, also after an error.
    let mut bufs = std::mem::take(&mut exec.bufs);
    for b in bufs.iter_mut() {
        exec.arena.give(std::mem::replace(b, Buf::Empty));
    }
    exec.arena.bufs = bufs;
    if let (Some(p), Some(t0), true) = (profile, run_start, result.is_ok()) {
        p.end_run(decode, t0.elapsed());
    }
    result
}

fn run_all(
    exec: &mut Exec<'_>,
    (inputs, late): StepInputs<'_>,
    kv: &mut Option<&mut KvPool>,
    deadline: Deadline,
    profile: Option<&Profile>,
    decode: &mut bool,
) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
    let plan = exec.plan;
    for (i, op) in plan.graph.equations.iter().enumerate() {
        // The clock before each equation that runs a weight or attention and every 8th
        // otherwise (the rest are a few vector passes each): reading it before all thousand
        // equations of a SmolLM2 decode step was about 1% of the step's samples.
        let heavy = matches!(
            op,
            Op::MatMul { .. } | Op::PagedAttention { .. } | Op::MoeMatMul { .. }
        );
        if (heavy || i % 8 == 0) && deadline.expired() {
            return Err(RuntimeError::Timeout {
                during: format!("equation {i} ({})", op.name()),
            });
        }
        // A later member of a fused matmul group (its output was made with the first's) or a
        // multiply its activation made.
        if !plan.fused_later.get(i).copied().unwrap_or(false) {
            let buf = match profile {
                None => exec.run_op(i, op, (inputs, late), kv.as_deref_mut(), deadline)?,
                Some(p) => {
                    let t0 = std::time::Instant::now();
                    let buf = exec.run_op(i, op, (inputs, late), kv.as_deref_mut(), deadline)?;
                    let (kind, rows) = super::profile::kind_of(plan, op, i);
                    *decode &= rows <= 1 || !matches!(op, Op::MatMul { .. });
                    p.add(i, &kind, rows, (t0, t0.elapsed()));
                    buf
                }
            };
            // An activation that made its multiply's product stores it there.
            let at = plan.act_mul.get(i).copied().flatten().map_or(i, |m| m.mul);
            exec.bufs[at] = buf;
            if matches!(op, Op::MatMul { .. }) {
                if let Some(next) = plan.prefetch_next.get(i) {
                    exec.pool.prefetch_hint(next);
                }
            }
        }
        for_each_operand(op, |v| {
            if plan.last_use[v.index()] == i {
                let b = std::mem::replace(&mut exec.bufs[v.index()], Buf::Empty);
                exec.arena.give(b);
            }
        });
    }
    let mut outputs = Vec::with_capacity(plan.graph.outputs.len());
    for (name, v) in &plan.graph.outputs {
        let shape = plan.graph.info(*v).shape.clone();
        // The output's buffer is handed to the caller (no copy), unless another output named
        // the same value first.
        let t = match std::mem::replace(&mut exec.bufs[v.index()], Buf::Empty) {
            Buf::F32(data) => HostTensor::F32 { shape, data },
            Buf::I32(data) => HostTensor::I32 { shape, data },
            Buf::Empty => match outputs.iter().find(|(n, _): &&(String, HostTensor)| {
                plan.graph.outputs.iter().any(|(m, w)| m == n && w == v)
            }) {
                Some((_, t)) => t.clone(),
                None => {
                    return Err(RuntimeError::Kernel {
                        op: "output",
                        detail: format!("output '{name}' was never computed"),
                    })
                }
            },
            Buf::Weight => {
                return Err(RuntimeError::Kernel {
                    op: "output",
                    detail: format!("output '{name}' is a weight; outputs are activations"),
                })
            }
        };
        outputs.push((name.clone(), t));
    }
    Ok(outputs)
}
