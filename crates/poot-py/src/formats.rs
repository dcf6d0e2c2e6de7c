//! Python classes over poot-formats: `TensorInfo`, `GgufFile`, `SafetensorsFile`,
//! `SafetensorsModel`.
//!
//! Invariants: opening a file maps and parses it with the GIL released; the Python objects own
//! the mapped files, so nothing is copied until a caller asks for values. Metadata converts to
//! plain Python values (ints, floats, bools, strs, nested lists) in file order; a large array
//! (a 150k-token vocabulary) becomes one list built straight from the stored values, and only
//! when asked for: `metadata(max_array_len=...)` leaves such arrays out, `array_len` counts one
//! without converting it, so a loaded model need not hold a Python copy of its vocabulary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use poot_formats::{
    FormatError, GgufFile, MetaArray, MetaValue, SafetensorsFile, SafetensorsModel, TensorInfo,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use crate::errors::format_error;
use crate::gil::without_gil;

/// Registers the classes of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTensorInfo>()?;
    m.add_class::<PyGgufFile>()?;
    m.add_class::<PySafetensorsFile>()?;
    m.add_class::<PySafetensorsModel>()?;
    Ok(())
}

/// Opens with the GIL released and maps the error to `poot.errors`.
fn open_with<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, FormatError> + Send,
) -> PyResult<T> {
    without_gil(py, f)?.map_err(|e| format_error(py, e))
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// One tensor of a checkpoint: where its stored bytes are and how to read them.
#[pyclass(name = "TensorInfo", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PyTensorInfo {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    dtype: &'static str,
    shape: Vec<u64>,
    #[pyo3(get)]
    offset: u64,
    #[pyo3(get)]
    nbytes: u64,
    #[pyo3(get)]
    n_elements: u64,
    #[pyo3(get)]
    file: String,
}

impl PyTensorInfo {
    fn new(t: &TensorInfo, file: &Path) -> Self {
        PyTensorInfo {
            name: t.name.clone(),
            dtype: t.dtype.name(),
            shape: t.shape.clone(),
            offset: t.offset,
            nbytes: t.nbytes,
            n_elements: t.n_elements(),
            file: path_str(file),
        }
    }
}

#[pymethods]
impl PyTensorInfo {
    /// Row-major shape, outermost dimension first.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    fn __repr__(&self) -> String {
        format!(
            "TensorInfo(name={:?}, dtype={:?}, shape={:?}, offset={}, nbytes={})",
            self.name, self.dtype, self.shape, self.offset, self.nbytes
        )
    }
}

fn tensor_list<'py, 'a>(
    py: Python<'py>,
    items: impl Iterator<Item = (&'a Path, &'a TensorInfo)>,
) -> PyResult<Bound<'py, PyList>> {
    let infos: Vec<PyTensorInfo> = items.map(|(f, t)| PyTensorInfo::new(t, f)).collect();
    PyList::new(py, infos)
}

/// A metadata value as a plain Python object.
fn meta_to_py<'py>(py: Python<'py>, v: &MetaValue) -> PyResult<Bound<'py, PyAny>> {
    match v {
        MetaValue::U8(x) => x.into_bound_py_any(py),
        MetaValue::I8(x) => x.into_bound_py_any(py),
        MetaValue::U16(x) => x.into_bound_py_any(py),
        MetaValue::I16(x) => x.into_bound_py_any(py),
        MetaValue::U32(x) => x.into_bound_py_any(py),
        MetaValue::I32(x) => x.into_bound_py_any(py),
        MetaValue::U64(x) => x.into_bound_py_any(py),
        MetaValue::I64(x) => x.into_bound_py_any(py),
        MetaValue::F32(x) => f64::from(*x).into_bound_py_any(py),
        MetaValue::F64(x) => x.into_bound_py_any(py),
        MetaValue::Bool(x) => x.into_bound_py_any(py),
        MetaValue::String(s) => Ok(PyString::new(py, s).into_any()),
        MetaValue::Array(items) => Ok(array_to_py(py, items)?.into_any()),
    }
}

