//! Python classes over poot-runtime: `CpuRuntime` and `Plan`.
//!
//! Invariants: compile and run release the GIL (`gil::without_gil`) and every run carries a
//! `Deadline` (`timeout_s`, 600 s by default); a miss is a `DeviceTimeoutError` and poisons the
//! runtime. Inputs are numpy arrays of exactly float32 or int32 (no silent casts: a float64
//! array is a `GraphInputError`); they are copied once into host tensors. Outputs become numpy
//! arrays that own the runtime's buffers (no copy). The binding is written against
//! `Arc<dyn Runtime>`, so every backend shares it; only construction differs.

use std::sync::Arc;
use std::time::Duration;

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use poot_core::Deadline;
use poot_runtime::{
    CompiledPlan, Health, HostTensor, KvCacheConfig, LateInput, Runtime, RuntimeError,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::runtime_error;
use crate::gil::without_gil;
use crate::graph::PyGraph;
use crate::late::PyLateInput;
use crate::limits::{compile_limits, PyCompileLimits};
use crate::weights::PyWeights;

/// Registers the classes of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCpuRuntime>()?;
    m.add_class::<PyPlan>()?;
    crate::wgpu::register(m)?;
    crate::cuda::register(m)?;
    Ok(())
}

/// The CPU backend of `options`.
fn new_cpu_runtime(
    options: poot_cpu::CpuOptions,
) -> Result<Arc<poot_cpu::CpuRuntime>, RuntimeError> {
    Ok(Arc::new(poot_cpu::CpuRuntime::new(options)?))
}

/// The CPU runtime's tuning knobs as given from Python (`poot.config.CpuSettings`); `None`
/// keeps `CpuOptions::default()`'s value (its `POOT_CPU_*` fallback).
#[derive(Debug, Default)]
struct CpuKnobs {
    isa: Option<String>,
    spin_us: Option<u64>,
    prefetch: Option<usize>,
    prefetch_float: Option<usize>,
    prefetch_next: Option<bool>,
    prefetch_gap: Option<usize>,
    huge_pages: Option<bool>,
    profile: Option<bool>,
}

impl CpuKnobs {
    /// `options` with every knob that was given set.
    fn apply(self, mut options: poot_cpu::CpuOptions) -> PyResult<poot_cpu::CpuOptions> {
        if let Some(name) = self.isa {
            options.isa = poot_cpu::Isa::from_name(&name).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "isa must be \"scalar\", \"avx2\", \"avx512\" or \"amx\", got {name:?}"
                ))
            })?;
        }
        if let Some(us) = self.spin_us {
            options.spin = Duration::from_micros(us);
        }
        options.prefetch = self.prefetch.unwrap_or(options.prefetch);
        options.prefetch_float = self.prefetch_float.unwrap_or(options.prefetch_float);
        options.prefetch_next = self.prefetch_next.unwrap_or(options.prefetch_next);
        options.prefetch_gap = self.prefetch_gap.unwrap_or(options.prefetch_gap);
        options.huge_pages = self.huge_pages.unwrap_or(options.huge_pages);
        options.profile = self.profile.unwrap_or(options.profile);
        Ok(options)
    }
}

/// A graph compiled for one runtime.
#[pyclass(name = "Plan", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PyPlan {
    pub(crate) inner: Arc<dyn CompiledPlan>,
}

#[pymethods]
impl PyPlan {
    /// Bytes the plan holds (schedule, buffers, generated code).
    #[getter]
    fn artifact_bytes(&self) -> u64 {
        self.inner.artifact_bytes()
    }

    /// The graph after the backend's passes.
    #[getter]
    fn graph(&self) -> PyGraph {
        PyGraph::new(self.inner.graph().clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(n_equations={}, artifact_bytes={})",
            self.inner.graph().equations.len(),
            self.inner.artifact_bytes()
        )
    }
}

fn input_error(py: Python<'_>, name: &str, got: String) -> PyErr {
    runtime_error(
        py,
        RuntimeError::InputMismatch {
            name: name.to_owned(),
            expected: "a float32 or int32 numpy array".into(),
            got,
        },
    )
}

