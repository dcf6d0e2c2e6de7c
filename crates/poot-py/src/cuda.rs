//! `CudaRuntime`: the CUDA runtime for Python, and `cuda_devices()` discovery.
//!
//! Invariants: the class exists in every build so the stub and the API are one; without the
//! `cuda` cargo feature its constructor raises `BackendNotCompiledError` and
//! `cuda_devices()` returns an empty list (never a panic). With it, a machine without the
//! NVIDIA driver, NVRTC or a device raises `DeviceUnavailableError` naming what is missing.
//! The shared methods are the ones `CpuRuntime` has (`runtime::*_on`): GIL released, every
//! run bounded by `timeout_s`, and a timeout or sticky CUDA error poisons the runtime
//! (`health()["status"] == "poisoned"`).

use std::sync::Arc;

use poot_runtime::{KvCacheConfig, Runtime, RuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::runtime_error;
use crate::gil::without_gil;
use crate::graph::PyGraph;
use crate::limits::PyCompileLimits;
use crate::runtime::{configure_kv_on, health_of, memory_of, prepare_on, run_on, PyPlan};
use crate::weights::PyWeights;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCudaRuntime>()?;
    m.add_function(wrap_pyfunction!(cuda_devices, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_emulator, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_memory, m)?)?;
    Ok(())
}

/// `(free, total)` bytes of CUDA device `device`'s memory now; what other processes hold is
/// not free. `driver_library` opens that file instead of `libcuda.so.1` (tests:
/// `_cuda_emulator()`). Raises `DeviceUnavailableError` without a driver or device, and
/// `BackendNotCompiledError` without the cuda feature.
#[pyfunction]
#[pyo3(signature = (device=0, driver_library=None))]
fn cuda_memory(
    py: Python<'_>,
    device: i32,
    driver_library: Option<String>,
) -> PyResult<(u64, u64)> {
    #[cfg(feature = "cuda")]
    {
        let path = driver_library.map(std::path::PathBuf::from);
        without_gil(py, || poot_cuda::memory_info(device, path.as_deref()))?
            .map_err(|e| runtime_error(py, e.into()))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, driver_library);
        Err(runtime_error(
            py,
            RuntimeError::NotCompiledIn { backend: "cuda" },
        ))
    }
}

#[cfg(feature = "cuda")]
type Inner = Arc<poot_cuda::CudaRuntime>;
#[cfg(not(feature = "cuda"))]
type Inner = Arc<dyn Runtime>;

/// The CUDA devices the driver sees (empty without a driver or without the cuda feature): a
/// list of `{"ordinal", "name", "compute_capability", "multiprocessors", "total_memory",
/// "driver_version"}`.
#[pyfunction]
fn cuda_devices(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    #[cfg(feature = "cuda")]
    for d in without_gil(py, poot_cuda::devices)? {
        list.append(device_dict(py, &d)?)?;
    }
    Ok(list)
}

#[cfg(feature = "cuda")]
fn device_dict<'py>(py: Python<'py>, d: &poot_cuda::DeviceInfo) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ordinal", d.ordinal)?;
    out.set_item("name", &d.name)?;
    out.set_item(
        "compute_capability",
        format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
    )?;
    out.set_item("multiprocessors", d.multiprocessors)?;
    out.set_item("total_memory", d.total_memory)?;
    out.set_item("driver_version", d.driver_version)?;
    out.set_item(
        "nvrtc_version",
        format!("{}.{}", d.nvrtc_version.0, d.nvrtc_version.1),
    )?;
    Ok(out)
}

/// Tests: builds (once per process; needs a host C++ compiler) the CPU shim library, which
/// also emulates the driver API and NVRTC, and returns its path. `CudaRuntime(...,
/// driver_library=path, nvrtc_library=path)` then runs the runtime's host code with the
/// kernels executed on the CPU (see poot-cuda's `shim` module); it says nothing about a GPU.
#[pyfunction]
#[pyo3(name = "_cuda_emulator")]
fn cuda_emulator(py: Python<'_>) -> PyResult<String> {
    #[cfg(feature = "cuda")]
    return without_gil(py, poot_cuda::shim::Shim::get)?
        .map(|s| s.library().display().to_string())
        .map_err(pyo3::exceptions::PyRuntimeError::new_err);
    #[cfg(not(feature = "cuda"))]
    Err(runtime_error(
        py,
        RuntimeError::NotCompiledIn { backend: "cuda" },
    ))
}

#[cfg(feature = "cuda")]
fn open(
    device: i32,
    timeout_s: f64,
    driver_library: Option<String>,
    nvrtc_library: Option<String>,
) -> Result<Inner, RuntimeError> {
    let options = poot_cuda::CudaOptions {
        device,
        timeout: std::time::Duration::from_secs_f64(timeout_s),
        driver_library: driver_library.map(Into::into),
        nvrtc_library: nvrtc_library.map(Into::into),
        ..poot_cuda::CudaOptions::default()
    };
    Ok(Arc::new(poot_cuda::CudaRuntime::new(options)?))
}

