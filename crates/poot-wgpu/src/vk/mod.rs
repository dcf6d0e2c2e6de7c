//! Raw Vulkan through `ash`: the second device under the shared executor (`Api::Vulkan`), not
//! production. The same WGSL kernels are compiled to SPIR-V by naga (`pipeline`), steps are
//! recorded into one command buffer per submission and waited on with a fence polled against
//! the deadline (`submit`).
//!
//! What it uses that wgpu hides:
//! - the device's own `maxStorageBufferRange` as the binding limit (capped at 4 GiB because
//!   kernels address bytes in `u32`);
//! - subgroup shuffles for the matmul's row-dot reduction (`matmul_subgroup.wgsl`) where the
//!   device offers them and its compute subgroups hold 8 to 64 lanes ([`VkCaps::subgroup_matvec`]);
//! - device-local memory for weights and the KV pool behind staged copies (`memory`) where the
//!   device's largest device-local heap is not host-visible (a discrete GPU without resizable
//!   BAR), or where [`VkOptions::staging`] forces it.
//!
//! `VK_KHR_cooperative_matrix` is reported ([`VkCaps`]) but no kernel uses it.
//!
//! Invariants: every step buffer lives in host-visible, host-coherent memory (device-local too
//! where the device has such a type), persistently mapped, so step uploads and readbacks are
//! plain copies; under staging, weights and the KV pool are device-local buffers the host
//! reaches only through staged copies, each finished before the call returns; a write only
//! ever targets a buffer no submitted command still reads (see `crate::gpu`). Once a wait
//! times out or the device is lost, the device is *faulted*: submitted work may still read its
//! buffers, so from then on nothing is destroyed (buffers, pools and the device are leaked, as
//! poot-cuda does), and the runtime above poisons itself.

mod caps;
mod memory;
mod pipeline;
pub(crate) mod submit;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ash::vk;
use poot_runtime::RuntimeError;

use crate::device::AdapterSummary;

pub use caps::VkCaps;
pub(crate) use memory::VkBuffer;
pub(crate) use pipeline::{build as build_pipeline, VkPipeline};

/// Choices for the raw Vulkan device. `None` takes the environment (`POOT_VK_SUBGROUPS`,
/// `POOT_VK_STAGING`: `0` or `1`; anything else is a `DeviceUnavailable` error naming it), and
/// where that is unset, the device's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VkOptions {
    /// The subgroup matmul where the device can run it (default on); off, `matmul.wgsl` as on
    /// wgpu, bit for bit.
    pub subgroups: Option<bool>,
    /// Weights and the KV pool in device-local memory behind staged copies even where the
    /// host could map it (default: only where the largest device-local heap is not mappable).
    pub staging: Option<bool>,
}

/// What the runtime settled on when it opened the device (reported by `validate-hardware`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VkSettings {
    /// Matmuls reduce each row's lanes with subgroup shuffles (`matmul_subgroup.wgsl`).
    pub subgroup_matvec: bool,
    /// Weights and the KV pool are device-local, reached by staged copies.
    pub staging: bool,
}

/// `name` from the environment as a flag: `None` when unset.
fn env_flag(name: &str) -> Result<Option<bool>, RuntimeError> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) if v == "1" => Ok(Some(true)),
        Ok(v) if v == "0" => Ok(Some(false)),
        Ok(v) => Err(unavailable(format!("{name} as 0 or 1 (it is {v:?})"))),
        Err(e) => Err(unavailable(format!("{name} as 0 or 1 ({e})"))),
    }
}

impl VkOptions {
    /// The settings on a device with `caps`.
    fn settle(self, caps: &VkCaps) -> Result<VkSettings, RuntimeError> {
        let subgroups = match self.subgroups {
            Some(b) => b,
            None => env_flag("POOT_VK_SUBGROUPS")?.unwrap_or(true),
        };
        let staging = match self.staging {
            Some(b) => b,
            None => env_flag("POOT_VK_STAGING")?.unwrap_or(false),
        };
        Ok(VkSettings {
            subgroup_matvec: subgroups && caps.subgroup_matvec(),
            staging: staging || !caps.local_heap_mappable,
        })
    }
}

/// The instance, the logical device and its queue; dropped after every buffer and pipeline.
pub(crate) struct Shared {
    _entry: ash::Entry,
    instance: ash::Instance,
    pub device: ash::Device,
    pub queue: Mutex<vk::Queue>,
    pub queue_family: u32,
    /// Host-visible, host-coherent: step buffers and staging buffers.
    host_type: u32,
    /// Device-local on the largest such heap: weights and the KV pool under staging.
    local_type: Option<u32>,
    /// Bound on a staged copy's wait (the runtime's `WgpuOptions::timeout`).
    timeout: Duration,
    lost: Mutex<Option<String>>,
    /// See the module docs: once set, nothing is destroyed.
    faulted: AtomicBool,
}

impl Shared {
    pub fn faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    pub fn fault(&self) {
        self.faulted.store(true, Ordering::Release);
    }

