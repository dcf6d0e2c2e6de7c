//! One recorded step on the raw Vulkan device: descriptor sets from a per-step pool, one
//! command buffer per submission (the step is split at each late input, as on wgpu), a memory
//! barrier after every dispatch (wgpu's ordering between passes), a fence per submission
//! polled against the deadline, and the outputs copied out of their mapped buffers.
//!
//! Invariants: no wait is longer than the deadline (fences are polled in slices of at most
//! 50 ms, and a loss recorded meanwhile ends the wait); a wait that times out or finds the
//! device lost faults the device before anything is dropped, so the step's pools and buffers
//! are leaked rather than freed under running work (see the module docs of `crate::vk`); on
//! any other error after a submission, the submitted work is waited for (within the deadline)
//! before the step's objects are freed.

use std::sync::Arc;
use std::time::Duration;

use ash::vk;
use poot_core::Deadline;
use poot_runtime::RuntimeError;

use super::{vk_err, Shared, VkGpu, VkPipeline};
use crate::device::WaitError;
use crate::exec::Recorded;
use crate::gpu::{foreign, Buffer, Pipeline};
use crate::submit::{late_bytes, Readback, StepError};

/// The longest single `vkWaitForFences` call: losses recorded meanwhile are seen this soon.
const SLICE: Duration = Duration::from_millis(50);

/// Waits for every fence in `fences` until `deadline`, polling in slices.
pub(crate) fn fence_wait(
    shared: &Shared,
    fences: &[vk::Fence],
    deadline: Deadline,
) -> Result<(), WaitError> {
    loop {
        if let Some(reason) = shared.lost_reason() {
            return Err(WaitError::Lost(reason));
        }
        if fences.is_empty() {
            return Ok(());
        }
        let slice = deadline.remaining().map_or(SLICE, |r| r.min(SLICE));
        // SAFETY: the fences belong to this device and outlive the wait.
        match unsafe {
            shared
                .device
                .wait_for_fences(fences, true, slice.as_nanos() as u64)
        } {
            Ok(()) => return Ok(()),
            Err(vk::Result::TIMEOUT) if deadline.expired() => return Err(WaitError::Timeout),
            Err(vk::Result::TIMEOUT) => {}
            Err(vk::Result::ERROR_DEVICE_LOST) => {
                shared.lose("VK_ERROR_DEVICE_LOST while waiting for a fence");
                return Err(WaitError::Lost("VK_ERROR_DEVICE_LOST".into()));
            }
            Err(e) => return Err(WaitError::Other(e.to_string())),
        }
    }
}

/// The per-step (or per-copy) pools and fences; freed on drop unless the device is faulted.
pub(super) struct StepObjects {
    shared: Arc<Shared>,
    pub descriptors: vk::DescriptorPool,
    pub commands: vk::CommandPool,
    pub fences: Vec<vk::Fence>,
}

impl StepObjects {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            descriptors: vk::DescriptorPool::null(),
            commands: vk::CommandPool::null(),
            fences: Vec::new(),
        }
    }
}

impl Drop for StepObjects {
    fn drop(&mut self) {
        if self.shared.faulted() {
            return;
        }
        // SAFETY: every submission of this step was waited for (else the device is faulted);
        // null handles are ignored by the destroy calls.
        unsafe {
            let d = &self.shared.device;
            for f in &self.fences {
                d.destroy_fence(*f, None);
            }
            d.destroy_command_pool(self.commands, None);
            d.destroy_descriptor_pool(self.descriptors, None);
        }
    }
}

fn vk_buf(b: &Buffer) -> Result<&super::VkBuffer, RuntimeError> {
    match b {
        Buffer::Vulkan(b) => Ok(b),
        Buffer::Wgpu(_) => Err(foreign("buffer")),
    }
}

fn vk_pipe(p: &Pipeline) -> Result<&VkPipeline, RuntimeError> {
    match p {
        Pipeline::Vulkan(p) => Ok(p),
        Pipeline::Wgpu(_) => Err(foreign("pipeline")),
    }
}

