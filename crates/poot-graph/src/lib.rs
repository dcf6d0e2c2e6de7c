//! poot-graph: the IR model definitions trace into, and the passes that prepare it.
//!
//! A model definition (Python) calls a `Tracer` op by op; the tracer checks every operand and
//! every budget (`TraceLimits`) as the graph grows. Backends compile the finished `Graph` under
//! `CompileLimits`. Weights are handles to stored tensors; no weight data enters a graph.

pub mod error;
pub mod ir;
mod kinds;
pub mod limits;
mod op_settings;
pub mod passes;
pub mod tracer;

pub use error::{CompileError, TraceError};
pub use ir::{
    broadcast_shape, AdjustInputs, AttentionConfig, AttentionMeta, BinaryKind, Graph, Op,
    ReduceKind, RopeConfig, RopeScaling, RopeStyle, SampleInputs, UnaryKind, ValueId, ValueInfo,
    MAX_ROPE_FACTORS,
};
pub use limits::{CompileLimits, Resource, TraceLimits};
pub use passes::{run_passes, validate, DeadCodeElimination, Emitter, FuseWeightCasts, Pass};
pub use tracer::{Tracer, Usage, WeightCatalog, MAX_RANK};

#[cfg(test)]
mod tests;
