//! One run of a compiled plan: check and stage the inputs (and each rope's angles, computed
//! on the host by the CPU runtime's recipe), queue the uploads, the plan's launches and the
//! output downloads, then one bounded wait. The host touches the device only through pinned
//! staging, so no call here can block on the GPU.

use poot_core::{DType, Deadline};
use poot_cpu::kernels::rope_angles;
use poot_runtime::{HostTensor, RuntimeError};

use crate::ops;
use crate::plan::CudaPlan;
use crate::CudaRuntime;

fn input<'a>(inputs: &'a [(&str, HostTensor)], name: &str) -> Result<&'a HostTensor, RuntimeError> {
    inputs
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| RuntimeError::MissingInput { name: name.into() })
}

fn bytes_of(t: &HostTensor) -> Vec<u8> {
    match t {
        HostTensor::F32 { data, .. } => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        HostTensor::I32 { data, .. } => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

pub(crate) fn run(
    rt: &CudaRuntime,
    plan: &CudaPlan,
    inputs: &[(&str, HostTensor)],
    deadline: Deadline,
) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
    // Host side first: every check happens before anything is queued.
    let mut staged: Vec<(u64, Vec<u8>)> = Vec::new();
    for slot in &plan.inputs {
        let t = input(inputs, &slot.name)?;
        if t.dtype() != slot.dtype || t.shape() != slot.shape.as_slice() {
            return Err(RuntimeError::InputMismatch {
                name: slot.name.clone(),
                expected: format!("{}{:?}", slot.dtype, slot.shape),
                got: t.describe(),
            });
        }
        if let (Some((bound, op)), HostTensor::I32 { data, .. }) = (slot.bound, t) {
            if let Some((i, &id)) = data
                .iter()
                .enumerate()
                .find(|(_, &id)| id < 0 || id as usize >= bound)
            {
                return Err(RuntimeError::Kernel {
                    op,
                    detail: format!("{}[{i}] = {id} is out of range 0..{bound}", slot.name),
                });
            }
        }
        staged.push((slot.offset, bytes_of(t)));
    }
    let mut cs = Vec::new();
    for r in &plan.ropes {
        let HostTensor::I32 { data, .. } = input(inputs, &r.positions)? else {
            return Err(RuntimeError::InputMismatch {
                name: r.positions.clone(),
                expected: "I32 positions".into(),
                got: input(inputs, &r.positions)?.describe(),
            });
        };
        rope_angles(data, &r.table, &mut cs).map_err(|e| RuntimeError::Kernel {
            op: "rope",
            detail: e.to_string(),
        })?;
        staged.push((
            r.offset,
            cs.iter()
                .flat_map(|(c, s)| [c.to_le_bytes(), s.to_le_bytes()])
                .flatten()
                .collect(),
        ));
    }
    let in_bytes: usize = staged.iter().map(|(_, b)| b.len()).sum();
    let out_bytes: usize = plan
        .outputs
        .iter()
        .map(|o| o.shape.iter().product::<usize>() * 4)
        .sum();

    let base = plan.arena.ptr;
    let mut s = rt.dev.session()?;
    s.reserve_staging(in_bytes + out_bytes)?;
    let mut at = 0;
    for (_, b) in &staged {
        s.staging.as_mut_slice(at + b.len())[at..].copy_from_slice(b);
        at += b.len();
    }
    let queued = (|| {
        let mut at = 0;
        for (off, b) in &staged {
            s.htod(base + off, at, b.len())?;
            at += b.len();
        }
        let stall = rt.stall_ns.load(std::sync::atomic::Ordering::Relaxed);
        if stall > 0 {
            s.launch(&ops::stall(stall, rt.sink.ptr))?;
        }
        for l in &plan.launches {
            s.launch(l)?;
        }
        for o in &plan.outputs {
            let n = o.shape.iter().product::<usize>() * 4;
            s.dtoh(base + o.offset, at, n)?;
            at += n;
        }
        s.wait("run", deadline)
    })();
    queued.map_err(|e| rt.fail(e, "run"))?;

    let mut at = in_bytes;
    let mut out = Vec::with_capacity(plan.outputs.len());
    let all = s.staging.as_mut_slice(in_bytes + out_bytes);
    for o in &plan.outputs {
        let n = o.shape.iter().product::<usize>();
        let words = all[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]]);
        let t = match o.dtype {
            DType::I32 => HostTensor::I32 {
                shape: o.shape.clone(),
                data: words.map(i32::from_le_bytes).collect(),
            },
            _ => HostTensor::F32 {
                shape: o.shape.clone(),
                data: words.map(f32::from_le_bytes).collect(),
            },
        };
        out.push((o.name.clone(), t));
        at += 4 * n;
    }
    Ok(out)
}
