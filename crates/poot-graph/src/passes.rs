//! Compile passes over a traced graph, under `CompileLimits`.
//!
//! Invariants: a pass builds its output through an `Emitter`, which refuses the equation that
//! would take the graph past `CompileLimits::max_equations` (`CompileError::Expansion`, naming
//! the pass) before pushing it. Passes keep definition order, so their output is a schedule.

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
