//! One CUDA device: its primary context, one non-blocking stream, the kernels compiled for
//! its architecture, device buffers, pinned staging, and the bounded wait.
//!
//! Invariants:
//! - Nothing here blocks on the GPU: copies are asynchronous through pinned staging and every
//!   completion is an event polled against a [`Deadline`] (`wait`). A wait that times out or
//!   reads a sticky error marks the device `faulted`; from then on buffers are not freed
//!   (`cuMemFree` would wait behind the stalled work) and the runtime above is poisoned.
//! - All use is serialized by one lock (`Device::lock`), and the context is made current on
//!   the calling thread at each entry, so any thread may call.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use poot_core::Deadline;

use crate::driver::*;
use crate::error::CudaError;
use crate::nvrtc::{Nvrtc, Target};
use crate::ops::{self, Launch, Params};

/// What discovery reports about the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    pub total_memory: u64,
    /// The driver's CUDA version as `major * 1000 + minor * 10` (13000 for 13.0).
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
}

/// Staging chunk for weight uploads: bounded host memory however large the weight.
const CHUNK: usize = 16 << 20;

pub struct Device {
    pub drv: Driver,
    pub info: DeviceInfo,
    dev: CuDevice,
    ctx: CuContext,
    stream: CuStream,
    event: CuEvent,
    functions: HashMap<&'static str, CuFunction>,
    /// Registers per thread and local (stack) bytes of each kernel, from the driver.
    resources: HashMap<&'static str, (u32, u32)>,
    modules: Vec<CuModule>,
    faulted: AtomicBool,
    lock: Mutex<Pinned>,
}

// SAFETY: the raw handles are driver objects usable from any thread once the context is
// current there (`enter` does that); every use goes through `lock`, which serializes them.
unsafe impl Send for Device {}
// SAFETY: as above: shared references only reach the handles under `lock`.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

/// Page-locked host memory (so async copies never block the host), grown on demand.
pub struct Pinned {
    ptr: *mut u8,
    cap: usize,
}

