//! Compiling a graph for the CPU: passes, support and weight checks, rope tables, liveness and
//! the artifact-size bound.
//!
//! Invariants: a `CpuPlan` only holds ops the CPU supports, every weight it reads exists in the
//! store with the traced dtype and shape, and its artifact (activation buffers at their peak,
//! plus tables) fits `CompileLimits::max_artifact_bytes`, checked before the plan is returned.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use poot_graph::{
    run_passes, CompileError, CompileLimits, DeadCodeElimination, FuseWeightCasts, Graph, Op,
};
use poot_runtime::{CompiledPlan, RuntimeError, WeightStore};

use crate::hugemem::HugeBytes;
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::MatmulPath;
use crate::kernels::{Numerics, RopeConfig, RopeTable};
use crate::DType;

/// A graph ready to run on the CPU.
pub struct CpuPlan {
    pub(crate) graph: Graph,
    pub(crate) weights: Arc<dyn WeightStore>,
    /// Rope ops' tables: equation index to an index into `rope_tables`, where equal tables
    /// (every layer's, in practice) are stored once, so a run can share their angles.
    pub(crate) rope: HashMap<usize, usize>,
    pub(crate) rope_tables: Vec<RopeTable>,
    /// The arithmetic the kernels follow (the runtime's at compile time).
    pub(crate) numerics: Numerics,
    /// For each value, the index of the last equation that reads it (or usize::MAX for outputs).
    pub(crate) last_use: Vec<usize>,
    pub(crate) artifact_bytes: u64,
    /// Re-laid copies of matmul weights by the weight's value index (filled by the runtime
    /// after compiling; shared with its other plans). Matmuls over these read the copy.
    /// Always `Prepared::Repack` or `Prepared::Experts`.
    pub(crate) repacked: HashMap<usize, Arc<Prepared>>,
    /// Copies of weights as stored, by value index (always `Prepared::Copy`): the small ones
    /// other ops read every step (norm weights, biases), made alongside `repacked` so that a
    /// run reads nothing from a released map, and plain float matmul weights on huge pages.
    pub(crate) copied: HashMap<usize, Arc<Prepared>>,
    /// How each matmul weight (by value index) is multiplied, chosen here from the plan's
    /// numerics and the weight's dtype (see `kernels::matmul::MatmulPath`).
    pub(crate) matmul_paths: HashMap<usize, MatmulPath>,
    /// Matmuls run together (`fuse_matmuls`): the first one's equation index to every member's,
    /// in order (the first included).
    pub(crate) fused: HashMap<usize, Vec<usize>>,
    /// By equation: whether its output exists before its turn comes, made by an earlier
    /// equation: a member of a `fused` group other than the first, or a multiply in
    /// `act_mul` (a flag per equation: the run loop asks for each).
    pub(crate) fused_later: Vec<bool>,
    /// By equation: for a SiLU/GELU whose only reader multiplies it by an activation of its
    /// shape that exists when it runs (a SwiGLU's `silu(gate) * up`; `fuse_activation_muls`),
    /// the multiply's equation and the other factor; the activation's run makes the product
    /// (the multiply's output), in the same pass. Indexed, not hashed: the run loop asks for
    /// every equation.
    pub(crate) act_mul: Vec<Option<ActMul>>,
    /// By equation: for the first matmul of a fused pair whose two outputs are read only by a
    /// fused activation's product (`act(gate) * up`, see `fuse_glu`), that product's recipe:
    /// the matmul's run makes it, and the activation's equation is skipped.
    pub(crate) glu: Vec<Option<Glu>>,
    /// By equation: for a matmul dispatch (a matmul not in `fused_later`), the (address,
    /// length) byte ranges of the weights the next dispatch streams, in the order it reads
    /// them; the last dispatch names the first (the next run's). Empty for every other
    /// equation and in a plan built by hand (`schedule_prefetch`).
    pub(crate) prefetch_next: Vec<Vec<(usize, usize)>>,
}

/// A multiply made by the activation it reads (`CpuPlan::act_mul`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActMul {
    /// The multiply's equation (its output is made at the activation's).
    pub(crate) mul: usize,
    /// The other factor.
    pub(crate) other: poot_graph::ValueId,
}

/// A gated FFN's product made by its fused gate/up matmul (`CpuPlan::glu`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Glu {
    /// The activation's equation (skipped in the run loop).
    pub(crate) act: usize,
    /// The multiply's equation, whose output the matmul makes.
    pub(crate) mul: usize,
    /// Whether the fused pair's first member is the gate (the activation's input).
    pub(crate) gate_first: bool,
    /// SiLU, or else GELU (tanh).
    pub(crate) silu: bool,
}

