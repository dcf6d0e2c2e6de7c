//! `WgpuRuntime`: the wgpu (Vulkan) runtime for Python, and `wgpu_adapters()` discovery; with
//! `api="vulkan"` the same class runs the same kernels on raw Vulkan (ash; not production),
//! and `vulkan_devices()` lists what raw Vulkan sees.
//!
//! Invariants: the class exists in every build so the stub and the API are one; without the
//! `wgpu` cargo feature its constructor raises `BackendNotCompiledError` and
//! `wgpu_adapters()` returns an empty list (never a panic); without the `vulkan` feature,
//! `api="vulkan"` raises `BackendNotCompiledError` naming vulkan (never a wgpu runtime in its
//! place) and `vulkan_devices()` is empty. The shared methods are the ones
//! `CpuRuntime` has (`runtime::*_on`): GIL released, every run bounded by `timeout_s`, and a
//! timeout or lost device poisons the runtime (`health()["status"] == "poisoned"`).

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
    m.add_class::<PyWgpuRuntime>()?;
    m.add_class::<crate::wgpu_tensor::PyWgpuTensor>()?;
    m.add_function(wrap_pyfunction!(wgpu_adapters, m)?)?;
    m.add_function(wrap_pyfunction!(vulkan_devices, m)?)?;
    Ok(())
}

#[cfg(feature = "wgpu")]
type Inner = Arc<poot_wgpu::WgpuRuntime>;
#[cfg(not(feature = "wgpu"))]
type Inner = Arc<dyn Runtime>;

/// The Vulkan adapters wgpu sees (empty when the wgpu backend is not compiled in): a list of
/// `{"name", "backend", "device_type", "driver"}`.
#[pyfunction]
fn wgpu_adapters(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    #[cfg(feature = "wgpu")]
    for a in without_gil(py, poot_wgpu::adapters)? {
        let d = PyDict::new(py);
        d.set_item("name", a.name)?;
        d.set_item("backend", a.backend)?;
        d.set_item("device_type", a.device_type)?;
        d.set_item("driver", a.driver)?;
        list.append(d)?;
    }
    Ok(list)
}

/// The devices raw Vulkan sees, best first (empty without the `vulkan` feature): the
/// adapter fields of `wgpu_adapters()` plus `api_version`, `shader_f64`, `subgroup_size`,
/// `subgroup_ops`, `cooperative_matrix`, `max_storage_buffer_range` and `device_local`.
#[pyfunction]
fn vulkan_devices(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    #[cfg(feature = "vulkan")]
    for (a, caps) in without_gil(py, poot_wgpu::vulkan_devices)? {
        let d = PyDict::new(py);
        d.set_item("name", a.name)?;
        d.set_item("backend", a.backend)?;
        d.set_item("device_type", a.device_type)?;
        d.set_item("driver", a.driver)?;
        set_caps(&d, &caps)?;
        list.append(d)?;
    }
    Ok(list)
}

#[cfg(feature = "vulkan")]
fn set_caps(d: &Bound<'_, PyDict>, caps: &poot_wgpu::VkCaps) -> PyResult<()> {
    d.set_item("api_version", &caps.api_version)?;
    d.set_item("shader_f64", caps.f64)?;
    d.set_item("subgroup_size", caps.subgroup_size)?;
    d.set_item("subgroup_ops", caps.subgroup_ops.clone())?;
    d.set_item("cooperative_matrix", caps.cooperative_matrix)?;
    d.set_item("max_storage_buffer_range", caps.max_storage_buffer_range)?;
    d.set_item("device_local", caps.device_local)?;
    d.set_item("subgroup_size_range", caps.subgroup_size_range)?;
    d.set_item("local_heap_mappable", caps.local_heap_mappable)?;
    Ok(())
}

/// The API `api` names: `"wgpu"`, or `"vulkan"` where the `vulkan` feature is built in.
#[cfg(feature = "wgpu")]
fn api_of(api: &str) -> Result<poot_wgpu::Api, RuntimeError> {
    match api {
        "vulkan" if cfg!(feature = "vulkan") => Ok(poot_wgpu::Api::Vulkan),
        "vulkan" => Err(RuntimeError::NotCompiledIn { backend: "vulkan" }),
        _ => Ok(poot_wgpu::Api::Wgpu),
    }
}

