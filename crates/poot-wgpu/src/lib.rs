//! poot-wgpu: the wgpu runtime, `poot_runtime::Runtime` over WGSL kernels (`shaders/wgsl`).
//!
//! Invariants:
//! - Weights reach the device as stored (every dtype the CPU runtime decodes: Q4_0, Q4_1,
//!   Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, F16, BF16, F32 bytes) and are decoded
//!   inside the kernels; a weight larger than one storage binding (lavapipe:
//!   128 MiB) is split by whole rows across bindings (`weights`).
//! - Every device wait is bounded: by the caller's `Deadline` and by
//!   [`WgpuOptions::timeout`] (600 s by default), whichever comes first. A wait that times out
//!   or finds the device lost returns a typed error (`Timeout`, or `Poisoned` naming the lost
//!   device) and poisons the runtime; every later call fails fast with `Poisoned` without
//!   touching the device.
//! - Arithmetic is f32 with an f32 KV pool (the CPU runtime's exact mode); error bounds per op
//!   are stated in the conformance tests (`tests/conformance.rs`). Opting in to
//!   [`WgpuOptions::f16_arithmetic`] takes F16-weight products in f16 where the adapter offers
//!   `shader-f16`, under a looser stated bound.
//! - [`WgpuOptions::ggml`] follows llama.cpp's CPU arithmetic instead (the CPU runtime's
//!   `Numerics::Ggml`): Q4_0/Q4_1/Q5_0/Q8_0 matmuls quantize activations to Q8 blocks and do integer
//!   block dots in ggml's order (`matmul_q8.wgsl`), Q4_K/Q6_K matmuls take Q8_K activations and
//!   exact super-block integer dots in the CPU runtime's order (`matmul_q8k.wgsl`), the KV pool holds f16-rounded values (still
//!   f32 storage), and attention rounds q and its softmax weights to f16
//!   (`attention_ggml.wgsl`), and SiLU uses ggml's vector `expf`. RoPE and norms keep the exact
//!   kernels and shader compilers may unfuse or reorder float steps, so results are a few ulps
//!   per op from ggml's, which activation quantization can amplify into flipped quants: logits
//!   are not bit-identical to llama.cpp's (greedy ids on SmolLM2 match its reference).
//! - Fault injection for tests is real device work: [`WgpuRuntime::inject_stall`] makes every
//!   later step start with a kernel that spins past any short deadline, and
//!   [`WgpuRuntime::inject_device_loss`] destroys the device.

mod device;
mod exec;
mod gpu;
mod kernels;
mod plan;
mod resident;
mod rope;
mod sample;
mod submit;
mod timer;
mod vk;
mod weights;
mod wgpu_submit;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use poot_core::{DType, Deadline, DEFAULT_DEVICE_TIMEOUT};
use poot_graph::{CompileLimits, Graph};
use poot_runtime::{
    CompiledPlan, Health, HostTensor, KvCacheConfig, LateInput, MemoryReport, Poison, Runtime,
    RuntimeError, WeightStore,
};

pub use device::{adapters, AdapterSummary};
pub use gpu::Api;
pub use plan::WgpuPlan;
pub use resident::DeviceTensor;
pub use vk::{devices as vulkan_devices, VkCaps, VkOptions, VkSettings};

use device::{Gpu, WaitError};
use gpu::{Buffer, Device, Pipeline};
use kernels::{Kernel, Pipelines};
use submit::StepError;
use weights::{GpuWeight, WeightCache};

/// Options for a wgpu runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Upper bound on the KV pool's bytes.
    pub max_kv_bytes: u64,
    /// Bound on every device wait, on top of the caller's deadline.
    pub timeout: Duration,
    /// Bytes per storage binding; `None` takes the adapter's limit. Tests set a small value to
    /// exercise splitting weights across bindings.
    pub max_binding_bytes: Option<u64>,
    /// F16 weights multiply in f16 (`matmul_f16.wgsl`) where the adapter offers `shader-f16`;
    /// off by default because it loosens the bound against the CPU (see the conformance suite).
    pub f16_arithmetic: bool,
    /// llama.cpp's CPU numerics (see the crate docs) instead of exact f32 arithmetic.
    pub ggml: bool,
    /// Samples on the host over read-back logits even where the adapter could sample on the
    /// device (as on an adapter without `shader-f64`; see `sample.rs`): for tests and
    /// comparison.
    pub host_sampling: bool,
    /// Raw Vulkan only: subgroups and staging (see [`VkOptions`]).
    pub vulkan: VkOptions,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        Self {
            max_kv_bytes: 8 << 30,
            timeout: DEFAULT_DEVICE_TIMEOUT,
            max_binding_bytes: None,
            f16_arithmetic: false,
            ggml: false,
            host_sampling: false,
            vulkan: VkOptions::default(),
        }
    }
}

