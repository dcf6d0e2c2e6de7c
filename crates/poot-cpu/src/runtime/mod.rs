//! The CPU runtime: `poot_runtime::Runtime` over the kernels of this crate.
//!
//! Invariants: one thread pool per runtime; the KV pool is allocated once by `configure_kv`
//! (bounded by `max_kv_bytes`, refused before allocating) and is then only written by attention
//! ops; a missed deadline poisons the runtime for good (every later call is `Poisoned`).
//!
//! Numerics ([`CpuOptions::numerics`], fixed per runtime): [`Numerics::Exact`] keeps an f32 KV
//! pool and exact kernels; [`Numerics::Ggml`] reproduces llama.cpp's CPU arithmetic (Q8
//! activations with integer dots for Q4_0/Q4_1/Q5_0/Q8_0 weights, an f16 KV pool, ggml's RoPE,
//! softmax and SiLU; see `kernels::ggml`), which makes greedy decoding follow llama.cpp's
//! tokens; its integer matmul is the cheaper one per decoded token. Plans compiled by one
//! runtime carry its numerics.
//!
//! Weight copies: under ggml numerics on AVX2+, compiling re-lays Q4_0/Q4_1/Q5_0/Q8_0 and
//! Q4_K/Q6_K matmul weights 8 rows at a time (`kernels::repack`, `kernels::repack_k`, once per
//! store and tensor, shared by plans; an expert stack of those dtypes whole, as one matrix of
//! every expert's rows, when each expert is whole 8-row groups: `prepare.rs`),
//! copies the small weights other ops read (once per store and tensor too), and then releases
//! those tensors' mapped pages, so
//! resident memory holds each weight once; `memory().weight_bytes` counts the copies. Where
//! Linux grants transparent huge pages (`hugemem::available`), plain float (F16/BF16/F32)
//! matmul weights are copied as they are onto huge pages too, each released as soon as it is
//! copied: a decode step streams every weight, and a page cache mapped in 4 KiB pages costs a
//! TLB miss (a nested page walk in a VM) every 4 KiB. Repacks live on huge pages as well.
//! Copies and repacks run on the pool's threads (the first touch of each huge page is the
//! kernel zeroing it, which made a 2.4 GB F16 model's first request take seconds).

mod arena;
mod exec;
mod kv;
mod plan;
mod prepare;
mod profile;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use half::f16;
use half::vec::HalfBitsVecExt;
use poot_core::Deadline;
use poot_graph::{CompileLimits, Graph};
use poot_runtime::{
    CompiledPlan, Health, HostTensor, KvCacheConfig, LateInput, MemoryReport, Poison, Runtime,
    RuntimeError, WeightStore,
};

pub use plan::CpuPlan;

use crate::kernels::Numerics;
use crate::tuning::Tuning;
use crate::Isa;
use crate::{PoolConfig, ThreadPool};
use kv::{kv_bytes, KvLayers, KvPool};
use plan::Prepared;

/// Options for a CPU runtime: each runtime has its own, so two in one process can differ.
///
/// The tuning knobs used to be process-wide environment variables; they are fields now, and
/// [`CpuOptions::default`] still reads those variables (once per process) as its defaults, so
/// `POOT_CPU_ISA=avx2` and the others keep working where a caller does not set the field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads; 0 means every available core.
    pub threads: usize,
    /// Upper bound on the KV pool's bytes.
    pub max_kv_bytes: u64,
    /// The arithmetic the kernels follow (see the module docs).
    pub numerics: Numerics,
    /// Time every equation by op kind (see `profile.rs`). Default: on when `POOT_CPU_PROFILE`
    /// is set (which also names where the report goes).
    pub profile: bool,
    /// The best code path the kernels may take; a path this CPU lacks gives the best one below
    /// it ([`CpuRuntime::isa`] says which runs). Default: `POOT_CPU_ISA`, else [`Isa::Amx`]
    /// (the best this CPU runs).
    pub isa: Isa,
    /// How long idle pool threads spin before they park (see `pool.rs`). Default:
    /// `POOT_CPU_SPIN_US` microseconds, else 5 ms.
    pub spin: Duration,
    /// Bytes ahead the streaming integer kernels prefetch (`0`: one line per super-block; see
    /// `kernels::simd::prefetch_ahead`). Default: `POOT_CPU_PREFETCH`, else 2048.
    pub prefetch: usize,
    /// Bytes ahead the AVX-512 one-token F16/BF16 loops prefetch into L2. Default:
    /// `POOT_CPU_PREFETCH_FLOAT`, else 8192.
    pub prefetch_float: usize,
    /// Whether the 16-row quantized dots prefetch the next unit. Default: off only when
    /// `POOT_CPU_PREFETCH_NEXT=0`.
    pub prefetch_next: bool,
    /// Whether large buffers (weight copies, repacks) ask for transparent huge pages. Default:
    /// off only when `POOT_CPU_THP=0`.
    pub huge_pages: bool,
    /// Bytes of the next matmul's weights the idle pool workers prefetch into their caches
    /// between two matmuls, while the caller runs the small ops in between (`0`: off; see
    /// `exec.rs`). Changes no result. Default: `POOT_CPU_PREFETCH_GAP`, else 256 KiB.
    pub prefetch_gap: usize,
}

