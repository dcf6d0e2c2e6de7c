//! `poot._native.StepDriver`: one call per step.
//!
//! The driver holds the scheduler (shared with `Scheduler`'s Python object), the runtime, the
//! compiled step plans it has used (by step shape) and each request's sampling state between
//! steps (`poot_engine::RequestSampling`: its seeded stream, settings, penalty counts, logit
//! bias). `step` schedules the next step, draws its rows' uniforms and lays out its inputs,
//! and, when the step can run here, runs it and applies its sampled tokens to the scheduler,
//! returning the tokens, logprobs, finish events and whatever rows of logits the call asked
//! for: one crossing from Python.
//!
//! Invariants:
//! - Python is called back only on a plan miss (`plan_for(key, uses)`, which traces and
//!   compiles through the Python plan cache and says which keys that cache still holds; the
//!   driver keeps exactly those), to fill a guidance mask while the step runs (`fill_mask`,
//!   a late input), and, for a runtime that is a Python object, to run.
//! - A step holding a prefill chunk that asks for prompt logprobs runs as an `all_logits`
//!   step, and the logits of that chunk's tokens come back (`prompt_rows`, `prompt_logits`).
//!   Such a request never starts from the prefix cache (`RequestSpec::skip_prefix_cache`),
//!   so its own prefill computes every prompt position, on every KV layout.
//!   A step asked for a row's full logits (`logits_for`) first runs as a `logits` step when
//!   that row samples, and then as its sample step, unless the row is the step's only one and
//!   no prompt logprobs are due (its token is then the logits' argmax, as numpy's).
//! - On a runtime without the logit ops (`samples_on_device` false), a step that needs them
//!   runs split (`step_run::run_split`): its forward pass there, its sampling step on
//!   `host_runtime`, as the Python runner's split path does.
//! - A step runs here unless it needs the logit ops the runtime lacks and no `host_runtime`
//!   was given: such a step comes back unrun, laid out, with its sampling inputs; the caller
//!   runs it and calls `update`. `fast=False` leaves every step unrun.
//! - A failed step is left in flight: the caller ends its rows (`step_rows`) and closes it.
//! - Rows whose logits were not finite (token -1) are aborted here before the update and
//!   listed in `failed`; the requests' sampling state goes when they finish or are aborted.
//! - The scheduler is borrowed only while scheduling and updating, never while a step runs
//!   (a Python runtime may read it).

use std::collections::HashMap;

use poot_engine::{step_sampling, RequestId, RequestSampling, SamplingSpec, StepDims, TokenId};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::PyScheduler;
use crate::errors::engine_error;
use crate::request_args::{request_spec, Keywords};
use crate::runtime::to_numpy;
use crate::step_driver::PyStepDriver;
use crate::step_io::{
    argmax, host_of, layout_dict, layout_inputs, native_runtime, pcg64_of, plan_dict, put_outputs,
    row_of, rows_of, sampling_inputs, tensor_dict, RunOutputs,
};
use crate::step_run::{PlanKey, SplitStep, StepPlans};

/// Registers the class of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStepDriver>()
}

