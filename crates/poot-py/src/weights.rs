//! `Weights`: a checkpoint's stored tensors behind one `Arc<dyn WeightStore>`.
//!
//! Invariant: it holds the mapped checkpoint through an `Arc`, so graphs and plans that use it
//! keep the mapping alive after the Python file object is gone; no tensor data is read or copied.

use std::sync::Arc;

use poot_graph::WeightCatalog;
use poot_runtime::{GgufWeights, GptqAwqWeights, SafetensorsWeights, WeightStore};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::formats::{PyGgufFile, PySafetensorsModel};

/// A checkpoint's stored tensors, shared by tracers (shapes and dtypes) and runtimes (bytes).
#[pyclass(name = "Weights", module = "poot._native", frozen)]
pub struct PyWeights {
    pub(crate) store: Arc<dyn WeightStore>,
    pub(crate) catalog: Arc<dyn WeightCatalog>,
    source: String,
}

impl std::fmt::Debug for PyWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("source", &self.source)
            .finish()
    }
}

impl PyWeights {
    fn from_store<S: WeightStore + 'static>(store: S, source: String) -> Self {
        let shared = Arc::new(store);
        let catalog: Arc<dyn WeightCatalog> = shared.clone();
        PyWeights {
            store: shared,
            catalog,
            source,
        }
    }
}

#[pymethods]
impl PyWeights {
    /// The weights of an opened `GgufFile` or `SafetensorsModel` (no data is read or copied,
    /// except a GPTQ/AWQ model's layers, re-laid once as Q4_Z/Q8_Z: `poot_core::quant::hf`).
    #[new]
    fn py_new(source: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(f) = source.downcast::<PyGgufFile>() {
            let file = f.get().shared();
            let name = file.path().to_string_lossy().into_owned();
            return Ok(Self::from_store(GgufWeights::new(file), name));
        }
        if let Ok(m) = source.downcast::<PySafetensorsModel>() {
            let model = m.get().shared();
            let name = model
                .files()
                .first()
                .map(|f| f.path().to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(spec) = m.get().packed() {
                // One re-lay per opened model: the planner and the LLM each build a `Weights`
                // from the same model, and two Q4_Z copies would double its memory.
                let cell = m.get().relaid();
                let store = match cell.get() {
                    Some(store) => Arc::clone(store),
                    None => {
                        let py = source.py();
                        let store = py
                            .allow_threads(move || GptqAwqWeights::new(model, spec))
                            .map_err(|e| crate::errors::gptq_awq_error(py, e))?;
                        Arc::clone(cell.get_or_init(|| Arc::new(store)))
                    }
                };
                let catalog: Arc<dyn WeightCatalog> = store.clone();
                return Ok(PyWeights {
                    store,
                    catalog,
                    source: name,
                });
            }
            return Ok(Self::from_store(SafetensorsWeights::new(model), name));
        }
        Err(PyTypeError::new_err(format!(
            "Weights() takes a GgufFile or a SafetensorsModel, not {}",
            source.get_type().name()?
        )))
    }

    /// Tensors held in memory by Python (name -> C-contiguous numpy array; `dtypes` names a
    /// tensor's dtype where numpy has none, "bf16" for 16-bit words). Nothing is copied: the
    /// store holds each array's buffer, and its owner must not write it while a run reads it.
    #[staticmethod]
    #[pyo3(signature = (arrays, *, dtypes=None))]
    fn from_arrays(
        arrays: &Bound<'_, pyo3::types::PyDict>,
        dtypes: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<Self> {
        let store = crate::arrays::ArrayWeights::from_arrays(arrays, dtypes)?;
        Ok(Self::from_store(store, "<arrays>".into()))
    }

    /// `(dtype, shape)` of a stored tensor, or None when there is no such tensor.
    fn describe<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match self.catalog.describe(name) {
            None => Ok(None),
            Some((dtype, shape)) => {
                let shape = PyTuple::new(py, shape)?;
                Ok(Some(PyTuple::new(
                    py,
                    [dtype.name().into_pyobject(py)?.into_any(), shape.into_any()],
                )?))
            }
        }
    }

    fn __contains__(&self, name: &str) -> bool {
        self.catalog.describe(name).is_some()
    }

    /// Bytes of every stored tensor.
    #[getter]
    fn total_bytes(&self) -> u64 {
        self.store.total_bytes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Weights({:?}, total_bytes={})",
            self.source,
            self.store.total_bytes()
        )
    }
}