/// An array as one list, built straight from the stored elements.
fn array_to_py<'py>(py: Python<'py>, a: &MetaArray) -> PyResult<Bound<'py, PyList>> {
    match a {
        MetaArray::U8(v) => PyList::new(py, v),
        MetaArray::I8(v) => PyList::new(py, v),
        MetaArray::U16(v) => PyList::new(py, v),
        MetaArray::I16(v) => PyList::new(py, v),
        MetaArray::U32(v) => PyList::new(py, v),
        MetaArray::I32(v) => PyList::new(py, v),
        MetaArray::F32(v) => PyList::new(py, v.iter().map(|&x| f64::from(x))),
        MetaArray::Bool(v) => PyList::new(py, v),
        MetaArray::String(v) => PyList::new(py, v.iter()),
        MetaArray::Array(v) => {
            let lists = v
                .iter()
                .map(|x| array_to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, lists)
        }
        MetaArray::U64(v) => PyList::new(py, v),
        MetaArray::I64(v) => PyList::new(py, v),
        MetaArray::F64(v) => PyList::new(py, v),
    }
}

/// A GGUF file, mapped read-only; tensors are views into the map.
#[pyclass(name = "GgufFile", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PyGgufFile {
    inner: Arc<GgufFile>,
}

impl PyGgufFile {
    /// The shared file, for weight stores that must outlive this Python object.
    pub(crate) fn shared(&self) -> Arc<GgufFile> {
        Arc::clone(&self.inner)
    }
}

#[pymethods]
impl PyGgufFile {
    #[new]
    fn py_new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = open_with(py, move || GgufFile::open(path))?;
        Ok(PyGgufFile {
            inner: Arc::new(inner),
        })
    }

    /// The path the file was opened with.
    #[getter]
    fn path(&self) -> String {
        path_str(self.inner.path())
    }

    /// GGUF version (2 or 3).
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version()
    }

    /// Data alignment in bytes.
    #[getter]
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    /// Absolute offset of the data section.
    #[getter]
    fn data_offset(&self) -> u64 {
        self.inner.data_offset()
    }

    /// File size in bytes.
    #[getter]
    fn file_size(&self) -> u64 {
        self.inner.file_size()
    }

    /// All metadata as a dict in file order; with `max_array_len`, arrays of more entries than
    /// that are left out (a vocabulary: fetch it with `get` when it is needed).
    #[pyo3(signature = (*, max_array_len = None))]
    fn metadata<'py>(
        &self,
        py: Python<'py>,
        max_array_len: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.metadata() {
            if let (Some(limit), MetaValue::Array(items)) = (max_array_len, v) {
                if items.len() > limit {
                    continue;
                }
            }
            d.set_item(k, meta_to_py(py, v)?)?;
        }
        Ok(d)
    }

    /// Every metadata key, in file order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.metadata().iter().map(|(k, _)| k.as_str()))
    }

    /// The value for `key`, or None when absent.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.inner.get(key) {
            Some(v) => meta_to_py(py, v),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// The number of entries of the array under `key`, without converting it; None when the
    /// key is absent or its value is not an array.
    fn array_len(&self, key: &str) -> Option<usize> {
        self.inner
            .get(key)
            .and_then(MetaValue::as_array)
            .map(MetaArray::len)
    }

    /// The tensors in file order.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let f = self.inner.path();
        tensor_list(py, self.inner.tensors().iter().map(|t| (f, t)))
    }

    fn __repr__(&self) -> String {
        format!(
            "GgufFile({:?}, version={}, tensors={})",
            self.path(),
            self.version(),
            self.inner.tensors().len()
        )
    }
}

fn string_dict<'py>(py: Python<'py>, items: &[(String, String)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in items {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// One safetensors file, mapped read-only; tensors are views into the map.
#[pyclass(name = "SafetensorsFile", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PySafetensorsFile {
    inner: SafetensorsFile,
}

#[pymethods]
impl PySafetensorsFile {
    #[new]
    fn py_new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = open_with(py, move || SafetensorsFile::open(path))?;
        Ok(PySafetensorsFile { inner })
    }

    /// The path the file was opened with.
    #[getter]
    fn path(&self) -> String {
        path_str(self.inner.path())
    }

    /// File size in bytes.
    #[getter]
    fn file_size(&self) -> u64 {
        self.inner.file_size()
    }

    /// Absolute offset of the data section (8 + header length).
    #[getter]
    fn data_offset(&self) -> u64 {
        self.inner.data_offset()
    }

    /// `__metadata__` as a dict in header order.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        string_dict(py, self.inner.metadata())
    }

    /// The tensors in header order.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let f = self.inner.path();
        tensor_list(py, self.inner.tensors().iter().map(|t| (f, t)))
    }

    fn __repr__(&self) -> String {
        format!(
            "SafetensorsFile({:?}, tensors={})",
            self.path(),
            self.inner.tensors().len()
        )
    }
}

