//! poot-runtime: the seam between compiled graphs and devices.
//!
//! A backend is a small trait over whole graphs (`supports`, `compile`, `run`, `memory`,
//! `health`), never one method per op. Invariants every backend keeps:
//! - `run` is bounded by its `Deadline`; a backend that misses one returns
//!   `RuntimeError::Timeout` and poisons itself (`Poison`), and every later call fails with
//!   `RuntimeError::Poisoned`.
//! - Weights are read where they are stored (`WeightStore::bytes` is a view into the mapped
//!   checkpoint); no backend makes a dequantized host copy of a weight.
//! - The host receives only the graph's named outputs.

mod error;
mod gptq_awq;
mod host;
mod late;
mod poison;
mod released_copy;
pub mod sample;
mod weights;

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use poot_core::Deadline;
use poot_graph::{CompileLimits, Graph};

pub use error::RuntimeError;
pub use gptq_awq::{GptqAwqError, GptqAwqSpec, GptqAwqWeights, HfFormat};
pub use host::HostTensor;
pub use late::LateInput;
pub use poison::Poison;
pub use weights::{GgufWeights, SafetensorsWeights, WeightStore};

/// Shape of the paged KV pool: per layer, K and V of `[blocks, block_size, n_kv_heads,
/// head_dim]`, where `blocks` is `num_blocks` for the first `n_layers - windowed_layers`
/// layers and `windowed_blocks` for the last `windowed_layers` (a windowed KV group with its
/// own, smaller pool and block tables; 0 layers: one group). Block 0 is an ordinary block;
/// the allocator (the driver) owns which are free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub n_layers: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub num_blocks: u32,
    pub windowed_layers: u32,
    pub windowed_blocks: u32,
}

impl KvCacheConfig {
    /// One group of `n_layers` layers of `num_blocks` blocks.
    pub fn uniform(
        n_layers: u32,
        n_kv_heads: u32,
        head_dim: u32,
        block_size: u32,
        num_blocks: u32,
    ) -> Self {
        Self {
            n_layers,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
            windowed_layers: 0,
            windowed_blocks: 0,
        }
    }

    /// Blocks of layer `layer` (see the type's docs).
    pub fn layer_blocks(&self, layer: usize) -> u32 {
        let first_windowed = self.n_layers.saturating_sub(self.windowed_layers) as usize;
        if layer >= first_windowed {
            self.windowed_blocks
        } else {
            self.num_blocks
        }
    }

    /// Elements of layer `layer`'s K (or V).
    pub fn layer_elems_of(&self, layer: usize) -> Option<usize> {
        (self.layer_blocks(layer) as usize)
            .checked_mul(self.block_size as usize)?
            .checked_mul(self.n_kv_heads as usize)?
            .checked_mul(self.head_dim as usize)
    }

    /// Elements of the largest layer's K (or V).
    pub fn layer_elems(&self) -> Option<usize> {
        let most = if self.windowed_layers > 0 {
            self.num_blocks.max(self.windowed_blocks)
        } else {
            self.num_blocks
        };
        (most as usize)
            .checked_mul(self.block_size as usize)?
            .checked_mul(self.n_kv_heads as usize)?
            .checked_mul(self.head_dim as usize)
    }

    /// Bytes of the whole pool with f32 entries (K and V, every layer).
    pub fn bytes_f32(&self) -> Option<u64> {
        (0..self.n_layers as usize).try_fold(0u64, |sum, l| {
            sum.checked_add((self.layer_elems_of(l)? as u64).checked_mul(2 * 4)?)
        })
    }

    /// Why this shape is malformed: more windowed layers than layers, or a windowed group of
    /// no blocks; None when well formed.
    pub fn invalid(&self) -> Option<String> {
        if self.windowed_layers > self.n_layers {
            return Some(format!(
                "{} windowed layers of {}",
                self.windowed_layers, self.n_layers
            ));
        }
        if self.windowed_layers > 0 && self.windowed_blocks == 0 {
            return Some("windowed layers need windowed_blocks >= 1".into());
        }
        None
    }
}

/// A graph compiled for one backend. Backends downcast through `as_any`.
pub trait CompiledPlan: Send + Sync + Debug {
    fn as_any(&self) -> &dyn Any;
    /// The graph after the backend's passes.
    fn graph(&self) -> &Graph;
    /// Bytes this plan holds (schedule, buffers, generated code).
    fn artifact_bytes(&self) -> u64;
}

/// What a runtime holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub kv_bytes: u64,
    pub scratch_bytes: u64,
    /// Host bytes of weight copies the runtime made (re-laid layouts); 0 when every weight is
    /// read in place from the checkpoint's map.
    pub weight_bytes: u64,
}

/// Whether a runtime can still be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Ok,
    Poisoned { reason: String },
}

/// The KV element of a runtime that does not say otherwise ([`Runtime::kv_entry_bytes`]): f32.
pub const DEFAULT_KV_ENTRY_BYTES: u32 = 4;

/// A device backend over whole graphs.
pub trait Runtime: Send + Sync {
    fn name(&self) -> &'static str;
    /// True when `compile` accepts graphs containing ops of kind `op` (as named by
    /// `poot_graph::Op::name`, e.g. `"adjust_logits"`). By kind, not by instance, so a caller can ask
    /// before it traces anything (the engine decides where a step samples from it).
    fn supports(&self, op: &str) -> bool;
    /// Bytes of one KV cache entry (one element of K or V) in this runtime's pool: what the
    /// driver sizes the pool by. f32 unless a backend says otherwise.
    fn kv_entry_bytes(&self) -> u32 {
        DEFAULT_KV_ENTRY_BYTES
    }
    /// Prepares a plan: compiles a traced graph against a checkpoint's weights, under `limits`
    /// (the runtime-level verb; `poot.compile` in Python places a whole model over devices).
    fn prepare(
        &self,
        graph: &Graph,
        weights: Arc<dyn WeightStore>,
        limits: &CompileLimits,
    ) -> Result<Arc<dyn CompiledPlan>, RuntimeError>;
    /// Allocates (or replaces) the paged KV pool that attention ops read and write.
    fn configure_kv(&self, cfg: KvCacheConfig) -> Result<(), RuntimeError>;
    /// Runs a compiled plan on named host inputs; returns the graph's named outputs.
    fn run(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError>;
    /// `run` with some inputs supplied late (see `LateInput`). The default waits for every
    /// late input before starting; a backend that can read them mid-run overrides it.
    fn run_late(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        late: &[(&str, LateInput)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        let mut all = inputs.to_vec();
        for (name, slot) in late {
            all.push((name, slot.wait(name, deadline)?.as_ref().clone()));
        }
        self.run(plan, &all, deadline)
    }
    fn memory(&self) -> MemoryReport;
    fn health(&self) -> Health;
}
