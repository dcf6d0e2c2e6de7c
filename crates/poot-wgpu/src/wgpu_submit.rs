//! A recorded step on wgpu: one compute pass per dispatch, one submission per late-input
//! split, one bounded wait, and one mapped staging buffer for the readback. A timed step
//! (`crate::timer`) has each pass write its begin and end timestamps into query sets, resolved
//! in the last submission and read back after the outputs.
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

/// Passes one query set holds (two timestamps each).
const PASSES_PER_SET: usize = wgpu::QUERY_SET_MAX_QUERIES as usize / 2;

/// The query sets of a timed step: pass `p` writes queries `2p` and `2p + 1` of the set
/// `p / PASSES_PER_SET` (indices within it).
struct Stamps {
    sets: Vec<(wgpu::QuerySet, u32)>,
}

impl Stamps {
    fn new(device: &wgpu::Device, passes: usize) -> Self {
        let sets = (0..passes.div_ceil(PASSES_PER_SET))
            .map(|s| {
                let count = (2 * (passes - s * PASSES_PER_SET).min(PASSES_PER_SET)) as u32;
                let set = device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("timer"),
                    ty: wgpu::QueryType::Timestamp,
                    count,
                });
                (set, count)
            })
            .collect();
        Self { sets }
    }

    fn writes(&self, pass: usize) -> wgpu::ComputePassTimestampWrites<'_> {
        let q = (pass % PASSES_PER_SET) as u32 * 2;
        wgpu::ComputePassTimestampWrites {
            query_set: &self.sets[pass / PASSES_PER_SET].0,
            beginning_of_pass_write_index: Some(q),
            end_of_pass_write_index: Some(q + 1),
        }
    }

    /// Resolves every set and copies the ticks, in pass order, to `staging` at `at`.
    fn resolve(
        &self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        staging: &wgpu::Buffer,
        at: u64,
    ) {
        // Each set resolves at a multiple of its full size, which keeps the 256-byte alignment.
        let stride = wgpu::QUERY_SET_MAX_QUERIES as u64 * 8;
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timer resolve"),
            size: stride * self.sets.len() as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        for (s, (set, count)) in self.sets.iter().enumerate() {
            let off = s as u64 * stride;
            encoder.resolve_query_set(set, 0..*count, &resolved, off);
            let to = at + s as u64 * PASSES_PER_SET as u64 * 16;
            encoder.copy_buffer_to_buffer(&resolved, off, staging, to, *count as u64 * 8);
        }
    }
}

/// Runs `rec` and returns the readback bytes laid out as `at` says, and (`timed`) each
/// dispatch's begin and end timestamps in device ticks.
pub(crate) fn execute(
    gpu: &Gpu,
    rec: &Recorded,
    at: &Readback,
    deadline: Deadline,
    timed: bool,
) -> Result<(Vec<u8>, Vec<u64>), StepError> {
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
    let stamps =
        (timed && !rec.dispatches.is_empty()).then(|| Stamps::new(device, rec.dispatches.len()));
    let mut start = 0;
    for l in &rec.late {
        let mut encoder = device.create_command_encoder(&Default::default());
        let at_pass = stamps.as_ref().map(|s| (s, start));
        encode(
            device,
            &mut encoder,
            &rec.dispatches[start..l.at],
            &uniform,
            at_pass,
        )?;
        gpu.queue.submit([encoder.finish()]);
        let bytes = late_bytes(l, deadline)?;
        gpu.queue.write_buffer(wgpu_buf(&l.buf)?, 0, &bytes);
        start = l.at;
    }
    let mut encoder = device.create_command_encoder(&Default::default());
    let at_pass = stamps.as_ref().map(|s| (s, start));
    encode(
        device,
        &mut encoder,
        &rec.dispatches[start..],
        &uniform,
        at_pass,
    )?;
    // The timestamps follow the outputs, 8-aligned.
    let stamps_at = at.total.div_ceil(8) * 8;
    let stamp_bytes = if stamps.is_some() {
        rec.dispatches.len() as u64 * 16
    } else {
        0
    };
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: (stamps_at + stamp_bytes).max(4),
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
    if let Some(s) = &stamps {
        s.resolve(device, &mut encoder, &staging, stamps_at);
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
    let ticks = view[stamps_at as usize..(stamps_at + stamp_bytes) as usize]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    drop(view);
    staging.unmap();
    Ok((bytes, ticks))
}

/// Records `dispatches` into `encoder`, one compute pass each; with `stamps`, the passes
/// write their timestamps, the first being the step's pass number `.1`.
fn encode(
    device: &wgpu::Device,
    encoder: &mut wgpu::CommandEncoder,
    dispatches: &[Dispatch],
    uniform: &wgpu::Buffer,
    stamps: Option<(&Stamps, usize)>,
) -> Result<(), RuntimeError> {
    for (n, d) in dispatches.iter().enumerate() {
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
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: stamps.map(|(s, first)| s.writes(first + n)),
        });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
    }
    Ok(())
}