/// `CpuOptions::prefetch_gap`'s built-in value: each idle worker fetches the first 256 KiB of
/// its own run of the next matmul (half a Zen 3 core's L2). SmolLM2's decode on 2 threads,
/// in-process A/B (`benches/bench_prefetch_gap.py`, 8 rounds): 128 KiB 0.90x the time per
/// token (0.87-1.03), 256 KiB 0.91x (0.88-0.98), 512 KiB 0.98x (0.91-1.03).
const DEFAULT_PREFETCH_GAP: usize = 256 << 10;

impl Default for CpuOptions {
    /// The built-in values, each overridden by its `POOT_CPU_*` variable where set (see the
    /// fields).
    fn default() -> Self {
        let t = Tuning::process_default();
        Self {
            threads: 0,
            max_kv_bytes: 8 << 30,
            numerics: Numerics::Exact,
            profile: std::env::var_os("POOT_CPU_PROFILE").is_some(),
            isa: crate::tuning::env_isa().unwrap_or(Isa::Amx),
            spin: PoolConfig::default().spin,
            prefetch: t.prefetch,
            prefetch_float: t.prefetch_float,
            prefetch_next: t.prefetch_next,
            huge_pages: t.huge_pages,
            prefetch_gap: crate::tuning::env_usize("POOT_CPU_PREFETCH_GAP", DEFAULT_PREFETCH_GAP),
        }
    }
}

impl CpuOptions {
    /// The kernels' share of these options (the code path resolved for this CPU).
    pub fn tuning(&self) -> Tuning {
        Tuning {
            isa: Isa::capped(self.isa),
            prefetch: self.prefetch,
            prefetch_float: self.prefetch_float,
            prefetch_next: self.prefetch_next,
            huge_pages: self.huge_pages,
        }
    }
}

/// Runs compiled graphs on this machine's cores.
#[derive(Debug)]
pub struct CpuRuntime {
    pool: ThreadPool,
    options: CpuOptions,
    /// Installed on the pool's workers, and on the caller for each compile and run.
    tuning: Tuning,
    kv: Mutex<Option<KvPool>>,
    poison: Poison,
    profile: Option<profile::Profile>,
    /// Equation spans of the last run when `record_spans` is on and profiling is off.
    spans: profile::Profile,
    spans_on: AtomicBool,
    /// Activation buffers reused across runs (see `exec.rs`).
    arena: Mutex<arena::Arena>,
    /// Weights re-laid for a faster kernel (`kernels::repack`), shared by every plan compiled
    /// against the same store; an entry lives while its store does.
    repacks: Mutex<RepackCache>,
    /// Stored bytes of matmul weights the compile in progress (or the last one) prepared, and
    /// of those it had to prepare: read without a lock while a compile holds `repacks`.
    preparing: (AtomicU64, AtomicU64),
}

/// Re-laid weights by (store address, tensor name); the `Weak` tells a live store from a new
/// one that reuses a freed address.
type RepackCache = HashMap<(usize, String), (Weak<dyn WeightStore>, Arc<Prepared>)>;

impl CpuRuntime {
    /// Bytes of one KV element in the pool of a runtime under `numerics`: f16 as llama.cpp
    /// keeps it under ggml numerics, f32 otherwise. What `Runtime::kv_entry_bytes` answers, for
    /// a caller (the planner) that sizes pools before it builds the runtime.
    pub fn kv_entry_bytes_for(numerics: Numerics) -> u32 {
        match numerics {
            Numerics::Exact => 4,
            Numerics::Ggml => 2,
        }
    }

    pub fn new(options: CpuOptions) -> Result<Self, RuntimeError> {
        let tuning = options.tuning();
        // The workers serve this runtime only; the caller (worker 0) enters it per call.
        let pool = ThreadPool::with_config(PoolConfig {
            threads: options.threads,
            spin: options.spin,
            tuning: Some(tuning),
            hint_bytes: options.prefetch_gap,
        })
        .map_err(|e| RuntimeError::Kernel {
            op: "thread_pool",
            detail: e.to_string(),
        })?;
        Ok(Self {
            pool,
            options,
            tuning,
            kv: Mutex::new(None),
            poison: Poison::default(),
            arena: Mutex::new(arena::Arena::default()),
            repacks: Mutex::new(HashMap::new()),
            preparing: (AtomicU64::new(0), AtomicU64::new(0)),
            profile: options.profile.then(profile::Profile::default),
            spans: profile::Profile::default(),
            spans_on: AtomicBool::new(false),
        })
    }

    /// The per-op-kind timing table, when profiling is on (see `CpuOptions::profile`).
    pub fn profile_report(&self) -> Option<String> {
        self.profile.as_ref().map(profile::Profile::report)
    }

    /// Keeps each run's equation spans for `last_run_spans` (without the profile report).
    pub fn record_spans(&self, on: bool) {
        self.spans_on.store(on, Ordering::Relaxed);
    }

