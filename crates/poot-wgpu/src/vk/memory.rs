//! Device buffers of the raw Vulkan device: persistently mapped host-visible ones (every step
//! buffer, and everything where the device's memory is host-visible), and, under staging
//! (`VkSettings::staging`), device-local ones the host never maps (weights and the KV pool),
//! reached through a host-visible staging buffer and a copy on the queue.
//!
//! Invariants: a mapped buffer's bytes are touched by the host only as `crate::gpu` allows (a
//! write targets a buffer no submitted command still reads; a read follows the fence of the
//! step that wrote it), so no host access races the device. A staged write or read is one or
//! more submissions of its own, each waited for within the device's timeout before the call
//! returns (so a staged write lands before the next step, as a mapped one does); a staged copy
//! that misses its deadline or finds the device lost marks the device lost, so the runtime
//! poisons itself at its next call and nothing the copy may still touch is freed.

use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use poot_core::Deadline;
use poot_runtime::RuntimeError;

use super::submit::{fence_wait, StepObjects};
use super::{vk_err, Shared};
use crate::device::WaitError;

/// Bytes of one staged piece: a large weight is copied through a staging buffer this big.
const STAGING_PIECE: u64 = 32 << 20;

/// A storage (and uniform) buffer: mapped, or device-local behind staged copies.
pub(crate) struct VkBuffer {
    shared: Arc<Shared>,
    pub raw: vk::Buffer,
    memory: vk::DeviceMemory,
    /// The persistent mapping; `None` for a device-local buffer reached by staged copies.
    ptr: Option<NonNull<u8>>,
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
            .field("mapped", &self.mapped())
            .finish()
    }
}

/// A buffer of at least `bytes` in `memory_type`, mapped when `map`.
pub(super) fn allocate(
    shared: &Arc<Shared>,
    bytes: u64,
    memory_type: u32,
    map: bool,
) -> Result<VkBuffer, RuntimeError> {
    let size = bytes.max(4).div_ceil(4) * 4;
    let d = &shared.device;
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
    // SAFETY: a plain exclusive buffer on a live device; every failure path below destroys
    // what was created before it.
    unsafe {
        let raw = d.create_buffer(&info, None).map_err(oom)?;
        let req = d.get_buffer_memory_requirements(raw);
        if req.memory_type_bits & (1 << memory_type) == 0 {
            d.destroy_buffer(raw, None);
            return Err(RuntimeError::Kernel {
                op: "vkAllocateMemory",
                detail: format!("memory type {memory_type} cannot hold storage buffers"),
            });
        }
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(memory_type);
        let memory = match d.allocate_memory(&alloc, None) {
            Ok(m) => m,
            Err(e) => {
                d.destroy_buffer(raw, None);
                return Err(oom(e));
            }
        };
        let bound = d.bind_buffer_memory(raw, memory, 0);
        let ptr = match (bound, map) {
            (Ok(()), false) => None,
            (Ok(()), true) => d
                .map_memory(memory, 0, vk::WHOLE_SIZE, Default::default())
                .ok()
                .and_then(|p| NonNull::new(p.cast::<u8>())),
            (Err(_), _) => None,
        };
        if bound.is_err() || (map && ptr.is_none()) {
            d.destroy_buffer(raw, None);
            d.free_memory(memory, None);
            return Err(RuntimeError::Kernel {
                op: "vkBindBufferMemory",
                detail: "binding or mapping a buffer's memory failed".into(),
            });
        }
        Ok(VkBuffer {
            shared: shared.clone(),
            raw,
            memory,
            ptr,
            size,
        })
    }
}

