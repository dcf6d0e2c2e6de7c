//! A step driver's runs on a runtime that is a Python object (the planner's leased, streaming
//! and split runtimes, a test's wrapped runtime): `runtime.run(plan, inputs, timeout_s[,
//! late])`, called back from the driver's one call.
//!
//! Invariants: a masked run gets its mask as the runner's path gives it, a late input
//! (`LateInput` under `token_mask`) filled here while the run goes on in a thread of its own
//! (it takes the GIL for its Python code; this thread releases it while it waits), so the
//! results are that path's bit for bit. A mask that fails fails the slot; the run's error then
//! only says so, and the mask's own error is raised once the run has ended.

use poot_runtime::{HostTensor, LateInput};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::late::PyLateInput;
use crate::runtime::host_tensor;
use crate::step_io::{tensor_dict, MASK_INPUT};

/// A run's outputs as the driver holds them (a Python runtime returns a dict of arrays).
fn named_outputs(py: Python<'_>, got: &Bound<'_, PyAny>) -> PyResult<Vec<(String, HostTensor)>> {
    let got = got.downcast::<PyDict>()?;
    let mut named = Vec::with_capacity(got.len());
    for (k, v) in got.iter() {
        let name: String = k.extract()?;
        let t = host_tensor(py, &name, &v)?;
        named.push((name, t));
    }
    Ok(named)
}

/// Runs `plan` on the Python `runtime`, here.
pub(crate) fn run_python(
    py: Python<'_>,
    runtime: &Py<PyAny>,
    plan: Py<PyAny>,
    inputs: Vec<(&'static str, HostTensor)>,
    timeout_s: f64,
) -> PyResult<Vec<(String, HostTensor)>> {
    let args = (plan, tensor_dict(py, inputs)?, timeout_s);
    let got = runtime.bind(py).call_method1("run", args)?;
    named_outputs(py, &got)
}

/// A masked step's mask: `fill(rows, seqs)` for `rows` = `[(row, request_id)]`.
pub(crate) struct Mask<'a, 'py> {
    pub(crate) fill: &'a Bound<'py, PyAny>,
    pub(crate) rows: Vec<(usize, u64)>,
    pub(crate) seqs: usize,
}

/// Runs `plan` on the Python `runtime` in a thread of its own while `mask.fill` computes the
/// token mask here. `late`: the plan takes the mask as its late input (a masked step);
/// otherwise the mask is only returned (a split step's forward pass, whose host head takes
/// it). Returns the run's outputs and the mask.
pub(crate) fn run_python_beside(
    py: Python<'_>,
    runtime: &Py<PyAny>,
    plan: Py<PyAny>,
    inputs: Vec<(&'static str, HostTensor)>,
    timeout_s: f64,
    mask: Mask<'_, '_>,
    late: bool,
) -> PyResult<(Vec<(String, HostTensor)>, HostTensor)> {
    let slot = LateInput::new();
    let late_dict = if late {
        let d = PyDict::new(py);
        let obj = Py::new(
            py,
            PyLateInput {
                inner: slot.clone(),
            },
        )?;
        d.set_item(MASK_INPUT, obj)?;
        Some(d.unbind())
    } else {
        None
    };
    let inputs = tensor_dict(py, inputs)?.unbind();
    let runtime = runtime.clone_ref(py);
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || {
            Python::with_gil(|py| {
                let rt = runtime.bind(py);
                let got = match late_dict {
                    Some(d) => rt.call_method1("run", (plan, inputs, timeout_s, d))?,
                    None => rt.call_method1("run", (plan, inputs, timeout_s))?,
                };
                named_outputs(py, &got)
            })
        });
        let filled = mask
            .fill
            .call1((mask.rows, mask.seqs))
            .and_then(|m| host_tensor(py, MASK_INPUT, &m));
        match &filled {
            Ok(t) => {
                slot.fill(t.clone());
            }
            Err(e) => {
                slot.fail(format!("the token mask failed: {e}"));
            }
        }
        let ran = py
            .allow_threads(move || handle.join())
            .map_err(|_| PyRuntimeError::new_err("the step's run panicked"))?;
        let t = filled?;
        Ok((ran?, t))
    })
}
