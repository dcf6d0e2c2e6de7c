//! poot-cuda: the CUDA runtime, `poot_runtime::Runtime` over kernels from `shaders/cuda`.
//!
//! Invariants:
//! - Nothing CUDA is linked: the driver (`libcuda.so.1`) and NVRTC are opened at run time, so
//!   the crate builds and its tests run anywhere. Where either (or a device) is missing,
//!   [`CudaRuntime::new`] returns `RuntimeError::DeviceUnavailable` naming what is missing.
//! - Kernels are the `.cu` sources, compiled once per runtime by NVRTC for the device's own
//!   architecture (`sm_XY`, `--fmad=false`). The same sources run on the CPU through the shim
//!   (`shim`, `shaders/cuda/cpu_shim.h`) in the ordinary tests.
//! - Weights reach the device as stored (Q8_0, Q4_0, Q4_1, F16, F32 bytes) and are decoded
//!   inside the kernels; a weight is uploaded once per runtime and shared by every live plan.
//! - Arithmetic is f32 (the CPU runtime's exact numerics): error bounds per op are stated in
//!   the tests (`tests/shim.rs` on the CPU, `tests/device.rs` on a GPU).
//! - Every wait polls an event against the caller's `Deadline`, capped by
//!   [`CudaOptions::timeout`] (600 s by default); nothing blocks on the GPU. A timeout or a
//!   sticky CUDA error poisons the runtime; later calls fail fast with `Poisoned`.
//! - Fault injection is real device work: [`CudaRuntime::inject_stall`] makes every later run
//!   start with a kernel that spins on the GPU timer.

mod device;
mod driver;
mod error;
mod lower;
mod nvrtc;
pub mod ops;
mod plan;
pub mod shim;
mod steps;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use poot_core::{DType, Deadline, DEFAULT_DEVICE_TIMEOUT};
use poot_graph::{CompileLimits, Graph};
use poot_runtime::{
    CompiledPlan, Health, HostTensor, KvCacheConfig, MemoryReport, Poison, Runtime, RuntimeError,
    WeightStore,
};

pub use device::DeviceInfo;
pub use error::CudaError;
pub use nvrtc::Target;
pub use steps::CudaPlan;

use device::{DevBuf, Device};

/// Options for a CUDA runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Which device (CUDA ordinal).
    pub device: i32,
    /// Upper bound on the KV pool's bytes.
    pub max_kv_bytes: u64,
    /// Bound on every device wait, on top of the caller's deadline.
    pub timeout: Duration,
    /// A driver library to open instead of `libcuda.so.1`; the tests point it (and
    /// `nvrtc_library`) at the CPU emulation (`shim::Shim::library`).
    pub driver_library: Option<PathBuf>,
    /// An NVRTC library to open instead of searching the usual names.
    pub nvrtc_library: Option<PathBuf>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            device: 0,
            max_kv_bytes: 8 << 30,
            timeout: DEFAULT_DEVICE_TIMEOUT,
            driver_library: None,
            nvrtc_library: None,
        }
    }
}

/// Every CUDA device this machine's driver sees (empty without a driver). Asks the driver
/// only: no context is created and nothing is compiled (`nvrtc_version` is `(0, 0)`).
pub fn devices() -> Vec<DeviceInfo> {
    let Ok(drv) = driver::Driver::open(None) else {
        return Vec::new();
    };
    (0..)
        .map_while(|i| Device::probe(&drv, i).ok().map(|(_, info)| info))
        .collect()
}

/// `(free, total)` bytes of device `ordinal`'s memory now (`cuMemGetInfo`): what other
/// processes hold is not free. Needs a context, so it retains the device's primary context
/// for the call and releases it (a runtime opened later retains it again). `driver` opens
/// that library instead of `libcuda.so.1` (tests: the CPU emulator).
pub fn memory_info(
    ordinal: i32,
    driver: Option<&std::path::Path>,
) -> Result<(u64, u64), CudaError> {
    let drv = driver::Driver::open(driver)?;
    let (dev, _) = Device::probe(&drv, ordinal)?;
    let mut ctx: driver::CuContext = std::ptr::null_mut();
    // SAFETY: retains the primary context of a device the probe found; released below.
    drv.check("cuDevicePrimaryCtxRetain", unsafe {
        (drv.primary_ctx_retain)(&mut ctx, dev)
    })?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: `ctx` was just retained.
    let got = drv
        .check("cuCtxSetCurrent", unsafe { (drv.ctx_set_current)(ctx) })
        .and_then(|()| {
            // SAFETY: writes two values in the context made current above.
            drv.check("cuMemGetInfo", unsafe {
                (drv.mem_get_info)(&mut free, &mut total)
            })
        });
    // SAFETY: releases the retain above, whatever the calls between returned.
    let released = drv.check("cuDevicePrimaryCtxRelease", unsafe {
        (drv.primary_ctx_release)(dev)
    });
    got.and(released)?;
    Ok((free as u64, total as u64))
}

