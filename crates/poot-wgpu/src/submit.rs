//! One step on the device: record every equation, encode the passes, submit, wait with the
//! deadline, read back the outputs (and the logits of host-sampled rows) through one mapped
//! staging buffer, or (a resident run) leave the outputs in their device buffers for
//! `read_back` to copy one later.
//!
//! A late input (the guided-decoding mask) splits the step: the dispatches recorded before
//! its input equation (the forward pass) are submitted first, then the host waits for the
//! input, writes it, and submits the rest, so the mask is computed while the device runs.
//!
//! Invariants: nothing waits without the deadline (a late input's wait included); a wait that
//! times out or finds the device lost is reported as such to the runtime, which poisons
//! itself; an uncaptured wgpu error (validation: a bug here) fails the step with a typed
//! `Kernel` error; a late input of the wrong dtype or shape is `InputMismatch`.

use std::sync::mpsc;

use poot_core::{DType, Deadline};
use poot_runtime::{HostTensor, RuntimeError};

use crate::device::WaitError;
use crate::exec::{tensor_bytes, Dispatch, Exec, LateSlot, Output, StepInputs};
use crate::plan::WgpuPlan;
use crate::sample::sample_row;
use crate::{KvPool, WgpuRuntime};

/// How a step failed on the device side, for the runtime to poison on.
#[derive(Debug)]
pub(crate) enum StepError {
    Runtime(RuntimeError),
    Wait(WaitError, &'static str),
}

impl From<RuntimeError> for StepError {
    fn from(e: RuntimeError) -> Self {
        StepError::Runtime(e)
    }
}

/// A step's outputs: read back to the host, or (`keep`) left in their device buffers.
pub(crate) type StepOut = (Vec<(String, HostTensor)>, Vec<Output>);

/// One step; with `keep` its named outputs stay in their device buffers (returned, not read
/// back), which a step whose sampling reads logits back on the host cannot do.
pub(crate) fn run_step(
    rt: &WgpuRuntime,
    plan: &WgpuPlan,
    (inputs, late): StepInputs<'_>,
    kv: Option<&KvPool>,
    deadline: Deadline,
    keep: bool,
) -> Result<StepOut, StepError> {
    let mut exec = Exec::new(rt, plan, inputs, late, kv);
    let stall = rt.stall_iters();
    if stall > 0 {
        exec.stall(stall)?;
    }
    exec.record_all()?;
    let gpu = &rt.gpu;
    let device = &gpu.device;
    let rec = exec.finish()?;
    let (dispatches, params, outputs) = (rec.dispatches, rec.params, rec.outputs);
    let (extra, host_rows) = (rec.extra, rec.host_rows);
    if keep && !host_rows.is_empty() {
        return Err(RuntimeError::Kernel {
            op: "run_resident",
            detail: "this step samples rows on the host, which reads its logits back".into(),
        }
        .into());
    }
    let (staged, kept) = if keep {
        (Vec::new(), outputs)
    } else {
        (outputs, Vec::new())
    };
    let outputs = staged;
    let uniform = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: (params.len() as u64).max(256).div_ceil(16) * 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    if !params.is_empty() {
        gpu.queue.write_buffer(&uniform, 0, &params);
    }
    let mut start = 0;
    for l in &rec.late {
        let mut encoder = device.create_command_encoder(&Default::default());
        encode(device, &mut encoder, &dispatches[start..l.at], &uniform);
        gpu.queue.submit([encoder.finish()]);
        fill_late(rt, l, deadline)?;
        start = l.at;
    }
    let mut encoder = device.create_command_encoder(&Default::default());
    encode(device, &mut encoder, &dispatches[start..], &uniform);
    // Outputs, then host-sampled logits, packed into one staging buffer.
    let mut offsets = Vec::new();
    let mut total = 0u64;
    for (_, _, bytes, _) in &outputs {
        offsets.push(total);
        total += bytes.div_ceil(4) * 4;
    }
    let mut extra_at = Vec::new();
    for (_, bytes) in &extra {
        extra_at.push(total);
        total += bytes;
    }
    rt.count_run(total);
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: total.max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    for ((_, buf, bytes, _), off) in outputs.iter().zip(&offsets) {
        if *bytes > 0 {
            encoder.copy_buffer_to_buffer(buf, 0, &staging, *off, *bytes);
        }
    }
    for ((buf, bytes), off) in extra.iter().zip(&extra_at) {
        encoder.copy_buffer_to_buffer(buf, 0, &staging, *off, *bytes);
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
    map_read(rt, &staging, deadline)?;
    let view = staging
        .get_mapped_range(..)
        .map_err(|e| RuntimeError::Kernel {
            op: "readback",
            detail: e.to_string(),
        })?;
    let words = |off: u64, n: usize| words_at(&view, off, n);
    let mut result = Vec::with_capacity(outputs.len());
    for ((name, _, bytes, (dtype, shape)), off) in outputs.iter().zip(&offsets) {
        let n = (*bytes / 4) as usize;
        result.push((name.clone(), decode(&view, *off, n, *dtype, shape)));
    }
    for h in host_rows {
        let base = extra_at[h.logits_at as usize] + (h.row * h.vocab) as u64 * 4;
        let row: Vec<f32> = words(base, h.vocab)
            .into_iter()
            .map(f32::from_le_bytes)
            .collect();
        let id = sample_row(&row, h.params)?;
        for (name, t) in &mut result {
            if *name == h.output {
                if let HostTensor::I32 { data, .. } = t {
                    data[h.row] = id;
                }
            }
        }
    }
    drop(view);
    staging.unmap();
    Ok((result, kept))
}

/// Maps `staging` for reading (after the copies into it were submitted), within `deadline`.
fn map_read(rt: &WgpuRuntime, staging: &wgpu::Buffer, deadline: Deadline) -> Result<(), StepError> {
    let (tx, rx) = mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    rt.gpu
        .wait(None, deadline)
        .map_err(|e| StepError::Wait(e, "the readback"))?;
    match rx.try_recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(RuntimeError::Kernel {
            op: "readback",
            detail: e.to_string(),
        }
        .into()),
        Err(_) => Err(StepError::Wait(WaitError::Timeout, "the readback")),
    }
}

fn words_at(view: &[u8], off: u64, n: usize) -> Vec<[u8; 4]> {
    view[off as usize..off as usize + 4 * n]
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect()
}

/// `n` little-endian words at `off` as a host tensor of `dtype` (I32, else F32) and `shape`.
fn decode(view: &[u8], off: u64, n: usize, dtype: DType, shape: &[usize]) -> HostTensor {
    let w = words_at(view, off, n);
    if dtype == DType::I32 {
        HostTensor::I32 {
            shape: shape.to_vec(),
            data: w.into_iter().map(i32::from_le_bytes).collect(),
        }
    } else {
        HostTensor::F32 {
            shape: shape.to_vec(),
            data: w.into_iter().map(f32::from_le_bytes).collect(),
        }
    }
}

/// Copies one kept output (`run_step` with `keep`) back to the host, within `deadline`.
pub(crate) fn read_back(
    rt: &WgpuRuntime,
    (buf, bytes, dtype, shape): (&wgpu::Buffer, u64, DType, &[usize]),
    deadline: Deadline,
) -> Result<HostTensor, StepError> {
    let gpu = &rt.gpu;
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: bytes.div_ceil(4).max(1) * 4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    if bytes > 0 {
        encoder.copy_buffer_to_buffer(buf, 0, &staging, 0, bytes);
    }
    if deadline.expired() {
        return Err(StepError::Wait(WaitError::Timeout, "the readback"));
    }
    rt.count_readback(bytes);
    let index = gpu.queue.submit([encoder.finish()]);
    if let Some(e) = gpu.take_error() {
        if let Some(reason) = gpu.lost_reason() {
            return Err(StepError::Wait(WaitError::Lost(reason), "the readback"));
        }
        return Err(RuntimeError::Kernel {
            op: "readback",
            detail: e,
        }
        .into());
    }
    gpu.wait(Some(index), deadline)
        .map_err(|e| StepError::Wait(e, "the readback"))?;
    map_read(rt, &staging, deadline)?;
    let view = staging
        .get_mapped_range(..)
        .map_err(|e| RuntimeError::Kernel {
            op: "readback",
            detail: e.to_string(),
        })?;
    let t = decode(&view, 0, (bytes / 4) as usize, dtype, shape);
    drop(view);
    staging.unmap();
    Ok(t)
}

/// Records `dispatches` into `encoder`, one compute pass each.
fn encode(
    device: &wgpu::Device,
    encoder: &mut wgpu::CommandEncoder,
    dispatches: &[Dispatch],
    uniform: &wgpu::Buffer,
) {
    for d in dispatches {
        let layout = d.pipeline.get_bind_group_layout(0);
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = d
            .bufs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
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
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
    }
}

/// Waits (within the deadline) for a late input, checks it and writes it to its buffer; the
/// write lands before the next submission's commands.
fn fill_late(rt: &WgpuRuntime, l: &LateSlot, deadline: Deadline) -> Result<(), StepError> {
    let t = l.slot.wait(&l.name, deadline).map_err(|e| match e {
        RuntimeError::Timeout { .. } => StepError::Wait(WaitError::Timeout, "a late input's wait"),
        e => StepError::Runtime(e),
    })?;
    if t.dtype() != l.dtype || t.shape() != l.shape.as_slice() || t.len() != l.buf_len() {
        return Err(RuntimeError::InputMismatch {
            name: l.name.clone(),
            expected: format!("{}{:?}", l.dtype, l.shape),
            got: t.describe(),
        }
        .into());
    }
    rt.gpu.queue.write_buffer(&l.buf, 0, &tensor_bytes(&t));
    Ok(())
}
