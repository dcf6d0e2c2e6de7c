//! Each equation of a graph to its CUDA launch: where every value lives (a weight's device
//! address as stored, everything else an offset in the plan's one arena) and the fully formed
//! launch that computes it.
//!
//! Invariants:
//! - A value is placed before any equation reads it; reading one that is not (or a token id
//!   sampled on the host) is `CompileError::Invalid`, never a launch with a wrong address.
//! - Arena addresses are offsets tagged with `ARENA_TAG` until the arena is allocated; the
//!   caller replaces every tagged argument once its base is known.
//! - Every extent a kernel takes as an i32, and every grid dimension, is checked here against
//!   the kernels' limits; an op without a kernel is `CompileError::Unsupported`.
//! - Ids whose range the host must check (embedding rows, gathered rows) mark their input
//!   slot's bound; a cast no kernel fused decodes one stored weight (`cast_f32`).
//! - `sample` reads computed f32 logits and places its ids on the host (`Loc::Host`); paged
//!   attention is the one step left to form at run time (`Step::Attention`).

use std::sync::Arc;

use poot_core::DType;
use poot_cpu::kernels::{RopeConfig, RopeTable};
use poot_graph::{CompileError, CompileLimits, Graph, Op, RopeStyle};
use poot_runtime::{RuntimeError, WeightStore};

use crate::device::DevBuf;
use crate::ops;
use crate::steps::{AttnStep, HostSample, InputSlot, RopeSlot, Step};
use crate::CudaRuntime;

/// Where a value lives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Loc {
    /// Byte offset into the plan's arena.
    Arena(u64),
    /// Index into `CudaPlan::weights`.
    Weight(usize),
    /// Token ids sampled on the host: index into `CudaPlan::samples`.
    Host(usize),
}

pub(crate) fn invalid(detail: String) -> RuntimeError {
    CompileError::Invalid(detail).into()
}

/// An extent a kernel takes as i32 (or a grid dimension, `max`).
fn extent(what: &str, v: usize, max: usize) -> Result<u32, RuntimeError> {
    if v > max {
        return Err(invalid(format!(
            "{what} = {v} is over the CUDA kernels' limit {max}"
        )));
    }
    Ok(v as u32)
}

const I32_MAX: usize = i32::MAX as usize;
/// gridDim.y and .z are at most 65535.
const GRID_Y: usize = 65_535;
const ALIGN: u64 = 256;

/// A plan being laid out: placements, uploads and launches so far.
pub(crate) struct Builder<'a> {
    rt: &'a CudaRuntime,
    graph: &'a Graph,
    store: &'a Arc<dyn WeightStore>,
    pub(crate) loc: Vec<Option<Loc>>,
    pub(crate) arena_bytes: u64,
    pub(crate) weights: Vec<Arc<DevBuf>>,
    weight_dtype: Vec<DType>,
    pub(crate) inputs: Vec<InputSlot>,
    pub(crate) ropes: Vec<RopeSlot>,
    pub(crate) literals: Vec<(u64, Vec<f32>)>,
    pub(crate) samples: Vec<HostSample>,
    /// Steps with arena offsets tagged by `ARENA_TAG`, fixed up at the end.
    pub(crate) launches: Vec<Step>,
}

/// Arena offsets are stored with this bit set until the arena's base address is known.
pub(crate) const ARENA_TAG: u64 = 1 << 63;

impl<'a> Builder<'a> {
    pub(crate) fn new(
        rt: &'a CudaRuntime,
        graph: &'a Graph,
        store: &'a Arc<dyn WeightStore>,
    ) -> Self {
        Self {
            rt,
            graph,
            store,
            loc: vec![None; graph.equations.len()],
            arena_bytes: 0,
            weights: Vec::new(),
            weight_dtype: Vec::new(),
            inputs: Vec::new(),
            ropes: Vec::new(),
            literals: Vec::new(),
            samples: Vec::new(),
            launches: Vec::new(),
        }
    }
}

