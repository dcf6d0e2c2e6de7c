//! The `Tracer` class's state and its `Value`s, and the one path every traced call takes: its
//! operands' ids checked, then one call to `poot_graph::Tracer`, then the new value wrapped.
//!
//! Invariants: a `Value` belongs to the tracer that made it; passing it to another tracer is a
//! `TraceError` (kind `"bad_value"`), never a silent mix-up of ids. A finished tracer refuses
//! every call (kind `"finished"`). A refused call leaves the trace unchanged (the graph tracer
//! checks before it records).

use std::sync::atomic::{AtomicU64, Ordering};

use poot_graph::{Tracer, ValueId, ValueInfo};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::{trace_error, trace_error_kind};

/// A value in a trace: its id, dtype and shape. Only the tracer that made it accepts it.
#[pyclass(name = "Value", module = "poot._native", frozen)]
#[derive(Clone, Debug)]
pub struct PyValue {
    trace: u64,
    #[pyo3(get)]
    id: u32,
    #[pyo3(get)]
    dtype: &'static str,
    shape: Vec<usize>,
}

#[pymethods]
impl PyValue {
    /// Row-major shape, outermost first.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    fn __repr__(&self) -> String {
        format!("Value(%{}: {}{:?})", self.id, self.dtype, self.shape)
    }
}

static NEXT_TRACE: AtomicU64 = AtomicU64::new(1);

/// Records one step's graph; every call checks operands and the `TraceLimits` budget.
#[pyclass(name = "Tracer", module = "poot._native")]
pub struct PyTracer {
    id: u64,
    inner: Option<Tracer>,
}

impl std::fmt::Debug for PyTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("id", &self.id)
            .field("inner", &self.inner)
            .finish()
    }
}

impl PyTracer {
    /// A tracer over `inner`, with an id no other tracer of this process has.
    pub(crate) fn new(inner: Tracer) -> Self {
        PyTracer {
            id: NEXT_TRACE.fetch_add(1, Ordering::Relaxed),
            inner: Some(inner),
        }
    }

    /// The trace recorded so far; the tracer accepts no further calls.
    pub(crate) fn take(&mut self, py: Python<'_>) -> PyResult<Tracer> {
        self.tracer(py)?;
        Ok(self.inner.take().expect("checked above"))
    }

    pub(crate) fn tracer(&mut self, py: Python<'_>) -> PyResult<&mut Tracer> {
        self.inner.as_mut().ok_or_else(|| {
            trace_error_kind(
                py,
                "finished",
                None,
                None,
                "the tracer is finished; start a new one".into(),
            )
        })
    }

    pub(crate) fn vid(&self, py: Python<'_>, v: &PyValue) -> PyResult<ValueId> {
        if v.trace != self.id {
            return Err(trace_error_kind(
                py,
                "bad_value",
                None,
                None,
                format!("value %{} belongs to another tracer", v.id),
            ));
        }
        Ok(ValueId(v.id))
    }

    pub(crate) fn value(&self, id: ValueId, info: &ValueInfo) -> PyValue {
        PyValue {
            trace: self.id,
            id: id.0,
            dtype: info.dtype.name(),
            shape: info.shape.clone(),
        }
    }

    /// Runs one tracer call and wraps the new value.
    pub(crate) fn rec(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut Tracer) -> Result<ValueId, poot_graph::TraceError>,
    ) -> PyResult<PyValue> {
        let t = self.tracer(py)?;
        let id = f(t).map_err(|e| trace_error(py, e))?;
        let info = t.info(id).map_err(|e| trace_error(py, e))?.clone();
        Ok(self.value(id, &info))
    }

    pub(crate) fn unary_op(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        f: fn(&mut Tracer, ValueId) -> Result<ValueId, poot_graph::TraceError>,
    ) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        self.rec(py, |t| f(t, x))
    }

    pub(crate) fn binary_op(
        &mut self,
        py: Python<'_>,
        a: &PyValue,
        b: &PyValue,
        f: fn(&mut Tracer, ValueId, ValueId) -> Result<ValueId, poot_graph::TraceError>,
    ) -> PyResult<PyValue> {
        let (a, b) = (self.vid(py, a)?, self.vid(py, b)?);
        self.rec(py, |t| f(t, a, b))
    }
}