/// Runs `rec` and returns the readback bytes laid out as `at` says.
pub(crate) fn execute(
    gpu: &VkGpu,
    rec: &Recorded,
    at: &Readback,
    deadline: Deadline,
) -> Result<Vec<u8>, StepError> {
    let shared = &gpu.shared;
    if let Some(reason) = shared.lost_reason() {
        return Err(StepError::Wait(
            WaitError::Lost(reason),
            "the step's submission",
        ));
    }
    let d = &shared.device;
    let uniform = gpu.buffer(rec.params.len().max(256) as u64)?;
    uniform.write(0, &rec.params)?;
    let pipes = rec
        .dispatches
        .iter()
        .map(|x| vk_pipe(&x.pipeline))
        .collect::<Result<Vec<_>, _>>()?;
    let n = rec.dispatches.len() as u32;
    let storage: u32 = rec.dispatches.iter().map(|x| x.bufs.len() as u32).sum();
    let sizes = [
        vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(storage.max(1)),
        vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::UNIFORM_BUFFER)
            .descriptor_count(n.max(1)),
    ];
    let mut objects = StepObjects::new(shared.clone());
    // SAFETY: pools on a live device, owned (and freed) by `objects`.
    unsafe {
        objects.descriptors = d
            .create_descriptor_pool(
                &vk::DescriptorPoolCreateInfo::default()
                    .max_sets(n.max(1))
                    .pool_sizes(&sizes),
                None,
            )
            .map_err(|e| vk_err("vkCreateDescriptorPool", e))?;
        objects.commands = d
            .create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(shared.queue_family)
                    .flags(vk::CommandPoolCreateFlags::TRANSIENT),
                None,
            )
            .map_err(|e| vk_err("vkCreateCommandPool", e))?;
    }
    let sets = if n == 0 {
        Vec::new()
    } else {
        let layouts: Vec<_> = pipes.iter().map(|p| p.set_layout).collect();
        // SAFETY: the pool was sized for one set per dispatch.
        unsafe {
            d.allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(objects.descriptors)
                    .set_layouts(&layouts),
            )
        }
        .map_err(|e| vk_err("vkAllocateDescriptorSets", e))?
    };
    // Buffer infos first (the writes point into them), one per binding of each dispatch.
    let mut infos = Vec::new();
    let mut slots = Vec::new();
    for (x, (p, set)) in rec.dispatches.iter().zip(pipes.iter().zip(&sets)) {
        for &(binding, kind) in &p.bindings {
            let b = binding as usize;
            let info = if b < x.bufs.len() && kind == vk::DescriptorType::STORAGE_BUFFER {
                let buf = vk_buf(&x.bufs[b])?;
                vk::DescriptorBufferInfo::default()
                    .buffer(buf.raw)
                    .range(vk::WHOLE_SIZE)
            } else if b == x.bufs.len() && kind == vk::DescriptorType::UNIFORM_BUFFER {
                vk::DescriptorBufferInfo::default()
                    .buffer(uniform.raw)
                    .offset(x.params.0)
                    .range(x.params.1)
            } else {
                return Err(RuntimeError::Kernel {
                    op: "vulkan dispatch",
                    detail: format!(
                        "binding {binding} ({kind:?}) of a kernel given {} buffers",
                        x.bufs.len()
                    ),
                }
                .into());
            };
            infos.push(info);
            slots.push((*set, binding, kind));
        }
    }
    let writes: Vec<_> = slots
        .iter()
        .zip(&infos)
        .map(|(&(set, binding, kind), info)| {
            vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(binding)
                .descriptor_type(kind)
                .buffer_info(std::slice::from_ref(info))
        })
        .collect();
    // SAFETY: the sets, buffers and the uniform are live; the infos outlive the call.
    unsafe { d.update_descriptor_sets(&writes, &[]) };
    // One command buffer per submission: split before each late input's first reader.
    let mut bounds: Vec<usize> = rec.late.iter().map(|l| l.at).collect();
    bounds.push(rec.dispatches.len());
    let count = bounds.len() as u32;
    // SAFETY: from the step's own pool.
    let cmds = unsafe {
        d.allocate_command_buffers(
            &vk::CommandBufferAllocateInfo::default()
                .command_pool(objects.commands)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(count),
        )
    }
    .map_err(|e| vk_err("vkAllocateCommandBuffers", e))?;
    let mut start = 0;
    for (i, (&cmd, &end)) in cmds.iter().zip(&bounds).enumerate() {
        let last = i + 1 == cmds.len();
        // SAFETY: every handle recorded is live until the step's fences signal.
        unsafe {
            record(
                d,
                cmd,
                &pipes[start..end],
                &sets[start..end],
                rec,
                start,
                last,
            )
        }
        .map_err(|e| vk_err("vkEndCommandBuffer", e))?;
        start = end;
    }
    let mut submitted = 0;
    let result = (|| -> Result<(), StepError> {
        for (i, &cmd) in cmds.iter().enumerate() {
            if i > 0 {
                let l = &rec.late[i - 1];
                let bytes = late_bytes(l, deadline)?;
                vk_buf(&l.buf)?.write(0, &bytes)?;
            }
            if deadline.expired() {
                return Err(StepError::Wait(WaitError::Timeout, "the step's submission"));
            }
            // SAFETY: a fence of this device, owned by `objects`.
            let fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
                .map_err(|e| vk_err("vkCreateFence", e))?;
            objects.fences.push(fence);
            let bufs = [cmd];
            let submit = vk::SubmitInfo::default().command_buffers(&bufs);
            let queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the queue is externally synchronized by its mutex; the command buffer
            // was recorded above and is submitted once.
            match unsafe { d.queue_submit(*queue, &[submit], fence) } {
                Ok(()) => submitted += 1,
                Err(vk::Result::ERROR_DEVICE_LOST) => {
                    shared.lose("VK_ERROR_DEVICE_LOST at submission");
                    return Err(StepError::Wait(
                        WaitError::Lost("VK_ERROR_DEVICE_LOST".into()),
                        "the step's submission",
                    ));
                }
                Err(e) => return Err(vk_err("vkQueueSubmit", e).into()),
            }
        }
        fence_wait(shared, &objects.fences[..submitted], deadline)
            .map_err(|e| StepError::Wait(e, "the step's submission"))
    })();
    if let Err(e) = result {
        match &e {
            StepError::Wait(..) => shared.fault(),
            // Work already submitted may still read this step's objects: wait for it.
            StepError::Runtime(_) => {
                if fence_wait(shared, &objects.fences[..submitted], deadline).is_err() {
                    shared.fault();
                }
            }
        }
        return Err(e);
    }
    let mut out = vec![0u8; at.total as usize];
    for ((_, buf, bytes, _), off) in rec.outputs.iter().zip(&at.outputs) {
        let o = *off as usize;
        vk_buf(buf)?.read(0, &mut out[o..o + *bytes as usize])?;
    }
    for ((buf, bytes), off) in rec.extra.iter().zip(&at.extra) {
        let o = *off as usize;
        vk_buf(buf)?.read(0, &mut out[o..o + *bytes as usize])?;
    }
    Ok(out)
}