    /// The last run's equation spans: (index, op kind, start since the run began, duration);
    /// empty unless profiling or `record_spans` is on.
    pub fn last_run_spans(&self) -> Vec<(usize, String, Duration, Duration)> {
        match &self.profile {
            Some(p) => p.last_run(),
            None if self.spans_on.load(Ordering::Relaxed) => self.spans.last_run(),
            None => Vec::new(),
        }
    }

    /// `(done, total)`: stored bytes of the matmul weights the compile in progress has
    /// prepared (copied or re-laid) and of those it found to prepare; after it, those of the
    /// last compile that prepared any. Lock-free, so a caller can draw progress while a
    /// compile runs (a model's first compile prepares gigabytes).
    pub fn weight_progress(&self) -> (u64, u64) {
        let (done, total) = &self.preparing;
        let total = total.load(Ordering::Acquire);
        (done.load(Ordering::Acquire).min(total), total)
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub fn numerics(&self) -> Numerics {
        self.options.numerics
    }

    /// The code path this runtime's kernels take (its `CpuOptions::isa`, capped to this CPU).
    pub fn isa(&self) -> Isa {
        self.tuning.isa
    }

    /// The options this runtime was built with.
    pub fn options(&self) -> &CpuOptions {
        &self.options
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

    fn supports(&self, op: &str) -> bool {
        plan::supports(op)
    }

    fn kv_entry_bytes(&self) -> u32 {
        CpuRuntime::kv_entry_bytes_for(self.options.numerics)
    }

    fn prepare(
        &self,
        graph: &Graph,
        weights: Arc<dyn WeightStore>,
        limits: &CompileLimits,
    ) -> Result<Arc<dyn CompiledPlan>, RuntimeError> {
        self.poison.check()?;
        let _tuning = self.tuning.enter();
        let mut plan = plan::compile(graph, weights.clone(), limits, self.options.numerics)?;
        self.prepare_weights(&mut plan, &weights)?;
        plan.fuse_matmuls();
        plan.fuse_activation_muls();
        plan.fuse_glu();
        plan.schedule_prefetch();
        Ok(Arc::new(plan))
    }

    fn configure_kv(&self, cfg: KvCacheConfig) -> Result<(), RuntimeError> {
        self.poison.check()?;
        if let Some(detail) = cfg.invalid() {
            return Err(RuntimeError::Kernel {
                op: "configure_kv",
                detail,
            });
        }
        let numerics = self.options.numerics;
        let bytes = kv_bytes(&cfg, numerics).unwrap_or(u64::MAX);
        if bytes > self.options.max_kv_bytes {
            return Err(RuntimeError::OutOfMemory {
                what: "KV pool",
                requested: bytes,
                limit: self.options.max_kv_bytes,
            });
        }
        let _tuning = self.tuning.enter();
        let elems = |l: usize| cfg.layer_elems_of(l).unwrap_or(0);
        let mut slot = self.kv_lock();
        *slot = None; // free the old pool before allocating the new one
        let n = cfg.n_layers as usize;
        // One zeroed allocation per layer (calloc: the OS maps zero pages as they are first
        // written), not `vec![layer; n]`, whose clones write every byte: a 1 GiB pool took
        // half a second at server start. A page is now first touched by the step that writes
        // KV into it, a few microseconds per page.
        let zeros_f32 = || -> Vec<Vec<f32>> { (0..n).map(|l| vec![0f32; elems(l)]).collect() };
        let zeros_f16 = || -> Vec<Vec<f16>> {
            (0..n)
                .map(|l| vec![0u16; elems(l)].reinterpret_into())
                .collect()
        };
        let layers = match numerics {
            Numerics::Exact => KvLayers::F32 {
                k: zeros_f32(),
                v: zeros_f32(),
            },
            Numerics::Ggml => KvLayers::F16 {
                k: zeros_f16(),
                v: zeros_f16(),
            },
        };
        *slot = Some(KvPool { cfg, layers });
        Ok(())
    }

    fn run(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.run_late(plan, inputs, &[], deadline)
    }

    /// Reads each late input when its `Input` equation is reached (model definitions trace
    /// the token mask just before the sampling step, after the forward pass).
    fn run_late(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        late: &[(&str, LateInput)],
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
        let _tuning = self.tuning.enter();
        let mut kv = self.kv_lock();
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        let result = exec::execute(
            plan,
            (inputs, late),
            kv.as_mut(),
            &self.pool,
            deadline,
            self.profile
                .as_ref()
                .or_else(|| self.spans_on.load(Ordering::Relaxed).then_some(&self.spans)),
            &mut arena,
        );
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
            .and_then(|p| kv_bytes(&p.cfg, self.options.numerics))
            .unwrap_or(0);
        let scratch_bytes = self
            .arena
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .parked_bytes();
        let weight_bytes = self
            .repacks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|(store, _)| store.strong_count() > 0)
            .map(|(_, rp)| rp.bytes() as u64)
            .sum();
        MemoryReport {
            kv_bytes,
            scratch_bytes,
            weight_bytes,
        }
    }

    fn health(&self) -> Health {
        self.poison.health()
    }
}

impl Drop for CpuRuntime {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            p.emit();
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "fusion_tests.rs"]
mod fusion_tests;
