//! `Graph`: a finished trace, its inputs, outputs, weights, equations and a text dump.
//!
//! Invariant: a `Graph` is immutable and shared (`Arc`), so compiling it never copies it.

use std::fmt::Write as _;
use std::sync::Arc;

use poot_graph::{run_passes, DeadCodeElimination, Graph, Op, RopeScaling, RopeStyle, ValueInfo};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::compile_error;
use crate::limits::{compile_limits, PyCompileLimits};

/// Registers the graph, tracer, limits and weights classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<crate::limits::PyTraceLimits>()?;
    m.add_class::<PyCompileLimits>()?;
    m.add_class::<crate::weights::PyWeights>()?;
    m.add_class::<crate::tracer_state::PyValue>()?;
    m.add_class::<crate::tracer_state::PyTracer>()?;
    m.add_class::<PyGraph>()?;
    Ok(())
}

/// A traced step: equations in definition order, typed values, named outputs.
#[pyclass(name = "Graph", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PyGraph {
    pub(crate) inner: Arc<Graph>,
}

impl PyGraph {
    pub(crate) fn new(graph: Graph) -> Self {
        PyGraph {
            inner: Arc::new(graph),
        }
    }
}

fn typed<'py>(py: Python<'py>, name: &str, info: &ValueInfo) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            name.into_pyobject(py)?.into_any(),
            info.dtype.name().into_pyobject(py)?.into_any(),
            PyTuple::new(py, &info.shape)?.into_any(),
        ],
    )
}

fn rope_style(s: RopeStyle) -> &'static str {
    match s {
        RopeStyle::Interleaved => "interleaved",
        RopeStyle::NeoX => "neox",
    }
}

/// The op's static attributes (everything but operands) as a dict.
fn attrs<'py>(py: Python<'py>, op: &Op) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match op {
        Op::Input { name } | Op::Weight { name } => d.set_item("name", name)?,
        Op::Literal { data } => d.set_item("data", data)?,
        Op::RmsNorm { eps, .. } => d.set_item("eps", eps)?,
        Op::Rope { cfg, .. } => {
            d.set_item("n_heads", cfg.n_heads)?;
            d.set_item("head_dim", cfg.head_dim)?;
            d.set_item("rot_dim", cfg.rot_dim)?;
            d.set_item("theta", cfg.theta)?;
            d.set_item("style", rope_style(cfg.style))?;
            let s = PyDict::new(py);
            match cfg.scaling {
                RopeScaling::None => s.set_item("type", "none")?,
                RopeScaling::Linear { factor } => {
                    s.set_item("type", "linear")?;
                    s.set_item("factor", factor)?;
                }
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position,
                } => {
                    s.set_item("type", "llama3")?;
                    s.set_item("factor", factor)?;
                    s.set_item("low_freq_factor", low_freq_factor)?;
                    s.set_item("high_freq_factor", high_freq_factor)?;
                    s.set_item("original_max_position", original_max_position)?;
                }
                RopeScaling::Factors {
                    factors,
                    attn_factor,
                } => {
                    s.set_item("type", "factors")?;
                    s.set_item("factors", &factors[..cfg.rot_dim as usize / 2])?;
                    s.set_item("attn_factor", attn_factor)?;
                }
            }
            d.set_item("scaling", s)?;
        }
        Op::PagedAttention { cfg, .. } => {
            d.set_item("layer", cfg.layer)?;
            d.set_item("n_heads", cfg.n_heads)?;
            d.set_item("n_kv_heads", cfg.n_kv_heads)?;
            d.set_item("head_dim", cfg.head_dim)?;
            d.set_item("scale", cfg.scale)?;
            d.set_item("window", cfg.window)?;
            d.set_item("softcap", cfg.softcap)?;
        }
        Op::Cast { to, .. } => d.set_item("to", to.to_string())?,
        Op::Softcap { cap, .. } => d.set_item("cap", cap)?,
        Op::Reshape { shape, .. } => d.set_item("shape", PyTuple::new(py, shape)?)?,
        Op::Slice {
            axis, start, end, ..
        } => {
            d.set_item("axis", axis)?;
            d.set_item("start", start)?;
            d.set_item("end", end)?;
        }
        Op::Concat { axis, .. } => d.set_item("axis", axis)?,
        Op::TopK { k, .. } => d.set_item("k", k)?,
        Op::ScatterAddRows { rows, .. } => d.set_item("rows", rows)?,
        Op::Scalar { value, reverse, .. } => {
            d.set_item("value", value)?;
            d.set_item("reverse", reverse)?;
        }
        Op::LayerNorm {
            eps, weight, bias, ..
        } => {
            d.set_item("eps", eps)?;
            d.set_item("weight", weight.is_some())?;
            d.set_item("bias", bias.is_some())?;
        }
        Op::Permute { perm, .. } => d.set_item("perm", PyTuple::new(py, perm)?)?,
        _ => {}
    }
    Ok(d)
}

