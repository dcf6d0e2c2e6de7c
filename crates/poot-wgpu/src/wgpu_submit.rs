//! A recorded step on wgpu: one compute pass per dispatch, one submission per late-input
//! split, one bounded wait, and one mapped staging buffer for the readback.
//!
//! Invariants: every wait goes through `Gpu::wait` with the deadline; an uncaptured wgpu error
//! (validation: a bug here) fails the step with a typed `Kernel` error unless it is the
//! symptom of a lost device.

use std::sync::mpsc;

use poot_core::Deadline;
use poot_runtime::RuntimeError;

use crate::device::{Gpu, WaitError};
use crate::exec::{Dispatch, Recorded};
use crate::gpu::{foreign, Buffer, Pipeline};
use crate::submit::{late_bytes, Readback, StepError};

fn wgpu_buf(b: &Buffer) -> Result<&wgpu::Buffer, RuntimeError> {
    match b {
        Buffer::Wgpu(b) => Ok(b),
        Buffer::Vulkan(_) => Err(foreign("buffer")),
    }
}

/// Runs `rec` and returns the readback bytes laid out as `at` says.
pub(crate) fn execute(
    gpu: &Gpu,
    rec: &Recorded,
    at: &Readback,
    deadline: Deadline,
) -> Result<Vec<u8>, StepError> {
    let device = &gpu.device;
    let uniform = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: (rec.params.len() as u64).max(256).div_ceil(16) * 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    if !rec.params.is_empty() {
        gpu.queue.write_buffer(&uniform, 0, &rec.params);
    }
    let mut start = 0;
    for l in &rec.late {
        let mut encoder = device.create_command_encoder(&Default::default());
        encode(device, &mut encoder, &rec.dispatches[start..l.at], &uniform)?;
        gpu.queue.submit([encoder.finish()]);
        let bytes = late_bytes(l, deadline)?;
        gpu.queue.write_buffer(wgpu_buf(&l.buf)?, 0, &bytes);
        start = l.at;
    }
    let mut encoder = device.create_command_encoder(&Default::default());
    encode(device, &mut encoder, &rec.dispatches[start..], &uniform)?;
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: at.total.max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    for ((_, buf, bytes, _), off) in rec.outputs.iter().zip(&at.outputs) {
        if *bytes > 0 {
            encoder.copy_buffer_to_buffer(wgpu_buf(buf)?, 0, &staging, *off, *bytes);
        }
    }
    for ((buf, bytes), off) in rec.extra.iter().zip(&at.extra) {
        encoder.copy_buffer_to_buffer(wgpu_buf(buf)?, 0, &staging, *off, *bytes);
    }
    if deadline.expired() {
        return Err(StepError::Wait(WaitError::Timeout, "submission"));
    }
    let index = gpu.queue.submit([encoder.finish()]);
    // A validation error fails the step without poisoning (a bug here, not a device fault),
    // unless it is the symptom of a lost device.
    if let Some(e) = gpu.take_error() {
        let _ = device.poll(wgpu::PollType::Poll);
        if let Some(reason) = gpu.lost_reason() {
            return Err(StepError::Wait(
                WaitError::Lost(reason),
                "the step's submission",
            ));
        }
        return Err(RuntimeError::Kernel {
            op: "wgpu",
            detail: e,
        }
        .into());
    }
    gpu.wait(Some(index), deadline)
        .map_err(|e| StepError::Wait(e, "the step's submission"))?;
    let (tx, rx) = mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.wait(None, deadline)
        .map_err(|e| StepError::Wait(e, "the readback"))?;
    match rx.try_recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(RuntimeError::Kernel {
                op: "readback",
                detail: e.to_string(),
            }
            .into())
        }
        Err(_) => return Err(StepError::Wait(WaitError::Timeout, "the readback")),
    }
    let view = staging
        .get_mapped_range(..)
        .map_err(|e| RuntimeError::Kernel {
            op: "readback",
            detail: e.to_string(),
        })?;
    let bytes = view[..at.total as usize].to_vec();
    drop(view);
    staging.unmap();
    Ok(bytes)
}

/// Records `dispatches` into `encoder`, one compute pass each.
fn encode(
    device: &wgpu::Device,
    encoder: &mut wgpu::CommandEncoder,
    dispatches: &[Dispatch],
    uniform: &wgpu::Buffer,
) -> Result<(), RuntimeError> {
    for d in dispatches {
        let Pipeline::Wgpu(pipeline) = &*d.pipeline else {
            return Err(foreign("pipeline"));
        };
        let layout = pipeline.get_bind_group_layout(0);
        let mut entries = Vec::with_capacity(d.bufs.len() + 1);
        for (i, b) in d.bufs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu_buf(b)?.as_entire_binding(),
            });
        }
        entries.push(wgpu::BindGroupEntry {
            binding: d.bufs.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: uniform,
                offset: d.params.0,
                size: wgpu::BufferSize::new(d.params.1),
            }),
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
    }
    Ok(())
}
