//! Compile passes over a traced graph, under `CompileLimits`.
//!
//! Invariants: a pass builds its output through an `Emitter`, which refuses the equation that
//! would take the graph past `CompileLimits::max_equations` (`CompileError::Expansion`, naming
//! the pass) before pushing it. Passes keep definition order, so their output is a schedule.

use poot_core::DType;

use crate::error::CompileError;
use crate::ir::{Graph, Op, ValueId, ValueInfo};
use crate::limits::CompileLimits;

/// Builds a pass's output graph under the equation limit.
#[derive(Debug)]
pub struct Emitter {
    pass: &'static str,
    limit: usize,
    graph: Graph,
}

impl Emitter {
    pub fn new(pass: &'static str, limits: &CompileLimits, step_tokens: usize) -> Self {
        let graph = Graph {
            step_tokens,
            ..Graph::default()
        };
        Self {
            pass,
            limit: limits.max_equations,
            graph,
        }
    }

    /// Appends an equation, or refuses it when the graph would pass the limit.
    pub fn emit(&mut self, op: Op, info: ValueInfo) -> Result<ValueId, CompileError> {
        let total = self.graph.equations.len() + 1;
        if total > self.limit {
            return Err(CompileError::Expansion {
                pass: self.pass,
                limit: self.limit as u64,
                total: total as u64,
            });
        }
        self.graph.equations.push(op);
        self.graph.values.push(info);
        Ok(ValueId((total - 1) as u32))
    }

    pub fn output(&mut self, name: String, v: ValueId) {
        self.graph.outputs.push((name, v));
    }

    pub fn finish(self) -> Graph {
        self.graph
    }
}

/// A graph-to-graph rewrite.
pub trait Pass {
    fn name(&self) -> &'static str;
    fn run(&self, graph: &Graph, limits: &CompileLimits) -> Result<Graph, CompileError>;
}

/// Drops every equation no output depends on, keeping inputs (the caller feeds them anyway).
#[derive(Debug, Default, Clone, Copy)]
pub struct DeadCodeElimination;

impl Pass for DeadCodeElimination {
    fn name(&self) -> &'static str {
        "dead_code_elimination"
    }

    fn run(&self, graph: &Graph, limits: &CompileLimits) -> Result<Graph, CompileError> {
        let n = graph.equations.len();
        let mut live = vec![false; n];
        for (_, v) in &graph.outputs {
            live[v.index()] = true;
        }
        for i in (0..n).rev() {
            if matches!(graph.equations[i], Op::Input { .. }) {
                live[i] = true;
            }
            if live[i] {
                for operand in graph.equations[i].operands() {
                    live[operand.index()] = true;
                }
            }
        }
        let mut out = Emitter::new(self.name(), limits, graph.step_tokens);
        let mut remap = vec![ValueId(u32::MAX); n];
        for i in 0..n {
            if live[i] {
                let op = graph.equations[i].map_operands(&mut |v| remap[v.index()]);
                remap[i] = out.emit(op, graph.values[i].clone())?;
            }
        }
        for (name, v) in &graph.outputs {
            out.output(name.clone(), remap[v.index()]);
        }
        Ok(out.finish())
    }
}

/// Fuses each `Op::Cast` of a stored weight into the ops that read it where they take a
/// stored weight: the reader gets the weight itself and its kernel decodes the stored words,
/// so no f32 copy of the weight is made. Matrix readers (a matmul's or MoE matmul's `w`, an
/// embedding's table) always; with `vectors`, also a norm's weight and bias, `Add`/`Mul`'s
/// `b`, either operand of `Binary` and `BatchMatMul` and `Permute`'s `x` (a backend whose
/// kernels take only f32 there leaves those casts to run). Value ids are kept; a cast left
/// with no reader is dead code for `DeadCodeElimination` (run it after this pass). A cast
/// read anywhere else stays, and runs as its own kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuseWeightCasts {
    pub vectors: bool,
}

impl FuseWeightCasts {
    /// Fuses into every reader that takes a stored weight.
    pub const EVERY_READER: Self = Self { vectors: true };
    /// Fuses into matrix readers only.
    pub const MATRIX_READERS: Self = Self { vectors: false };

    fn fused(&self, graph: &Graph, op: &Op) -> Op {
        let f = |v: ValueId| match graph.op(v) {
            Op::Cast { x, to: DType::F32 } if matches!(graph.op(*x), Op::Weight { .. }) => *x,
            _ => v,
        };
        let mut op = op.clone();
        match &mut op {
            Op::MatMul { w, .. } | Op::MoeMatMul { w, .. } => *w = f(*w),
            Op::Embedding { table, .. } => *table = f(*table),
            _ if !self.vectors => {}
            Op::RmsNorm { weight, .. } => *weight = f(*weight),
            Op::Add { b, .. } | Op::Mul { b, .. } => *b = f(*b),
            Op::Binary { a, b, .. } | Op::BatchMatMul { a, b } => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::Permute { x, .. } => *x = f(*x),
            Op::LayerNorm { weight, bias, .. } => {
                for v in [weight, bias].into_iter().flatten() {
                    *v = f(*v);
                }
            }
            _ => {}
        }
        op
    }
}

impl Pass for FuseWeightCasts {
    fn name(&self) -> &'static str {
        "fuse_weight_casts"
    }

    fn run(&self, graph: &Graph, limits: &CompileLimits) -> Result<Graph, CompileError> {
        let mut out = Emitter::new(self.name(), limits, graph.step_tokens);
        for (op, info) in graph.equations.iter().zip(&graph.values) {
            out.emit(self.fused(graph, op), info.clone())?;
        }
        for (name, v) in &graph.outputs {
            out.output(name.clone(), *v);
        }
        Ok(out.finish())
    }
}

/// Checks the graph's structure: operands defined before use, outputs in range.
pub fn validate(graph: &Graph) -> Result<(), CompileError> {
    if graph.values.len() != graph.equations.len() {
        return Err(CompileError::Invalid(
            "values and equations differ in length".into(),
        ));
    }
    for (i, op) in graph.equations.iter().enumerate() {
        if let Some(bad) = op.operands().into_iter().find(|v| v.index() >= i) {
            return Err(CompileError::Invalid(format!(
                "equation {i} ({}) reads value {} before it is defined",
                op.name(),
                bad.0
            )));
        }
    }
    if let Some((name, _)) = graph
        .outputs
        .iter()
        .find(|(_, v)| v.index() >= graph.equations.len())
    {
        return Err(CompileError::Invalid(format!(
            "output '{name}' is out of range"
        )));
    }
    Ok(())
}

/// Validates, then runs `passes` in order, each under the limits.
pub fn run_passes(
    graph: &Graph,
    passes: &[&dyn Pass],
    limits: &CompileLimits,
) -> Result<Graph, CompileError> {
    validate(graph)?;
    let mut current = graph.clone();
    for pass in passes {
        current = pass.run(&current, limits)?;
    }
    Ok(current)
}
