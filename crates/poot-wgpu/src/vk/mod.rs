//! Raw Vulkan through `ash`: the second device under the shared executor (`Api::Vulkan`), not
//! production. The same WGSL kernels are compiled to SPIR-V by naga (`pipeline`), steps are
//! recorded into one command buffer per submission and waited on with a fence polled against
//! the deadline (`submit`).
//!
//! What it uses that wgpu hides: the device's own `maxStorageBufferRange` as the binding limit
//! (capped at 4 GiB because kernels address bytes in `u32`), and a report of the device's
//! subgroup size and operations and of `VK_KHR_cooperative_matrix` ([`VkCaps`]). No kernel
//! takes subgroup or cooperative-matrix paths yet: the capabilities are reported, not used.
//!
//! Invariants: every buffer lives in host-visible, host-coherent memory (device-local too where
//! the device has such a type: lavapipe, integrated GPUs, resizable BAR), persistently mapped,
//! so uploads and readbacks are plain copies; a write only ever targets a buffer no submitted
//! command still reads (see `crate::gpu`). Once a wait times out or the device is lost, the
//! device is *faulted*: submitted work may still read its buffers, so from then on nothing is
//! destroyed (buffers, pools and the device are leaked, as poot-cuda does), and the runtime
//! above poisons itself.

mod pipeline;
pub(crate) mod submit;

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;
use poot_runtime::RuntimeError;

use crate::device::AdapterSummary;

pub(crate) use pipeline::{build as build_pipeline, VkPipeline};

/// What the Vulkan device offers beyond the baseline the kernels need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VkCaps {
    /// `VkPhysicalDeviceProperties::apiVersion` as `major.minor.patch`.
    pub api_version: String,
    /// `shaderFloat64`: the sampling step runs on the device where it is set.
    pub f64: bool,
    /// Lanes per subgroup (0 where the device reports none).
    pub subgroup_size: u32,
    /// Subgroup operations usable in compute shaders (`basic`, `vote`, `arithmetic`, ...).
    pub subgroup_ops: Vec<&'static str>,
    /// `VK_KHR_cooperative_matrix` is offered.
    pub cooperative_matrix: bool,
    /// `maxStorageBufferRange`, as the device reports it.
    pub max_storage_buffer_range: u64,
    /// Buffers are device-local as well as host-visible (else host memory the device reads).
    pub device_local: bool,
}

/// The instance, the logical device and its queue; dropped after every buffer and pipeline.
pub(crate) struct Shared {
    _entry: ash::Entry,
    instance: ash::Instance,
    pub device: ash::Device,
    pub queue: Mutex<vk::Queue>,
    pub queue_family: u32,
    memory_type: u32,
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
    limits: vk::PhysicalDeviceLimits,
}

impl std::fmt::Debug for VkGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VkGpu")
            .field("info", &self.info)
            .field("caps", &self.caps)
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

fn version(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

fn device_type(t: vk::PhysicalDeviceType) -> (&'static str, u8) {
    // The rank prefers a discrete GPU, as wgpu's high-performance preference does.
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => ("DiscreteGpu", 0),
        vk::PhysicalDeviceType::INTEGRATED_GPU => ("IntegratedGpu", 1),
        vk::PhysicalDeviceType::VIRTUAL_GPU => ("VirtualGpu", 2),
        vk::PhysicalDeviceType::CPU => ("Cpu", 3),
        _ => ("Other", 4),
    }
}

fn subgroup_ops(f: vk::SubgroupFeatureFlags) -> Vec<&'static str> {
    [
        (vk::SubgroupFeatureFlags::BASIC, "basic"),
        (vk::SubgroupFeatureFlags::VOTE, "vote"),
        (vk::SubgroupFeatureFlags::ARITHMETIC, "arithmetic"),
        (vk::SubgroupFeatureFlags::BALLOT, "ballot"),
        (vk::SubgroupFeatureFlags::SHUFFLE, "shuffle"),
        (
            vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE,
            "shuffle_relative",
        ),
        (vk::SubgroupFeatureFlags::CLUSTERED, "clustered"),
        (vk::SubgroupFeatureFlags::QUAD, "quad"),
    ]
    .into_iter()
    .filter(|(bit, _)| f.contains(*bit))
    .map(|(_, name)| name)
    .collect()
}

