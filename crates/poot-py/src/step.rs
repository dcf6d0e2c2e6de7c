//! `poot._native.StepDriver`: one call per steady-state step.
//!
//! The driver holds the scheduler (shared with `Scheduler`'s Python object), the runtime, the
//! compiled step plans it has used (by step shape) and each request's sampling state between
//! steps (`poot_engine::RequestSampling`: its seeded stream, settings, penalty counts, logit
//! bias). `step` schedules the next step, draws its rows' uniforms and lays out its inputs,
//! and, when the step can run here, runs it and applies its sampled tokens to the scheduler,
//! returning the tokens, logprobs and finish events: one crossing from Python.
//!
//! Invariants:
//! - Python is called back only on a plan miss (`plan_for(key, uses)`, which traces and
//!   compiles through the Python plan cache and says which keys that cache still holds; the
//!   driver keeps exactly those), to fill a guidance mask while the step runs (`fill_mask`,
//!   a late input), and, for a runtime that is a Python object, to run.
//! - A step runs here unless it needs the host: a row asks for prompt logprobs in its
//!   prefill, the caller wants a row's logits (`fast=False`), its sampling needs logit ops the
//!   runtime lacks, or it takes a mask on a runtime that is a Python object. Such a step comes back unrun, laid out,
//!   with its sampling inputs; the caller runs it and calls `update`.
//! - A failed step is left in flight: the caller ends its rows (`step_rows`) and closes it.
//! - Rows whose logits were not finite (token -1) are aborted here before the update and
//!   listed in `failed`; the requests' sampling state goes when they finish or are aborted.
//! - The scheduler is borrowed only while scheduling and updating, never while a step runs
//!   (a Python runtime may read it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use poot_core::Deadline;
use poot_engine::{
    step_sampling, RequestId, RequestSampling, RequestSpec, SamplingSpec, StepDims, StepOutput,
    TokenId,
};
use poot_runtime::{CompiledPlan, Runtime};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::{finish_name, PyScheduler};
use crate::errors::{engine_error, runtime_error};
use crate::gil::without_gil;
use crate::runtime::{host_tensor, to_numpy, PyPlan};
pub(crate) use crate::step_io::layout_dict;
use crate::step_io::{
    native_runtime, pcg64_of, run_masked, sampling_inputs, step_inputs, tensor_dict, RunOutputs,
};

/// Registers the class of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStepDriver>()
}

/// A sample plan's shape: `(tokens, seqs, max_blocks, adjust, masked, logprobs)`.
type PlanKey = (usize, usize, usize, usize, bool, usize);

/// A plan as Python holds it, and the compiled plan inside when it is a native `Plan`.
type PlanPair = (Py<PyAny>, Option<Arc<dyn CompiledPlan>>);

#[derive(Debug)]
struct CachedPlan {
    obj: Py<PyAny>,
    native: Option<Arc<dyn CompiledPlan>>,
    last_use: u64,
    uses: u64,
}

/// Schedules, lays out and runs steps; see the module docs.
#[pyclass(name = "StepDriver", module = "poot._native")]
pub struct PyStepDriver {
    scheduler: Py<PyScheduler>,
    runtime: Py<PyAny>,
    native: Option<Arc<dyn Runtime>>,
    samples_on_device: bool,
    /// `(plan_for, fill_mask)`; None once the garbage collector cleared the driver (they
    /// hold the engine core that holds the driver).
    callbacks: Option<(Py<PyAny>, Py<PyAny>)>,
    timeout_s: f64,
    logprob_width: usize,
    plans: HashMap<PlanKey, CachedPlan>,
    clock: u64,
    requests: HashMap<u64, RequestSampling>,
    step_rows: Vec<u64>,
    prefill_tokens: u64,
    decode_tokens: u64,
}

impl std::fmt::Debug for PyStepDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepDriver")
            .field("requests", &self.requests.len())
            .field("plans", &self.plans.len())
            .finish()
    }
}