#[cfg(feature = "wgpu")]
fn open(
    api: &str,
    timeout_s: f64,
    max_binding_bytes: Option<u64>,
    f16_arithmetic: bool,
    (ggml, host_sampling): (bool, bool),
) -> Result<Inner, RuntimeError> {
    let options = poot_wgpu::WgpuOptions {
        timeout: std::time::Duration::from_secs_f64(timeout_s),
        max_binding_bytes,
        f16_arithmetic,
        ggml,
        host_sampling,
        ..poot_wgpu::WgpuOptions::default()
    };
    Ok(Arc::new(poot_wgpu::WgpuRuntime::open(
        api_of(api)?,
        options,
    )?))
}

#[cfg(not(feature = "wgpu"))]
fn open(
    api: &str,
    _timeout_s: f64,
    _max_binding_bytes: Option<u64>,
    _f16_arithmetic: bool,
    _flags: (bool, bool),
) -> Result<Inner, RuntimeError> {
    Err(RuntimeError::NotCompiledIn {
        backend: if api == "vulkan" { "vulkan" } else { "wgpu" },
    })
}

/// The wgpu runtime: WGSL kernels over packed weights on the first Vulkan adapter (or, with
/// `api="vulkan"`, on raw Vulkan).
#[pyclass(name = "WgpuRuntime", module = "poot._native", frozen)]
pub struct PyWgpuRuntime {
    inner: Inner,
}

impl std::fmt::Debug for PyWgpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuRuntime").finish()
    }
}

impl PyWgpuRuntime {
    pub(crate) fn dyn_rt(&self) -> Arc<dyn Runtime> {
        self.inner.clone()
    }
}

