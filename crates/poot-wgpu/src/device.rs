//! The device: adapter discovery, the wgpu device with the adapter's own limits, and bounded
//! waits.
//!
//! Invariants: every wait on the device goes through [`Gpu::wait`], which passes the time left
//! before the caller's `Deadline` to `Device::poll` (never an unbounded wait); a poll that
//! times out, a lost device and an uncaptured wgpu error are all recorded here, and the runtime
//! turns the first two into poisoning. Cost of a wait: one `vkWaitForFences`-style call.

use std::sync::{Arc, Mutex};

use poot_core::Deadline;
use poot_runtime::RuntimeError;

/// What a wait on the device ended with, when it did not simply finish.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// The deadline passed first.
    Timeout,
    /// The device was lost (driver reset, watchdog, removal); the reason is wgpu's.
    Lost(String),
    /// Any other poll failure.
    Other(String),
}

/// One visible adapter, as discovery reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
}

fn summary(info: &wgpu::AdapterInfo) -> AdapterSummary {
    AdapterSummary {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info),
    }
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    wgpu::Instance::new(desc)
}

/// Every adapter wgpu can see on this machine (Vulkan; lavapipe counts).
pub fn adapters() -> Vec<AdapterSummary> {
    pollster::block_on(instance().enumerate_adapters(wgpu::Backends::VULKAN))
        .iter()
        .map(|a| summary(&a.get_info()))
        .collect()
}

/// The device and what the runtime needs to know about it.
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: AdapterSummary,
    pub limits: wgpu::Limits,
    /// The adapter offers `shader-f16` and the device was created with it.
    pub f16: bool,
    /// The adapter offers `shader-f64` and the device was created with it: the sampling
    /// step's kernels need it (see `crate::sample`).
    pub f64: bool,
    /// The adapter offers `timestamp-query` and the device was created with it: the timer
    /// (`crate::timer`) writes a timestamp around each compute pass.
    pub timestamps: bool,
    /// Nanoseconds per timestamp tick (the queue's period).
    pub tick_ns: f64,
    /// Set by the device-lost callback.
    pub lost: Arc<Mutex<Option<String>>>,
    /// The first uncaptured wgpu error (a validation error is a bug in this crate).
    pub error: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("info", &self.info)
            .field("f16", &self.f16)
            .field("f64", &self.f64)
            .field("timestamps", &self.timestamps)
            .finish()
    }
}

fn no_adapter(detail: String) -> RuntimeError {
    RuntimeError::Kernel {
        op: "wgpu adapter",
        detail,
    }
}

impl Gpu {
    /// Opens the first adapter (high performance preferred) with its own limits, so large
    /// storage bindings are available where the hardware has them.
    pub fn open() -> Result<Self, RuntimeError> {
        let instance = instance();
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| no_adapter(format!("no Vulkan adapter: {e}")))?;
        let limits = adapter.limits();
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let f64 = adapter.features().contains(wgpu::Features::SHADER_F64);
        let mut required_features = wgpu::Features::empty();
        if f16 {
            required_features |= wgpu::Features::SHADER_F16;
        }
        if f64 {
            required_features |= wgpu::Features::SHADER_F64;
        }
        let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        if timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("poot"),
            required_features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| no_adapter(format!("device request failed: {e}")))?;
        let lost = Arc::new(Mutex::new(None));
        let slot = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
            s.get_or_insert(format!("{reason:?}: {msg}"));
        });
        let error = Arc::new(Mutex::new(None));
        let slot = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
            s.get_or_insert(e.to_string());
        }));
        let tick_ns = f64::from(queue.get_timestamp_period());
        Ok(Self {
            device,
            queue,
            info: summary(&adapter.get_info()),
            limits,
            f16,
            f64,
            timestamps,
            tick_ns,
            lost,
            error,
        })
    }

    pub fn lost_reason(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes the first uncaptured error, if any.
    pub fn take_error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Waits for `index` (or the latest submission) until `deadline`, never longer.
    pub fn wait(
        &self,
        index: Option<wgpu::SubmissionIndex>,
        deadline: Deadline,
    ) -> Result<(), WaitError> {
        if let Some(reason) = self.lost_reason() {
            return Err(WaitError::Lost(reason));
        }
        // A deadline of `never` is for tests and tools; the runtime's own default applies
        // before a `Deadline` reaches here, so `None` stays rare and explicit.
        let timeout = deadline.remaining();
        let r = self.device.poll(wgpu::PollType::Wait {
            submission_index: index,
            timeout,
        });
        if let Some(reason) = self.lost_reason() {
            return Err(WaitError::Lost(reason));
        }
        match r {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => Err(WaitError::Timeout),
            Err(e) => Err(WaitError::Other(e.to_string())),
        }
    }
}
