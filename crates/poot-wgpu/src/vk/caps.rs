//! What a Vulkan physical device offers (`VkCaps`), as discovery and `VkGpu::open` see it: the
//! queue family, subgroups, cooperative matrix, the storage range and the memory types.
//!
//! Invariants: every query is on a live instance of API version 1.1 or later; a structure of a
//! newer version or an extension is chained into a query only where the device reports that
//! version or extension.

use std::ffi::CStr;

use ash::vk;
use poot_runtime::RuntimeError;

use super::unavailable;
use crate::device::AdapterSummary;

/// What the Vulkan device offers beyond the baseline the kernels need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VkCaps {
    /// `VkPhysicalDeviceProperties::apiVersion` as `major.minor.patch`.
    pub api_version: String,
    /// `shaderFloat64`: the sampling step runs on the device where it is set.
    pub f64: bool,
    /// Lanes per subgroup (0 where the device reports none).
    pub subgroup_size: u32,
    /// The fewest and most lanes a compute subgroup may have (`VK_EXT_subgroup_size_control`;
    /// both `subgroup_size` where the device lacks it).
    pub subgroup_size_range: (u32, u32),
    /// Subgroup operations usable in compute shaders (`basic`, `vote`, `arithmetic`, ...).
    pub subgroup_ops: Vec<&'static str>,
    /// `VK_KHR_cooperative_matrix` is offered.
    pub cooperative_matrix: bool,
    /// `maxStorageBufferRange`, as the device reports it.
    pub max_storage_buffer_range: u64,
    /// Buffers are device-local as well as host-visible (else host memory the device reads).
    pub device_local: bool,
    /// The largest device-local heap has a host-visible memory type (lavapipe, integrated
    /// GPUs, resizable BAR); where it has none (a discrete GPU's VRAM), weights and the KV
    /// pool need staged copies to live there.
    pub local_heap_mappable: bool,
}

impl VkCaps {
    /// Whether `matmul_subgroup.wgsl` runs correctly here: subgroup shuffles in compute, and
    /// every subgroup a compute dispatch may get holds 8 to 64 lanes (a whole number of the
    /// kernel's 8-lane rows, and a divisor of its 64-lane workgroup: sizes are powers of two).
    pub fn subgroup_matvec(&self) -> bool {
        let (lo, hi) = self.subgroup_size_range;
        self.subgroup_ops.contains(&"basic")
            && self.subgroup_ops.contains(&"shuffle")
            && lo >= 8
            && hi <= 64
            && lo.is_power_of_two()
            && hi.is_power_of_two()
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
pub(super) struct Candidate {
    pub phys: vk::PhysicalDevice,
    pub family: u32,
    rank: u8,
    pub info: AdapterSummary,
    pub caps: VkCaps,
    pub limits: vk::PhysicalDeviceLimits,
}

/// Every physical device with a compute queue, best first.
///
/// # Safety
/// `instance` must be a live instance of API version 1.1 or later.
pub(super) unsafe fn candidates(instance: &ash::Instance) -> Result<Vec<Candidate>, RuntimeError> {
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
        // SAFETY: a query on the live instance (see above).
        let exts =
            unsafe { instance.enumerate_device_extension_properties(phys) }.unwrap_or_default();
        let has = |name: &CStr| {
            exts.iter()
                .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
        };
        let coop = has(ash::khr::cooperative_matrix::NAME);
        let size_control = has(ash::ext::subgroup_size_control::NAME);
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut sizes = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        // SAFETY: a query on the live instance (see above).
        let base = unsafe { instance.get_physical_device_properties(phys) };
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
        if base.api_version >= vk::API_VERSION_1_2 {
            props = props.push_next(&mut driver);
        }
        if size_control {
            props = props.push_next(&mut sizes);
        }
        // SAFETY: a query on the live instance (see above).
        unsafe { instance.get_physical_device_properties2(phys, &mut props) };
        let p = props.properties;
        // SAFETY: a query on the live instance (see above).
        let features = unsafe { instance.get_physical_device_features(phys) };
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
        let compute = subgroup
            .supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE);
        let size = if compute { subgroup.subgroup_size } else { 0 };
        let size_range = if size_control && compute {
            (sizes.min_subgroup_size, sizes.max_subgroup_size)
        } else {
            (size, size)
        };
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
                subgroup_size: size,
                subgroup_size_range: size_range,
                subgroup_ops: if compute {
                    subgroup_ops(subgroup.supported_operations)
                } else {
                    Vec::new()
                },
                cooperative_matrix: coop,
                max_storage_buffer_range: u64::from(p.limits.max_storage_buffer_range),
                device_local: host_type(&memory, true).is_some(),
                local_heap_mappable: local_type(&memory).is_some_and(|(_, mappable)| mappable),
            },
            limits: p.limits,
        });
    }
    out.sort_by_key(|c| c.rank);
    Ok(out)
}

/// A host-visible, host-coherent memory type (and device-local when `local`).
pub(super) fn host_type(m: &vk::PhysicalDeviceMemoryProperties, local: bool) -> Option<u32> {
    let mut want = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    if local {
        want |= vk::MemoryPropertyFlags::DEVICE_LOCAL;
    }
    (0..m.memory_type_count).find(|&i| m.memory_types[i as usize].property_flags.contains(want))
}

/// A device-local memory type of the largest device-local heap, and whether that heap has a
/// host-visible, host-coherent type too; `None` where no heap is device-local.
pub(super) fn local_type(m: &vk::PhysicalDeviceMemoryProperties) -> Option<(u32, bool)> {
    let heaps = &m.memory_heaps[..m.memory_heap_count as usize];
    let types = &m.memory_types[..m.memory_type_count as usize];
    let heap = (0..heaps.len())
        .filter(|&h| heaps[h].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|&h| heaps[h].size)?;
    let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
    let mapped = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let on_heap = |i: &usize| types[*i].heap_index as usize == heap;
    // A type the host cannot map first: on a discrete GPU, the VRAM proper.
    let first = (0..types.len())
        .filter(on_heap)
        .filter(|&i| types[i].property_flags.contains(local))
        .min_by_key(|&i| {
            types[i]
                .property_flags
                .contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
        })?;
    let mappable = (0..types.len())
        .filter(on_heap)
        .any(|i| types[i].property_flags.contains(local | mapped));
    Some((first as u32, mappable))
}