/// One numpy array as a host tensor (a copy; any memory layout).
pub(crate) fn host_tensor(
    py: Python<'_>,
    name: &str,
    value: &Bound<'_, PyAny>,
) -> PyResult<HostTensor> {
    if let Ok(a) = value.downcast::<PyArrayDyn<f32>>() {
        let r = a.readonly();
        let shape = r.shape().to_vec();
        let data = match r.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => r.as_array().iter().copied().collect(),
        };
        return Ok(HostTensor::F32 { shape, data });
    }
    if let Ok(a) = value.downcast::<PyArrayDyn<i32>>() {
        let r = a.readonly();
        let shape = r.shape().to_vec();
        let data = match r.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => r.as_array().iter().copied().collect(),
        };
        return Ok(HostTensor::I32 { shape, data });
    }
    let got = match value.getattr("dtype") {
        Ok(d) => format!("an array of {}", d.str()?),
        Err(_) => value.get_type().name()?.to_string(),
    };
    Err(input_error(py, name, got))
}

/// A host tensor as a numpy array that owns its buffer.
pub(crate) fn to_numpy(py: Python<'_>, t: HostTensor) -> PyResult<Bound<'_, PyAny>> {
    let bad = |e: numpy::ndarray::ShapeError| PyValueError::new_err(e.to_string());
    Ok(match t {
        HostTensor::F32 { shape, data } => ArrayD::from_shape_vec(IxDyn(&shape), data)
            .map_err(bad)?
            .into_pyarray(py)
            .into_any(),
        HostTensor::I32 { shape, data } => ArrayD::from_shape_vec(IxDyn(&shape), data)
            .map_err(bad)?
            .into_pyarray(py)
            .into_any(),
    })
}

/// The CPU runtime: compiles traced graphs and runs them, multi-threaded, with bounded waits.
#[pyclass(name = "CpuRuntime", module = "poot._native", frozen)]
pub struct PyCpuRuntime {
    inner: Arc<dyn Runtime>,
    /// The same runtime, for what only the CPU runtime has.
    cpu: Arc<poot_cpu::CpuRuntime>,
}

impl std::fmt::Debug for PyCpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuRuntime")
            .field("name", &self.inner.name())
            .finish()
    }
}

impl PyCpuRuntime {
    pub(crate) fn dyn_rt(&self) -> Arc<dyn Runtime> {
        self.inner.clone()
    }
}

