//! The step driver's conversions and its masked run: runtime objects, numpy's generator
//! state, a step's inputs as host tensors and numpy arrays, what a run brings back, and a run
//! whose token mask the host fills while it goes on.
//!
//! Invariant: the inputs are exactly the step-graph contract's (`poot.models.step`), named and
//! shaped as the Python runner lays them out, so a plan compiled by either path runs here.

use std::sync::Arc;
use std::time::Duration;

use numpy::{IntoPyArray, PyArray1, PyArrayMethods};
use poot_core::Deadline;
use poot_engine::{FlatStep, Pcg64, SchedulerOutput, StepDims, StepSampling};
use poot_runtime::{CompiledPlan, HostTensor, LateInput, Runtime};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::runtime_error;
use crate::runtime::{host_tensor, to_numpy, PyCpuRuntime};

/// The step graph's late input (`poot.models.step.MASK_INPUT`).
pub(crate) const MASK_INPUT: &str = "token_mask";

/// The Rust runtime behind a native runtime object; None for a Python runtime.
pub(crate) fn native_runtime(obj: &Bound<'_, PyAny>) -> Option<Arc<dyn Runtime>> {
    if let Ok(r) = obj.downcast::<PyCpuRuntime>() {
        return Some(r.get().dyn_rt());
    }
    if let Ok(r) = obj.downcast::<crate::wgpu::PyWgpuRuntime>() {
        return Some(r.get().dyn_rt());
    }
    if let Ok(r) = obj.downcast::<crate::cuda::PyCudaRuntime>() {
        return Some(r.get().dyn_rt());
    }
    None
}

/// A runtime object and the Rust runtime behind it.
pub(crate) type NativeRuntime = (Py<PyAny>, Arc<dyn Runtime>);

/// The native runtime behind `host_runtime`, refused when it is not one.
pub(crate) fn host_of(
    py: Python<'_>,
    host_runtime: Option<Py<PyAny>>,
) -> PyResult<Option<NativeRuntime>> {
    let Some(obj) = host_runtime else {
        return Ok(None);
    };
    match native_runtime(obj.bind(py)) {
        Some(rt) => Ok(Some((obj, rt))),
        None => Err(PyValueError::new_err(
            "host_runtime must be a native runtime (a CpuRuntime)",
        )),
    }
}

/// A numpy `bit_generator.state` of `PCG64` as the driver's generator.
pub(crate) fn pcg64_of(state: &Bound<'_, PyDict>) -> PyResult<Pcg64> {
    let bad = || PyValueError::new_err("rng_state must be a numpy PCG64 bit_generator.state");
    let kind: String = state
        .get_item("bit_generator")?
        .ok_or_else(bad)?
        .extract()?;
    if kind != "PCG64" {
        return Err(PyValueError::new_err(format!(
            "the driver continues numpy's PCG64 stream only, got {kind}"
        )));
    }
    let inner = state.get_item("state")?.ok_or_else(bad)?;
    let inner = inner.downcast::<PyDict>()?;
    let s: u128 = inner.get_item("state")?.ok_or_else(bad)?.extract()?;
    let inc: u128 = inner.get_item("inc")?.ok_or_else(bad)?.extract()?;
    let has: i64 = state.get_item("has_uint32")?.ok_or_else(bad)?.extract()?;
    let u: u32 = state.get_item("uinteger")?.ok_or_else(bad)?.extract()?;
    Ok(Pcg64::from_numpy_state(s, inc, has != 0, u))
}

fn i32_tensor(shape: Vec<usize>, data: Vec<i32>) -> HostTensor {
    HostTensor::I32 { shape, data }
}

fn f32_tensor(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
    HostTensor::F32 { shape, data }
}

/// The step graph's layout inputs (`poot.models.step`); a sample step adds its sampling
/// inputs (`sampling_inputs`).
pub(crate) fn layout_inputs(flat: FlatStep) -> Vec<(&'static str, HostTensor)> {
    let d = flat.dims;
    let mut v = vec![
        ("ids", i32_tensor(vec![d.tokens], flat.ids)),
        ("positions", i32_tensor(vec![d.tokens], flat.positions)),
        (
            "slot_mapping",
            i32_tensor(vec![d.tokens], flat.slot_mapping),
        ),
        ("token_seq", i32_tensor(vec![d.tokens], flat.token_seq)),
        (
            "block_tables",
            i32_tensor(vec![d.seqs, d.max_blocks], flat.block_tables),
        ),
        ("last_rows", i32_tensor(vec![d.seqs], flat.last_rows)),
    ];
    if !flat.window_block_tables.is_empty() {
        v.push((
            "window_slot_mapping",
            i32_tensor(vec![d.tokens], flat.window_slot_mapping),
        ));
        v.push((
            "window_block_tables",
            i32_tensor(vec![d.seqs, d.max_blocks], flat.window_block_tables),
        ));
    }
    v
}