/// Records dispatches `first..` of `rec` into `cmd`, a barrier after each; the last command
/// buffer ends with a barrier that makes the shaders' writes visible to the host.
///
/// # Safety
/// `cmd` is a fresh primary command buffer of this device; every pipeline, set and buffer
/// named stays alive until the submission's fence signals.
unsafe fn record(
    d: &ash::Device,
    cmd: vk::CommandBuffer,
    pipes: &[&VkPipeline],
    sets: &[vk::DescriptorSet],
    rec: &Recorded,
    first: usize,
    last: bool,
) -> Result<(), vk::Result> {
    let compute = vk::PipelineStageFlags::COMPUTE_SHADER;
    let between = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
        .dst_access_mask(
            vk::AccessFlags::SHADER_READ
                | vk::AccessFlags::SHADER_WRITE
                | vk::AccessFlags::UNIFORM_READ,
        )];
    // SAFETY: see the function's contract.
    unsafe {
        d.begin_command_buffer(
            cmd,
            &vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
        )?;
        // Orders this submission after the previous one's writes (a late input's split).
        d.cmd_pipeline_barrier(
            cmd,
            compute,
            compute,
            Default::default(),
            &between,
            &[],
            &[],
        );
        for (i, (p, set)) in pipes.iter().zip(sets).enumerate() {
            let g = rec.dispatches[first + i].groups;
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, p.raw);
            d.cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                p.layout,
                0,
                &[*set],
                &[],
            );
            d.cmd_dispatch(cmd, g[0], g[1], g[2]);
            d.cmd_pipeline_barrier(
                cmd,
                compute,
                compute,
                Default::default(),
                &between,
                &[],
                &[],
            );
        }
        if last {
            let host = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ)];
            d.cmd_pipeline_barrier(
                cmd,
                compute,
                vk::PipelineStageFlags::HOST,
                Default::default(),
                &host,
                &[],
                &[],
            );
        }
        d.end_command_buffer(cmd)
    }
}