/// A physical device with a compute queue, as discovery and `open` see it.
struct Candidate {
    phys: vk::PhysicalDevice,
    family: u32,
    rank: u8,
    info: AdapterSummary,
    caps: VkCaps,
    limits: vk::PhysicalDeviceLimits,
}

/// Every physical device with a compute queue, best first.
///
/// # Safety
/// `instance` must be a live instance of API version 1.1 or later.
unsafe fn candidates(instance: &ash::Instance) -> Result<Vec<Candidate>, RuntimeError> {
    // SAFETY: every query below is on the live instance (the caller's contract) and its
    // physical devices, with structures built by ash.
    let physicals = unsafe { instance.enumerate_physical_devices() }
        .map_err(|e| unavailable(format!("a Vulkan device ({e})")))?;
    let mut out = Vec::new();
    for phys in physicals {
        // SAFETY: a query on the live instance (see above).
        let families = unsafe { instance.get_physical_device_queue_family_properties(phys) };
        let Some(family) = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        else {
            continue;
        };
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        // SAFETY: a query on the live instance (see above).
        let base = unsafe { instance.get_physical_device_properties(phys) };
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
        if base.api_version >= vk::API_VERSION_1_2 {
            props = props.push_next(&mut driver);
        }
        // SAFETY: a query on the live instance (see above).
        unsafe { instance.get_physical_device_properties2(phys, &mut props) };
        let p = props.properties;
        // SAFETY: a query on the live instance (see above).
        let features = unsafe { instance.get_physical_device_features(phys) };
        // SAFETY: a query on the live instance (see above).
        let exts =
            unsafe { instance.enumerate_device_extension_properties(phys) }.unwrap_or_default();
        let coop = exts.iter().any(|e| {
            e.extension_name_as_c_str()
                .is_ok_and(|n| n == ash::khr::cooperative_matrix::NAME)
        });
        let cstr = |b: &[std::ffi::c_char]| {
            // SAFETY: Vulkan's fixed-size name arrays are NUL-terminated.
            unsafe { CStr::from_ptr(b.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        };
        let (kind, rank) = device_type(p.device_type);
        let driver_name = if base.api_version >= vk::API_VERSION_1_2 {
            format!(
                "{} {}",
                cstr(&driver.driver_name),
                cstr(&driver.driver_info)
            )
        } else {
            format!("driver {}", p.driver_version)
        };
        // SAFETY: a query on the live instance (see above).
        let memory = unsafe { instance.get_physical_device_memory_properties(phys) };
        let device_local = memory_type(&memory, true).is_some();
        let compute = subgroup
            .supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE);
        out.push(Candidate {
            phys,
            family: family as u32,
            rank,
            info: AdapterSummary {
                name: cstr(&p.device_name),
                backend: "Vulkan (ash)".into(),
                device_type: kind.into(),
                driver: driver_name,
            },
            caps: VkCaps {
                api_version: version(p.api_version),
                f64: features.shader_float64 == vk::TRUE,
                subgroup_size: if compute { subgroup.subgroup_size } else { 0 },
                subgroup_ops: if compute {
                    subgroup_ops(subgroup.supported_operations)
                } else {
                    Vec::new()
                },
                cooperative_matrix: coop,
                max_storage_buffer_range: u64::from(p.limits.max_storage_buffer_range),
                device_local,
            },
            limits: p.limits,
        });
    }
    out.sort_by_key(|c| c.rank);
    Ok(out)
}

/// A host-visible, host-coherent memory type (and device-local when `local`).
fn memory_type(m: &vk::PhysicalDeviceMemoryProperties, local: bool) -> Option<u32> {
    let mut want = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    if local {
        want |= vk::MemoryPropertyFlags::DEVICE_LOCAL;
    }
    (0..m.memory_type_count).find(|&i| m.memory_types[i as usize].property_flags.contains(want))
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
    let found = unsafe { candidates(&instance) }.unwrap_or_default();
    // SAFETY: nothing was created from the instance.
    unsafe { instance.destroy_instance(None) };
    found.into_iter().map(|c| (c.info, c.caps)).collect()
}

impl VkGpu {
    /// Opens the best device with a compute queue (a discrete GPU first).
    pub fn open() -> Result<Self, RuntimeError> {
        let (entry, instance) = load()?;
        // SAFETY: `instance` is live and of version 1.1.
        let found = unsafe { candidates(&instance) };
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
        let Some(memory_type) = memory_type(&memory, true).or_else(|| memory_type(&memory, false))
        else {
            // SAFETY: nothing was created from the instance.
            unsafe { instance.destroy_instance(None) };
            return Err(unavailable("host-visible device memory".into()));
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
                memory_type,
                lost: Mutex::new(None),
                faulted: AtomicBool::new(false),
            }),
            info: c.info,
            caps: c.caps,
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
        let size = bytes.max(4).div_ceil(4) * 4;
        let d = &self.shared.device;
        let info = vk::BufferCreateInfo::default().size(size).usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::UNIFORM_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST,
        );
        let oom = |e: vk::Result| match e {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                RuntimeError::OutOfMemory {
                    what: "a Vulkan buffer",
                    requested: size,
                    limit: 0,
                }
            }
            e => vk_err("vkCreateBuffer", e),
        };
        // SAFETY: a plain exclusive buffer on a live device; every failure path below
        // destroys what was created before it.
        unsafe {
            let raw = d.create_buffer(&info, None).map_err(oom)?;
            let req = d.get_buffer_memory_requirements(raw);
            if req.memory_type_bits & (1 << self.shared.memory_type) == 0 {
                d.destroy_buffer(raw, None);
                return Err(RuntimeError::Kernel {
                    op: "vkAllocateMemory",
                    detail: "no host-visible memory type for storage buffers".into(),
                });
            }
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(req.size)
                .memory_type_index(self.shared.memory_type);
            let memory = match d.allocate_memory(&alloc, None) {
                Ok(m) => m,
                Err(e) => {
                    d.destroy_buffer(raw, None);
                    return Err(oom(e));
                }
            };
            let mapped = d
                .bind_buffer_memory(raw, memory, 0)
                .and_then(|()| d.map_memory(memory, 0, vk::WHOLE_SIZE, Default::default()));
            let ptr = match mapped.map(|p| NonNull::new(p.cast::<u8>())) {
                Ok(Some(p)) => p,
                Ok(None) | Err(_) => {
                    d.destroy_buffer(raw, None);
                    d.free_memory(memory, None);
                    return Err(RuntimeError::Kernel {
                        op: "vkMapMemory",
                        detail: "mapping a buffer failed".into(),
                    });
                }
            };
            Ok(VkBuffer {
                shared: self.shared.clone(),
                raw,
                memory,
                ptr,
                size,
            })
        }
    }
}