pub(crate) fn sampling_inputs(s: &StepSampling) -> Vec<(&'static str, HostTensor)> {
    let n = vec![s.seqs];
    let mut v = vec![
        ("temperature", f32_tensor(n.clone(), s.temperature.clone())),
        ("top_k", i32_tensor(n.clone(), s.top_k.clone())),
        ("top_p", f32_tensor(n.clone(), s.top_p.clone())),
        ("min_p", f32_tensor(n.clone(), s.min_p.clone())),
        ("uniform", f32_tensor(n.clone(), s.uniform.clone())),
    ];
    if s.adjust > 0 {
        let w = vec![s.seqs, s.adjust];
        v.extend([
            ("adj_ids", i32_tensor(w.clone(), s.adj_ids.clone())),
            ("adj_counts", i32_tensor(w.clone(), s.adj_counts.clone())),
            ("adj_bias", f32_tensor(w, s.adj_bias.clone())),
            ("repetition", f32_tensor(n.clone(), s.repetition.clone())),
            ("presence", f32_tensor(n.clone(), s.presence.clone())),
            ("frequency", f32_tensor(n, s.frequency.clone())),
        ]);
    }
    v
}

pub(crate) fn tensor_dict<'py>(
    py: Python<'py>,
    named: Vec<(&'static str, HostTensor)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, t) in named {
        d.set_item(name, to_numpy(py, t)?)?;
    }
    Ok(d)
}

/// What a run brings back, rows trimmed: token ids, the logprob pair when asked, and an
/// `all_logits` step's every token's logits (untrimmed).
pub(crate) struct RunOutputs {
    pub(crate) token_ids: Vec<i32>,
    pub(crate) logprobs: Option<(HostTensor, HostTensor)>,
    pub(crate) all_logits: Option<HostTensor>,
}

impl RunOutputs {
    pub(crate) fn from_named(mut outs: Vec<(String, HostTensor)>, rows: usize) -> PyResult<Self> {
        let ids = take(&mut outs, "token_ids")
            .ok_or_else(|| PyRuntimeError::new_err("the step plan output no token_ids"))?;
        let token_ids = match ids {
            HostTensor::I32 { data, .. } => data.into_iter().take(rows).collect(),
            HostTensor::F32 { .. } => {
                return Err(PyRuntimeError::new_err("token_ids came back as float32"));
            }
        };
        let logprobs = match (take(&mut outs, "logprob_ids"), take(&mut outs, "logprobs")) {
            (Some(a), Some(b)) => Some((trim(a, rows), trim(b, rows))),
            _ => None,
        };
        let all_logits = take(&mut outs, "all_logits");
        Ok(Self {
            token_ids,
            logprobs,
            all_logits,
        })
    }

    /// One row's token, chosen on the host (no logprobs).
    pub(crate) fn argmax(token: i32) -> Self {
        Self {
            token_ids: vec![token],
            logprobs: None,
            all_logits: None,
        }
    }
}

fn take(outs: &mut Vec<(String, HostTensor)>, name: &str) -> Option<HostTensor> {
    outs.iter()
        .position(|(n, _)| n == name)
        .map(|i| outs.swap_remove(i).1)
}

/// The index of the largest value, as numpy's `argmax`: the first of equal maxima, and the
/// first NaN if there is one.
pub(crate) fn argmax(data: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in data.iter().enumerate() {
        if v.is_nan() {
            return i as i32;
        }
        if v > data[best] {
            best = i;
        }
    }
    best as i32
}

/// Row `i` of the float32 `[rows, n]` output `name`.
pub(crate) fn row_of(
    mut outs: Vec<(String, HostTensor)>,
    name: &str,
    i: usize,
) -> PyResult<Vec<f32>> {
    let missing = || PyRuntimeError::new_err(format!("the step plan output no float32 {name}"));
    match take(&mut outs, name).ok_or_else(missing)? {
        HostTensor::F32 { shape, data } if shape.len() == 2 && i < shape[0] => {
            let n = shape[1];
            Ok(data[i * n..(i + 1) * n].to_vec())
        }
        _ => Err(missing()),
    }
}

/// Rows `js` of a float32 `[rows, n]` tensor, as `[js.len(), n]`.
pub(crate) fn rows_of(t: &HostTensor, js: &[usize]) -> PyResult<HostTensor> {
    let bad = || PyRuntimeError::new_err("all_logits came back with the wrong shape or type");
    let HostTensor::F32 { shape, data } = t else {
        return Err(bad());
    };
    let (rows, n) = match shape[..] {
        [rows, n] => (rows, n),
        _ => return Err(bad()),
    };
    let mut out = Vec::with_capacity(js.len() * n);
    for &j in js {
        if j >= rows {
            return Err(bad());
        }
        out.extend_from_slice(&data[j * n..(j + 1) * n]);
    }
    Ok(f32_tensor(vec![js.len(), n], out))
}

/// The first `rows` rows of a `[seqs, k]` tensor.
pub(crate) fn trim(t: HostTensor, rows: usize) -> HostTensor {
    match t {
        HostTensor::I32 { shape, data } => {
            let k = shape.get(1).copied().unwrap_or(1);
            i32_tensor(vec![rows, k], data.into_iter().take(rows * k).collect())
        }
        HostTensor::F32 { shape, data } => {
            let k = shape.get(1).copied().unwrap_or(1);
            f32_tensor(vec![rows, k], data.into_iter().take(rows * k).collect())
        }
    }
}