/// The paged KV pool on the device: per layer, K and V of `[slots, n_kv_heads * head_dim]` f32.
#[derive(Debug)]
pub(crate) struct KvPool {
    pub cfg: KvCacheConfig,
    pub k: Vec<Arc<Buffer>>,
    pub v: Vec<Arc<Buffer>>,
}

/// Runs compiled graphs on a Vulkan device, through wgpu or raw Vulkan ([`Api`]).
#[derive(Debug)]
pub struct WgpuRuntime {
    pub(crate) gpu: Device,
    options: WgpuOptions,
    max_binding: u64,
    pipelines: Pipelines,
    weights: WeightCache,
    kv: Mutex<Option<KvPool>>,
    poison: Poison,
    stall: AtomicU32,
    stats: Stats,
    /// Per-dispatch timestamps, when on (`timer`).
    timer: timer::Timer,
    /// Tells this runtime's `DeviceTensor`s from another's.
    id: u64,
}

/// Counters over a runtime's life (`WgpuRuntime::stats`).
#[derive(Debug, Default)]
struct Stats {
    runs: AtomicU64,
    readback_bytes: AtomicU64,
    upload_bytes: AtomicU64,
}

/// What a runtime has done: steps run, bytes read back from the device (the outputs, and
/// the logits rows of host-sampled rows on an adapter without f64; not the timer's
/// timestamps), and bytes of host inputs uploaded at a step's start (not late inputs,
/// literals or weights; an input bound from a kept `DeviceTensor` uploads nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgpuStats {
    pub runs: u64,
    pub readback_bytes: u64,
    pub upload_bytes: u64,
}

impl WgpuRuntime {
    /// Opens the first Vulkan adapter through wgpu; a typed error when there is none.
    pub fn new(options: WgpuOptions) -> Result<Self, RuntimeError> {
        Self::with_device(Device::Wgpu(Box::new(Gpu::open()?)), options)
    }

    /// Opens the best Vulkan device through raw Vulkan (`ash`), not production: the same
    /// kernels and executor as [`WgpuRuntime::new`], compiled to SPIR-V by naga (see `vk`).
    /// `DeviceUnavailable` where there is no loader or device.
    pub fn vulkan(options: WgpuOptions) -> Result<Self, RuntimeError> {
        let gpu = vk::VkGpu::open(options.vulkan, options.timeout)?;
        Self::with_device(Device::Vulkan(Box::new(gpu)), options)
    }

    /// Opens the runtime of `api`.
    pub fn open(api: Api, options: WgpuOptions) -> Result<Self, RuntimeError> {
        match api {
            Api::Wgpu => Self::new(options),
            Api::Vulkan => Self::vulkan(options),
        }
    }

    fn with_device(gpu: Device, options: WgpuOptions) -> Result<Self, RuntimeError> {
        let limit = gpu.max_binding();
        let max_binding = options.max_binding_bytes.map_or(limit, |b| b.min(limit));
        Ok(Self {
            gpu,
            options,
            max_binding,
            pipelines: Pipelines::default(),
            weights: WeightCache::default(),
            kv: Mutex::new(None),
            poison: Poison::default(),
            stall: AtomicU32::new(0),
            stats: Stats::default(),
            timer: timer::Timer::default(),
            id: resident::next_runtime_id(),
        })
    }

    /// The adapter this runtime runs on.
    pub fn adapter(&self) -> &AdapterSummary {
        self.gpu.info()
    }

    /// The API driving the device (wgpu, or raw Vulkan).
    pub fn api(&self) -> Api {
        self.gpu.api()
    }

    /// On raw Vulkan, what the device offers beyond the kernels' baseline (subgroups,
    /// cooperative matrix, the storage range); `None` on wgpu.
    pub fn vulkan_caps(&self) -> Option<&VkCaps> {
        match &self.gpu {
            Device::Vulkan(v) => Some(&v.caps),
            Device::Wgpu(_) => None,
        }
    }

    /// On raw Vulkan, how the runtime uses the device (the subgroup matmul, staging); `None`
    /// on wgpu.
    pub fn vulkan_settings(&self) -> Option<VkSettings> {
        match &self.gpu {
            Device::Vulkan(v) => Some(v.settings),
            Device::Wgpu(_) => None,
        }
    }

    /// Whether the adapter offers f16 shader arithmetic (`shader-f16`).
    pub fn has_f16(&self) -> bool {
        self.gpu.f16()
    }

    /// Whether the adapter offers f64 shader arithmetic (`shader-f64`): the sampling step runs
    /// on the device only where it does (see `sample.rs`).
    pub fn has_f64(&self) -> bool {
        self.gpu.f64()
    }

