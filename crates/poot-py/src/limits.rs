//! Python classes over `poot_graph::{TraceLimits, CompileLimits}`: frozen, keyword-only
//! constructors whose defaults are the Rust defaults.

use poot_graph::{CompileLimits, TraceLimits};
use pyo3::prelude::*;

/// What a trace may grow to (`poot_graph::TraceLimits`).
#[pyclass(name = "TraceLimits", module = "poot._native", frozen, eq)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyTraceLimits {
    pub(crate) inner: TraceLimits,
}

#[pymethods]
impl PyTraceLimits {
    #[new]
    #[pyo3(signature = (*, max_tokens=None, max_values=None, max_equations=None, max_literal_bytes=None, max_records=None))]
    fn py_new(
        max_tokens: Option<usize>,
        max_values: Option<usize>,
        max_equations: Option<usize>,
        max_literal_bytes: Option<usize>,
        max_records: Option<usize>,
    ) -> Self {
        let d = TraceLimits::default();
        PyTraceLimits {
            inner: TraceLimits {
                max_tokens: max_tokens.unwrap_or(d.max_tokens),
                max_values: max_values.unwrap_or(d.max_values),
                max_equations: max_equations.unwrap_or(d.max_equations),
                max_literal_bytes: max_literal_bytes.unwrap_or(d.max_literal_bytes),
                max_records: max_records.unwrap_or(d.max_records),
            },
        }
    }

    /// Tokens in one step; longer prompts run as several chunks.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens
    }

    #[getter]
    fn max_values(&self) -> usize {
        self.inner.max_values
    }

    #[getter]
    fn max_equations(&self) -> usize {
        self.inner.max_equations
    }

    /// Bytes of literal (constant) data.
    #[getter]
    fn max_literal_bytes(&self) -> usize {
        self.inner.max_literal_bytes
    }

    /// Owned records: names (inputs, weights, outputs) and operand lists.
    #[getter]
    fn max_records(&self) -> usize {
        self.inner.max_records
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "TraceLimits(max_tokens={}, max_values={}, max_equations={}, max_literal_bytes={}, \
             max_records={})",
            l.max_tokens, l.max_values, l.max_equations, l.max_literal_bytes, l.max_records
        )
    }
}

/// What compilation may grow to (`poot_graph::CompileLimits`).
#[pyclass(name = "CompileLimits", module = "poot._native", frozen, eq)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyCompileLimits {
    pub(crate) inner: CompileLimits,
}

#[pymethods]
impl PyCompileLimits {
    #[new]
    #[pyo3(signature = (*, max_equations=None, max_kernel_instructions=None, max_kernel_locals=None, max_artifact_bytes=None))]
    fn py_new(
        max_equations: Option<usize>,
        max_kernel_instructions: Option<usize>,
        max_kernel_locals: Option<usize>,
        max_artifact_bytes: Option<u64>,
    ) -> Self {
        let d = CompileLimits::default();
        PyCompileLimits {
            inner: CompileLimits {
                max_equations: max_equations.unwrap_or(d.max_equations),
                max_kernel_instructions: max_kernel_instructions
                    .unwrap_or(d.max_kernel_instructions),
                max_kernel_locals: max_kernel_locals.unwrap_or(d.max_kernel_locals),
                max_artifact_bytes: max_artifact_bytes.unwrap_or(d.max_artifact_bytes),
            },
        }
    }

    /// Equations after every pass.
    #[getter]
    fn max_equations(&self) -> usize {
        self.inner.max_equations
    }

    /// Instructions in one generated kernel body.
    #[getter]
    fn max_kernel_instructions(&self) -> usize {
        self.inner.max_kernel_instructions
    }

    /// Live locals in one generated kernel body.
    #[getter]
    fn max_kernel_locals(&self) -> usize {
        self.inner.max_kernel_locals
    }

    /// Bytes of one compiled artifact.
    #[getter]
    fn max_artifact_bytes(&self) -> u64 {
        self.inner.max_artifact_bytes
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "CompileLimits(max_equations={}, max_kernel_instructions={}, max_kernel_locals={}, \
             max_artifact_bytes={})",
            l.max_equations, l.max_kernel_instructions, l.max_kernel_locals, l.max_artifact_bytes
        )
    }
}

/// The limits a Python caller gave, or the defaults.
pub(crate) fn compile_limits(limits: Option<&PyCompileLimits>) -> CompileLimits {
    limits.map(|l| l.inner).unwrap_or_default()
}