impl Pinned {
    pub fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        assert!(
            len <= self.cap,
            "staging of {} bytes asked for {len}",
            self.cap
        );
        if len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` points at `cap >= len` bytes of pinned memory owned by this struct.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    pub fn addr(&self) -> *mut u8 {
        self.ptr
    }
}

/// The device under its lock: every operation that touches the stream.
pub struct Session<'a> {
    pub dev: &'a Device,
    pub staging: MutexGuard<'a, Pinned>,
}

fn device_attr(drv: &Driver, dev: CuDevice, attr: c_int) -> Result<i32, CudaError> {
    let mut v = 0;
    // SAFETY: writes one int for a valid device ordinal and attribute id.
    drv.check("cuDeviceGetAttribute", unsafe {
        (drv.device_get_attribute)(&mut v, attr, dev)
    })?;
    Ok(v)
}

impl Device {
    /// What the driver says about device `ordinal` (no context, no NVRTC): for discovery.
    pub fn probe(drv: &Driver, ordinal: i32) -> Result<(CuDevice, DeviceInfo), CudaError> {
        let mut count = 0;
        // SAFETY: writes one int.
        drv.check("cuDeviceGetCount", unsafe {
            (drv.device_get_count)(&mut count)
        })?;
        if ordinal < 0 || ordinal >= count {
            return Err(CudaError::Unavailable {
                what: format!("CUDA device {ordinal} (the driver sees {count})"),
            });
        }
        let mut dev = 0;
        // SAFETY: the ordinal is in range; writes one device handle.
        drv.check("cuDeviceGet", unsafe {
            (drv.device_get)(&mut dev, ordinal)
        })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes, the length passed.
        drv.check("cuDeviceGetName", unsafe {
            (drv.device_get_name)(name.as_mut_ptr(), 256, dev)
        })?;
        // SAFETY: the driver NUL-terminates the name inside the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let cc = (
            device_attr(drv, dev, ATTR_CC_MAJOR)? as u32,
            device_attr(drv, dev, ATTR_CC_MINOR)? as u32,
        );
        let sms = device_attr(drv, dev, ATTR_MULTIPROCESSOR_COUNT)? as u32;
        let (mut total, mut version) = (0usize, 0);
        // SAFETY: each writes one value.
        drv.check("cuDeviceTotalMem", unsafe {
            (drv.device_total_mem)(&mut total, dev)
        })?;
        // SAFETY: writes one int.
        drv.check("cuDriverGetVersion", unsafe {
            (drv.driver_get_version)(&mut version)
        })?;
        let info = DeviceInfo {
            ordinal,
            name,
            compute_capability: cc,
            multiprocessors: sms,
            total_memory: total as u64,
            driver_version: version,
            nvrtc_version: (0, 0),
        };
        Ok((dev, info))
    }

    /// Opens device `ordinal`: driver, context, stream, and every kernel compiled by NVRTC
    /// for its architecture. A missing driver, device or NVRTC is `CudaError::Unavailable`.
    pub fn open(
        ordinal: i32,
        driver: Option<&Path>,
        nvrtc: Option<&Path>,
    ) -> Result<Arc<Self>, CudaError> {
        let drv = Driver::open(driver)?;
        let (dev, mut info) = Self::probe(&drv, ordinal)?;
        let nvrtc = Nvrtc::open(nvrtc)?;
        info.nvrtc_version = nvrtc.version();
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: retains the device's primary context (released in Drop).
        drv.check("cuDevicePrimaryCtxRetain", unsafe {
            (drv.primary_ctx_retain)(&mut ctx, dev)
        })?;
        // SAFETY: `ctx` was just retained.
        drv.check("cuCtxSetCurrent", unsafe { (drv.ctx_set_current)(ctx) })?;
        let mut stream: CuStream = std::ptr::null_mut();
        // SAFETY: creates a stream in the current context.
        drv.check("cuStreamCreate", unsafe {
            (drv.stream_create)(&mut stream, STREAM_NON_BLOCKING)
        })?;
        let mut event: CuEvent = std::ptr::null_mut();
        // SAFETY: creates an event in the current context.
        drv.check("cuEventCreate", unsafe {
            (drv.event_create)(&mut event, EVENT_DISABLE_TIMING)
        })?;
        let mut d = Self {
            drv,
            info,
            dev,
            ctx,
            stream,
            event,
            functions: HashMap::new(),
            resources: HashMap::new(),
            modules: Vec::new(),
            faulted: AtomicBool::new(false),
            lock: Mutex::new(Pinned {
                ptr: std::ptr::null_mut(),
                cap: 0,
            }),
        };
        d.load_kernels(&nvrtc)?;
        Ok(Arc::new(d))
    }

    fn load_kernels(&mut self, nvrtc: &Nvrtc) -> Result<(), CudaError> {
        let arch = self.info.compute_capability.0 * 10 + self.info.compute_capability.1;
        for (file, text) in ops::SOURCES {
            let cubin = nvrtc.compile(file, text, &[ops::COMMON], Target::Cubin(arch))?;
            let mut module: CuModule = std::ptr::null_mut();
            // SAFETY: `cubin` is a complete image NVRTC produced for this architecture; the
            // context is current (set in `open`).
            self.drv.check("cuModuleLoadData", unsafe {
                (self.drv.module_load_data)(&mut module, cubin.as_ptr().cast())
            })?;
            self.modules.push(module);
            for name in ops::kernel_names(text) {
                let cname = CString::new(name).expect("kernel names hold no NUL");
                let mut f: CuFunction = std::ptr::null_mut();
                // SAFETY: `module` is loaded; `cname` is NUL-terminated.
                self.drv.check("cuModuleGetFunction", unsafe {
                    (self.drv.module_get_function)(&mut f, module, cname.as_ptr())
                })?;
                let attr = |a| -> Result<u32, CudaError> {
                    let mut v = 0;
                    // SAFETY: `f` was just resolved; writes one int.
                    self.drv.check("cuFuncGetAttribute", unsafe {
                        (self.drv.func_get_attribute)(&mut v, a, f)
                    })?;
                    Ok(v as u32)
                };
                let res = (attr(FUNC_ATTR_NUM_REGS)?, attr(FUNC_ATTR_LOCAL_SIZE_BYTES)?);
                self.resources.insert(name, res);
                self.functions.insert(name, f);
            }
        }
        Ok(())
    }

    /// Takes the device lock and makes the context current on this thread.
    pub fn session(&self) -> Result<Session<'_>, CudaError> {
        let staging = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `ctx` is the retained primary context, alive until Drop.
        self.drv.check("cuCtxSetCurrent", unsafe {
            (self.drv.ctx_set_current)(self.ctx)
        })?;
        Ok(Session { dev: self, staging })
    }

    /// `(registers per thread, local bytes per thread)` of kernel `name`.
    pub fn resources(&self, name: &str) -> Option<(u32, u32)> {
        self.resources.get(name).copied()
    }

    pub fn faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    /// Marks the device unusable (a missed deadline or a sticky error).
    pub fn fault(&self) {
        self.faulted.store(true, Ordering::Release);
    }

    /// Free device memory (`cuMemGetInfo`), bytes.
    pub fn free_memory(&self) -> Result<u64, CudaError> {
        let _s = self.session()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two values; the context is current.
        self.drv.check("cuMemGetInfo", unsafe {
            (self.drv.mem_get_info)(&mut free, &mut total)
        })?;
        Ok(free as u64)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.faulted() {
            // Destroying the stream or context would wait behind work that missed its
            // deadline; the process keeps them (the driver reclaims them at exit).
            return;
        }
        // SAFETY: the handles were created in `open` and are destroyed once, here, with the
        // context current; every buffer holding an `Arc<Device>` is already gone.
        unsafe {
            (self.drv.ctx_set_current)(self.ctx);
            let staging = self.lock.get_mut().unwrap_or_else(|e| e.into_inner());
            if !staging.ptr.is_null() {
                (self.drv.mem_free_host)(staging.ptr.cast());
            }
            for &m in &self.modules {
                (self.drv.module_unload)(m);
            }
            (self.drv.event_destroy)(self.event);
            (self.drv.stream_destroy)(self.stream);
            (self.drv.primary_ctx_release)(self.dev);
        }
    }
}

/// A device allocation, freed on drop unless the device faulted.
#[derive(Debug)]
pub struct DevBuf {
    pub ptr: CuDevicePtr,
    pub bytes: u64,
    dev: Arc<Device>,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ptr == 0 || self.dev.faulted() {
            return;
        }
        if let Ok(_s) = self.dev.session() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once; the
            // stream is idle (every run ends with a completed wait).
            unsafe { (self.dev.drv.mem_free)(self.ptr) };
        }
    }
}

impl Session<'_> {
    /// `bytes` of device memory (at least one byte is allocated, so the address is real).
    pub fn alloc(&self, arc: &Arc<Device>, bytes: u64) -> Result<DevBuf, CudaError> {
        let mut ptr = 0;
        // SAFETY: writes one device address; the context is current.
        self.dev.drv.check("cuMemAlloc", unsafe {
            (self.dev.drv.mem_alloc)(&mut ptr, bytes.max(1) as usize)
        })?;
        Ok(DevBuf {
            ptr,
            bytes,
            dev: arc.clone(),
        })
    }

    /// Grows the pinned staging to at least `bytes`.
    pub fn reserve_staging(&mut self, bytes: usize) -> Result<(), CudaError> {
        if bytes <= self.staging.cap {
            return Ok(());
        }
        let drv = &self.dev.drv;
        if !self.staging.ptr.is_null() {
            // SAFETY: the old staging is idle (every run ends with a completed wait).
            unsafe { (drv.mem_free_host)(self.staging.ptr.cast()) };
            self.staging.ptr = std::ptr::null_mut();
            self.staging.cap = 0;
        }
        let cap = bytes.next_power_of_two();
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one host pointer to `cap` pinned bytes; flags 0 = portable default.
        drv.check("cuMemHostAlloc", unsafe {
            (drv.mem_host_alloc)(&mut p, cap, 0)
        })?;
        self.staging.ptr = p.cast();
        self.staging.cap = cap;
        Ok(())
    }

    /// Queues a copy of staging bytes `[from, from + len)` to device address `dst`.
    pub fn htod(&self, dst: CuDevicePtr, from: usize, len: usize) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        assert!(from + len <= self.staging.cap);
        // SAFETY: the source range lies in pinned staging that stays untouched until the
        // stream's next completed wait; `dst` holds `len` bytes (the caller's plan).
        self.dev.drv.check("cuMemcpyHtoDAsync", unsafe {
            (self.dev.drv.memcpy_htod_async)(
                dst,
                self.staging.addr().add(from).cast(),
                len,
                self.dev.stream,
            )
        })
    }

    /// Queues a copy of `len` bytes at device address `src` into staging at `to`.
    pub fn dtoh(&self, src: CuDevicePtr, to: usize, len: usize) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        assert!(to + len <= self.staging.cap);
        // SAFETY: as `htod`, in the other direction.
        self.dev.drv.check("cuMemcpyDtoHAsync", unsafe {
            (self.dev.drv.memcpy_dtoh_async)(
                self.staging.addr().add(to).cast(),
                src,
                len,
                self.dev.stream,
            )
        })
    }

    /// Queues a zero fill of `len` bytes at `dst`.
    pub fn zero(&self, dst: CuDevicePtr, len: usize) -> Result<(), CudaError> {
        // SAFETY: `dst` holds `len` bytes (the caller's allocation).
        self.dev.drv.check("cuMemsetD8Async", unsafe {
            (self.dev.drv.memset_d8_async)(dst, 0, len, self.dev.stream)
        })
    }

    /// Queues one kernel launch.
    pub fn launch(&self, l: &Launch) -> Result<(), CudaError> {
        let f = *self
            .dev
            .functions
            .get(l.kernel)
            .expect("every launch names a kernel of ops::SOURCES");
        let mut p = Params::new(&l.args);
        let [gx, gy, gz] = l.grid;
        let [bx, by, bz] = l.block;
        // SAFETY: `p` holds one value per kernel parameter in order (the builders in `ops`
        // mirror the signatures); device addresses in it belong to live allocations the
        // plan sized for these shapes; the driver copies the values before returning.
        self.dev.drv.check("cuLaunchKernel", unsafe {
            (self.dev.drv.launch_kernel)(
                f,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                0,
                self.dev.stream,
                p.as_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Waits for everything queued so far, polling until `deadline`. A timeout or any error
    /// other than "not ready" faults the device (the caller poisons its runtime).
    pub fn wait(&self, during: &str, deadline: Deadline) -> Result<(), CudaError> {
        let drv = &self.dev.drv;
        // SAFETY: records the runtime's event on its stream.
        let r = unsafe { (drv.event_record)(self.dev.event, self.dev.stream) };
        if let Err(e) = drv.check("cuEventRecord", r) {
            self.dev.fault();
            return Err(e);
        }
        let mut polls = 0u32;
        loop {
            // SAFETY: queries the event recorded above.
            let r = unsafe { (drv.event_query)(self.dev.event) };
            if r == CUDA_SUCCESS {
                return Ok(());
            }
            if r != CUDA_ERROR_NOT_READY {
                self.dev.fault();
                return Err(CudaError::Driver {
                    call: "cuEventQuery",
                    code: r,
                    name: drv.error_name(r),
                });
            }
            if deadline.expired() {
                self.dev.fault();
                return Err(CudaError::Timeout {
                    during: during.to_owned(),
                });
            }
            // Spin briefly (most steps finish in microseconds), then back off to 200 us
            // sleeps so a long wait costs no core.
            polls += 1;
            if polls < 2000 {
                std::hint::spin_loop();
            } else if polls < 2100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Copies `src` to device address `dst` in staged chunks, each wait bounded by
    /// `deadline` (weights: no size limit on the host side beyond one chunk).
    pub fn upload(
        &mut self,
        dst: CuDevicePtr,
        src: &[u8],
        deadline: Deadline,
    ) -> Result<(), CudaError> {
        self.reserve_staging(CHUNK.min(src.len().max(1)))?;
        let cap = self.staging.cap;
        for (i, chunk) in src.chunks(cap).enumerate() {
            self.staging
                .as_mut_slice(chunk.len())
                .copy_from_slice(chunk);
            self.htod(dst + (i * cap) as u64, 0, chunk.len())?;
            self.wait("weight upload", deadline)?;
        }
        Ok(())
    }
}

impl Session<'_> {
    /// Replays `launches` `iters` times between two timing events; total milliseconds as
    /// seconds. The wait is bounded like every other.
    pub fn time(
        &self,
        launches: &[Launch],
        iters: u32,
        deadline: Deadline,
    ) -> Result<f64, CudaError> {
        let drv = &self.dev.drv;
        let (mut a, mut b): (CuEvent, CuEvent) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: creates two timing events in the current context (destroyed below).
        unsafe {
            drv.check("cuEventCreate", (drv.event_create)(&mut a, 0))?;
            drv.check("cuEventCreate", (drv.event_create)(&mut b, 0))?;
        }
        let timed = (|| {
            // SAFETY: records on the runtime's stream.
            drv.check("cuEventRecord", unsafe {
                (drv.event_record)(a, self.dev.stream)
            })?;
            for _ in 0..iters {
                for l in launches {
                    self.launch(l)?;
                }
            }
            // SAFETY: as above.
            drv.check("cuEventRecord", unsafe {
                (drv.event_record)(b, self.dev.stream)
            })?;
            self.wait("timing", deadline)?;
            let mut ms = 0f32;
            // SAFETY: both events completed (the wait above covers b, recorded after a).
            drv.check("cuEventElapsedTime", unsafe {
                (drv.event_elapsed)(&mut ms, a, b)
            })?;
            Ok(f64::from(ms) / 1e3)
        })();
        // SAFETY: destroys the two events created above (safe even if still pending).
        unsafe {
            (drv.event_destroy)(a);
            (drv.event_destroy)(b);
        }
        timed
    }
}