#[pymethods]
impl PyWgpuRuntime {
    /// Opens the first Vulkan adapter. `timeout_s` bounds every device wait (on top of each
    /// run's own); `max_binding_bytes` lowers the per-binding size (tests of weight splitting);
    /// `f16_arithmetic` takes F16-weight products in f16 where the adapter offers it;
    /// `numerics` is `"exact"` (f32) or `"ggml"` (llama.cpp's CPU arithmetic: Q8-quantized
    /// activations with integer dots for Q4_0/Q4_1/Q8_0 weights, f16-rounded KV, q and
    /// attention weights); `host_sampling` samples on the host over read-back logits even
    /// where the adapter (one with `shader-f64`) samples on the device (tests, comparison);
    /// `api` is `"wgpu"` or `"vulkan"` (raw Vulkan through ash, the same kernels as SPIR-V:
    /// not production; `BackendNotCompiledError` in a build without the `vulkan` feature).
    #[new]
    #[pyo3(signature = (timeout_s=600.0, max_binding_bytes=None, f16_arithmetic=false, numerics="exact", host_sampling=false, api="wgpu"))]
    fn py_new(
        py: Python<'_>,
        timeout_s: f64,
        max_binding_bytes: Option<u64>,
        f16_arithmetic: bool,
        numerics: &str,
        host_sampling: bool,
        api: &str,
    ) -> PyResult<Self> {
        let ggml = crate::runtime::ggml_numerics(numerics)?;
        if api != "wgpu" && api != "vulkan" {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "api must be \"wgpu\" or \"vulkan\", got {api:?}"
            )));
        }
        let api = api.to_owned();
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "timeout_s must be finite and > 0, got {timeout_s}"
            )));
        }
        let inner = without_gil(py, move || {
            open(
                &api,
                timeout_s,
                max_binding_bytes,
                f16_arithmetic,
                (ggml, host_sampling),
            )
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

    /// Bytes of one KV cache element in this runtime's pool.
    #[getter]
    fn kv_entry_bytes(&self) -> u32 {
        self.dyn_rt().kv_entry_bytes()
    }

    /// The adapter: `{"name", "backend", "device_type", "driver", "shader_f16",
    /// "shader_f64", "f16_arithmetic", "samples_on_device", "max_binding_bytes", "numerics",
    /// "api", "timestamp_query"}` (`timestamp_query`: the per-dispatch timer works here), and
    /// on raw Vulkan the capabilities of `vulkan_devices()` and the runtime's settings:
    /// `"subgroup_matvec"` (matmuls reduce rows by subgroup shuffles) and `"staging"` (weights
    /// and KV in device-local memory behind staged copies).
    #[getter]
    fn adapter<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        #[cfg(feature = "wgpu")]
        {
            let a = self.inner.adapter();
            d.set_item("name", &a.name)?;
            d.set_item("backend", &a.backend)?;
            d.set_item("device_type", &a.device_type)?;
            d.set_item("driver", &a.driver)?;
            d.set_item("shader_f16", self.inner.has_f16())?;
            d.set_item("shader_f64", self.inner.has_f64())?;
            d.set_item("f16_arithmetic", self.inner.uses_f16_arithmetic())?;
            d.set_item("samples_on_device", self.inner.samples_on_device())?;
            d.set_item("max_binding_bytes", self.inner.max_binding_bytes())?;
            d.set_item("numerics", if self.inner.ggml() { "ggml" } else { "exact" })?;
            d.set_item("api", self.inner.api().name())?;
            d.set_item("timestamp_query", self.inner.timestamps_supported())?;
            #[cfg(feature = "vulkan")]
            if let Some(caps) = self.inner.vulkan_caps() {
                set_caps(&d, caps)?;
            }
            #[cfg(feature = "vulkan")]
            if let Some(s) = self.inner.vulkan_settings() {
                d.set_item("subgroup_matvec", s.subgroup_matvec)?;
                d.set_item("staging", s.staging)?;
            }
        }
        Ok(d)
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

    /// Runs `plan` like `run` but leaves its outputs on the device: a dict of `WgpuTensor`
    /// (each copied to the host only by its `to_numpy()`). An input may be a `WgpuTensor`
    /// this runtime made: it is bound as it lies (no readback, no upload).
    #[pyo3(signature = (plan, inputs, timeout_s=600.0))]
    fn run_on_device<'py>(
        &self,
        py: Python<'py>,
        plan: &PyPlan,
        inputs: &Bound<'py, PyDict>,
        timeout_s: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::wgpu_tensor::run_resident_on(&self.inner, py, plan, inputs, timeout_s)
    }

    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        memory_of(&self.dyn_rt(), py)
    }

    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        health_of(&self.dyn_rt(), py)
    }

    /// Counters over this runtime's life: `{"runs", "readback_bytes", "upload_bytes"}`
    /// (bytes copied back from the device: the outputs, and the logits rows of host-sampled
    /// rows; bytes of host inputs uploaded at a step's start: not late inputs, constants or
    /// weights, and nothing for an input given as a `WgpuTensor`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        #[cfg(feature = "wgpu")]
        {
            let s = self.inner.stats();
            d.set_item("runs", s.runs)?;
            d.set_item("readback_bytes", s.readback_bytes)?;
            d.set_item("upload_bytes", s.upload_bytes)?;
        }
        Ok(d)
    }

    /// Times each later run's dispatches with device timestamps for `last_run_spans` (no
    /// effect where `adapter["timestamp_query"]` is false).
    fn record_spans(&self, on: bool) {
        #[cfg(feature = "wgpu")]
        self.inner.record_spans(on);
        #[cfg(not(feature = "wgpu"))]
        let _ = on;
    }

    /// The last timed run's equations as `(index, op kind, start_s, end_s)`, seconds from its
    /// first device timestamp (the device's clock); empty unless `record_spans(True)` on an
    /// adapter with timestamps.
    fn last_run_spans(&self) -> Vec<(usize, String, f64, f64)> {
        #[cfg(feature = "wgpu")]
        return self.inner.last_run_spans();
        #[cfg(not(feature = "wgpu"))]
        Vec::new()
    }

    /// Fault injection (tests): every later run first spins a device kernel for about
    /// `rows` x 2.5 s on lavapipe (0 turns it off).
    fn _inject_stall(&self, rows: u32) {
        #[cfg(feature = "wgpu")]
        self.inner.inject_stall(rows);
        #[cfg(not(feature = "wgpu"))]
        let _ = rows;
    }

    /// Fault injection (tests): destroys the device, as a driver reset would lose it.
    fn _inject_device_loss(&self) {
        #[cfg(feature = "wgpu")]
        self.inner.inject_device_loss();
    }

    fn __repr__(&self) -> String {
        format!("WgpuRuntime(name={:?})", self.inner.name())
    }
}