#[pymethods]
impl PyStepDriver {
    /// `plan_for(key, uses)` returns `(plan, held_keys)`: the compiled plan of the sample step
    /// `key` = `(tokens, seqs, max_blocks, adjust, masked, logprobs)`, after recording `uses`
    /// (`[(key, hits)]`, least recent first: the driver's plan hits since the last call), and
    /// the keys the Python cache holds afterwards. `fill_mask(rows, seqs)` returns a masked
    /// step's token mask (int32 `[seqs, words]`) for `rows` = `[(row, request_id)]`.
    #[new]
    #[pyo3(signature = (
        scheduler, runtime, plan_for, fill_mask, *, timeout_s, samples_on_device, logprob_width
    ))]
    #[allow(clippy::too_many_arguments)] // the Python constructor's arguments
    fn py_new(
        py: Python<'_>,
        scheduler: Py<PyScheduler>,
        runtime: Py<PyAny>,
        plan_for: Py<PyAny>,
        fill_mask: Py<PyAny>,
        timeout_s: f64,
        samples_on_device: bool,
        logprob_width: usize,
    ) -> PyResult<Self> {
        if !(timeout_s.is_finite() && timeout_s >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout_s must be finite and >= 0, got {timeout_s}"
            )));
        }
        let native = native_runtime(runtime.bind(py));
        Ok(Self {
            scheduler,
            runtime,
            native,
            samples_on_device,
            callbacks: Some((plan_for, fill_mask)),
            timeout_s,
            logprob_width,
            plans: HashMap::new(),
            clock: 0,
            requests: HashMap::new(),
            step_rows: Vec::new(),
            prefill_tokens: 0,
            decode_tokens: 0,
        })
    }

    /// Runs later steps on `runtime` (its plans are dropped: they were compiled for another).
    fn set_runtime(&mut self, py: Python<'_>, runtime: Py<PyAny>, samples_on_device: bool) {
        self.native = native_runtime(runtime.bind(py));
        self.runtime = runtime;
        self.samples_on_device = samples_on_device;
        self.plans.clear();
    }

    /// Queues a request in the scheduler and keeps its sampling state (`rng_state`: numpy's
    /// `PCG64` `bit_generator.state`, continued here draw for draw).
    #[pyo3(signature = (
        request_id, prompt_ids, max_tokens, *, eos_ids, stop_ids, ignore_eos, temperature,
        top_k, top_p, min_p, repetition, presence, frequency, bias, rng_state, logprobs,
        prompt_logprobs, guided
    ))]
    #[allow(clippy::too_many_arguments)] // one request's settings, as Python keywords
    fn add_request(
        &mut self,
        py: Python<'_>,
        request_id: u64,
        prompt_ids: Vec<TokenId>,
        max_tokens: usize,
        eos_ids: Vec<TokenId>,
        stop_ids: Vec<TokenId>,
        ignore_eos: bool,
        temperature: f32,
        top_k: i32,
        top_p: f32,
        min_p: f32,
        repetition: f32,
        presence: f32,
        frequency: f32,
        bias: Vec<(TokenId, f32)>,
        rng_state: &Bound<'_, PyDict>,
        logprobs: bool,
        prompt_logprobs: bool,
        guided: bool,
    ) -> PyResult<()> {
        if self.requests.contains_key(&request_id) {
            return Err(PyValueError::new_err(format!(
                "request {request_id} is already in the driver"
            )));
        }
        let rng = pcg64_of(rng_state)?;
        let mut prompt_tokens = prompt_ids.clone();
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        let spec = SamplingSpec {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition,
            presence,
            frequency,
            bias,
            prompt_tokens,
            logprobs,
            guided,
            prompt_logprobs,
        };
        let request = RequestSpec {
            id: RequestId(request_id),
            prompt_ids,
            max_tokens,
            eos_ids,
            stop_ids,
            ignore_eos,
        };
        self.scheduler
            .borrow_mut(py)
            .inner
            .add_request(request)
            .map_err(|e| engine_error(py, e))?;
        self.requests
            .insert(request_id, RequestSampling::new(spec, rng));
        Ok(())
    }

    /// Ends a request and frees its blocks; False when it was not live.
    fn abort(&mut self, py: Python<'_>, request_id: u64) -> PyResult<bool> {
        self.requests.remove(&request_id);
        self.scheduler
            .borrow_mut(py)
            .inner
            .abort(RequestId(request_id))
            .map_err(|e| engine_error(py, e))
    }

    /// Plans the next step and, unless it needs the host (see the module docs) or `fast` is
    /// False, runs and applies it. Always: `request_ids`, `row_tokens`, `sample`, `prefill`
    /// (whether each row was a prefill chunk), `preempted`, `num_tokens`,
    /// `num_cached_tokens`, `dims`, `ran`. Run here: `token_ids` (per row; -1: not finite),
    /// `logprob_ids` / `logprobs` (numpy, or None), `events` (`(request_id, token,
    /// finish)`), `failed` (requests ended for non-finite logits). Not run: `inputs` (the
    /// layout), `sampling` (the sampling inputs, numpy), `adjust`, `logprobs` (bool),
    /// `mask_rows`; the step stays in flight until `update`.
    #[pyo3(signature = (fast = true, forget = Vec::new()))]
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        fast: bool,
        forget: Vec<PlanKey>,
    ) -> PyResult<Bound<'py, PyDict>> {
        for k in &forget {
            self.plans.remove(k);
        }
        self.step_rows.clear();
        let (out, dims) = {
            let mut s = self.scheduler.borrow_mut(py);
            let out = s.inner.schedule().map_err(|e| engine_error(py, e))?;
            let dims = StepDims::padded(out.dims(), s.inner.config().max_step_tokens);
            (out, dims)
        };
        self.step_rows = out.seqs.iter().map(|s| s.request_id.0).collect();
        for rid in &out.preempted {
            if let Some(r) = self.requests.get_mut(&rid.0) {
                r.in_prefill = true;
            }
        }
        let d = PyDict::new(py);
        let sample: Vec<bool> = out.seqs.iter().map(|s| s.sample).collect();
        d.set_item("request_ids", self.step_rows.clone())?;
        d.set_item(
            "row_tokens",
            out.seqs.iter().map(|s| s.num_tokens()).collect::<Vec<_>>(),
        )?;
        d.set_item("sample", sample.clone())?;
        d.set_item(
            "preempted",
            out.preempted.iter().map(|r| r.0).collect::<Vec<_>>(),
        )?;
        d.set_item("num_tokens", out.num_tokens)?;
        d.set_item("num_cached_tokens", out.num_cached_tokens)?;
        d.set_item("dims", (dims.tokens, dims.seqs, dims.max_blocks))?;
        if out.is_empty() {
            d.set_item("prefill", Vec::<bool>::new())?;
            d.set_item("ran", false)?;
            d.set_item("inputs", PyDict::new(py))?;
            return Ok(d);
        }
        // The rows' states, taken out while the step is laid out (one request per row).
        let mut states = Vec::with_capacity(out.seqs.len());
        for s in &out.seqs {
            match self.requests.remove(&s.request_id.0) {
                Some(r) => states.push(r),
                None => {
                    for (s, r) in out.seqs.iter().zip(states) {
                        self.requests.insert(s.request_id.0, r);
                    }
                    return Err(PyRuntimeError::new_err(format!(
                        "request {} was scheduled but never added to the driver",
                        s.request_id.0
                    )));
                }
            }
        }
        let mut prefill = Vec::with_capacity(states.len());
        let mut prompt_logprobs = false;
        for (r, s) in states.iter_mut().zip(&out.seqs) {
            prefill.push(r.in_prefill);
            prompt_logprobs |= r.in_prefill && r.spec().prompt_logprobs;
            if r.in_prefill {
                self.prefill_tokens += s.num_tokens() as u64;
                r.in_prefill = !s.sample;
            } else {
                self.decode_tokens += s.num_tokens() as u64;
            }
        }
        let sampling = {
            let mut refs: Vec<&mut RequestSampling> = states.iter_mut().collect();
            step_sampling(&mut refs, &sample, dims.seqs)
        };
        for (s, r) in out.seqs.iter().zip(states) {
            self.requests.insert(s.request_id.0, r);
        }
        d.set_item("prefill", prefill)?;
        let masked = !sampling.mask_rows.is_empty();
        let logit_ops = sampling.adjust > 0 || sampling.logprobs || masked;
        // A mask is filled while the step runs: on a thread here for a native runtime; a
        // Python runtime's masked steps take the runner's path.
        let here = fast
            && !prompt_logprobs
            && (!masked || self.native.is_some())
            && (!logit_ops || self.samples_on_device);
        let flat = out.flatten(dims).map_err(|e| engine_error(py, e))?;
        if !here {
            d.set_item("ran", false)?;
            d.set_item("inputs", layout_dict(py, flat)?)?;
            d.set_item("sampling", tensor_dict(py, sampling_inputs(&sampling))?)?;
            d.set_item("adjust", sampling.adjust)?;
            d.set_item("logprobs", sampling.logprobs)?;
            d.set_item("mask_rows", sampling.mask_rows.clone())?;
            return Ok(d);
        }
        let width = if sampling.logprobs {
            self.logprob_width
        } else {
            0
        };
        let key = (
            dims.tokens,
            dims.seqs,
            dims.max_blocks,
            sampling.adjust,
            masked,
            width,
        );
        let (plan_obj, plan) = self.plan(py, key)?;
        let inputs = step_inputs(flat, &sampling);
        let rows = out.seqs.len();
        let outs = match (&self.native, plan) {
            (Some(rt), Some(plan)) if masked => {
                let mask_rows = sampling
                    .mask_rows
                    .iter()
                    .map(|&i| (i, out.seqs[i].request_id.0))
                    .collect();
                let fill = self.callbacks()?.1.bind(py);
                let named = run_masked(
                    py,
                    fill,
                    self.timeout_s,
                    rt.clone(),
                    plan,
                    inputs,
                    mask_rows,
                    dims.seqs,
                )?;
                RunOutputs::from_named(named, rows)?
            }
            (Some(rt), Some(plan)) => {
                let rt = rt.clone();
                let deadline = Deadline::after(Duration::from_secs_f64(self.timeout_s));
                let named = without_gil(py, move || rt.run(plan.as_ref(), &inputs, deadline))?
                    .map_err(|e| runtime_error(py, e))?;
                RunOutputs::from_named(named, rows)?
            }
            _ if masked => {
                return Err(PyRuntimeError::new_err(
                    "a masked step needs a native plan on a native runtime",
                ));
            }
            _ => {
                let args = (plan_obj, tensor_dict(py, inputs)?, self.timeout_s);
                let got = self.runtime.bind(py).call_method1("run", args)?;
                let got = got.downcast::<PyDict>()?;
                let mut named = Vec::with_capacity(got.len());
                for (k, v) in got.iter() {
                    let name: String = k.extract()?;
                    let t = host_tensor(py, &name, &v)?;
                    named.push((name, t));
                }
                RunOutputs::from_named(named, rows)?
            }
        };
        // Apply: rows with non-finite logits end here; the others' tokens go to the scheduler.
        let mut sampled = Vec::new();
        let mut failed = Vec::new();
        {
            let mut sched = self.scheduler.borrow_mut(py);
            for (i, s) in out.seqs.iter().enumerate() {
                if !s.sample {
                    continue;
                }
                let t = outs.token_ids[i];
                if t < 0 {
                    failed.push(s.request_id.0);
                    self.requests.remove(&s.request_id.0);
                    sched
                        .inner
                        .abort(s.request_id)
                        .map_err(|e| engine_error(py, e))?;
                } else {
                    sampled.push((s.request_id, t as TokenId));
                }
            }
        }
        let events = self.apply(py, sampled)?;
        d.set_item("ran", true)?;
        d.set_item("token_ids", outs.token_ids)?;
        match outs.logprobs {
            Some((ids, lps)) => {
                d.set_item("logprob_ids", to_numpy(py, ids)?)?;
                d.set_item("logprobs", to_numpy(py, lps)?)?;
            }
            None => {
                d.set_item("logprob_ids", py.None())?;
                d.set_item("logprobs", py.None())?;
            }
        }
        d.set_item("events", events)?;
        d.set_item("failed", failed)?;
        Ok(d)
    }

    /// Applies an unrun step's `(request_id, token)` per sampled row (after the caller ran it);
    /// returns `(request_id, token, finish_reason)` per accepted token.
    fn update<'py>(
        &mut self,
        py: Python<'py>,
        sampled: Vec<(u64, TokenId)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let sampled = sampled
            .into_iter()
            .map(|(id, t)| (RequestId(id), t))
            .collect();
        self.apply(py, sampled)
    }

    /// The request ids of the step last planned (the rows a failed step must end).
    #[getter]
    fn step_rows(&self) -> Vec<u64> {
        self.step_rows.clone()
    }

    /// Prompt tokens (and recomputed ones after a preemption) run through the model.
    #[getter]
    fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens
    }

    /// Tokens run in decode rows.
    #[getter]
    fn decode_tokens(&self) -> u64 {
        self.decode_tokens
    }

    /// The driver's plan hits since the last plan miss (`[(key, hits)]`, least recent first),
    /// forgotten once returned: the Python cache records them (LRU order, hit counts).
    fn take_plan_uses(&mut self) -> Vec<(PlanKey, u64)> {
        self.drain_uses()
    }

    /// Sample plans the driver holds.
    #[getter]
    fn plan_keys(&self) -> Vec<PlanKey> {
        let mut keys: Vec<_> = self.plans.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some((plan_for, fill_mask)) = &self.callbacks {
            visit.call(plan_for)?;
            visit.call(fill_mask)?;
        }
        visit.call(&self.runtime)?;
        visit.call(&self.scheduler)
    }

    fn __clear__(&mut self) {
        self.callbacks = None;
    }

    fn __repr__(&self) -> String {
        format!(
            "StepDriver(requests={}, plans={})",
            self.requests.len(),
            self.plans.len()
        )
    }
}