#[pymethods]
impl PyCpuRuntime {
    /// `threads` None means one per available core; the keyword-only knobs are
    /// `poot.config.CpuSettings`' fields (None keeps the default, which the `POOT_CPU_*`
    /// variables set where present).
    #[new]
    #[pyo3(signature = (
        threads=None, numerics="exact", *, isa=None, spin_us=None, prefetch=None,
        prefetch_float=None, prefetch_next=None, prefetch_gap=None, huge_pages=None, profile=None
    ))]
    #[allow(clippy::too_many_arguments)] // the Python keywords of one settings object
    fn py_new(
        py: Python<'_>,
        threads: Option<usize>,
        numerics: &str,
        isa: Option<String>,
        spin_us: Option<u64>,
        prefetch: Option<usize>,
        prefetch_float: Option<usize>,
        prefetch_next: Option<bool>,
        prefetch_gap: Option<usize>,
        huge_pages: Option<bool>,
        profile: Option<bool>,
    ) -> PyResult<Self> {
        let numerics = poot_cpu::Numerics::from_name(numerics).ok_or_else(|| {
            PyValueError::new_err(format!(
                "numerics must be \"ggml\" or \"exact\", got {numerics:?}"
            ))
        })?;
        let knobs = CpuKnobs {
            isa,
            spin_us,
            prefetch,
            prefetch_float,
            prefetch_next,
            prefetch_gap,
            huge_pages,
            profile,
        };
        let options = knobs.apply(poot_cpu::CpuOptions {
            threads: threads.unwrap_or(0),
            numerics,
            ..poot_cpu::CpuOptions::default()
        })?;
        let cpu =
            without_gil(py, move || new_cpu_runtime(options))?.map_err(|e| runtime_error(py, e))?;
        Ok(PyCpuRuntime {
            inner: cpu.clone(),
            cpu,
        })
    }

    /// The backend's name.
    #[getter]
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// Whether graphs with ops of this kind compile here (`"adjust_logits"`, `"matmul"`, ...:
    /// the names of the graph's ops).
    fn supports(&self, op: &str) -> bool {
        self.inner.supports(op)
    }

    /// Bytes of one KV element in the pool of a CPU runtime under `numerics` (what
    /// `kv_entry_bytes` says once it exists): for sizing pools before the runtime is built.
    #[staticmethod]
    fn kv_entry_bytes_for(numerics: &str) -> PyResult<u32> {
        let n = poot_cpu::Numerics::from_name(numerics).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "numerics must be \"ggml\" or \"exact\", got {numerics:?}"
            ))
        })?;
        Ok(poot_cpu::CpuRuntime::kv_entry_bytes_for(n))
    }

    /// Bytes of one KV cache element in this runtime's pool (2 for f16, 4 for f32).
    #[getter]
    fn kv_entry_bytes(&self) -> u32 {
        self.inner.kv_entry_bytes()
    }

    /// The kernels' code path: "scalar", "avx2", "avx512" or "amx".
    #[getter]
    fn isa(&self) -> &'static str {
        self.cpu.isa().name()
    }

    /// Prepares a plan: the traced graph compiled against `weights` under `limits` (GIL
    /// released).
    #[pyo3(signature = (graph, weights, limits=None))]
    fn prepare(
        &self,
        py: Python<'_>,
        graph: &PyGraph,
        weights: &PyWeights,
        limits: Option<&PyCompileLimits>,
    ) -> PyResult<PyPlan> {
        prepare_on(&self.inner, py, graph, weights, limits)
    }

    /// Allocates (or replaces) the paged KV pool: per layer, K and V of
    /// `[num_blocks, block_size, n_kv_heads, head_dim]` f32.
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
        configure_kv_on(&self.inner, py, cfg)
    }

    /// Runs a plan on named numpy inputs (float32 or int32) within `timeout_s` seconds;
    /// returns the graph's named outputs as numpy arrays (GIL released while it runs).
    /// `late` maps input names to `LateInput`s the caller fills while the run goes on.
    #[pyo3(signature = (plan, inputs, timeout_s=600.0, late=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        plan: &PyPlan,
        inputs: &Bound<'py, PyDict>,
        timeout_s: f64,
        late: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        run_on(&self.inner, py, plan, inputs, timeout_s, late)
    }

    /// Bytes the runtime holds: `{"kv_bytes": ..., "scratch_bytes": ..., "weight_bytes": ...}`
    /// (`weight_bytes`: re-laid weight copies, whose stored pages were released).
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        memory_of(&self.inner, py)
    }

    /// `{"status": "ok"}` or `{"status": "poisoned", "reason": ...}`.
    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        health_of(&self.inner, py)
    }

    /// `(done, total)`: stored bytes of the matmul weights the compile in progress has
    /// prepared and of those it has to prepare (after it, the last such compile's); callable
    /// from another thread while `compile` runs, to draw progress.
    fn weight_progress(&self) -> (u64, u64) {
        self.cpu.weight_progress()
    }

    /// Keeps each run's per-equation spans for `last_run_spans` (no profile report).
    fn record_spans(&self, on: bool) {
        self.cpu.record_spans(on);
    }

    /// The last run's equations as `(index, op kind, start_s, end_s)`, seconds since the run
    /// began; empty unless `record_spans(True)` or `profile=True`.
    fn last_run_spans(&self) -> Vec<(usize, String, f64, f64)> {
        self.cpu
            .last_run_spans()
            .into_iter()
            .map(|(i, k, s, d)| (i, k, s.as_secs_f64(), (s + d).as_secs_f64()))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!("CpuRuntime(name={:?})", self.inner.name())
    }
}