/// A step's layout as the step graph's int32 inputs (numpy).
pub(crate) fn layout_dict<'py>(py: Python<'py>, f: FlatStep) -> PyResult<Bound<'py, PyDict>> {
    let dims = f.dims;
    let inputs = PyDict::new(py);
    inputs.set_item("ids", f.ids.into_pyarray(py))?;
    inputs.set_item("positions", f.positions.into_pyarray(py))?;
    inputs.set_item("slot_mapping", f.slot_mapping.into_pyarray(py))?;
    inputs.set_item("token_seq", f.token_seq.into_pyarray(py))?;
    let tables: Bound<'py, PyArray1<i32>> = f.block_tables.into_pyarray(py);
    inputs.set_item(
        "block_tables",
        tables.reshape([dims.seqs, dims.max_blocks])?,
    )?;
    inputs.set_item("last_rows", f.last_rows.into_pyarray(py))?;
    if !f.window_block_tables.is_empty() {
        inputs.set_item(
            "window_slot_mapping",
            f.window_slot_mapping.into_pyarray(py),
        )?;
        let tables: Bound<'py, PyArray1<i32>> = f.window_block_tables.into_pyarray(py);
        inputs.set_item(
            "window_block_tables",
            tables.reshape([dims.seqs, dims.max_blocks])?,
        )?;
    }
    Ok(inputs)
}

/// Runs a masked step on a thread while `fill_mask(rows, seqs)` computes its token mask
/// here (a late input); a failed mask fails the slot, and its own error is raised once the
/// run has ended.
#[allow(clippy::too_many_arguments)] // one run's parts, the mask's callback and its rows
pub(crate) fn run_masked(
    py: Python<'_>,
    fill: &Bound<'_, PyAny>,
    timeout_s: f64,
    rt: Arc<dyn Runtime>,
    plan: Arc<dyn CompiledPlan>,
    inputs: Vec<(&'static str, HostTensor)>,
    mask_rows: Vec<(usize, u64)>,
    seqs: usize,
) -> PyResult<Vec<(String, HostTensor)>> {
    let slot = LateInput::new();
    let deadline = Deadline::after(Duration::from_secs_f64(timeout_s));
    std::thread::scope(|scope| {
        let run_slot = slot.clone();
        let handle = scope.spawn(move || {
            rt.run_late(plan.as_ref(), &inputs, &[(MASK_INPUT, run_slot)], deadline)
        });
        let mask = fill
            .call1((mask_rows, seqs))
            .and_then(|m| host_tensor(py, MASK_INPUT, &m));
        let mask_error = match mask {
            Ok(t) => {
                slot.fill(t);
                None
            }
            Err(e) => {
                slot.fail(format!("the token mask was not computed: {e}"));
                Some(e)
            }
        };
        let ran = py
            .allow_threads(move || handle.join())
            .map_err(|_| PyRuntimeError::new_err("the step's run panicked"))?;
        if let Some(e) = mask_error {
            return Err(e);
        }
        py.check_signals()?;
        ran.map_err(|e| runtime_error(py, e))
    })
}

/// A planned step's rows as a dict: `request_ids`, `row_tokens`, `sample`, `preempted`,
/// `num_tokens`, `num_cached_tokens` and `dims` (`(tokens, seqs, max_blocks)`, padded).
pub(crate) fn plan_dict<'py>(
    py: Python<'py>,
    out: &SchedulerOutput,
    dims: StepDims,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let seqs = &out.seqs;
    d.set_item(
        "request_ids",
        seqs.iter().map(|s| s.request_id.0).collect::<Vec<_>>(),
    )?;
    d.set_item(
        "row_tokens",
        seqs.iter().map(|s| s.num_tokens()).collect::<Vec<_>>(),
    )?;
    d.set_item("sample", seqs.iter().map(|s| s.sample).collect::<Vec<_>>())?;
    d.set_item(
        "preempted",
        out.preempted.iter().map(|r| r.0).collect::<Vec<_>>(),
    )?;
    d.set_item("num_tokens", out.num_tokens)?;
    d.set_item("num_cached_tokens", out.num_cached_tokens)?;
    d.set_item("dims", (dims.tokens, dims.seqs, dims.max_blocks))?;
    Ok(d)
}

/// A run step's outputs into `d`: `token_ids`, `logprob_ids` / `logprobs` (numpy, or None)
/// and `logits` (the asked row's, or None).
pub(crate) fn put_outputs(
    d: &Bound<'_, PyDict>,
    outs: RunOutputs,
    logits: Option<Vec<f32>>,
) -> PyResult<()> {
    let py = d.py();
    d.set_item("token_ids", outs.token_ids)?;
    let (ids, lps) = match outs.logprobs {
        Some((ids, lps)) => (Some(to_numpy(py, ids)?), Some(to_numpy(py, lps)?)),
        None => (None, None),
    };
    d.set_item("logprob_ids", ids)?;
    d.set_item("logprobs", lps)?;
    d.set_item("logits", logits.map(|x| x.into_pyarray(py)))
}