impl PyStepDriver {
    fn callbacks(&self) -> PyResult<&(Py<PyAny>, Py<PyAny>)> {
        self.callbacks
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the step driver was cleared"))
    }

    fn drain_uses(&mut self) -> Vec<(PlanKey, u64)> {
        let mut used: Vec<(u64, PlanKey, u64)> = self
            .plans
            .iter()
            .filter(|(_, p)| p.uses > 0)
            .map(|(k, p)| (p.last_use, *k, p.uses))
            .collect();
        used.sort_unstable();
        for p in self.plans.values_mut() {
            p.uses = 0;
        }
        used.into_iter().map(|(_, k, n)| (k, n)).collect()
    }

    /// The plan for `key`: held, or from `plan_for` (see `py_new`).
    fn plan(&mut self, py: Python<'_>, key: PlanKey) -> PyResult<PlanPair> {
        self.clock += 1;
        if let Some(p) = self.plans.get_mut(&key) {
            p.last_use = self.clock;
            p.uses += 1;
            return Ok((p.obj.clone_ref(py), p.native.clone()));
        }
        let uses = self.drain_uses();
        let got = self.callbacks()?.0.bind(py).call1((key, uses))?;
        let (obj, held): (Bound<'_, PyAny>, Vec<PlanKey>) = got.extract()?;
        self.plans.retain(|k, _| held.contains(k));
        let native = obj.downcast::<PyPlan>().ok().map(|p| p.get().inner.clone());
        if held.contains(&key) {
            let cached = CachedPlan {
                obj: obj.clone().unbind(),
                native: native.clone(),
                last_use: self.clock,
                uses: 0,
            };
            self.plans.insert(key, cached);
        }
        Ok((obj.unbind(), native))
    }

    /// Gives the scheduler a step's sampled tokens; counts the accepted ones for penalties and
    /// drops finished requests' state.
    fn apply<'py>(
        &mut self,
        py: Python<'py>,
        sampled: Vec<(RequestId, TokenId)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let events = self
            .scheduler
            .borrow_mut(py)
            .inner
            .update(StepOutput { sampled })
            .map_err(|e| engine_error(py, e))?;
        let list = PyList::empty(py);
        for e in events {
            let rid = e.request_id.0;
            if e.finish.is_some() {
                self.requests.remove(&rid);
            } else if let Some(r) = self.requests.get_mut(&rid) {
                r.accept(e.token);
            }
            list.append((rid, e.token, finish_name(e.finish)))?;
        }
        Ok(list)
    }
}
