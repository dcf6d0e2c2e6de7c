//! A step driver's plans and runs: the compiled plans it holds by step shape (from the Python
//! plan cache on a miss) and one run of a plan on a runtime.
//!
//! Invariants: the plans held are exactly the keys the Python cache said it holds at the last
//! miss, less those forgotten since (the cache evicted them); a run on a native runtime
//! releases the GIL (a masked one fills its mask meanwhile, a late input), and a run on a
//! runtime that is a Python object calls its `run` (`step_python`; a masked one fills its
//! mask meanwhile too). A split step (`run_split`) runs exactly the runner's split path: the
//! same forward and head plans on the same inputs, so its results are that path's bit for bit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use poot_core::Deadline;
use poot_engine::{StepDims, StepSampling};
use poot_runtime::{CompiledPlan, HostTensor, Runtime};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::runtime_error;
use crate::gil::without_gil;
use crate::runtime::{host_tensor, PyPlan};
use crate::step_io::{rows_of, run_masked, sampling_inputs, MASK_INPUT};
pub(crate) use crate::step_python::Mask;
use crate::step_python::{run_python, run_python_beside};

/// A plan's step shape, as `poot.models.step.StepShape`'s fields in order:
/// `(tokens, seqs, max_blocks, kind, adjust, masked, logprobs)`.
pub(crate) type PlanKey = (usize, usize, usize, String, usize, bool, usize);

/// A plan as Python holds it, and the compiled plan inside when it is a native `Plan`.
pub(crate) type PlanPair = (Py<PyAny>, Option<Arc<dyn CompiledPlan>>);

#[derive(Debug)]
struct CachedPlan {
    obj: Py<PyAny>,
    native: Option<Arc<dyn CompiledPlan>>,
    last_use: u64,
    uses: u64,
}

/// The plans a driver holds, with their hits since the last miss (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StepPlans {
    plans: HashMap<PlanKey, CachedPlan>,
    clock: u64,
}

impl StepPlans {
    pub(crate) fn len(&self) -> usize {
        self.plans.len()
    }

    pub(crate) fn clear(&mut self) {
        self.plans.clear();
    }

    pub(crate) fn forget(&mut self, key: &PlanKey) {
        self.plans.remove(key);
    }

    /// The keys held, sorted.
    pub(crate) fn keys(&self) -> Vec<PlanKey> {
        let mut keys: Vec<_> = self.plans.keys().cloned().collect();
        keys.sort_unstable();
        keys
    }

    /// The hits since the last call (`[(key, hits)]`, least recent first), then forgotten.
    pub(crate) fn drain_uses(&mut self) -> Vec<(PlanKey, u64)> {
        let mut used: Vec<(u64, PlanKey, u64)> = self
            .plans
            .iter()
            .filter(|(_, p)| p.uses > 0)
            .map(|(k, p)| (p.last_use, k.clone(), p.uses))
            .collect();
        used.sort_unstable();
        for p in self.plans.values_mut() {
            p.uses = 0;
        }
        used.into_iter().map(|(_, k, n)| (k, n)).collect()
    }

    /// The plan for `key`: held, or from `plan_for(key, uses) -> (plan, held_keys)`.
    pub(crate) fn get(
        &mut self,
        py: Python<'_>,
        key: PlanKey,
        plan_for: &Bound<'_, PyAny>,
    ) -> PyResult<PlanPair> {
        self.clock += 1;
        if let Some(p) = self.plans.get_mut(&key) {
            p.last_use = self.clock;
            p.uses += 1;
            return Ok((p.obj.clone_ref(py), p.native.clone()));
        }
        let uses = self.drain_uses();
        let got = plan_for.call1((key.clone(), uses))?;
        let (obj, held): (Bound<'_, PyAny>, Vec<PlanKey>) = got.extract()?;
        self.plans.retain(|k, _| held.contains(k));
        let native = obj.downcast::<PyPlan>().ok().map(|p| p.get().inner.clone());
        if held.contains(&key) {
            let cached = CachedPlan {
                obj: obj.clone().unbind(),
                native: native.clone(),
                last_use: self.clock,
                uses: 0,
            };
            self.plans.insert(key, cached);
        }
        Ok((obj.unbind(), native))
    }
}

/// Where a step runs: the runtime object, the Rust runtime behind it (None for a Python
/// runtime) and each run's deadline.
pub(crate) struct Target<'a> {
    pub(crate) runtime: &'a Py<PyAny>,
    pub(crate) native: Option<&'a Arc<dyn Runtime>>,
    pub(crate) timeout_s: f64,
}