impl CpuPlan {
    /// The re-laid copy of weight value `i`, if the runtime made one.
    pub(crate) fn repack(&self, i: usize) -> Option<&crate::kernels::matmul::repack::Repack> {
        match self.repacked.get(&i).map(|p| &**p) {
            Some(Prepared::Repack(r)) => Some(r),
            _ => None,
        }
    }

    /// The lazily re-laid expert stack of weight value `i`, if the runtime made one.
    pub(crate) fn experts(
        &self,
        i: usize,
    ) -> Option<&crate::kernels::matmul::experts_stack::LazyStack> {
        match self.repacked.get(&i).map(|p| &**p) {
            Some(Prepared::Experts(s)) => Some(s),
            _ => None,
        }
    }

    /// Groups the matmuls that read the same activation through re-laid weights of one kind
    /// (a layer's q/k/v, its gate/up) so that a run computes each group in one pool dispatch
    /// (`kernels::matmul::matmul_repacked_fused`) when it reaches the first, instead of one
    /// dispatch per weight. Bit-identical to running them one by one; the other outputs are
    /// simply made earlier, alive from the first member to their last reader.
    pub(crate) fn fuse_matmuls(&mut self) {
        use crate::kernels::matmul::repack::Repack;
        // The format names the re-lay too (Q4_0 and Q4_K never share one).
        let key = |w: &Repack| match w {
            Repack::Q(r) => (r.kind, w.k()),
            Repack::K(r) => (r.kind, w.k()),
            Repack::F8(_) | Repack::F8G(_) => (crate::kernels::format::Format::F8_S, w.k()),
        };
        let mut by_input: HashMap<_, Vec<usize>> = HashMap::new();
        for (i, op) in self.graph.equations.iter().enumerate() {
            let Op::MatMul { x, w } = op else { continue };
            let Some(rp) = self.repack(w.index()) else {
                continue;
            };
            by_input.entry((x.index(), key(rp))).or_default().push(i);
        }
        self.fused.clear();
        self.fused_later = vec![false; self.graph.equations.len()];
        for members in by_input.into_values() {
            for chunk in members.chunks(crate::kernels::matmul::groups::MAX_SEGMENTS) {
                if chunk.len() < 2 {
                    continue;
                }
                for &j in &chunk[1..] {
                    self.fused_later[j] = true;
                }
                self.fused.insert(chunk[0], chunk.to_vec());
            }
        }
    }

    /// Fills `act_mul` (after `fuse_matmuls`, which decides when a fused matmul's outputs
    /// exist): a SiLU or GELU read by nothing but one multiply, whose other factor is an
    /// activation of the same shape made before it, runs the multiply too, in one pass: one
    /// dispatch and one buffer less per FFN layer. Every product is the rounded `f32` product
    /// of the same two values, so the bits are the unfused ones (a multiply commutes; neither
    /// path pins which NaN payload a NaN times a NaN keeps).
    pub(crate) fn fuse_activation_muls(&mut self) {
        let eqs = &self.graph.equations;
        let n = eqs.len();
        if self.fused_later.len() != n {
            self.fused_later = vec![false; n];
        }
        let mut readers = vec![0usize; n];
        for op in eqs {
            super::arena::for_each_operand(op, |v| readers[v.index()] += 1);
        }
        for (_, v) in &self.graph.outputs {
            readers[v.index()] += 1;
        }
        // The equation whose run makes each value: its own, or its fused group's first.
        let mut made: Vec<usize> = (0..n).collect();
        for (&first, members) in &self.fused {
            for &m in members {
                made[m] = first;
            }
        }
        self.act_mul = vec![None; n];
        for (j, op) in eqs.iter().enumerate() {
            let Op::Mul { a, b } = op else { continue };
            for (act, other) in [(*a, *b), (*b, *a)] {
                let i = act.index();
                let fits = matches!(eqs[i], Op::Silu { .. } | Op::Gelu { .. })
                    && readers[i] == 1
                    && !matches!(eqs[other.index()], Op::Weight { .. })
                    && made[other.index()] < i
                    && self.graph.info(act).shape == self.graph.info(other).shape
                    && self.graph.info(other).dtype == poot_core::DType::F32;
                if fits {
                    self.act_mul[i] = Some(ActMul { mul: j, other });
                    self.fused_later[j] = true;
                    break;
                }
            }
        }
    }