/// The host side of a staged copy.
enum Host<'a> {
    Upload(&'a [u8]),
    Download(&'a mut [u8]),
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

    /// Whether the host maps this buffer (else it is reached by staged copies).
    pub fn mapped(&self) -> bool {
        self.ptr.is_some()
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), RuntimeError> {
        let at = self.range(offset, data.len())?;
        let Some(ptr) = self.ptr else {
            return self.staged(offset, Host::Upload(data));
        };
        // SAFETY: in bounds of the mapping (checked above); see the `Send` impl for races.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr().add(at), data.len());
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), RuntimeError> {
        let at = self.range(offset, out.len())?;
        let Some(ptr) = self.ptr else {
            return self.staged(offset, Host::Download(out));
        };
        // SAFETY: in bounds of the mapping (checked above); see the `Send` impl for races.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.as_ptr().add(at), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// A staged write or read of this (unmapped) buffer at `offset`, piece by piece.
    fn staged(&self, offset: u64, mut host: Host<'_>) -> Result<(), RuntimeError> {
        let len = match &host {
            Host::Upload(d) => d.len(),
            Host::Download(o) => o.len(),
        } as u64;
        if len == 0 {
            return Ok(());
        }
        let shared = &self.shared;
        let staging = allocate(shared, len.min(STAGING_PIECE), shared.host_type, true)?;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(STAGING_PIECE);
            let piece = done as usize..(done + n) as usize;
            if let Host::Upload(d) = &host {
                staging.write(0, &d[piece.clone()])?;
            }
            let upload = matches!(host, Host::Upload(_));
            self.copy(&staging, offset + done, n, upload)?;
            if let Host::Download(o) = &mut host {
                staging.read(0, &mut o[piece])?;
            }
            done += n;
        }
        Ok(())
    }

    /// One submission copying `n` bytes between `staging` (at 0) and this buffer at `offset`
    /// (into this buffer when `upload`), waited for within the device's timeout.
    fn copy(
        &self,
        staging: &VkBuffer,
        offset: u64,
        n: u64,
        upload: bool,
    ) -> Result<(), RuntimeError> {
        let shared = &self.shared;
        if let Some(reason) = shared.lost_reason() {
            return Err(lost(&reason));
        }
        let d = &shared.device;
        let mut objects = StepObjects::new(shared.clone());
        let compute = vk::PipelineStageFlags::COMPUTE_SHADER;
        let transfer = vk::PipelineStageFlags::TRANSFER;
        let shader = vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE;
        // SAFETY: a transient pool, one command buffer and a fence of this device, owned by
        // `objects`; the buffers outlive the wait below (or are leaked with a faulted device).
        unsafe {
            objects.commands = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(shared.queue_family)
                        .flags(vk::CommandPoolCreateFlags::TRANSIENT),
                    None,
                )
                .map_err(|e| vk_err("vkCreateCommandPool", e))?;
            let cmd = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(objects.commands)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .map_err(|e| vk_err("vkAllocateCommandBuffers", e))?[0];
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(|e| vk_err("vkBeginCommandBuffer", e))?;
            // Earlier kernels' accesses to this buffer finish before the copy touches it, and
            // the copy's writes are visible to later kernels (uploads) or to the host.
            let before = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)];
            d.cmd_pipeline_barrier(
                cmd,
                compute,
                transfer,
                Default::default(),
                &before,
                &[],
                &[],
            );
            let (src, dst, region) = if upload {
                (
                    staging.raw,
                    self.raw,
                    vk::BufferCopy::default().dst_offset(offset),
                )
            } else {
                (
                    self.raw,
                    staging.raw,
                    vk::BufferCopy::default().src_offset(offset),
                )
            };
            d.cmd_copy_buffer(cmd, src, dst, &[region.size(n)]);
            let (stage, access) = if upload {
                (compute, shader)
            } else {
                (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ)
            };
            let after = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(access)];
            d.cmd_pipeline_barrier(cmd, transfer, stage, Default::default(), &after, &[], &[]);
            d.end_command_buffer(cmd)
                .map_err(|e| vk_err("vkEndCommandBuffer", e))?;
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(|e| vk_err("vkCreateFence", e))?;
            objects.fences.push(fence);
            let bufs = [cmd];
            let submit = vk::SubmitInfo::default().command_buffers(&bufs);
            let queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            let sent = d.queue_submit(*queue, &[submit], fence);
            drop(queue);
            match sent {
                Ok(()) => {}
                Err(vk::Result::ERROR_DEVICE_LOST) => {
                    shared.lose("VK_ERROR_DEVICE_LOST at a staged copy");
                    return Err(lost("VK_ERROR_DEVICE_LOST"));
                }
                Err(e) => return Err(vk_err("vkQueueSubmit", e)),
            }
        }
        match fence_wait(shared, &objects.fences, Deadline::after(shared.timeout)) {
            Ok(()) => Ok(()),
            Err(WaitError::Timeout) => {
                shared.lose("a staged copy missed its deadline");
                Err(RuntimeError::Timeout {
                    during: "a staged copy to or from device-local memory".into(),
                })
            }
            Err(WaitError::Lost(reason) | WaitError::Other(reason)) => {
                shared.lose(&reason);
                Err(lost(&reason))
            }
        }
    }
}

fn lost(reason: &str) -> RuntimeError {
    RuntimeError::Kernel {
        op: "vulkan staging",
        detail: format!("the device is lost ({reason})"),
    }
}

impl Drop for VkBuffer {
    fn drop(&mut self) {
        if self.shared.faulted() {
            return; // submitted work may still read it (see the module docs of `vk`)
        }
        // SAFETY: no submitted command uses the buffer (every submission that bound it was
        // waited for, else the device would be faulted); freeing the memory unmaps it.
        unsafe {
            self.shared.device.destroy_buffer(self.raw, None);
            self.shared.device.free_memory(self.memory, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{VkGpu, VkOptions};

    fn staged_gpu() -> Option<VkGpu> {
        let options = VkOptions {
            subgroups: Some(false),
            staging: Some(true),
        };
        match VkGpu::open(options, Duration::from_secs(60)) {
            Ok(g) => Some(g),
            Err(e) if std::env::var("POOT_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
                panic!("POOT_REQUIRE_WGPU=1 but no raw Vulkan device: {e}")
            }
            Err(e) => {
                eprintln!("SKIP: no raw Vulkan device on this machine ({e})");
                None
            }
        }
    }

    #[test]
    fn a_staged_buffer_round_trips_across_pieces_and_offsets() {
        let Some(gpu) = staged_gpu() else {
            return;
        };
        if !gpu.settings.staging {
            eprintln!("SKIP: the device has no device-local memory to stage into");
            return;
        }
        // Past one staging piece, at an offset inside the buffer.
        let len = (super::STAGING_PIECE + 12) as usize;
        let buf = gpu.resident(len as u64 + 8).unwrap();
        assert!(
            !buf.mapped(),
            "a resident buffer under staging is device-local"
        );
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        buf.write(8, &data).unwrap();
        let mut back = vec![0u8; len];
        buf.read(8, &mut back).unwrap();
        assert!(back == data, "staged bytes came back changed");
        let mut head = [0u8; 4];
        buf.read(8, &mut head).unwrap();
        assert_eq!(head, data[..4]);
        // Out of range is a typed error, and nothing is copied.
        let err = buf.write(buf.size - 2, &[1, 2, 3, 4]).unwrap_err();
        assert!(err.to_string().contains("bytes at"), "{err}");
        // Step buffers stay mapped.
        assert!(gpu.buffer(64).unwrap().mapped());
    }
}
