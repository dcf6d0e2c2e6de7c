//! One step on the device: record every equation (`exec`), hand the recording to the device's
//! submission (`wgpu_submit`, or `vk::submit` for raw Vulkan), which waits with the deadline
//! and returns the outputs (and the logits of host-sampled rows) as one byte buffer laid out
//! by [`Readback`]; then decode the outputs and sample the host rows. A resident run (`keep`)
//! leaves the outputs in their device buffers instead, for [`read_back`] to copy one later.
//!
//! A late input (the guided-decoding mask) splits the step: the dispatches recorded before
//! its input equation (the forward pass) are submitted first, then the host waits for the
//! input ([`late_bytes`]), writes it, and submits the rest, so the mask is computed while the
//! device runs.
//!
//! With the runtime's timer on (`timer`), the wgpu submission also writes a timestamp at the
//! start and end of every compute pass, read back after the outputs; the step's per-equation
//! spans are kept for `WgpuRuntime::last_run_spans`.
//!
//! Invariants: nothing waits without the deadline (a late input's wait included); a wait that
//! times out or finds the device lost is reported as such to the runtime, which poisons
//! itself; a late input of the wrong dtype or shape is `InputMismatch`.

use poot_core::{DType, Deadline};
use poot_runtime::{HostTensor, RuntimeError};

use crate::device::WaitError;
use crate::exec::{tensor_bytes, Exec, LateSlot, Output, Recorded, StepInputs};
use crate::gpu::Device;
use crate::plan::WgpuPlan;
use crate::resident::DeviceTensor;
use crate::sample::sample_row;
use crate::{vk, wgpu_submit, KvPool, WgpuRuntime};

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

/// Where each output and extra readback lies in the step's readback bytes.
pub(crate) struct Readback {
    pub total: u64,
    pub outputs: Vec<u64>,
    pub extra: Vec<u64>,
}

/// A step's outputs: read back to the host, or (`keep`) left in their device buffers.
pub(crate) type StepOut = (Vec<(String, HostTensor)>, Vec<Output>);

/// One step; with `keep` its named outputs stay in their device buffers (returned, not read
/// back), which a step whose sampling reads logits back on the host cannot do. `device`
/// inputs are bound as they lie (see `resident`).
pub(crate) fn run_step(
    rt: &WgpuRuntime,
    plan: &WgpuPlan,
    (inputs, late): StepInputs<'_>,
    device: &[(&str, DeviceTensor)],
    kv: Option<&KvPool>,
    deadline: Deadline,
    keep: bool,
) -> Result<StepOut, StepError> {
    let mut exec = Exec::new(rt, plan, inputs, late, kv);
    exec.bind_device(device);
    let stall = rt.stall_iters();
    if stall > 0 {
        exec.stall(stall)?;
    }
    exec.record_all()?;
    let mut rec = exec.finish()?;
    if keep && !rec.host_rows.is_empty() {
        return Err(RuntimeError::Kernel {
            op: "run_resident",
            detail: "this step samples rows on the host, which reads its logits back".into(),
        }
        .into());
    }
    let kept = if keep {
        std::mem::take(&mut rec.outputs)
    } else {
        Vec::new()
    };
    // Outputs, then host-sampled logits, one after the other.
    let mut at = Readback {
        total: 0,
        outputs: Vec::new(),
        extra: Vec::new(),
    };
    for (_, _, bytes, _) in &rec.outputs {
        at.outputs.push(at.total);
        at.total += bytes.div_ceil(4) * 4;
    }
    for (_, bytes) in &rec.extra {
        at.extra.push(at.total);
        at.total += bytes;
    }
    rt.count_run(at.total);
    let timed = crate::timer::timed(rt);
    let (view, stamps) = execute(rt, &rec, &at, deadline, timed)?;
    if timed {
        crate::timer::keep_spans(rt, plan, &rec.dispatches, &stamps);
    }
    let words = |off: u64, n: usize| -> Vec<[u8; 4]> {
        view[off as usize..off as usize + 4 * n]
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect()
    };
    let mut result = Vec::with_capacity(rec.outputs.len());
    for ((name, _, bytes, (dtype, shape)), off) in rec.outputs.iter().zip(&at.outputs) {
        let n = (*bytes / 4) as usize;
        let t = if *dtype == DType::I32 {
            HostTensor::I32 {
                shape: shape.clone(),
                data: words(*off, n).into_iter().map(i32::from_le_bytes).collect(),
            }
        } else {
            HostTensor::F32 {
                shape: shape.clone(),
                data: words(*off, n).into_iter().map(f32::from_le_bytes).collect(),
            }
        };
        result.push((name.clone(), t));
    }
    for h in &rec.host_rows {
        let base = at.extra[h.logits_at as usize] + (h.row * h.vocab) as u64 * 4;
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
    Ok((result, kept))
}

/// Runs `rec` on the runtime's device and returns the readback bytes laid out as `at` says,
/// and (`timed`, wgpu only) each dispatch's begin and end timestamps in device ticks.
fn execute(
    rt: &WgpuRuntime,
    rec: &Recorded,
    at: &Readback,
    deadline: Deadline,
    timed: bool,
) -> Result<(Vec<u8>, Vec<u64>), StepError> {
    match &rt.gpu {
        Device::Wgpu(g) => wgpu_submit::execute(g, rec, at, deadline, timed),
        Device::Vulkan(v) => Ok((vk::submit::execute(v, rec, at, deadline)?, Vec::new())),
    }
}

/// Copies one kept output (`run_step` with `keep`) back to the host, within `deadline`: a
/// submission with no dispatches whose one output is that buffer.
pub(crate) fn read_back(
    rt: &WgpuRuntime,
    out: Output,
    deadline: Deadline,
) -> Result<HostTensor, StepError> {
    let bytes = out.2;
    let (dtype, shape) = (out.3 .0, out.3 .1.clone());
    let rec = Recorded {
        dispatches: Vec::new(),
        params: Vec::new(),
        outputs: vec![out],
        extra: Vec::new(),
        host_rows: Vec::new(),
        late: Vec::new(),
    };
    let at = Readback {
        total: bytes.div_ceil(4) * 4,
        outputs: vec![0],
        extra: Vec::new(),
    };
    rt.count_readback(bytes);
    let (view, _) = execute(rt, &rec, &at, deadline, false)?;
    let w = view[..bytes as usize]
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]]);
    Ok(if dtype == DType::I32 {
        HostTensor::I32 {
            shape,
            data: w.map(i32::from_le_bytes).collect(),
        }
    } else {
        HostTensor::F32 {
            shape,
            data: w.map(f32::from_le_bytes).collect(),
        }
    })
}

/// Waits (within the deadline) for a late input, checks it and returns its bytes for the
/// device to write before the next submission.
pub(crate) fn late_bytes(l: &LateSlot, deadline: Deadline) -> Result<Vec<u8>, StepError> {
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
    Ok(tensor_bytes(&t))
}