    /// Fills `glu` (after `fuse_activation_muls`): a fused pair of re-laid 8-row matmuls whose
    /// outputs nothing reads but one activation's product (`act(gate) * up`) makes that
    /// product at the pair's turn, each thread applying the activation and the multiply to the
    /// rows it just computed (`kernels::matmul::matmul_glu`): no pass over the gate and up
    /// outputs on one thread afterwards, and one equation less. The activation's equation is
    /// then skipped. Every value is the same rounded operation on the same inputs, so the bits
    /// are the unfused plan's.
    pub(crate) fn fuse_glu(&mut self) {
        use crate::kernels::matmul::repack::Repack;
        let eqs = &self.graph.equations;
        let n = eqs.len();
        self.glu = vec![None; n];
        if self.act_mul.len() != n {
            return;
        }
        let mut readers = vec![0usize; n];
        for op in eqs {
            super::arena::for_each_operand(op, |v| readers[v.index()] += 1);
        }
        for (_, v) in &self.graph.outputs {
            readers[v.index()] += 1;
        }
        for (i, op) in eqs.iter().enumerate() {
            let (Some(m), Op::Silu { x } | Op::Gelu { x }) = (self.act_mul[i], op) else {
                continue;
            };
            let (gate, up) = (x.index(), m.other.index());
            let Some((&first, _)) = self
                .fused
                .iter()
                .find(|(_, ms)| ms.len() == 2 && ms.contains(&gate) && ms.contains(&up))
            else {
                continue;
            };
            let r8 = |j: usize| match &eqs[j] {
                Op::MatMul { w, .. } => matches!(self.repack(w.index()), Some(Repack::Q(_))),
                _ => false,
            };
            if readers[gate] == 1 && readers[up] == 1 && gate != up && r8(gate) && r8(up) {
                self.glu[first] = Some(Glu {
                    act: i,
                    mul: m.mul,
                    gate_first: first == gate,
                    silu: matches!(op, Op::Silu { .. }),
                });
                self.fused_later[i] = true;
            }
        }
    }

    /// Fills `prefetch_next` from the matmul dispatches in equation order (after
    /// `fuse_matmuls` and the weight copies, whose addresses it records: a hint only, read by
    /// prefetches, which never fault, so a stale address is harmless).
    pub(crate) fn schedule_prefetch(&mut self) {
        let mut dispatches: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
        for (i, op) in self.graph.equations.iter().enumerate() {
            if !matches!(op, Op::MatMul { .. }) || self.fused_later.get(i) == Some(&true) {
                continue;
            }
            let members = self.fused.get(&i).cloned().unwrap_or_else(|| vec![i]);
            let ranges = members
                .iter()
                .filter_map(|&j| match &self.graph.equations[j] {
                    Op::MatMul { w, .. } => self.matmul_bytes(w.index()),
                    _ => None,
                })
                .map(|b| (b.as_ptr() as usize, b.len()))
                .collect();
            dispatches.push((i, ranges));
        }
        self.prefetch_next = vec![Vec::new(); self.graph.equations.len()];
        let n = dispatches.len();
        for d in 0..n {
            let (i, next) = (dispatches[d].0, &dispatches[(d + 1) % n].1);
            self.prefetch_next[i] = next.clone();
        }
    }

    /// The bytes a matmul over weight value `i` streams: its re-laid copy, its copy as stored,
    /// or the store's bytes.
    fn matmul_bytes(&self, i: usize) -> Option<&[u8]> {
        if let Some(rp) = self.repack(i) {
            return Some(match rp {
                Repack::Q(r) => &r.data[..],
                Repack::K(r) => &r.data[..],
                Repack::F8(r) => &r.data[..],
                Repack::F8G(r) => &r.data[..],
            });
        }
        if let Some(c) = self.copy(i) {
            return Some(c);
        }
        match &self.graph.equations[i] {
            Op::Weight { name } => self.weights.bytes(name),
            _ => None,
        }
    }

    /// The path compiling chose for matmul weight value `i` (every matmul weight has one).
    pub(crate) fn matmul_path(&self, i: usize) -> Option<MatmulPath> {
        self.matmul_paths.get(&i).copied()
    }

    /// The runtime's copy of weight value `i` as stored, if it made one.
    pub(crate) fn copy(&self, i: usize) -> Option<&[u8]> {
        match self.copied.get(&i).map(|p| &**p) {
            Some(Prepared::Copy(c)) => Some(c),
            _ => None,
        }
    }
}

impl std::fmt::Debug for CpuPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPlan")
            .field("equations", &self.graph.equations.len())
            .field("artifact_bytes", &self.artifact_bytes)
            .finish()
    }
}

