//! `poot._native.Scheduler` and `SchedulerOutput`: poot-engine's scheduler for Python.
//!
//! Invariants: the Python objects are thin wrappers, so every policy (FCFS under a token
//! budget, chunked prefill, preemption by recompute, block accounting) is the Rust scheduler's;
//! `num_blocks` given here counts usable blocks, and the pool gets one more for the reserved
//! null block 0 (configure the runtime's KV pool with `num_blocks + 1` blocks). Scheduler
//! errors map to `poot.errors` in `errors::engine_error`.

use std::collections::HashMap;

use poot_engine::{
    FinishReason, RequestId, Scheduler, SchedulerConfig, StepDims, StepOutput, TokenId,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::engine_error;
use crate::request_args::{request_spec, Keywords};
use crate::step_io::{layout_dict, plan_dict};

/// Registers the classes of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyScheduler>()?;
    Ok(())
}

/// The driver's scheduler: plans steps, takes their sampled tokens, owns the KV blocks.
#[pyclass(name = "Scheduler", module = "poot._native")]
#[derive(Debug)]
pub struct PyScheduler {
    pub(crate) inner: Scheduler,
}

pub(crate) fn finish_name(f: Option<FinishReason>) -> Option<&'static str> {
    f.map(|f| match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    })
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (
        *, max_num_seqs, max_batched_tokens, max_step_tokens, max_model_len, block_size,
        num_blocks, enable_prefix_caching = false, model_key = 0, kv_window = None,
        window_group = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        max_num_seqs: usize,
        max_batched_tokens: usize,
        max_step_tokens: usize,
        max_model_len: usize,
        block_size: usize,
        num_blocks: usize,
        enable_prefix_caching: bool,
        model_key: u64,
        kv_window: Option<usize>,
        window_group: Option<usize>,
    ) -> PyResult<Self> {
        let config = SchedulerConfig {
            max_num_seqs,
            max_batched_tokens,
            max_step_tokens,
            max_model_len,
            block_size,
            num_blocks: num_blocks.saturating_add(1),
            enable_prefix_caching,
            model_key,
            kv_window,
            window_group,
        };
        let inner = Scheduler::new(config).map_err(|e| engine_error(py, e))?;
        Ok(Self { inner })
    }

    /// Queues a request (FCFS); keywords: `eos_ids`, `stop_ids`, `ignore_eos`
    /// (`request_args::request_spec`).
    #[pyo3(
        signature = (request_id, prompt_ids, max_tokens, **kw),
        text_signature = "($self, request_id, prompt_ids, max_tokens, *, eos_ids=..., stop_ids=..., ignore_eos=False)"
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
        let spec = request_spec(request_id, prompt_ids, max_tokens, &mut kw)?;
        kw.finish()?;
        self.inner
            .add_request(spec)
            .map_err(|e| engine_error(py, e))
    }

    /// Ends a request and frees its blocks; False when it was not live.
    fn abort(&mut self, py: Python<'_>, request_id: u64) -> PyResult<bool> {
        self.inner
            .abort(RequestId(request_id))
            .map_err(|e| engine_error(py, e))
    }

    /// Plans the next step (its blocks reserved) and lays it out for its graph, as one dict:
    /// `request_ids`, `row_tokens`, `sample` (per row), `preempted`, `num_tokens`,
    /// `num_cached_tokens`, `dims` (`(tokens, seqs, max_blocks)`, padded by
    /// `StepDims::padded`) and `inputs` (the step graph's int32 arrays at those dims: `ids`,
    /// `positions`, `slot_mapping`, `token_seq`, `block_tables` `[seqs, max_blocks]`,
    /// `last_rows`). No rows when nothing is runnable.
    fn schedule<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = self.inner.schedule().map_err(|e| engine_error(py, e))?;
        let dims = StepDims::padded(out.dims(), self.inner.config().max_step_tokens);
        let d = plan_dict(py, &out, dims)?;
        let inputs = if out.is_empty() {
            PyDict::new(py)
        } else {
            let f = out.flatten(dims).map_err(|e| engine_error(py, e))?;
            layout_dict(py, f)?
        };
        d.set_item("inputs", inputs)?;
        Ok(d)
    }

    /// Takes the step's `(request_id, token)` per sampled row; returns
    /// `(request_id, token, finish_reason)` per accepted token (`"stop"`, `"length"` or None).
    fn update(
        &mut self,
        py: Python<'_>,
        sampled: Vec<(u64, TokenId)>,
    ) -> PyResult<Vec<(u64, TokenId, Option<&'static str>)>> {
        let output = StepOutput {
            sampled: sampled
                .into_iter()
                .map(|(id, t)| (RequestId(id), t))
                .collect(),
        };
        let events = self.inner.update(output).map_err(|e| engine_error(py, e))?;
        Ok(events
            .into_iter()
            .map(|e| (e.request_id.0, e.token, finish_name(e.finish)))
            .collect())
    }

    /// Usable KV blocks (the null block excluded).
    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.pool().num_usable_blocks()
    }

    /// Blocks the runtime's KV pool must hold: the usable ones plus the reserved null block 0
    /// (padding table entries point at it).
    #[getter]
    fn pool_blocks(&self) -> usize {
        self.inner.config().num_blocks
    }

    /// KV blocks in use.
    #[getter]
    fn used_blocks(&self) -> usize {
        self.inner.num_used_blocks()
    }

    /// Blocks the runtime's pool holds for each windowed layer (`window_group`), the null
    /// block included; 0 without a windowed group.
    #[getter]
    fn window_pool_blocks(&self) -> usize {
        self.inner.config().window_pool_blocks()
    }

    /// The windowed group's KV blocks in use (0 without one).
    #[getter]
    fn used_window_blocks(&self) -> usize {
        self.inner.num_used_window_blocks()
    }

    /// Usable KV blocks not in use.
    #[getter]
    fn free_blocks(&self) -> usize {
        self.inner.pool().num_free_blocks()
    }

    /// Tokens per KV block.
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.config().block_size
    }

    /// Whether any request is live (waiting or running).
    #[getter]
    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }

    /// Whether a planned step awaits its `update`.
    #[getter]
    fn step_in_flight(&self) -> bool {
        self.inner.step_in_flight()
    }

    /// Steps, computed and cached tokens, preemptions, finished and aborted requests.
    fn stats(&self) -> HashMap<&'static str, u64> {
        let s = self.inner.stats();
        HashMap::from([
            ("steps", s.steps),
            ("computed_tokens", s.computed_tokens),
            ("cached_tokens", s.cached_tokens),
            ("preemptions", s.preemptions),
            ("finished", s.finished),
            ("aborted", s.aborted),
        ])
    }

    fn __repr__(&self) -> String {
        format!(
            "Scheduler(num_blocks={}, used_blocks={}, block_size={})",
            self.num_blocks(),
            self.used_blocks(),
            self.block_size()
        )
    }
}