#[cfg(not(feature = "cuda"))]
fn open(
    _device: i32,
    _timeout_s: f64,
    _driver_library: Option<String>,
    _nvrtc_library: Option<String>,
) -> Result<Inner, RuntimeError> {
    Err(RuntimeError::NotCompiledIn { backend: "cuda" })
}

/// The CUDA runtime: kernels from shaders/cuda compiled by NVRTC for one NVIDIA GPU.
#[pyclass(name = "CudaRuntime", module = "poot._native", frozen)]
pub struct PyCudaRuntime {
    inner: Inner,
}

impl std::fmt::Debug for PyCudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime").finish()
    }
}

impl PyCudaRuntime {
    pub(crate) fn dyn_rt(&self) -> Arc<dyn Runtime> {
        self.inner.clone()
    }
}

#[pymethods]
impl PyCudaRuntime {
    /// Opens CUDA device `device` and compiles the kernels for it. `timeout_s` bounds every
    /// device wait (on top of each run's own). `driver_library` / `nvrtc_library` open those
    /// files instead of `libcuda.so.1` and the usual NVRTC names (tests: `_cuda_emulator()`).
    #[new]
    #[pyo3(signature = (device=0, timeout_s=600.0, driver_library=None, nvrtc_library=None))]
    fn py_new(
        py: Python<'_>,
        device: i32,
        timeout_s: f64,
        driver_library: Option<String>,
        nvrtc_library: Option<String>,
    ) -> PyResult<Self> {
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "timeout_s must be finite and > 0, got {timeout_s}"
            )));
        }
        let inner = without_gil(py, move || {
            open(device, timeout_s, driver_library, nvrtc_library)
        })?
        .map_err(|e| runtime_error(py, e))?;
        Ok(Self { inner })
    }

    #[getter]
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// Whether graphs with ops of this kind compile here (see `CpuRuntime.supports`).
    fn supports(&self, op: &str) -> bool {
        self.dyn_rt().supports(op)
    }

    /// Bytes of one KV element in the pool of this backend's runtime under `numerics` (what
    /// `kv_entry_bytes` says once it exists; f32 under either): for sizing pools before the
    /// runtime is built.
    #[staticmethod]
    fn kv_entry_bytes_for(numerics: &str) -> PyResult<u32> {
        crate::runtime::ggml_numerics(numerics)?;
        Ok(poot_runtime::DEFAULT_KV_ENTRY_BYTES)
    }

    /// Bytes of one KV cache element in this runtime's pool (f32).
    #[getter]
    fn kv_entry_bytes(&self) -> u32 {
        self.dyn_rt().kv_entry_bytes()
    }

    /// The device (`cuda_devices()`'s fields; empty without the cuda feature).
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        #[cfg(feature = "cuda")]
        return device_dict(py, self.inner.device());
        #[cfg(not(feature = "cuda"))]
        Ok(PyDict::new(py))
    }

    #[pyo3(signature = (graph, weights, limits=None))]
    fn prepare(
        &self,
        py: Python<'_>,
        graph: &PyGraph,
        weights: &PyWeights,
        limits: Option<&PyCompileLimits>,
    ) -> PyResult<PyPlan> {
        prepare_on(&self.dyn_rt(), py, graph, weights, limits)
    }

    #[pyo3(signature = (*, n_layers, n_kv_heads, head_dim, block_size, num_blocks, windowed_layers=0, windowed_blocks=0))]
    #[allow(clippy::too_many_arguments)] // the pool's shape, one keyword each
    fn configure_kv(
        &self,
        py: Python<'_>,
        n_layers: u32,
        n_kv_heads: u32,
        head_dim: u32,
        block_size: u32,
        num_blocks: u32,
        windowed_layers: u32,
        windowed_blocks: u32,
    ) -> PyResult<()> {
        let cfg = KvCacheConfig {
            n_layers,
            n_kv_heads,
            head_dim,
            block_size,
            num_blocks,
            windowed_layers,
            windowed_blocks,
        };
        configure_kv_on(&self.dyn_rt(), py, cfg)
    }

    #[pyo3(signature = (plan, inputs, timeout_s=600.0, late=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        plan: &PyPlan,
        inputs: &Bound<'py, PyDict>,
        timeout_s: f64,
        late: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        run_on(&self.dyn_rt(), py, plan, inputs, timeout_s, late)
    }

    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        memory_of(&self.dyn_rt(), py)
    }

    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        health_of(&self.dyn_rt(), py)
    }

    /// Fault injection (tests): every later run first spins on the GPU for `seconds`
    /// (0 turns it off).
    fn _inject_stall(&self, seconds: f64) {
        #[cfg(feature = "cuda")]
        self.inner
            .inject_stall(std::time::Duration::from_secs_f64(seconds.max(0.0)));
        #[cfg(not(feature = "cuda"))]
        let _ = seconds;
    }

    fn __repr__(&self) -> String {
        format!("CudaRuntime(name={:?})", self.inner.name())
    }
}