/// One line of attributes for the text dump.
fn attr_text(op: &Op) -> String {
    match op {
        Op::Input { name } | Op::Weight { name } => format!(" {name:?}"),
        Op::Literal { data } => format!(" [{} values]", data.len()),
        Op::RmsNorm { eps, .. } => format!(" eps={eps}"),
        Op::Rope { cfg, .. } => format!(
            " heads={}x{} rot_dim={} theta={} style={} scaling={:?}",
            cfg.n_heads,
            cfg.head_dim,
            cfg.rot_dim,
            cfg.theta,
            rope_style(cfg.style),
            cfg.scaling
        ),
        Op::PagedAttention { cfg, .. } => format!(
            " layer={} heads={}/{}x{} scale={} window={} softcap={}",
            cfg.layer,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            cfg.scale,
            cfg.window,
            cfg.softcap
        ),
        Op::Cast { to, .. } => format!(" to={to}"),
        Op::Softcap { cap, .. } => format!(" cap={cap}"),
        Op::Reshape { shape, .. } => format!(" shape={shape:?}"),
        Op::Slice {
            axis, start, end, ..
        } => format!(" axis={axis} {start}..{end}"),
        Op::Concat { axis, .. } => format!(" axis={axis}"),
        Op::TopK { k, .. } => format!(" k={k}"),
        Op::ScatterAddRows { rows, .. } => format!(" rows={rows}"),
        Op::Scalar { value, reverse, .. } => format!(" value={value} reverse={reverse}"),
        Op::LayerNorm { eps, .. } => format!(" eps={eps}"),
        Op::Permute { perm, .. } => format!(" perm={perm:?}"),
        _ => String::new(),
    }
}

#[pymethods]
impl PyGraph {
    #[getter]
    fn n_equations(&self) -> usize {
        self.inner.equations.len()
    }

    /// Tokens in the step the graph was traced for.
    #[getter]
    fn step_tokens(&self) -> usize {
        self.inner.step_tokens
    }

    /// Runtime inputs as `(name, dtype, shape)`, in definition order.
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .inputs()
            .map(|(n, _, info)| typed(py, n, info))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Named outputs as `(name, dtype, shape)`.
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let g = &self.inner;
        let items = g
            .outputs
            .iter()
            .map(|(n, v)| typed(py, n, g.info(*v)))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Each named output's value id (the index into `equations()`).
    fn output_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, v) in &self.inner.outputs {
            d.set_item(name, v.0)?;
        }
        Ok(d)
    }

    /// Stored tensors the graph reads as `(name, dtype, shape)`, in definition order.
    fn weights<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .weights()
            .map(|(n, _, info)| typed(py, n, info))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Every equation as `(op, operand ids, attributes, dtype, shape)`; equation i defines
    /// value i.
    fn equations<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let g = &self.inner;
        let mut items = Vec::with_capacity(g.equations.len());
        for (op, info) in g.equations.iter().zip(&g.values) {
            let operands: Vec<u32> = op.operands().iter().map(|v| v.0).collect();
            items.push(PyTuple::new(
                py,
                [
                    op.name().into_pyobject(py)?.into_any(),
                    PyList::new(py, operands)?.into_any(),
                    attrs(py, op)?.into_any(),
                    info.dtype.name().into_pyobject(py)?.into_any(),
                    PyTuple::new(py, &info.shape)?.into_any(),
                ],
            )?);
        }
        PyList::new(py, items)
    }

    /// The graph as text, one equation a line: `%3 = matmul(%1, %2) : F32[5, 64]`.
    fn dump(&self) -> String {
        let g = &self.inner;
        let mut out = format!(
            "graph: {} equations, step of {} tokens\n",
            g.equations.len(),
            g.step_tokens
        );
        for (i, (op, info)) in g.equations.iter().zip(&g.values).enumerate() {
            let operands: Vec<String> = op.operands().iter().map(|v| format!("%{}", v.0)).collect();
            let _ = writeln!(
                out,
                "%{i} = {}({}){} : {}{:?}",
                op.name(),
                operands.join(", "),
                attr_text(op),
                info.dtype,
                info.shape
            );
        }
        for (name, v) in &g.outputs {
            let _ = writeln!(out, "output {name:?} = %{}", v.0);
        }
        out
    }

    /// The graph with every equation no output needs removed, under `limits`
    /// (a `CompileExpansionError` when the result would pass `max_equations`).
    #[pyo3(signature = (limits=None))]
    fn eliminate_dead_code(
        &self,
        py: Python<'_>,
        limits: Option<&PyCompileLimits>,
    ) -> PyResult<PyGraph> {
        let limits = compile_limits(limits);
        run_passes(&self.inner, &[&DeadCodeElimination], &limits)
            .map(PyGraph::new)
            .map_err(|e| compile_error(py, e))
    }

    fn __str__(&self) -> String {
        self.dump()
    }

    fn __repr__(&self) -> String {
        format!(
            "Graph(n_equations={}, step_tokens={}, outputs={:?})",
            self.inner.equations.len(),
            self.inner.step_tokens,
            self.inner
                .outputs
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
        )
    }
}