/// A checkpoint of one or more safetensors files (a directory, an index JSON, or one file).
#[pyclass(name = "SafetensorsModel", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PySafetensorsModel {
    inner: Arc<SafetensorsModel>,
    /// How its GPTQ/AWQ layers are packed, when the checkpoint's config says so.
    packed: Option<poot_runtime::GptqAwqSpec>,
    /// The re-laid store, built by the first `Weights` over this model and shared by the rest.
    relaid: std::sync::OnceLock<Arc<poot_runtime::GptqAwqWeights>>,
}

impl PySafetensorsModel {
    /// The shared checkpoint, for weight stores that must outlive this Python object.
    pub(crate) fn shared(&self) -> Arc<SafetensorsModel> {
        Arc::clone(&self.inner)
    }

    /// The GPTQ/AWQ packing `Weights` re-lays the layers from, if any.
    pub(crate) fn packed(&self) -> Option<poot_runtime::GptqAwqSpec> {
        self.packed
    }

    /// Where the re-laid store is kept once built (see `Weights`).
    pub(crate) fn relaid(&self) -> &std::sync::OnceLock<Arc<poot_runtime::GptqAwqWeights>> {
        &self.relaid
    }
}

/// `("gptq" | "gptq_v2" | "awq" | "pack-quantized" | "fp8", group_size, bits)` as an [`poot_runtime::GptqAwqSpec`].
fn packed_spec(packed: Option<(String, i64, u8)>) -> PyResult<Option<poot_runtime::GptqAwqSpec>> {
    use poot_core::quant::hf::IntPacking;
    use pyo3::exceptions::PyValueError;
    let Some((packing, group_size, bits)) = packed else {
        return Ok(None);
    };
    if packing == "fp8" {
        return poot_runtime::GptqAwqSpec::fp8(group_size)
            .map(Some)
            .map_err(PyValueError::new_err);
    }
    if packing == "pack-quantized" {
        return poot_runtime::GptqAwqSpec::pack_quantized(group_size, bits)
            .map(Some)
            .map_err(PyValueError::new_err);
    }
    let packing = match packing.as_str() {
        "gptq" => IntPacking::GptqV1,
        "gptq_v2" => IntPacking::GptqV2,
        "awq" => IntPacking::Awq,
        other => {
            return Err(PyValueError::new_err(format!(
                "packing {other:?} is not one of 'gptq', 'gptq_v2', 'awq', 'pack-quantized', 'fp8'"
            )))
        }
    };
    poot_runtime::GptqAwqSpec::new(packing, group_size, bits)
        .map(Some)
        .map_err(PyValueError::new_err)
}

#[pymethods]
impl PySafetensorsModel {
    /// `packed`: `(packing, group_size, bits)` for a GPTQ/AWQ checkpoint; `Weights` then
    /// re-lays its quantized layers (nothing is read here).
    #[new]
    #[pyo3(signature = (path, *, packed=None))]
    fn py_new(py: Python<'_>, path: PathBuf, packed: Option<(String, i64, u8)>) -> PyResult<Self> {
        let packed = packed_spec(packed)?;
        let inner = open_with(py, move || SafetensorsModel::open(path))?;
        Ok(PySafetensorsModel {
            inner: Arc::new(inner),
            packed,
            relaid: std::sync::OnceLock::new(),
        })
    }

    /// The files' paths, in shard order.
    #[getter]
    fn files(&self) -> Vec<String> {
        self.inner
            .files()
            .iter()
            .map(|f| path_str(f.path()))
            .collect()
    }

    /// The index file's path, when opened through one.
    #[getter]
    fn index_path(&self) -> Option<String> {
        self.inner.index_path().map(path_str)
    }

    /// Every tensor, in file order then header order; `TensorInfo.file` names its shard.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        tensor_list(py, self.inner.tensors().map(|(f, t)| (f.path(), t)))
    }

    /// `__metadata__` of all files merged; the first file to set a key wins.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        string_dict(py, &self.inner.metadata())
    }

    fn __repr__(&self) -> String {
        format!(
            "SafetensorsModel(files={}, tensors={})",
            self.inner.files().len(),
            self.inner.tensors().count()
        )
    }
}