    /// Whether the sampling step runs on the device here (the adapter has f64 and
    /// [`WgpuOptions::host_sampling`] is off).
    pub fn samples_on_device(&self) -> bool {
        self.gpu.f64() && !self.options.host_sampling
    }

    /// Whether F16-weight matmuls run in f16 here (opted in and offered by the adapter).
    pub fn uses_f16_arithmetic(&self) -> bool {
        self.options.f16_arithmetic && self.gpu.f16()
    }

    /// The matmul kernel for weights of `dtype` on this runtime.
    pub(crate) fn matmul_kernel(&self, dtype: DType) -> Kernel {
        if dtype == DType::F16 && self.uses_f16_arithmetic() {
            Kernel::MatMulF16
        } else if self.gpu.subgroup_matvec() {
            Kernel::MatMulSubgroup
        } else {
            Kernel::MatMul
        }
    }

    /// Whether this runtime follows llama.cpp's numerics ([`WgpuOptions::ggml`]).
    pub fn ggml(&self) -> bool {
        self.options.ggml
    }

    /// Whether a `[t, k]` by `dtype` matmul takes the Q8 integer path here (ggml numerics, a
    /// dtype with an integer decoder, whole 32-blocks).
    pub(crate) fn q8_matmul(&self, dtype: DType, k: usize) -> bool {
        self.options.ggml && k.is_multiple_of(32) && kernels::qdecoder(dtype).is_some()
    }

    /// Whether a `[t, k]` by `dtype` matmul takes the Q8_K integer path here (ggml numerics,
    /// Q4_K/Q6_K, whole 256-value super-blocks), as the CPU runtime's ggml numerics does.
    pub(crate) fn q8k_matmul(&self, dtype: DType, k: usize) -> bool {
        self.options.ggml && k.is_multiple_of(256) && kernels::kdecoder(dtype).is_some()
    }

