//! What a compiled CUDA plan holds: where each input, rope table and output lives in the
//! arena, the steps to replay (fixed launches, and paged attentions formed at run time), and
//! the sample nodes drawn on the host.

use poot_core::DType;
use poot_cpu::kernels::RopeTable;
use poot_graph::{AttentionConfig, Graph};
use poot_runtime::{CompiledPlan, WeightStore};
use std::sync::Arc;

use crate::device::DevBuf;
use crate::ops::Launch;

/// A `sample` node: its logits rows come back to the host and are drawn there.
#[derive(Debug)]
pub(crate) struct HostSample {
    /// Arena offset of the logits `[rows, vocab]`.
    pub offset: u64,
    pub rows: usize,
    pub vocab: usize,
    /// Input names: temperature, top_k, top_p, min_p, uniform.
    pub params: [String; 5],
}

/// A graph input: uploaded at every run.
#[derive(Debug)]
pub(crate) struct InputSlot {
    pub name: String,
    pub offset: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Ids must lie in `0..bound` (embedding rows, gathered rows): checked on the host.
    pub bound: Option<(usize, &'static str)>,
}

/// A rope's (cos, sin) table, computed on the host from its positions input at every run.
#[derive(Debug)]
pub(crate) struct RopeSlot {
    pub positions: String,
    pub table: RopeTable,
    pub offset: u64,
}

/// A paged attention: addresses of its activations and metadata inputs, formed into
/// launches at run time (`run.rs`) once the pool and the step's block table are known.
#[derive(Debug)]
pub(crate) struct AttnStep {
    pub cfg: AttentionConfig,
    pub t: u32,
    pub max_blocks: u32,
    /// q, k, v, out, then slot_mapping, token_seq, positions, block_tables.
    pub addrs: [u64; 8],
    /// The metadata inputs' names, in `addrs[4..]`'s order.
    pub meta: [String; 4],
}

/// One scheduled equation.
#[derive(Debug)]
pub(crate) enum Step {
    Fixed(Launch),
    Attention(AttnStep),
}

#[derive(Debug)]
pub(crate) struct OutputSlot {
    pub name: String,
    /// Where the output is: an arena offset, or a host-sampled node (`CudaPlan::samples`).
    pub sample: Option<usize>,
    pub offset: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// A graph compiled for one CUDA device.
pub struct CudaPlan {
    pub(crate) graph: Graph,
    pub(crate) arena: DevBuf,
    pub(crate) inputs: Vec<InputSlot>,
    pub(crate) ropes: Vec<RopeSlot>,
    pub(crate) outputs: Vec<OutputSlot>,
    pub(crate) samples: Vec<HostSample>,
    /// Absolute device addresses, ready to replay.
    pub(crate) steps: Vec<Step>,
    pub(crate) _weights: Vec<Arc<DevBuf>>,
    pub(crate) _store: Arc<dyn WeightStore>,
}

impl std::fmt::Debug for CudaPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPlan")
            .field("steps", &self.steps.len())
            .field("arena_bytes", &self.arena.bytes)
            .finish_non_exhaustive()
    }
}

impl CompiledPlan for CudaPlan {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn graph(&self) -> &Graph {
        &self.graph
    }
    fn artifact_bytes(&self) -> u64 {
        self.arena.bytes
    }
}