impl CompiledPlan for CpuPlan {
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

/// Every op of the IR runs on the CPU (the reference backend).
pub(crate) fn supports(_op: &str) -> bool {
    true
}

fn rope_table(cfg: &poot_graph::RopeConfig, numerics: Numerics) -> Result<RopeTable, RuntimeError> {
    let kcfg = RopeConfig {
        style: cfg.style,
        head_dim: cfg.head_dim as usize,
        rot_dim: cfg.rot_dim as usize,
        theta: cfg.theta,
        scaling: cfg.scaling,
    };
    RopeTable::with_numerics(&kcfg, numerics).map_err(|e| RuntimeError::Kernel {
        op: "rope",
        detail: e.to_string(),
    })
}

fn value_bytes(graph: &Graph, i: usize) -> u64 {
    match graph.equations[i] {
        Op::Weight { .. } => 0,
        _ => (graph.values[i].numel() as u64).saturating_mul(4),
    }
}

pub(crate) fn compile(
    graph: &Graph,
    weights: Arc<dyn WeightStore>,
    limits: &CompileLimits,
    numerics: Numerics,
) -> Result<CpuPlan, RuntimeError> {
    let graph = run_passes(
        graph,
        &[&FuseWeightCasts::EVERY_READER, &DeadCodeElimination],
        limits,
    )?;
    let n = graph.equations.len();
    let mut rope = HashMap::new();
    let mut rope_tables: Vec<RopeTable> = Vec::new();
    let mut matmul_paths = HashMap::new();
    let mut last_use = vec![0usize; n];
    for (i, op) in graph.equations.iter().enumerate() {
        if !supports(op.name()) {
            return Err(CompileError::Unsupported {
                backend: "cpu",
                op: op.name(),
            }
            .into());
        }
        for v in op.operands() {
            last_use[v.index()] = i;
        }
        match op {
            Op::Weight { name } => {
                let (dtype, shape) = weights
                    .describe(name)
                    .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })?;
                let info = &graph.values[i];
                if dtype != info.dtype || shape != info.shape {
                    return Err(CompileError::Invalid(format!(
                        "weight '{name}' was traced as {}{:?} but the store has {dtype}{shape:?}",
                        info.dtype, info.shape
                    ))
                    .into());
                }
            }
            Op::Rope { cfg, .. } => {
                let table = rope_table(cfg, numerics)?;
                let at = match rope_tables.iter().position(|t| *t == table) {
                    Some(at) => at,
                    None => {
                        rope_tables.push(table);
                        rope_tables.len() - 1
                    }
                };
                rope.insert(i, at);
            }
            Op::MatMul { w, .. } => {
                let dtype = graph.values[w.index()].dtype;
                matmul_paths.insert(w.index(), MatmulPath::choose(numerics, dtype));
            }
            Op::Input { .. } => {
                let dt = graph.values[i].dtype;
                if dt != DType::F32 && dt != DType::I32 {
                    return Err(CompileError::Invalid(format!("input of dtype {dt}")).into());
                }
            }
            _ => {}
        }
    }
    for (_, v) in &graph.outputs {
        last_use[v.index()] = usize::MAX;
    }
    let rope_bytes: u64 = rope_tables
        .iter()
        .map(|t| t.inv_freq().len() as u64 * 4)
        .sum();
    let artifact_bytes = graph
        .peak_live_bytes(&last_use, |i| value_bytes(&graph, i))
        .saturating_add(rope_bytes)
        .saturating_add((n as u64).saturating_mul(std::mem::size_of::<Op>() as u64 + 32));
    if artifact_bytes > limits.max_artifact_bytes {
        return Err(CompileError::ArtifactTooLarge {
            limit: limits.max_artifact_bytes,
            total: artifact_bytes,
        }
        .into());
    }
    Ok(CpuPlan {
        graph,
        weights,
        rope,
        rope_tables,
        numerics,
        last_use,
        artifact_bytes,
        repacked: HashMap::new(),
        copied: HashMap::new(),
        matmul_paths,
        fused: HashMap::new(),
        fused_later: Vec::new(),
        act_mul: Vec::new(),
        glu: Vec::new(),
        prefetch_next: Vec::new(),
    })
}

/// A runtime's own copy of a stored weight, made once when a plan is compiled.
#[derive(Debug)]
pub(crate) enum Prepared {
    /// Re-laid for a faster kernel (`kernels::repack`).
    Repack(Repack),
    /// An expert stack re-laid expert by expert on first use (`kernels::matmul::experts_stack`).
    Experts(crate::kernels::matmul::experts_stack::LazyStack),
    /// The stored bytes as they are, in memory this runtime owns: small weights other ops read
    /// each step, and on hosts with transparent huge pages the plain float matmul weights.
    Copy(HugeBytes),
}

impl Prepared {
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Prepared::Repack(r) => r.bytes(),
            Prepared::Experts(s) => s.bytes(),
            Prepared::Copy(c) => c.len(),
        }
    }
}