/// The paged KV pool on the device: per layer, K and V of f32.
#[derive(Debug)]
pub(crate) struct KvPool {
    cfg: KvCacheConfig,
    k: Vec<DevBuf>,
    v: Vec<DevBuf>,
}

/// Runs compiled graphs on one NVIDIA GPU.
#[derive(Debug)]
pub struct CudaRuntime {
    dev: Arc<Device>,
    options: CudaOptions,
    /// Uploaded weights by (store address, name): live while a plan holds them.
    weights: Mutex<HashMap<(usize, String), Weak<DevBuf>>>,
    kv: Mutex<Option<KvPool>>,
    /// Attention scores of the step running (grown on demand; runs hold the KV lock).
    scratch: Mutex<Option<DevBuf>>,
    poison: Poison,
    stall_ns: AtomicU64,
    sink: DevBuf,
}

impl CudaRuntime {
    /// Opens device `options.device` and compiles the kernels for it.
    pub fn new(options: CudaOptions) -> Result<Self, RuntimeError> {
        let dev = Device::open(
            options.device,
            options.driver_library.as_deref(),
            options.nvrtc_library.as_deref(),
        )?;
        let sink = dev.session()?.alloc(&dev, 4)?;
        Ok(Self {
            dev,
            options,
            weights: Mutex::new(HashMap::new()),
            kv: Mutex::new(None),
            scratch: Mutex::new(None),
            poison: Poison::default(),
            stall_ns: AtomicU64::new(0),
            sink,
        })
    }

    /// The device this runtime runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.dev.info
    }

    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// Marks this runtime dead (used when a caller's own wait on it timed out).
    pub fn poison(&self, reason: &str) {
        self.poison.poison(reason);
    }

    /// Fault injection: every later run first spins on the GPU for `duration` (zero turns it
    /// off). Used to make a real run miss its deadline.
    pub fn inject_stall(&self, duration: Duration) {
        self.stall_ns
            .store(duration.as_nanos() as u64, Ordering::Relaxed);
    }

    /// `(registers per thread, local bytes per thread)` of a kernel, as the driver reports.
    pub fn kernel_resources(&self, kernel: &str) -> Option<(u32, u32)> {
        self.dev.resources(kernel)
    }

    /// Free device memory now, bytes.
    pub fn free_device_memory(&self) -> Result<u64, RuntimeError> {
        Ok(self.dev.free_memory()?)
    }

    /// Device bytes of the weights uploaded for live plans (as stored: packed stays packed).
    pub fn weight_bytes(&self) -> u64 {
        let w = self.weights.lock().unwrap_or_else(|e| e.into_inner());
        w.values().filter_map(Weak::upgrade).map(|b| b.bytes).sum()
    }

    pub(crate) fn alloc(&self, bytes: u64) -> Result<DevBuf, RuntimeError> {
        Ok(self.dev.session()?.alloc(&self.dev, bytes)?)
    }

    pub(crate) fn upload(
        &self,
        dst: u64,
        src: &[u8],
        deadline: Deadline,
    ) -> Result<(), RuntimeError> {
        let mut s = self.dev.session()?;
        s.upload(dst, src, deadline)
            .map_err(|e| self.fail(e, "upload"))
    }

    /// The device copy of weight `name` (its stored bytes), shared with live plans.
    pub(crate) fn weight(
        &self,
        store: &Arc<dyn WeightStore>,
        name: &str,
        bytes: &[u8],
    ) -> Result<Arc<DevBuf>, RuntimeError> {
        // The key's address is the store's; the entry is only reused while a plan holding
        // that store (so the same store at that address) keeps the buffer alive.
        let key = (Arc::as_ptr(store).cast::<u8>() as usize, name.to_owned());
        let mut cache = self.weights.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(buf) = cache.get(&key).and_then(Weak::upgrade) {
            return Ok(buf);
        }
        let buf = Arc::new(self.alloc(bytes.len() as u64)?);
        self.upload(buf.ptr, bytes, Deadline::after(self.options.timeout))?;
        cache.retain(|_, w| w.strong_count() > 0);
        cache.insert(key, Arc::downgrade(&buf));
        Ok(buf)
    }

    /// The caller's deadline, capped by `options.timeout`.
    fn bound(&self, deadline: Deadline) -> Deadline {
        match deadline.remaining() {
            Some(left) if left <= self.options.timeout => deadline,
            _ => Deadline::after(self.options.timeout),
        }
    }

    /// A device error during `during`: a timeout or fault poisons the runtime.
    fn fail(&self, e: CudaError, during: &str) -> RuntimeError {
        match e {
            CudaError::Timeout { .. } => {
                self.poison
                    .poison(format!("deadline missed during {during}"));
                e.into()
            }
            CudaError::Driver { .. } => {
                self.poison.poison(format!("{e} during {during}"));
                self.poison.check().unwrap_err()
            }
            other => other.into(),
        }
    }

    fn plan<'p>(&self, plan: &'p dyn CompiledPlan) -> Result<&'p CudaPlan, RuntimeError> {
        plan.as_any()
            .downcast_ref::<CudaPlan>()
            .ok_or_else(|| RuntimeError::Kernel {
                op: "run",
                detail: "plan was compiled by another backend".into(),
            })
    }

    /// Runs `plan` once to warm up, then replays its launches `iters` times between two
    /// timing events; returns the mean seconds per replay (device time, no host copies).
    pub fn time_plan(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        iters: u32,
        deadline: Deadline,
    ) -> Result<f64, RuntimeError> {
        self.run(plan, inputs, deadline)?;
        let plan = self.plan(plan)?;
        let launches: Vec<ops::Launch> = plan
            .steps
            .iter()
            .map(|s| match s {
                steps::Step::Fixed(l) => Ok(l.clone()),
                steps::Step::Attention(_) => Err(RuntimeError::Kernel {
                    op: "time_plan",
                    detail: "a plan with paged attention is timed by whole runs".into(),
                }),
            })
            .collect::<Result<_, _>>()?;
        let s = self.dev.session()?;
        let secs = s
            .time(&launches, iters.max(1), self.bound(deadline))
            .map_err(|e| self.fail(e, "timing"))?;
        Ok(secs / f64::from(iters.max(1)))
    }
}