/// A persistently mapped buffer (see the module docs).
pub(crate) struct VkBuffer {
    shared: Arc<Shared>,
    pub raw: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: NonNull<u8>,
    pub size: u64,
}

// SAFETY: `ptr` is a mapping of `memory`, valid until drop; host accesses go through `write`
// and `read`, which the executor only calls on buffers no submitted command is using (writes)
// or after the step's fence signalled (reads), so threads never race on the bytes.
unsafe impl Send for VkBuffer {}
// SAFETY: as above.
unsafe impl Sync for VkBuffer {}

impl std::fmt::Debug for VkBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VkBuffer")
            .field("size", &self.size)
            .finish()
    }
}

impl VkBuffer {
    fn range(&self, offset: u64, len: usize) -> Result<usize, RuntimeError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(offset as usize),
            _ => Err(RuntimeError::Kernel {
                op: "vulkan buffer",
                detail: format!("{len} bytes at {offset} of a {}-byte buffer", self.size),
            }),
        }
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), RuntimeError> {
        let at = self.range(offset, data.len())?;
        // SAFETY: in bounds of the mapping (checked above); see the `Send` impl for races.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), data.len());
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), RuntimeError> {
        let at = self.range(offset, out.len())?;
        // SAFETY: in bounds of the mapping (checked above); see the `Send` impl for races.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }
}

impl Drop for VkBuffer {
    fn drop(&mut self) {
        if self.shared.faulted() {
            return; // submitted work may still read it (see the module docs)
        }
        // SAFETY: no submitted command uses the buffer (every submission that bound it was
        // waited for, else the device would be faulted); freeing the memory unmaps it.
        unsafe {
            self.shared.device.destroy_buffer(self.raw, None);
            self.shared.device.free_memory(self.memory, None);
        }
    }
}
