//! `LateInput`: a graph input the host fills while `CpuRuntime.run` already runs.
//!
//! Invariant: the slot settles once (`fill` or `fail`); the run waits for it only when it
//! reaches the input's equation, within the run's deadline (see poot_runtime::LateInput).

use std::time::Duration;

use poot_core::Deadline;
use poot_runtime::LateInput;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::runtime_error;
use crate::gil::without_gil;
use crate::runtime::{host_tensor, to_numpy};

/// Registers the class of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLateInput>()
}

/// A graph input supplied after the run has started (pass it in `run(..., late=...)`).
#[derive(Debug)]
#[pyclass(name = "LateInput", module = "poot._native", frozen)]
pub struct PyLateInput {
    pub(crate) inner: LateInput,
}

#[pymethods]
impl PyLateInput {
    #[new]
    fn py_new() -> Self {
        Self {
            inner: LateInput::new(),
        }
    }

    /// Supplies the tensor (a float32 or int32 numpy array); False if already settled.
    fn fill(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        let t = host_tensor(py, "late input", value)?;
        Ok(self.inner.fill(t))
    }

    /// Tells the waiting run that the input will never come; False if already settled.
    fn fail(&self, reason: &str) -> bool {
        self.inner.fail(reason)
    }

    /// Waits (GIL released) up to `timeout_s` for the tensor; raises what a run would.
    #[pyo3(signature = (timeout_s=600.0))]
    fn wait<'py>(&self, py: Python<'py>, timeout_s: f64) -> PyResult<Bound<'py, PyAny>> {
        if !(timeout_s.is_finite() && timeout_s >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout_s must be finite and >= 0, got {timeout_s}"
            )));
        }
        let slot = self.inner.clone();
        let deadline = Deadline::after(Duration::from_secs_f64(timeout_s));
        let t = without_gil(py, move || slot.wait("late input", deadline))?
            .map_err(|e| runtime_error(py, e))?;
        to_numpy(py, t.as_ref().clone())
    }

    /// True once filled or failed.
    #[getter]
    fn settled(&self) -> bool {
        self.inner.is_settled()
    }
}