    pub fn lost_reason(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn lose(&self, reason: &str) {
        self.fault();
        let mut l = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        l.get_or_insert_with(|| reason.to_owned());
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.faulted() {
            return;
        }
        // SAFETY: every buffer, pipeline and pool holds an `Arc<Shared>`, so they are gone;
        // every submission was waited for (else the device would be faulted).
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// The raw Vulkan device.
pub(crate) struct VkGpu {
    pub shared: Arc<Shared>,
    pub info: AdapterSummary,
    pub caps: VkCaps,
    pub settings: VkSettings,
    limits: vk::PhysicalDeviceLimits,
}

impl std::fmt::Debug for VkGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VkGpu")
            .field("info", &self.info)
            .field("caps", &self.caps)
            .field("settings", &self.settings)
            .finish()
    }
}

fn unavailable(missing: String) -> RuntimeError {
    RuntimeError::DeviceUnavailable {
        backend: "vulkan",
        missing,
    }
}

pub(crate) fn vk_err(op: &'static str, e: vk::Result) -> RuntimeError {
    RuntimeError::Kernel {
        op,
        detail: format!("Vulkan: {e}"),
    }
}

fn load() -> Result<(ash::Entry, ash::Instance), RuntimeError> {
    // SAFETY: loading the system's Vulkan loader library; ash checks its entry points.
    let entry = unsafe { ash::Entry::load() }
        .map_err(|e| unavailable(format!("the Vulkan loader ({e})")))?;
    let app = vk::ApplicationInfo::default()
        .application_name(c"poot")
        .api_version(vk::API_VERSION_1_1);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a plain instance with no layers or extensions.
    let instance = unsafe { entry.create_instance(&info, None) }
        .map_err(|e| unavailable(format!("a Vulkan 1.1 instance ({e})")))?;
    Ok((entry, instance))
}

/// The devices raw Vulkan sees here, best first (empty where there is no loader).
pub fn devices() -> Vec<(AdapterSummary, VkCaps)> {
    let Ok((_entry, instance)) = load() else {
        return Vec::new();
    };
    // SAFETY: `instance` is live and of version 1.1; destroyed once, after the queries.
    let found = unsafe { caps::candidates(&instance) }.unwrap_or_default();
    // SAFETY: nothing was created from the instance.
    unsafe { instance.destroy_instance(None) };
    found.into_iter().map(|c| (c.info, c.caps)).collect()
}

impl VkGpu {
    /// Opens the best device with a compute queue (a discrete GPU first); staged copies wait
    /// at most `timeout`.
    pub fn open(options: VkOptions, timeout: Duration) -> Result<Self, RuntimeError> {
        let (entry, instance) = load()?;
        // SAFETY: `instance` is live and of version 1.1.
        let found = unsafe { caps::candidates(&instance) };
        let c = match found.map(|mut v| (!v.is_empty()).then(|| v.remove(0))) {
            Ok(Some(c)) => c,
            Ok(None) | Err(_) => {
                // SAFETY: nothing was created from the instance.
                unsafe { instance.destroy_instance(None) };
                return Err(unavailable("a Vulkan device with a compute queue".into()));
            }
        };
        // SAFETY: a query on a physical device of the live instance.
        let memory = unsafe { instance.get_physical_device_memory_properties(c.phys) };
        let host_type = caps::host_type(&memory, true).or_else(|| caps::host_type(&memory, false));
        let settled = host_type
            .ok_or_else(|| unavailable("host-visible device memory".into()))
            .and_then(|t| Ok((t, options.settle(&c.caps)?)));
        let (host_type, settings) = match settled {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: nothing was created from the instance.
                unsafe { instance.destroy_instance(None) };
                return Err(e);
            }
        };
        let local_type = caps::local_type(&memory).map(|(t, _)| t);
        // Staging without a device-local type would only add copies: host memory it is.
        let settings = VkSettings {
            staging: settings.staging && local_type.is_some(),
            ..settings
        };
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(c.family)
            .queue_priorities(&priorities)];
        let features = vk::PhysicalDeviceFeatures::default().shader_float64(c.caps.f64);
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_features(&features);
        // SAFETY: the queue family exists on this physical device and the features were
        // reported by it.
        let device = match unsafe { instance.create_device(c.phys, &info, None) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: nothing else was created from the instance.
                unsafe { instance.destroy_instance(None) };
                return Err(unavailable(format!("a Vulkan device ({e})")));
            }
        };
        // SAFETY: queue 0 of a family the device was created with.
        let queue = unsafe { device.get_device_queue(c.family, 0) };
        Ok(Self {
            shared: Arc::new(Shared {
                _entry: entry,
                instance,
                device,
                queue: Mutex::new(queue),
                queue_family: c.family,
                host_type,
                local_type,
                timeout,
                lost: Mutex::new(None),
                faulted: AtomicBool::new(false),
            }),
            info: c.info,
            caps: c.caps,
            settings,
            limits: c.limits,
        })
    }

    /// Bytes one storage binding may hold: the device's range, below 4 GiB (kernels address
    /// bytes in `u32`), in whole words.
    pub fn max_binding(&self) -> u64 {
        u64::from(self.limits.max_storage_buffer_range).min((1 << 32) - 4) & !3
    }

    pub fn uniform_align(&self) -> u64 {
        self.limits.min_uniform_buffer_offset_alignment.max(16)
    }

    pub fn lost_reason(&self) -> Option<String> {
        self.shared.lost_reason()
    }

    pub fn lose(&self, reason: &str) {
        self.shared.lose(reason);
    }

    /// A mapped storage (and uniform) buffer of at least `bytes`.
    pub fn buffer(&self, bytes: u64) -> Result<VkBuffer, RuntimeError> {
        memory::allocate(&self.shared, bytes, self.shared.host_type, true)
    }

    /// A buffer for weights or the KV pool: device-local and unmapped under staging, else as
    /// [`VkGpu::buffer`].
    pub fn resident(&self, bytes: u64) -> Result<VkBuffer, RuntimeError> {
        match self.shared.local_type {
            Some(t) if self.settings.staging => memory::allocate(&self.shared, bytes, t, false),
            _ => self.buffer(bytes),
        }
    }
}