mod run;

impl Runtime for CudaRuntime {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports(&self, op: &str) -> bool {
        plan::supports(op)
    }

    fn prepare(
        &self,
        graph: &Graph,
        weights: Arc<dyn WeightStore>,
        limits: &CompileLimits,
    ) -> Result<Arc<dyn CompiledPlan>, RuntimeError> {
        self.poison.check()?;
        Ok(Arc::new(plan::compile(self, graph, weights, limits)?))
    }

    fn configure_kv(&self, cfg: KvCacheConfig) -> Result<(), RuntimeError> {
        self.poison.check()?;
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
        let layer = |l: u32| {
            (cfg.layer_elems_of(l as usize).unwrap_or(usize::MAX) as u64).saturating_mul(4)
        };
        let mut slot = self.kv.lock().unwrap_or_else(|e| e.into_inner());
        *slot = None; // free the old pool before allocating the new one
        let make = || -> Result<Vec<DevBuf>, RuntimeError> {
            (0..cfg.n_layers).map(|l| self.alloc(layer(l))).collect()
        };
        let (k, v) = (make()?, make()?);
        {
            let s = self.dev.session()?;
            for b in k.iter().chain(&v) {
                s.zero(b.ptr, b.bytes as usize)
                    .map_err(|e| self.fail(e, "kv zero"))?;
            }
            s.wait("kv zero", Deadline::after(self.options.timeout))
                .map_err(|e| self.fail(e, "kv zero"))?;
        }
        *slot = Some(KvPool { cfg, k, v });
        Ok(())
    }

    fn run(
        &self,
        plan: &dyn CompiledPlan,
        inputs: &[(&str, HostTensor)],
        deadline: Deadline,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.poison.check()?;
        let plan = self.plan(plan)?;
        run::run(self, plan, inputs, self.bound(deadline))
    }

    fn memory(&self) -> MemoryReport {
        let kv_bytes = self
            .kv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|p| p.cfg.bytes_f32())
            .unwrap_or(0);
        MemoryReport {
            kv_bytes,
            scratch_bytes: 0,
            // Weights live in device memory, not host copies.
            weight_bytes: 0,
        }
    }

    fn health(&self) -> Health {
        self.poison.health()
    }
}

/// Every kernel source compiled by NVRTC (found as the runtime finds it) to `target`, with
/// the runtime's own options: `(file name, image)`. Needs no GPU; `scripts/ptx_check.sh` runs
/// the PTX through `ptxas`, and the tests check that every source compiles.
pub fn compile_kernels(target: Target) -> Result<Vec<(&'static str, Vec<u8>)>, CudaError> {
    let nvrtc = nvrtc::Nvrtc::open(None)?;
    ops::SOURCES
        .iter()
        .map(|(file, text)| Ok((*file, nvrtc.compile(file, text, &[ops::COMMON], target)?)))
        .collect()
}

/// One source (including `common.cuh` as the kernels do) compiled with the runtime's options.
pub fn compile_source(name: &str, source: &str, target: Target) -> Result<Vec<u8>, CudaError> {
    nvrtc::Nvrtc::open(None)?.compile(name, source, &[ops::COMMON], target)
}

/// NVRTC's version, where NVRTC can be opened.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    Ok(nvrtc::Nvrtc::open(None)?.version())
}

/// Whether the CUDA kernels read weights of `dtype` in matmuls.
pub fn matmul_dtype(dtype: DType) -> bool {
    ops::matvec_kernel(dtype).is_some()
}