#[pymethods]
impl PyStepDriver {
    /// `plan_for(key, uses)` returns `(plan, held_keys)`: the compiled plan of the step shape
    /// `key` (`PlanKey`), after recording `uses` (`[(key, hits)]`, least recent first: the
    /// driver's plan hits since the last call), and the keys the Python cache holds
    /// afterwards. `fill_mask(rows, seqs)` returns a masked step's token mask (int32
    /// `[seqs, words]`) for `rows` = `[(row, request_id)]`.
    #[new]
    #[pyo3(signature = (
        scheduler, runtime, plan_for, fill_mask, *, timeout_s, samples_on_device, logprob_width,
        host_runtime = None
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
        host_runtime: Option<Py<PyAny>>,
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
            host: host_of(py, host_runtime)?,
            callbacks: Some((plan_for, fill_mask)),
            timeout_s,
            logprob_width,
            plans: StepPlans::default(),
            requests: HashMap::new(),
            step_rows: Vec::new(),
            prefill_tokens: 0,
            decode_tokens: 0,
        })
    }

    /// Runs later steps on `runtime`, split steps' sampling on `host_runtime` (the plans are
    /// dropped: they were compiled for others).
    #[pyo3(signature = (runtime, samples_on_device, host_runtime = None))]
    fn set_runtime(
        &mut self,
        py: Python<'_>,
        runtime: Py<PyAny>,
        samples_on_device: bool,
        host_runtime: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        self.host = host_of(py, host_runtime)?;
        self.native = native_runtime(runtime.bind(py));
        self.runtime = runtime;
        self.samples_on_device = samples_on_device;
        self.plans.clear();
        Ok(())
    }

    /// Queues a request in the scheduler (keywords `eos_ids`, `stop_ids`, `ignore_eos`, read
    /// by `request_args::request_spec`) and keeps its sampling state (the other keywords, all
    /// required; `rng_state`: numpy's `PCG64` `bit_generator.state`, continued here draw for
    /// draw).
    #[pyo3(
        signature = (request_id, prompt_ids, max_tokens, **kw),
        text_signature = "($self, request_id, prompt_ids, max_tokens, *, eos_ids=..., stop_ids=..., ignore_eos=False, temperature, top_k, top_p, min_p, repetition, presence, frequency, bias, rng_state, logprobs, prompt_logprobs, guided)"
    )]
    fn add_request(
        &mut self,
        py: Python<'_>,
        request_id: u64,
        prompt_ids: Vec<TokenId>,
        max_tokens: usize,
        kw: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let mut kw = Keywords::new("add_request", kw);
        let mut request = request_spec(request_id, prompt_ids, max_tokens, &mut kw)?;
        let mut prompt_tokens = request.prompt_ids.clone();
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        let spec = SamplingSpec {
            temperature: kw.required("temperature")?,
            top_k: kw.required("top_k")?,
            top_p: kw.required("top_p")?,
            min_p: kw.required("min_p")?,
            repetition: kw.required("repetition")?,
            presence: kw.required("presence")?,
            frequency: kw.required("frequency")?,
            bias: kw.required("bias")?,
            prompt_tokens,
            logprobs: kw.required("logprobs")?,
            guided: kw.required("guided")?,
            prompt_logprobs: kw.required("prompt_logprobs")?,
        };
        let rng_state: Bound<'_, PyDict> = kw.required("rng_state")?;
        kw.finish()?;
        if self.requests.contains_key(&request_id) {
            return Err(PyValueError::new_err(format!(
                "request {request_id} is already in the driver"
            )));
        }
        let rng = pcg64_of(&rng_state)?;
        // Every prompt position's logits come from the request's own prefill.
        request.skip_prefix_cache = spec.prompt_logprobs;
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
        self.forget_request(request_id);
        self.scheduler
            .borrow_mut(py)
            .inner
            .abort(RequestId(request_id))
            .map_err(|e| engine_error(py, e))
    }

    /// Plans the next step and, unless it needs the host (see the module docs) or `fast` is
    /// False, runs and applies it. `logits_for`: a request whose row's full logits to bring
    /// back if it samples in this step. Always: `request_ids`, `row_tokens`, `sample`,
    /// `prefill` (whether each row was a prefill chunk), `preempted`, `num_tokens`,
    /// `num_cached_tokens`, `dims`, `ran`. Run here: `token_ids` (per row; -1: not finite),
    /// `logprob_ids` / `logprobs` (numpy, or None), `logits` (the asked row's, float32
    /// `[vocab]`, or None), `prompt_rows` (`(row, position)` per token of a chunk asking for
    /// prompt logprobs, in step order) with `prompt_logits` (float32 `[len, vocab]`, or
    /// None), `events` (`(request_id, token, finish)`), `failed` (requests ended for
    /// non-finite logits). Not run: `inputs` (the layout), `sampling` (the sampling inputs,
    /// numpy), `adjust`, `logprobs` (bool), `mask_rows`; the step stays in flight until
    /// `update`.
    #[pyo3(signature = (fast = true, forget = Vec::new(), logits_for = None))]
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        fast: bool,
        forget: Vec<PlanKey>,
        logits_for: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        for k in &forget {
            self.plans.forget(k);
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
        let d = plan_dict(py, &out, dims)?;
        let sample: Vec<bool> = out.seqs.iter().map(|s| s.sample).collect();
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
        // Rows whose prefill chunk asks for prompt logprobs (such a request never starts
        // from the prefix cache: `add_request`).
        let mut wants = Vec::new();
        for (i, (r, s)) in states.iter_mut().zip(&out.seqs).enumerate() {
            prefill.push(r.in_prefill);
            if r.in_prefill && r.spec().prompt_logprobs {
                wants.push(i);
            }
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
        // A mask is filled while the step runs (`step_run::run_plan`).
        let split = logit_ops && !self.samples_on_device;
        let here = fast && (!split || self.host.is_some());
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
        // The tokens of the chunks asking for prompt logprobs: (token, row, position).
        let prompt_tokens: Vec<(usize, usize, i32)> = (0..out.num_tokens)
            .map(|j| (j, flat.token_seq[j] as usize, flat.positions[j]))
            .filter(|(_, row, _)| wants.contains(row))
            .collect();
        let rows = out.seqs.len();
        let last_rows = flat.last_rows.clone();
        let layout = layout_inputs(flat);
        let logits_row = logits_for
            .and_then(|id| self.step_rows.iter().position(|&r| r == id))
            .filter(|&i| sample[i]);
        let (t, s, b) = (dims.tokens, dims.seqs, dims.max_blocks);
        let logits = match logits_row {
            Some(i) => {
                let key = (t, s, b, "logits".to_string(), 0, false, 0);
                let named = self.run_key(py, key, layout.clone(), None)?;
                Some(row_of(named, "logits", i)?)
            }
            None => None,
        };
        let width = if sampling.logprobs {
            self.logprob_width
        } else {
            0
        };
        let mask_rows: Option<Vec<(usize, u64)>> = masked.then(|| {
            sampling
                .mask_rows
                .iter()
                .map(|&i| (i, out.seqs[i].request_id.0))
                .collect()
        });
        let outs = match &logits {
            Some(x) if rows == 1 && wants.is_empty() => RunOutputs::argmax(argmax(x)),
            _ if split => {
                let step = SplitStep {
                    dims,
                    every: !wants.is_empty(),
                    width,
                    last_rows: &last_rows,
                    sampling: &sampling,
                };
                RunOutputs::from_named(self.run_split(py, step, layout, mask_rows)?, rows)?
            }
            _ => {
                let kind = if wants.is_empty() {
                    "sample"
                } else {
                    "all_logits"
                };
                let key = (t, s, b, kind.to_string(), sampling.adjust, masked, width);
                let mut inputs = layout;
                inputs.extend(sampling_inputs(&sampling));
                RunOutputs::from_named(self.run_key(py, key, inputs, mask_rows)?, rows)?
            }
        };
        let prompt_logits = match &outs.all_logits {
            Some(all) if !prompt_tokens.is_empty() => {
                let js: Vec<usize> = prompt_tokens.iter().map(|p| p.0).collect();
                Some(to_numpy(py, rows_of(all, &js)?)?)
            }
            _ => None,
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
        put_outputs(&d, outs, logits)?;
        let prompt_rows: Vec<(usize, i32)> = prompt_tokens.iter().map(|p| (p.1, p.2)).collect();
        d.set_item("prompt_rows", prompt_rows)?;
        d.set_item("prompt_logits", prompt_logits)?;
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
        self.plans.drain_uses()
    }

    /// Plans the driver holds.
    #[getter]
    fn plan_keys(&self) -> Vec<PlanKey> {
        self.plans.keys()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some((plan_for, fill_mask)) = &self.callbacks {
            visit.call(plan_for)?;
            visit.call(fill_mask)?;
        }
        if let Some((host, _)) = &self.host {
            visit.call(host)?;
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