/// Runs `plan` on `inputs` (see the module docs).
pub(crate) fn run_plan(
    py: Python<'_>,
    target: Target<'_>,
    (plan_obj, plan): PlanPair,
    inputs: Vec<(&'static str, HostTensor)>,
    mask: Option<Mask<'_, '_>>,
) -> PyResult<Vec<(String, HostTensor)>> {
    match (target.native, plan) {
        (Some(rt), Some(plan)) => match mask {
            Some(m) => run_masked(
                py,
                m.fill,
                target.timeout_s,
                rt.clone(),
                plan,
                inputs,
                m.rows,
                m.seqs,
            ),
            None => {
                let rt = rt.clone();
                let deadline = Deadline::after(Duration::from_secs_f64(target.timeout_s));
                without_gil(py, move || rt.run(plan.as_ref(), &inputs, deadline))?
                    .map_err(|e| runtime_error(py, e))
            }
        },
        _ => match mask {
            Some(m) => {
                let rt = target.runtime;
                run_python_beside(py, rt, plan_obj, inputs, target.timeout_s, m, true)
                    .map(|(outs, _)| outs)
            }
            None => run_python(py, target.runtime, plan_obj, inputs, target.timeout_s),
        },
    }
}

/// A split step's shape: its padded dims, whether it brings every token's logits back
/// (prompt logprobs), its logprob width, its `last_rows` and its sampling inputs.
pub(crate) struct SplitStep<'a> {
    pub(crate) dims: StepDims,
    pub(crate) every: bool,
    pub(crate) width: usize,
    pub(crate) last_rows: &'a [i32],
    pub(crate) sampling: &'a StepSampling,
}

/// The sampling inputs an `all_logits` step's own (plain) head reads.
const PLAIN: [&str; 5] = ["temperature", "top_k", "top_p", "min_p", "uniform"];

/// A step whose sampling needs logit ops the runtime (`targets[0]`) lacks: its forward pass
/// there as a `logits` step (`all_logits` when `every`; the mask filled meanwhile), then its
/// sampling step on the host runtime (`targets[1]`) as a `head` plan, keyed
/// `(vocab, seqs, 0, "head", adjust, masked, logprobs)`, with the logits as an input.
/// Returns the head's outputs, and the forward's `all_logits` when `every`.
pub(crate) fn run_split(
    py: Python<'_>,
    plans: &mut StepPlans,
    plan_for: &Bound<'_, PyAny>,
    [device, host]: [Target<'_>; 2],
    step: SplitStep<'_>,
    mut layout: Vec<(&'static str, HostTensor)>,
    mask: Option<Mask<'_, '_>>,
) -> PyResult<Vec<(String, HostTensor)>> {
    let d = step.dims;
    let kind = if step.every { "all_logits" } else { "logits" };
    let key = (
        d.tokens,
        d.seqs,
        d.max_blocks,
        kind.to_string(),
        0,
        false,
        0,
    );
    let mut head_inputs = sampling_inputs(step.sampling);
    if step.every {
        let plain = head_inputs
            .iter()
            .filter(|(n, _)| PLAIN.contains(n))
            .cloned();
        layout.extend(plain);
    }
    let forward = plans.get(py, key, plan_for)?;
    let masked = mask.is_some();
    let (mut outs, mask): (Vec<(String, HostTensor)>, Option<HostTensor>) = match mask {
        Some(m) => {
            let (outs, t) = run_beside(py, device, forward, layout, m)?;
            (outs, Some(t))
        }
        None => (run_plan(py, device, forward, layout, None)?, None),
    };
    let name = if step.every { "all_logits" } else { "logits" };
    let i = outs.iter().position(|(n, _)| n == name);
    let forward_out = i
        .map(|i| outs.swap_remove(i).1)
        .ok_or_else(|| PyRuntimeError::new_err(format!("the forward plan output no {name}")))?;
    let (logits, every) = if step.every {
        let rows: Vec<usize> = step.last_rows.iter().map(|&r| r as usize).collect();
        (rows_of(&forward_out, &rows)?, Some(forward_out))
    } else {
        (forward_out, None)
    };
    let vocab = match &logits {
        HostTensor::F32 { shape, .. } if shape.len() == 2 => shape[1],
        _ => {
            return Err(PyRuntimeError::new_err(
                "the forward plan's logits are not f32 2-D",
            ))
        }
    };
    head_inputs.push(("logits", logits));
    if let Some(t) = mask {
        head_inputs.push((MASK_INPUT, t));
    }
    let s = step.sampling;
    let key = (
        vocab,
        d.seqs,
        0,
        "head".to_string(),
        s.adjust,
        masked,
        step.width,
    );
    let head = plans.get(py, key, plan_for)?;
    let mut out = run_plan(py, host, head, head_inputs, None)?;
    if let Some(all) = every {
        out.push(("all_logits".to_string(), all));
    }
    Ok(out)
}

/// Runs `plan` on a thread while `mask.fill` computes the token mask here (an ordinary input
/// of the step after this one); a failed mask is raised once the run has ended.
fn run_beside(
    py: Python<'_>,
    target: Target<'_>,
    (plan_obj, plan): PlanPair,
    inputs: Vec<(&'static str, HostTensor)>,
    mask: Mask<'_, '_>,
) -> PyResult<(Vec<(String, HostTensor)>, HostTensor)> {
    let (Some(rt), Some(plan)) = (target.native, plan) else {
        let rt = target.runtime;
        return run_python_beside(py, rt, plan_obj, inputs, target.timeout_s, mask, false);
    };
    let rt = rt.clone();
    let deadline = Deadline::after(Duration::from_secs_f64(target.timeout_s));
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || rt.run(plan.as_ref(), &inputs, deadline));
        let filled = mask
            .fill
            .call1((mask.rows, mask.seqs))
            .and_then(|m| host_tensor(py, MASK_INPUT, &m));
        let ran = py
            .allow_threads(move || handle.join())
            .map_err(|_| PyRuntimeError::new_err("the step's run panicked"))?;
        let t = filled?;
        py.check_signals()?;
        Ok((ran.map_err(|e| runtime_error(py, e))?, t))
    })
}