impl Builder<'_> {
    fn reserve(&mut self, bytes: u64) -> u64 {
        let at = self.arena_bytes;
        self.arena_bytes += bytes.div_ceil(ALIGN) * ALIGN;
        at
    }

    fn numel(&self, v: poot_graph::ValueId) -> usize {
        self.graph.info(v).numel()
    }

    /// The address argument of value `v`: a weight's device address, or a tagged offset.
    fn addr(&self, v: poot_graph::ValueId) -> Result<u64, RuntimeError> {
        match self.loc[v.index()] {
            Some(Loc::Arena(off)) => Ok(ARENA_TAG | off),
            Some(Loc::Weight(i)) => Ok(self.weights[i].ptr),
            Some(Loc::Host(_)) => Err(invalid(format!(
                "value {} is sampled on the host; it can only be a graph output",
                v.0
            ))),
            None => Err(invalid(format!(
                "value {} is used before it is defined",
                v.0
            ))),
        }
    }

    /// An operand that must be f32 activations (or an f32-stored weight).
    fn f32_operand(&self, op: &str, v: poot_graph::ValueId) -> Result<u64, RuntimeError> {
        let dtype = match self.loc[v.index()] {
            Some(Loc::Weight(i)) => self.weight_dtype[i],
            _ => self.graph.info(v).dtype,
        };
        if dtype != DType::F32 {
            return Err(invalid(format!(
                "{op}: operand {} is {dtype}, the CUDA kernels take f32",
                v.0
            )));
        }
        self.addr(v)
    }

    fn weight_index(&self, op: &str, v: poot_graph::ValueId) -> Result<usize, RuntimeError> {
        match self.loc[v.index()] {
            Some(Loc::Weight(i)) => Ok(i),
            _ => Err(invalid(format!(
                "{op}: operand {} must be a stored weight",
                v.0
            ))),
        }
    }

    /// The name of graph input `v` (its data is needed on the host).
    fn input_name(&self, op: &str, v: poot_graph::ValueId) -> Result<String, RuntimeError> {
        match self.graph.op(v) {
            Op::Input { name } => Ok(name.clone()),
            _ => Err(invalid(format!(
                "{op}: operand {} must be a graph input",
                v.0
            ))),
        }
    }

    /// The input slot behind `v`, which must be a graph input (its data is needed on the host).
    fn host_input(
        &mut self,
        op: &str,
        v: poot_graph::ValueId,
    ) -> Result<&mut InputSlot, RuntimeError> {
        let Op::Input { name } = self.graph.op(v) else {
            return Err(invalid(format!(
                "{op}: operand {} must be a graph input (its values are checked on the host)",
                v.0
            )));
        };
        let name = name.clone();
        self.inputs
            .iter_mut()
            .find(|s| s.name == name)
            .ok_or_else(|| invalid(format!("{op}: input {name} has no slot")))
    }

    fn out(&mut self, i: usize) -> u64 {
        let bytes = self.graph.values[i].numel() as u64 * 4;
        let off = self.reserve(bytes);
        self.loc[i] = Some(Loc::Arena(off));
        ARENA_TAG | off
    }

    /// Places value `i` and forms the launch that computes it, if any.
    pub(crate) fn equation(
        &mut self,
        i: usize,
        limits: &CompileLimits,
    ) -> Result<(), RuntimeError> {
        let g = self.graph;
        let info = &g.values[i];
        match &g.equations[i] {
            Op::Input { name } => {
                if !matches!(info.dtype, DType::F32 | DType::I32) {
                    return Err(invalid(format!(
                        "input {name} is {}, runs take f32 or i32",
                        info.dtype
                    )));
                }
                let offset = self.reserve(info.numel() as u64 * 4);
                self.loc[i] = Some(Loc::Arena(offset));
                self.inputs.push(InputSlot {
                    name: name.clone(),
                    offset,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    bound: None,
                });
            }
            Op::Weight { name } => {
                let bytes = self
                    .store
                    .bytes(name)
                    .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })?;
                if bytes.len() as u64 > limits.max_artifact_bytes {
                    return Err(CompileError::ArtifactTooLarge {
                        limit: limits.max_artifact_bytes,
                        total: bytes.len() as u64,
                    }
                    .into());
                }
                let w = self.rt.weight(self.store, name, bytes)?;
                self.weights.push(w);
                self.weight_dtype.push(info.dtype);
                self.loc[i] = Some(Loc::Weight(self.weights.len() - 1));
            }
            Op::Literal { data } => {
                let off = self.reserve(data.len() as u64 * 4);
                self.loc[i] = Some(Loc::Arena(off));
                self.literals.push((off, data.clone()));
            }
            Op::Reshape { x, .. } => self.loc[i] = self.loc[x.index()],
            // A cast no kernel fused (a norm's or an elementwise op's half weight; see
            // `compile`): the stored words decoded into the arena once a run.
            Op::Cast { x, .. } => {
                let wi = self.weight_index("cast", *x)?;
                let dtype = self.weight_dtype[wi];
                if ops::cast_code(dtype).is_none() {
                    return Err(invalid(format!(
                        "cast: weight of {dtype} has no CUDA kernel"
                    )));
                }
                let (w, n) = (self.weights[wi].ptr, self.numel(*x) as u64);
                let out = self.out(i);
                self.launches.push(Step::Fixed(ops::cast(w, dtype, out, n)));
            }
            Op::Embedding { table, ids } => {
                let wi = self.weight_index("embedding", *table)?;
                let dtype = self.weight_dtype[wi];
                let shape = &g.info(*table).shape;
                if ops::dtype_code(dtype).is_none() || shape.len() != 2 {
                    return Err(invalid(format!(
                        "embedding: table {dtype}{shape:?} has no CUDA kernel"
                    )));
                }
                let (vocab, dim) = (shape[0], extent("embedding dim", shape[1], I32_MAX)?);
                let n = extent("embedding ids", self.numel(*ids), GRID_Y)?;
                let table_addr = self.weights[wi].ptr;
                let ids_addr = self.addr(*ids)?;
                self.host_input("embedding", *ids)?.bound = Some((vocab, "embedding"));
                let out = self.out(i);
                let l = ops::embedding(table_addr, dtype, ids_addr, out, n, dim);
                self.launches.push(Step::Fixed(l));
            }
            Op::RmsNorm { x, weight, eps } => {
                let d = *g.info(*x).shape.last().unwrap_or(&1);
                let d32 = extent("rms_norm dim", d, I32_MAX)?;
                let t = extent("rms_norm rows", self.numel(*x) / d.max(1), I32_MAX)?;
                let (xa, wa) = (
                    self.f32_operand("rms_norm", *x)?,
                    self.f32_operand("rms_norm", *weight)?,
                );
                let out = self.out(i);
                self.launches
                    .push(Step::Fixed(ops::rms_norm(xa, wa, out, t, d32, *eps)));
            }
            Op::MatMul { x, w } => {
                let wi = self.weight_index("matmul", *w)?;
                let dtype = self.weight_dtype[wi];
                let shape = &g.info(*w).shape;
                if ops::matvec_kernel(dtype).is_none() || !matches!(shape.len(), 1 | 2) {
                    return Err(invalid(format!(
                        "matmul: weight {dtype}{shape:?} has no CUDA kernel"
                    )));
                }
                // A 1-D weight is one row (ValueInfo::matrix).
                let (n, k) = g.info(*w).matrix();
                let (n, k) = (
                    extent("matmul n", n, I32_MAX)?,
                    extent("matmul k", k, I32_MAX)?,
                );
                let t = extent("matmul rows", self.numel(*x) / k.max(1) as usize, GRID_Y)?;
                let (wa, xa) = (self.weights[wi].ptr, self.f32_operand("matmul", *x)?);
                let out = self.out(i);
                self.launches
                    .push(Step::Fixed(ops::matvec(dtype, wa, xa, out, t, n, k)));
            }
            Op::Add { a, b } | Op::Mul { a, b } => {
                let kernel = if matches!(g.equations[i], Op::Add { .. }) {
                    "add_f32"
                } else {
                    "mul_f32"
                };
                let (n, nb) = (self.numel(*a) as u64, self.numel(*b) as u64);
                if nb == 0 || n % nb != 0 {
                    return Err(invalid(format!(
                        "{kernel}: {nb} elements do not broadcast over {n}"
                    )));
                }
                let (aa, ba) = (self.f32_operand(kernel, *a)?, self.f32_operand(kernel, *b)?);
                let out = self.out(i);
                self.launches
                    .push(Step::Fixed(ops::binary(kernel, aa, ba, out, n, nb)));
            }
            Op::Silu { x } => {
                let xa = self.f32_operand("silu", *x)?;
                let out = self.out(i);
                let l = ops::silu(xa, out, self.numel(*x) as u64);
                self.launches.push(Step::Fixed(l));
            }
            Op::Gelu { x } => {
                let xa = self.f32_operand("gelu", *x)?;
                let out = self.out(i);
                let l = ops::gelu(xa, out, self.numel(*x) as u64);
                self.launches.push(Step::Fixed(l));
            }
            Op::Softcap { x, cap } => {
                let xa = self.f32_operand("softcap", *x)?;
                let out = self.out(i);
                let l = ops::softcap(xa, out, self.numel(*x) as u64, *cap);
                self.launches.push(Step::Fixed(l));
            }
            Op::Slice {
                x,
                axis,
                start,
                end,
            } => {
                let shape = &g.info(*x).shape;
                let inner: usize = shape[axis + 1..].iter().product();
                let outer: usize = shape[..*axis].iter().product();
                let o = extent("slice rows", outer, GRID_Y)?;
                let in_w = extent("slice row", shape[*axis] * inner, I32_MAX)?;
                let w = extent("slice width", (end - start) * inner, I32_MAX)?;
                let xa = self.f32_operand("slice", *x)?;
                let out = self.out(i);
                let l = ops::slice_cols(xa, out, o, in_w, w, (start * inner) as u32);
                self.launches.push(Step::Fixed(l));
            }
            Op::GatherRows { x, rows } => {
                let d = *g.info(*x).shape.last().unwrap_or(&1);
                let n_rows = self.numel(*x) / d.max(1);
                let r = extent("gather_rows rows", self.numel(*rows), GRID_Y)?;
                let d32 = extent("gather_rows dim", d, I32_MAX)?;
                let (xa, ra) = (self.f32_operand("gather_rows", *x)?, self.addr(*rows)?);
                self.host_input("gather_rows", *rows)?.bound = Some((n_rows, "gather_rows"));
                let out = self.out(i);
                self.launches
                    .push(Step::Fixed(ops::gather_rows(xa, ra, out, r, d32)));
            }
            Op::Rope { x, positions, cfg } => {
                let table = RopeTable::new(&RopeConfig {
                    style: cfg.style,
                    head_dim: cfg.head_dim as usize,
                    rot_dim: cfg.rot_dim as usize,
                    theta: cfg.theta,
                    scaling: cfg.scaling,
                })
                .map_err(|e| invalid(format!("rope: {e}")))?;
                let row = cfg.n_heads as usize * cfg.head_dim as usize;
                let t = extent("rope tokens", self.numel(*x) / row.max(1), I32_MAX)?;
                let half = table.inv_freq().len() as u32;
                let xa = self.f32_operand("rope", *x)?;
                let Op::Input { name } = g.op(*positions) else {
                    return Err(invalid("rope: positions must be a graph input".into()));
                };
                let cs = self.reserve(u64::from(t) * u64::from(half) * 8);
                let neox = cfg.style == RopeStyle::NeoX;
                self.ropes.push(RopeSlot {
                    positions: name.clone(),
                    table,
                    offset: cs,
                });
                let out = self.out(i);
                self.launches.push(Step::Fixed(ops::rope(
                    xa,
                    ARENA_TAG | cs,
                    out,
                    t,
                    cfg.n_heads,
                    cfg.head_dim,
                    half,
                    neox,
                )));
            }
            Op::Sample { logits, params } => {
                let offset = match self.loc[logits.index()] {
                    Some(Loc::Arena(off)) if g.info(*logits).dtype == DType::F32 => off,
                    _ => return Err(invalid("sample: logits must be computed f32 values".into())),
                };
                let shape = &g.info(*logits).shape;
                let (rows, vocab) = (shape[0], shape[1]);
                let p = [
                    params.temperature,
                    params.top_k,
                    params.top_p,
                    params.min_p,
                    params.uniform,
                ]
                .map(|v| self.input_name("sample", v));
                let [a, b, c, d, e] = p;
                self.samples.push(HostSample {
                    offset,
                    rows,
                    vocab,
                    params: [a?, b?, c?, d?, e?],
                });
                self.loc[i] = Some(Loc::Host(self.samples.len() - 1));
            }
            Op::PagedAttention { q, k, v, meta, cfg } => {
                if cfg.n_kv_heads == 0
                    || cfg.n_heads % cfg.n_kv_heads != 0
                    || !cfg.scale.is_finite()
                    || !(cfg.softcap.is_finite() && cfg.softcap >= 0.0)
                {
                    return Err(invalid(format!(
                        "paged_attention: {cfg:?} is not a valid head layout"
                    )));
                }
                let row = cfg.n_heads as usize * cfg.head_dim as usize;
                let t = extent(
                    "paged_attention tokens",
                    self.numel(*q) / row.max(1),
                    GRID_Y,
                )?;
                let tables = g.info(meta.block_tables);
                let max_blocks = extent(
                    "paged_attention max_blocks",
                    *tables.shape.last().unwrap_or(&0),
                    I32_MAX,
                )?;
                let names = [
                    meta.slot_mapping,
                    meta.token_seq,
                    meta.positions,
                    meta.block_tables,
                ]
                .map(|m| self.input_name("paged_attention", m));
                let [a, b, c, d] = names;
                let meta_names = [a?, b?, c?, d?];
                let addrs = [
                    self.f32_operand("paged_attention", *q)?,
                    self.f32_operand("paged_attention", *k)?,
                    self.f32_operand("paged_attention", *v)?,
                    0,
                    self.addr(meta.slot_mapping)?,
                    self.addr(meta.token_seq)?,
                    self.addr(meta.positions)?,
                    self.addr(meta.block_tables)?,
                ];
                let out = self.out(i);
                let mut addrs = addrs;
                addrs[3] = out;
                self.launches.push(Step::Attention(AttnStep {
                    cfg: *cfg,
                    t,
                    max_blocks,
                    addrs,
                    meta: meta_names,
                }));
            }
            other => {
                return Err(CompileError::Unsupported {
                    backend: "cuda",
                    op: other.name(),
                }
                .into());
            }
        }
        Ok(())
    }
}
