//! The one parser of a request's keyword arguments: every native `add_request` takes
//! `(request_id, prompt_ids, max_tokens, **kw)` and reads the scheduler's part of `kw` with
//! `request_spec`, then any further part it owns (sampling settings) with the same `Keywords`.
//!
//! Invariants: a keyword is read at most once; `finish` refuses any keyword nobody read, and a
//! missing required one or a value of the wrong type is a `TypeError` naming the argument, as
//! a Python signature would raise.

use poot_engine::{RequestId, RequestSpec, TokenId};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A call's keyword arguments, read one by one.
pub(crate) struct Keywords<'py> {
    method: &'static str,
    dict: Option<Bound<'py, PyDict>>,
    read: Vec<&'static str>,
}

impl<'py> Keywords<'py> {
    pub(crate) fn new(method: &'static str, dict: Option<&Bound<'py, PyDict>>) -> Self {
        Self {
            method,
            dict: dict.cloned(),
            read: Vec::new(),
        }
    }

    fn value(&mut self, name: &'static str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.read.push(name);
        match &self.dict {
            Some(d) => d.get_item(name),
            None => Ok(None),
        }
    }

    fn extract<T: FromPyObject<'py>>(&self, name: &str, v: &Bound<'py, PyAny>) -> PyResult<T> {
        v.extract()
            .map_err(|e| PyTypeError::new_err(format!("{}() argument '{name}': {e}", self.method)))
    }

    /// The keyword `name`, or `default` when the call leaves it out.
    pub(crate) fn get<T: FromPyObject<'py>>(
        &mut self,
        name: &'static str,
        default: T,
    ) -> PyResult<T> {
        match self.value(name)? {
            Some(v) => self.extract(name, &v),
            None => Ok(default),
        }
    }

    /// The keyword `name`, which the call must give.
    pub(crate) fn required<T: FromPyObject<'py>>(&mut self, name: &'static str) -> PyResult<T> {
        match self.value(name)? {
            Some(v) => self.extract(name, &v),
            None => Err(PyTypeError::new_err(format!(
                "{}() missing required keyword argument '{name}'",
                self.method
            ))),
        }
    }

    /// Refuses the keywords nobody read.
    pub(crate) fn finish(self) -> PyResult<()> {
        let Some(d) = &self.dict else {
            return Ok(());
        };
        for k in d.keys() {
            let k: String = k.extract()?;
            if !self.read.iter().any(|r| *r == k) {
                return Err(PyTypeError::new_err(format!(
                    "{}() got an unexpected keyword argument '{k}'",
                    self.method
                )));
            }
        }
        Ok(())
    }
}

/// The scheduler's request: the positional arguments and the keywords `eos_ids`, `stop_ids`
/// (default none) and `ignore_eos` (default False); it reads the prefix cache (the step
/// driver turns that off for a request asking for prompt logprobs).
pub(crate) fn request_spec(
    request_id: u64,
    prompt_ids: Vec<TokenId>,
    max_tokens: usize,
    kw: &mut Keywords<'_>,
) -> PyResult<RequestSpec> {
    Ok(RequestSpec {
        id: RequestId(request_id),
        prompt_ids,
        max_tokens,
        eos_ids: kw.get("eos_ids", Vec::new())?,
        stop_ids: kw.get("stop_ids", Vec::new())?,
        ignore_eos: kw.get("ignore_eos", false)?,
        skip_prefix_cache: false,
    })
}
