//! The device under the executor: wgpu ([`crate::device::Gpu`]) or raw Vulkan through ash
//! ([`crate::vk::VkGpu`]). The executor, the planner of a step and the weight cache are written
//! once against these handles; only submission and pipeline building differ per device.
//!
//! Invariants: a runtime owns exactly one device, and every buffer and pipeline it records was
//! made by that device (a handle of the other kind is a `Kernel` error, never a panic); a
//! `write` lands before the next submission's commands and targets a buffer no submitted
//! command still reads (fresh uploads, late inputs, weights, the KV pool), so it never races
//! the device.

use poot_runtime::RuntimeError;

use crate::device::{AdapterSummary, Gpu};
use crate::vk::{VkBuffer, VkGpu, VkPipeline};

/// Which API drives the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// wgpu (its Vulkan backend): the production GPU path.
    Wgpu,
    /// Raw Vulkan through `ash`, the same WGSL compiled to SPIR-V by naga: not production.
    Vulkan,
}

impl Api {
    /// The runtime's name as `Runtime::name` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Api::Wgpu => "wgpu",
            Api::Vulkan => "vulkan",
        }
    }
}

/// The runtime's device.
#[derive(Debug)]
pub(crate) enum Device {
    Wgpu(Box<Gpu>),
    Vulkan(Box<VkGpu>),
}

/// A storage buffer of either device.
#[derive(Debug)]
pub(crate) enum Buffer {
    Wgpu(wgpu::Buffer),
    Vulkan(VkBuffer),
}

/// A compute pipeline of either device.
#[derive(Debug)]
pub(crate) enum Pipeline {
    Wgpu(wgpu::ComputePipeline),
    Vulkan(VkPipeline),
}

impl Buffer {
    pub fn size(&self) -> u64 {
        match self {
            Buffer::Wgpu(b) => b.size(),
            Buffer::Vulkan(b) => b.size,
        }
    }
}

/// A handle made by the other device (impossible by construction; typed, not a panic).
pub(crate) fn foreign(what: &str) -> RuntimeError {
    RuntimeError::Kernel {
        op: "device",
        detail: format!("a {what} of another device reached this runtime"),
    }
}

impl Device {
    pub fn api(&self) -> Api {
        match self {
            Device::Wgpu(_) => Api::Wgpu,
            Device::Vulkan(_) => Api::Vulkan,
        }
    }

    pub fn info(&self) -> &AdapterSummary {
        match self {
            Device::Wgpu(g) => &g.info,
            Device::Vulkan(v) => &v.info,
        }
    }

    /// Bytes one storage binding (and one buffer) may hold.
    pub fn max_binding(&self) -> u64 {
        match self {
            Device::Wgpu(g) => g
                .limits
                .max_storage_buffer_binding_size
                .min(g.limits.max_buffer_size),
            Device::Vulkan(v) => v.max_binding(),
        }
    }

    /// Alignment of a uniform binding's offset.
    pub fn uniform_align(&self) -> u64 {
        match self {
            Device::Wgpu(g) => u64::from(g.limits.min_uniform_buffer_offset_alignment),
            Device::Vulkan(v) => v.uniform_align(),
        }
    }

    pub fn f16(&self) -> bool {
        match self {
            Device::Wgpu(g) => g.f16,
            Device::Vulkan(_) => false,
        }
    }

    pub fn f64(&self) -> bool {
        match self {
            Device::Wgpu(g) => g.f64,
            Device::Vulkan(v) => v.caps.f64,
        }
    }

    /// A storage buffer of at least `bytes` (readable and writable by kernels, copyable).
    pub fn storage(&self, bytes: u64, label: Option<&str>) -> Result<Buffer, RuntimeError> {
        Ok(match self {
            Device::Wgpu(g) => Buffer::Wgpu(g.device.create_buffer(&wgpu::BufferDescriptor {
                label,
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })),
            Device::Vulkan(v) => Buffer::Vulkan(v.buffer(bytes)?),
        })
    }

    /// A buffer for weights or the KV pool: as [`Device::storage`], but device-local behind
    /// staged copies on raw Vulkan under staging (`crate::vk::VkSettings::staging`).
    pub fn resident(&self, bytes: u64, label: Option<&str>) -> Result<Buffer, RuntimeError> {
        match self {
            Device::Wgpu(_) => self.storage(bytes, label),
            Device::Vulkan(v) => Ok(Buffer::Vulkan(v.resident(bytes)?)),
        }
    }

    /// Whether matmuls take the subgroup kernel (`matmul_subgroup.wgsl`; raw Vulkan only).
    pub fn subgroup_matvec(&self) -> bool {
        match self {
            Device::Wgpu(_) => false,
            Device::Vulkan(v) => v.settings.subgroup_matvec,
        }
    }

    /// Writes `data` at `offset` of `buf`; it lands before the next submission.
    pub fn write(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<(), RuntimeError> {
        match (self, buf) {
            (Device::Wgpu(g), Buffer::Wgpu(b)) => {
                g.queue.write_buffer(b, offset, data);
                Ok(())
            }
            (Device::Vulkan(_), Buffer::Vulkan(b)) => b.write(offset, data),
            _ => Err(foreign("buffer")),
        }
    }

    pub fn lost_reason(&self) -> Option<String> {
        match self {
            Device::Wgpu(g) => g.lost_reason(),
            Device::Vulkan(v) => v.lost_reason(),
        }
    }

    /// Fault injection: the device is lost (see `WgpuRuntime::inject_device_loss`).
    pub fn lose(&self) {
        match self {
            Device::Wgpu(g) => g.device.destroy(),
            Device::Vulkan(v) => v.lose("destroyed by inject_device_loss"),
        }
    }
}