/// Whether a GPU runtime's `numerics` argument is `"ggml"` (`false` for `"exact"`); a
/// `ValueError` naming both choices otherwise.
pub(crate) fn ggml_numerics(numerics: &str) -> PyResult<bool> {
    match numerics {
        "exact" => Ok(false),
        "ggml" => Ok(true),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "numerics must be \"exact\" or \"ggml\", got {other:?}"
        ))),
    }
}

// The methods every runtime class shares (written once against `Arc<dyn Runtime>`).

/// Prepares a plan without the GIL; see `CpuRuntime.prepare`.
pub(crate) fn prepare_on(
    rt: &Arc<dyn Runtime>,
    py: Python<'_>,
    graph: &PyGraph,
    weights: &PyWeights,
    limits: Option<&PyCompileLimits>,
) -> PyResult<PyPlan> {
    let limits = compile_limits(limits);
    let (rt, g, store) = (rt.clone(), graph.inner.clone(), weights.store.clone());
    let plan = without_gil(py, move || rt.prepare(&g, store, &limits))?
        .map_err(|e| runtime_error(py, e))?;
    Ok(PyPlan { inner: plan })
}

pub(crate) fn configure_kv_on(
    rt: &Arc<dyn Runtime>,
    py: Python<'_>,
    cfg: KvCacheConfig,
) -> PyResult<()> {
    let rt = rt.clone();
    without_gil(py, move || rt.configure_kv(cfg))?.map_err(|e| runtime_error(py, e))
}

/// The deadline `timeout_s` seconds from now (`ValueError` unless finite and >= 0).
pub(crate) fn deadline_of(timeout_s: f64) -> PyResult<Deadline> {
    if !(timeout_s.is_finite() && timeout_s >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "timeout_s must be finite and >= 0, got {timeout_s}"
        )));
    }
    Ok(Deadline::after(Duration::from_secs_f64(timeout_s)))
}

pub(crate) fn run_on<'py>(
    rt: &Arc<dyn Runtime>,
    py: Python<'py>,
    plan: &PyPlan,
    inputs: &Bound<'py, PyDict>,
    timeout_s: f64,
    late: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let deadline = deadline_of(timeout_s)?;
    let mut names = Vec::with_capacity(inputs.len());
    let mut tensors = Vec::with_capacity(inputs.len());
    for (k, v) in inputs.iter() {
        let name: String = k.extract()?;
        tensors.push(host_tensor(py, &name, &v)?);
        names.push(name);
    }
    let mut late_slots: Vec<(String, LateInput)> = Vec::new();
    if let Some(late) = late {
        for (k, v) in late.iter() {
            let slot = v.downcast::<PyLateInput>()?.get().inner.clone();
            late_slots.push((k.extract()?, slot));
        }
    }
    let (rt, p) = (rt.clone(), plan.inner.clone());
    let outputs = without_gil(py, move || {
        let named: Vec<(&str, HostTensor)> =
            names.iter().map(String::as_str).zip(tensors).collect();
        let late: Vec<(&str, LateInput)> = late_slots
            .iter()
            .map(|(n, l)| (n.as_str(), l.clone()))
            .collect();
        rt.run_late(p.as_ref(), &named, &late, deadline)
    })?
    .map_err(|e| runtime_error(py, e))?;
    let d = PyDict::new(py);
    for (name, t) in outputs {
        d.set_item(name, to_numpy(py, t)?)?;
    }
    Ok(d)
}

pub(crate) fn memory_of<'py>(
    rt: &Arc<dyn Runtime>,
    py: Python<'py>,
) -> PyResult<Bound<'py, PyDict>> {
    let m = rt.memory();
    let d = PyDict::new(py);
    d.set_item("kv_bytes", m.kv_bytes)?;
    d.set_item("scratch_bytes", m.scratch_bytes)?;
    d.set_item("weight_bytes", m.weight_bytes)?;
    Ok(d)
}

pub(crate) fn health_of<'py>(
    rt: &Arc<dyn Runtime>,
    py: Python<'py>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match rt.health() {
        Health::Ok => {
            d.set_item("status", "ok")?;
            d.set_item("reason", py.None())?;
        }
        Health::Poisoned { reason } => {
            d.set_item("status", "poisoned")?;
            d.set_item("reason", reason)?;
        }
    }
    Ok(d)
}