    /// Bytes one storage binding may hold here.
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding
    }

    /// Device bytes of the weights uploaded for live plans (as stored: packed stays packed).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
    }

    /// Steps run and bytes read back so far.
    pub fn stats(&self) -> WgpuStats {
        WgpuStats {
            runs: self.stats.runs.load(Ordering::Relaxed),
            readback_bytes: self.stats.readback_bytes.load(Ordering::Relaxed),
            upload_bytes: self.stats.upload_bytes.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count_upload(&self, bytes: u64) {
        self.stats.upload_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn count_run(&self, readback_bytes: u64) {
        self.stats.runs.fetch_add(1, Ordering::Relaxed);
        self.stats
            .readback_bytes
            .fetch_add(readback_bytes, Ordering::Relaxed);
    }

    pub(crate) fn count_readback(&self, bytes: u64) {
        self.stats
            .readback_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Marks this runtime dead (used when a caller's own wait on it timed out).
    pub fn poison(&self, reason: &str) {
        self.poison.poison(reason);
    }

    /// Fault injection: every later step first runs `stall.wgsl` over `iters` rows of 256
    /// workgroups (about 2.5 s per row on lavapipe; 0 turns it off). Used to make a real
    /// submission miss its deadline.
    pub fn inject_stall(&self, iters: u32) {
        self.stall.store(iters, Ordering::Relaxed);
    }

    /// Fault injection: destroys the device, as a driver reset would lose it (on raw Vulkan,
    /// which cannot lose a device on demand, the device is marked lost at the layer's
    /// boundary, the path a `VK_ERROR_DEVICE_LOST` takes).
    pub fn inject_device_loss(&self) {
        self.gpu.lose();
    }

    pub(crate) fn stall_iters(&self) -> u32 {
        self.stall.load(Ordering::Relaxed)
    }

    pub(crate) fn compile_limits(&self) -> CompileLimits {
        // Pipelines are checked against the caller's limits at compile time; at run time they
        // are cached, so the default limits only matter for a kernel first seen while running.
        CompileLimits::default()
    }

    pub(crate) fn pipeline(
        &self,
        kernel: Kernel,
        dtype: DType,
        limits: &CompileLimits,
    ) -> Result<Arc<Pipeline>, RuntimeError> {
        self.pipelines.get(&self.gpu, kernel, dtype, limits)
    }

    pub(crate) fn weight(
        &self,
        store: &Arc<dyn WeightStore>,
        name: &str,
    ) -> Result<Arc<GpuWeight>, RuntimeError> {
        self.weights.get(&self.gpu, store, name, self.max_binding)
    }

    fn kv_lock(&self) -> std::sync::MutexGuard<'_, Option<KvPool>> {
        self.kv.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The caller's deadline, capped by `options.timeout`.
    fn bound(&self, deadline: Deadline) -> Deadline {
        match deadline.remaining() {
            Some(left) if left <= self.options.timeout => deadline,
            _ => Deadline::after(self.options.timeout),
        }
    }

    /// One step (the late inputs read when the step reaches them; see `submit`); a missed
    /// deadline or a lost device poisons the runtime.
    fn run_with(
        &self,
        plan: &dyn CompiledPlan,
        inputs: exec::StepInputs<'_>,
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.check()?;
        let plan =
            plan.as_any()
                .downcast_ref::<WgpuPlan>()
                .ok_or_else(|| RuntimeError::Kernel {
                    op: "run",
                    detail: "plan was compiled by another backend".into(),
                })?;
        let kv = self.kv_lock();
        let deadline = self.bound(deadline);
        let step = submit::run_step(self, plan, inputs, &[], kv.as_ref(), deadline, false);
        self.settle(step).map(|(host, _)| host)
    }

    /// A device-side result as the runtime's: a missed deadline or a lost device poisons it.
    pub(crate) fn settle<T>(&self, r: Result<T, StepError>) -> Result<T, RuntimeError> {
        match r {
            Ok(out) => Ok(out),
            Err(StepError::Runtime(e)) => Err(e),
            Err(StepError::Wait(WaitError::Timeout, during)) => {
                self.poison
                    .poison(format!("deadline missed during {during}"));
                Err(RuntimeError::Timeout {
                    during: during.to_owned(),
                })
            }
            Err(StepError::Wait(WaitError::Lost(reason) | WaitError::Other(reason), during)) => {
                self.poison
                    .poison(format!("device lost during {during} ({reason})"));
                Err(self.poison.check().unwrap_err())
            }
        }
    }

    /// Fails fast when poisoned, and poisons when the device was lost in the meantime.
    fn check(&self) -> Result<(), RuntimeError> {
        self.poison.check()?;
        if let Some(reason) = self.gpu.lost_reason() {
            self.poison.poison(format!("device lost ({reason})"));
            return self.poison.check();
        }
        Ok(())
    }
}

impl Runtime for WgpuRuntime {
    fn name(&self) -> &'static str {
        self.gpu.api().name()
    }

    fn supports(&self, op: &str) -> bool {
        plan::supports(self.samples_on_device(), op)
    }

    fn prepare(
        &self,
        graph: &Graph,
        weights: Arc<dyn WeightStore>,
        limits: &CompileLimits,
    ) -> Result<Arc<dyn CompiledPlan>, RuntimeError> {
        self.check()?;
        Ok(Arc::new(plan::compile(self, graph, weights, limits)?))
    }

    fn configure_kv(&self, cfg: KvCacheConfig) -> Result<(), RuntimeError> {
        self.check()?;
        if let Some(detail) = cfg.invalid() {
            return Err(RuntimeError::Kernel {
                op: "configure_kv",
                detail,
            });
        }
        let bytes = cfg.bytes_f32().unwrap_or(u64::MAX);
        if bytes > self.options.max_kv_bytes {
            return Err(RuntimeError::OutOfMemory {
                what: "KV pool",
                requested: bytes,
                limit: self.options.max_kv_bytes,
            });
        }
        let layer = (cfg.layer_elems().unwrap_or(usize::MAX) as u64).saturating_mul(4);
        if layer > self.max_binding {
            return Err(RuntimeError::OutOfMemory {
                what: "one layer's K (or V) in a storage binding",
                requested: layer,
                limit: self.max_binding,
            });
        }
        let mut slot = self.kv_lock();
        *slot = None; // free the old pool before allocating the new one
        let make = |l: u32, kind: &str| {
            let bytes = (cfg.layer_elems_of(l as usize).unwrap_or(0) as u64).saturating_mul(4);
            self.gpu
                .resident(bytes.max(4), Some(&format!("kv {kind} {l}")))
                .map(Arc::new)
        };
        let k = (0..cfg.n_layers)
            .map(|l| make(l, "k"))
            .collect::<Result<_, _>>()?;
        let v = (0..cfg.n_layers)
            .map(|l| make(l, "v"))
            .collect::<Result<_, _>>()?;
        *slot = Some(KvPool { cfg, k, v });
        Ok(())
    }

    fn run(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.run_with(plan, (inputs, &[]), deadline)
    }

    fn run_late(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        late: &[(&str, LateInput)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.run_with(plan, (inputs, late), deadline)
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
            // Weights live in device buffers, not host copies.
            weight_bytes: 0,
        }
    }

    fn health(&self) -> Health {
        if let Some(reason) = self.gpu.lost_reason() {
            self.poison.poison(format!("device lost ({reason})"));
        }
        self.poison.health()
    }
}
