//! The CPU runtime: `poot_runtime::Runtime` over the kernels of this crate.
//!
//! Invariants: one thread pool per runtime; the KV pool is allocated once by `configure_kv`
//! (bounded by `max_kv_bytes`, refused before allocating) and is then only written by attention
//! ops; a missed deadline poisons the runtime for good (every later call is `Poisoned`).

mod exec;
mod plan;
mod sample;

use std::sync::{Arc, Mutex};

use poot_core::Deadline;
use poot_graph::{CompileLimits, Graph, Op};
use poot_runtime::{
    CompiledPlan, Health, HostTensor, KvCacheConfig, MemoryReport, Poison, Runtime, RuntimeError,
    WeightStore,
};

pub use plan::CpuPlan;

use crate::ThreadPool;

/// The KV pool: per layer, K and V of `[num_blocks, block_size, n_kv_heads, head_dim]` f32.
#[derive(Debug)]
pub(crate) struct KvPool {
    cfg: KvCacheConfig,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Options for a CPU runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads; 0 means every available core.
    pub threads: usize,
    /// Upper bound on the KV pool's bytes.
    pub max_kv_bytes: u64,
}

impl Default for CpuOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            max_kv_bytes: 8 << 30,
        }
    }
}

/// Runs compiled graphs on this machine's cores.
#[derive(Debug)]
pub struct CpuRuntime {
    pool: ThreadPool,
    options: CpuOptions,
    kv: Mutex<Option<KvPool>>,
    poison: Poison,
}

impl CpuRuntime {
    pub fn new(options: CpuOptions) -> Result<Self, RuntimeError> {
        let pool = ThreadPool::new(options.threads).map_err(|e| RuntimeError::Kernel {
            op: "thread_pool",
            detail: e.to_string(),
        })?;
        Ok(Self {
            pool,
            options,
            kv: Mutex::new(None),
            poison: Poison::default(),
        })
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Marks this runtime dead (used when a caller's own wait on it timed out).
    pub fn poison(&self, reason: &str) {
        self.poison.poison(reason);
    }

    fn kv_lock(&self) -> std::sync::MutexGuard<'_, Option<KvPool>> {
        self.kv.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Runtime for CpuRuntime {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn supports(&self, op: &Op) -> bool {
        plan::supports(op)
    }

    fn compile(
        &self,
        graph: &Graph,
        weights: Arc<dyn WeightStore>,
        limits: &CompileLimits,
    ) -> Result<Arc<dyn CompiledPlan>, RuntimeError> {
        self.poison.check()?;
        Ok(Arc::new(plan::compile(graph, weights, limits)?))
    }

    fn configure_kv(&self, cfg: KvCacheConfig) -> Result<(), RuntimeError> {
        self.poison.check()?;
        let bytes = cfg.bytes_f32().unwrap_or(u64::MAX);
        if bytes > self.options.max_kv_bytes {
            return Err(RuntimeError::OutOfMemory {
                what: "KV pool",
                requested: bytes,
                limit: self.options.max_kv_bytes,
            });
        }
        let elems = cfg.layer_elems().unwrap_or(0);
        let mut slot = self.kv_lock();
        *slot = None; // free the old pool before allocating the new one
        let layer = || vec![0f32; elems];
        *slot = Some(KvPool {
            cfg,
            k: (0..cfg.n_layers).map(|_| layer()).collect(),
            v: (0..cfg.n_layers).map(|_| layer()).collect(),
        });
        Ok(())
    }

    fn run(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.poison.check()?;
        let plan = plan
            .as_any()
            .downcast_ref::<CpuPlan>()
            .ok_or_else(|| RuntimeError::Kernel {
                op: "run",
                detail: "plan was compiled by another backend".into(),
            })?;
        let mut kv = self.kv_lock();
        let result = exec::execute(plan, inputs, kv.as_mut(), &self.pool, deadline);
        if let Err(RuntimeError::Timeout { during }) = &result {
            self.poison
                .poison(format!("deadline missed during {during}"));
        }
        result
    }

    fn memory(&self) -> MemoryReport {
        let kv_bytes = self
            .kv_lock()
            .as_ref()
            .and_then(|p| p.cfg.bytes_f32())
            .unwrap_or(0);
        MemoryReport {
            kv_bytes,
            scratch_bytes: 0,
        }
    }

    fn health(&self) -> Health {
        self.poison.health()
    }
}

#[cfg(test)]
mod tests;
