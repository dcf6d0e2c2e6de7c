//! `WgpuTensor`: an output of `WgpuRuntime.run_on_device`, left in its device buffer.
//!
//! Invariants: the class exists in every build (like `WgpuRuntime`); only a wgpu build makes
//! one. `to_numpy` is the only way its values reach the host (one bounded readback per call,
//! GIL released); nothing copies it implicitly. It keeps its runtime alive, and reading it on
//! a poisoned runtime is the runtime's `Poisoned` error. Given back to `run_on_device` of the
//! runtime that made it, it is bound as that input's buffer (no readback, no upload); another
//! runtime's is a `ValueError` before anything runs.

use std::sync::Arc;

#[cfg(not(feature = "wgpu"))]
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[cfg(feature = "wgpu")]
use crate::errors::runtime_error;
#[cfg(feature = "wgpu")]
use crate::gil::without_gil;
use crate::runtime::PyPlan;

/// A run's output held on the wgpu device; `to_numpy()` copies it to the host.
#[pyclass(name = "WgpuTensor", module = "poot._native", frozen)]
pub struct PyWgpuTensor {
    #[cfg(feature = "wgpu")]
    rt: Arc<poot_wgpu::WgpuRuntime>,
    #[cfg(feature = "wgpu")]
    inner: poot_wgpu::DeviceTensor,
    #[cfg(not(feature = "wgpu"))]
    _never: Arc<()>,
}

impl std::fmt::Debug for PyWgpuTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuTensor").finish()
    }
}

#[cfg(feature = "wgpu")]
#[pymethods]
impl PyWgpuTensor {
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// `"f32"` or `"i32"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        if self.inner.dtype() == poot_core::DType::I32 {
            "i32"
        } else {
            "f32"
        }
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.nbytes()
    }

    /// Copies the values to a new numpy array, waiting at most `timeout_s`.
    #[pyo3(signature = (timeout_s=600.0))]
    fn to_numpy<'py>(&self, py: Python<'py>, timeout_s: f64) -> PyResult<Bound<'py, PyAny>> {
        let deadline = crate::runtime::deadline_of(timeout_s)?;
        let (rt, t) = (self.rt.clone(), self.inner.clone());
        let host =
            without_gil(py, move || rt.read(&t, deadline))?.map_err(|e| runtime_error(py, e))?;
        crate::runtime::to_numpy(py, host)
    }

    fn __repr__(&self) -> String {
        format!(
            "WgpuTensor(shape={:?}, dtype={})",
            self.inner.shape(),
            self.dtype()
        )
    }
}

#[cfg(not(feature = "wgpu"))]
#[pymethods]
impl PyWgpuTensor {}

/// `WgpuRuntime.run_on_device`: a run whose outputs stay on the device.
#[cfg(feature = "wgpu")]
pub(crate) fn run_resident_on<'py>(
    rt: &Arc<poot_wgpu::WgpuRuntime>,
    py: Python<'py>,
    plan: &PyPlan,
    inputs: &Bound<'py, PyDict>,
    timeout_s: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let deadline = crate::runtime::deadline_of(timeout_s)?;
    let mut named = Vec::with_capacity(inputs.len());
    let mut on_device = Vec::new();
    for (k, v) in inputs.iter() {
        let name: String = k.extract()?;
        if let Ok(t) = v.downcast::<PyWgpuTensor>() {
            let t = t.get();
            if !rt.owns(&t.inner) {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "input {name:?} is a WgpuTensor of another WgpuRuntime (another device): \
                     copy it with to_numpy() first"
                )));
            }
            on_device.push((name, t.inner.clone()));
            continue;
        }
        let t = crate::runtime::host_tensor(py, &name, &v)?;
        named.push((name, t));
    }
    let (r, p) = (rt.clone(), plan.inner.clone());
    let outputs = without_gil(py, move || {
        let refs: Vec<(&str, poot_runtime::HostTensor)> =
            named.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let dev: Vec<(&str, poot_wgpu::DeviceTensor)> = on_device
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        r.run_resident_with(p.as_ref(), &refs, &dev, deadline)
    })?
    .map_err(|e| runtime_error(py, e))?;
    let d = PyDict::new(py);
    for (name, t) in outputs {
        let obj = PyWgpuTensor {
            rt: rt.clone(),
            inner: t,
        };
        d.set_item(name, Py::new(py, obj)?)?;
    }
    Ok(d)
}

#[cfg(not(feature = "wgpu"))]
pub(crate) fn run_resident_on<'py>(
    _rt: &Arc<dyn poot_runtime::Runtime>,
    _py: Python<'py>,
    _plan: &PyPlan,
    _inputs: &Bound<'py, PyDict>,
    _timeout_s: f64,
) -> PyResult<Bound<'py, PyDict>> {
    Err(PyValueError::new_err(
        "the wgpu backend is not compiled into this build",
    ))
}
