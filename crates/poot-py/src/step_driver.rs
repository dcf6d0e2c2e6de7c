//! The step driver's state and the work its Python methods share: running a plan by step
//! shape (`run_key`), running a split step (`run_split`), and applying sampled tokens to the
//! scheduler (`apply`).
//!
//! Invariants:
//! - `requests` holds the sampling state of exactly the live requests the driver was given;
//!   a request's state goes when it finishes or is aborted.
//! - `callbacks` is None only after the garbage collector cleared the driver; every call that
//!   needs Python then fails with a `RuntimeError` instead of running without them.
//! - The scheduler is borrowed only while applying tokens, never while a plan runs (a Python
//!   runtime may read it).

use std::collections::HashMap;
use std::sync::Arc;

use poot_engine::{RequestId, RequestSampling, StepOutput, TokenId};
use poot_runtime::{HostTensor, Runtime};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::engine::{finish_name, PyScheduler};
use crate::errors::engine_error;
use crate::step_io::NativeRuntime;
use crate::step_run::{run_plan, run_split, Mask, PlanKey, SplitStep, StepPlans, Target};

/// Schedules, lays out and runs steps (`poot._native.StepDriver`).
#[pyclass(name = "StepDriver", module = "poot._native")]
pub struct PyStepDriver {
    pub(crate) scheduler: Py<PyScheduler>,
    pub(crate) runtime: Py<PyAny>,
    pub(crate) native: Option<Arc<dyn Runtime>>,
    pub(crate) samples_on_device: bool,
    /// Where a split step samples (the runtime lacks the logit ops): a native CPU runtime.
    pub(crate) host: Option<NativeRuntime>,
    /// `(plan_for, fill_mask)`; None once the garbage collector cleared the driver (they
    /// hold the engine core that holds the driver).
    pub(crate) callbacks: Option<(Py<PyAny>, Py<PyAny>)>,
    pub(crate) timeout_s: f64,
    pub(crate) logprob_width: usize,
    pub(crate) plans: StepPlans,
    pub(crate) requests: HashMap<u64, RequestSampling>,
    pub(crate) step_rows: Vec<u64>,
    pub(crate) prefill_tokens: u64,
    pub(crate) decode_tokens: u64,
}

impl std::fmt::Debug for PyStepDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepDriver")
            .field("requests", &self.requests.len())
            .field("plans", &self.plans.len())
            .finish()
    }
}

impl PyStepDriver {
    /// `(plan_for, fill_mask)`, new references (a run may call back into Python).
    fn callbacks(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        let (plan_for, fill) = self
            .callbacks
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the step driver was cleared"))?;
        Ok((plan_for.clone_ref(py), fill.clone_ref(py)))
    }

    /// Runs the plan of `key` on `inputs`; `mask_rows` (`(row, request_id)`): the step takes
    /// a token mask, filled while it runs.
    pub(crate) fn run_key(
        &mut self,
        py: Python<'_>,
        key: PlanKey,
        inputs: Vec<(&'static str, HostTensor)>,
        mask_rows: Option<Vec<(usize, u64)>>,
    ) -> PyResult<Vec<(String, HostTensor)>> {
        let seqs = key.1;
        let (plan_for, fill) = self.callbacks(py)?;
        let plan = self.plans.get(py, key, plan_for.bind(py))?;
        let target = Target {
            runtime: &self.runtime,
            native: self.native.as_ref(),
            timeout_s: self.timeout_s,
        };
        let fill = fill.bind(py);
        let mask = mask_rows.map(|rows| Mask { fill, rows, seqs });
        run_plan(py, target, plan, inputs, mask)
    }

    /// Runs a split step (`step_run::run_split`) on the runtime and the host runtime.
    pub(crate) fn run_split(
        &mut self,
        py: Python<'_>,
        step: SplitStep<'_>,
        layout: Vec<(&'static str, HostTensor)>,
        mask_rows: Option<Vec<(usize, u64)>>,
    ) -> PyResult<Vec<(String, HostTensor)>> {
        let (plan_for, fill) = self.callbacks(py)?;
        let (host_obj, host_rt) = self
            .host
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("a split step needs a host runtime"))?;
        let device = Target {
            runtime: &self.runtime,
            native: self.native.as_ref(),
            timeout_s: self.timeout_s,
        };
        let host = Target {
            runtime: host_obj,
            native: Some(host_rt),
            timeout_s: self.timeout_s,
        };
        let fill = fill.bind(py);
        let seqs = step.dims.seqs;
        let mask = mask_rows.map(|rows| Mask { fill, rows, seqs });
        let plan_for = plan_for.bind(py);
        run_split(
            py,
            &mut self.plans,
            plan_for,
            [device, host],
            step,
            layout,
            mask,
        )
    }

    pub(crate) fn forget_request(&mut self, request_id: u64) {
        self.requests.remove(&request_id);
    }

    /// Gives the scheduler a step's sampled tokens; counts the accepted ones for penalties and
    /// drops finished requests' state.
    pub(crate) fn apply<'py>(
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
                self.forget_request(rid);
            } else if let Some(r) = self.requests.get_mut(&rid) {
                r.accept(e.token);
            }
            list.append((rid, e.token, finish_name(e.finish)))?;
        }
        Ok(list)
    }
}
