//! `Tracer`'s methods: model definitions record a step's graph op by op, one method an op.
//!
//! Invariants: every call goes straight to `poot_graph::Tracer` (through `tracer_state`'s
//! `rec`), which checks operands and budgets before recording anything, so a refused call
//! leaves the trace unchanged. Tracing costs no GIL release: each call is a few checks and one
//! push.

use poot_core::DType;
use poot_graph::{
    AdjustInputs, AttentionConfig, AttentionMeta, ReduceKind, RopeConfig, SampleInputs, Tracer,
    UnaryKind,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{trace_error, trace_error_kind};
use crate::graph::PyGraph;
use crate::limits::PyTraceLimits;
use crate::rope_args::{bad_kind, binary_kind, parse_scaling, parse_style};
use crate::tracer_state::{PyTracer, PyValue};
use crate::weights::PyWeights;

fn parse_dtype(py: Python<'_>, dtype: &str) -> PyResult<DType> {
    match dtype.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "i32" | "int32" => Ok(DType::I32),
        _ => Err(trace_error_kind(
            py,
            "shape",
            Some("input"),
            None,
            format!("input: dtype must be \"f32\" or \"i32\", got {dtype:?}"),
        )),
    }
}

#[pymethods]
impl PyTracer {
    /// Starts a trace of one step of `step_tokens` tokens against `weights`.
    #[new]
    #[pyo3(signature = (weights, step_tokens, limits=None))]
    fn py_new(
        py: Python<'_>,
        weights: &PyWeights,
        step_tokens: usize,
        limits: Option<&PyTraceLimits>,
    ) -> PyResult<Self> {
        let limits = limits.map(|l| l.inner).unwrap_or_default();
        let inner = Tracer::new(limits, step_tokens, weights.catalog.clone())
            .map_err(|e| trace_error(py, e))?;
        Ok(PyTracer::new(inner))
    }

    /// Tokens in the step being traced.
    #[getter]
    fn step_tokens(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.tracer(py)?.step_tokens())
    }

    #[getter]
    fn limits(&mut self, py: Python<'_>) -> PyResult<PyTraceLimits> {
        Ok(PyTraceLimits {
            inner: *self.tracer(py)?.limits(),
        })
    }

    /// Running totals: values, equations, literal_bytes, records.
    fn usage<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = self.tracer(py)?.usage();
        let d = PyDict::new(py);
        d.set_item("values", u.values)?;
        d.set_item("equations", u.equations)?;
        d.set_item("literal_bytes", u.literal_bytes)?;
        d.set_item("records", u.records)?;
        Ok(d)
    }

    /// A runtime input fed by name at every run; dtype "f32" or "i32".
    fn input(
        &mut self,
        py: Python<'_>,
        name: &str,
        dtype: &str,
        shape: Vec<usize>,
    ) -> PyResult<PyValue> {
        let dtype = parse_dtype(py, dtype)?;
        self.rec(py, |t| t.input(name, dtype, shape))
    }

    /// A handle to a stored tensor; the same name gives the same value.
    fn weight(&mut self, py: Python<'_>, name: &str) -> PyResult<PyValue> {
        self.rec(py, |t| t.weight(name))
    }

    /// The stored float weight `x` read as `to` ("f32", the only target). Reading a half
    /// weight through `matmul`, `embedding`, a norm or an elementwise op records one already.
    #[pyo3(signature = (x, to = "f32"))]
    fn cast(&mut self, py: Python<'_>, x: &PyValue, to: &str) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        let to = match to.to_ascii_lowercase().as_str() {
            "f32" | "float32" => DType::F32,
            _ => {
                return Err(trace_error_kind(
                    py,
                    "shape",
                    Some("cast"),
                    None,
                    format!("cast: to must be \"f32\", got {to:?}"),
                ))
            }
        };
        self.rec(py, |t| t.cast(x, to))
    }

    /// True when the checkpoint has a tensor of this name.
    fn has_weight(&mut self, py: Python<'_>, name: &str) -> PyResult<bool> {
        Ok(self.tracer(py)?.has_weight(name))
    }

    /// A small f32 constant; its size is checked against the budget before it is converted.
    fn literal(
        &mut self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        shape: Vec<usize>,
    ) -> PyResult<PyValue> {
        let n = data.len()?;
        self.tracer(py)?
            .check_literal(n)
            .map_err(|e| trace_error(py, e))?;
        let values: Vec<f32> = data.extract()?;
        self.rec(py, |t| t.literal(&values, shape))
    }

    /// Rows of a stored table [V, D] picked by ids [T] -> [T, D].
    fn embedding(&mut self, py: Python<'_>, table: &PyValue, ids: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, table, ids, Tracer::embedding)
    }

    /// RMS norm over the last dim of `x`, times `weight` [D].
    #[pyo3(signature = (x, weight, eps))]
    fn rms_norm(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        weight: &PyValue,
        eps: f32,
    ) -> PyResult<PyValue> {
        let (x, w) = (self.vid(py, x)?, self.vid(py, weight)?);
        self.rec(py, |t| t.rms_norm(x, w, eps))
    }

    /// `x` [T, K] times a stored weight [N, K] -> [T, N].
    fn matmul(&mut self, py: Python<'_>, x: &PyValue, w: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, x, w, Tracer::matmul)
    }

    /// Elementwise; `b` is `a`'s shape or one row broadcast over `a`'s rows.
    fn add(&mut self, py: Python<'_>, a: &PyValue, b: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, a, b, Tracer::add)
    }

    /// Elementwise, broadcasting like `add`.
    fn mul(&mut self, py: Python<'_>, a: &PyValue, b: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, a, b, Tracer::mul)
    }

    fn silu(&mut self, py: Python<'_>, x: &PyValue) -> PyResult<PyValue> {
        self.unary_op(py, x, Tracer::silu)
    }

    /// tanh approximation.
    fn gelu(&mut self, py: Python<'_>, x: &PyValue) -> PyResult<PyValue> {
        self.unary_op(py, x, Tracer::gelu)
    }

    /// `x` [T, E] at `ids` [T, k] (i32) -> [T, k] (a router's weights of its chosen experts);
    /// `ids` [1, k] picks the same columns of every row.
    fn gather_cols(&mut self, py: Python<'_>, x: &PyValue, ids: &PyValue) -> PyResult<PyValue> {
        let (x, ids) = (self.vid(py, x)?, self.vid(py, ids)?);
        self.rec(py, |t| t.gather_cols(x, ids))
    }

    /// `x` [T or T * k, K] through experts `ids` [T, k] of the stored `w` [E, N, K]
    /// -> [T * k, N]; only the chosen experts' rows are read.
    fn moe_matmul(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        w: &PyValue,
        ids: &PyValue,
    ) -> PyResult<PyValue> {
        let (x, w, ids) = (self.vid(py, x)?, self.vid(py, w)?, self.vid(py, ids)?);
        self.rec(py, |t| t.moe_matmul(x, w, ids))
    }

    /// `y` [T * k, D] weighted by `weights` [T, k] and summed per token -> [T, D].
    fn moe_combine(&mut self, py: Python<'_>, y: &PyValue, weights: &PyValue) -> PyResult<PyValue> {
        let (y, weights) = (self.vid(py, y)?, self.vid(py, weights)?);
        self.rec(py, |t| t.moe_combine(y, weights))
    }

    /// `cap * tanh(x / cap)` elementwise (logit soft-capping).
    fn softcap(&mut self, py: Python<'_>, x: &PyValue, cap: f32) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.softcap(x, cap))
    }

    /// Over the last dim.
    fn softmax(&mut self, py: Python<'_>, x: &PyValue) -> PyResult<PyValue> {
        self.unary_op(py, x, Tracer::softmax)
    }

    /// Rotates `x` [T, n_heads * head_dim] by `positions` [T].
    ///
    /// `style` is "interleaved" (GPT-J pairs 2i, 2i+1) or "neox" (pairs i, i + rot_dim/2);
    /// `scaling` is None, {"type": "linear", "factor": f} or {"type": "llama3", "factor",
    /// "low_freq_factor", "high_freq_factor", "original_max_position"}.
    #[pyo3(signature = (x, positions, *, n_heads, head_dim, rot_dim=None, theta=10000.0, style="neox", scaling=None))]
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        positions: &PyValue,
        n_heads: u32,
        head_dim: u32,
        rot_dim: Option<u32>,
        theta: f32,
        style: &str,
        scaling: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyValue> {
        let style = parse_style(py, style)?;
        let cfg = RopeConfig {
            n_heads,
            head_dim,
            rot_dim: rot_dim.unwrap_or(head_dim),
            theta,
            style,
            scaling: parse_scaling(py, scaling)?,
        };
        let (x, p) = (self.vid(py, x)?, self.vid(py, positions)?);
        self.rec(py, |t| t.rope(x, p, cfg))
    }

    /// Causal grouped-query attention over the paged KV cache of `layer`, writing this step's
    /// k/v into their slots first. `scale` defaults to 1/sqrt(head_dim); `window` (0: none)
    /// limits each token to its last `window` positions; `softcap` (0: none) caps scores.
    #[pyo3(signature = (q, k, v, *, slot_mapping, token_seq, positions, block_tables, layer, n_heads, n_kv_heads, head_dim, scale=None, window=0, softcap=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn paged_attention(
        &mut self,
        py: Python<'_>,
        q: &PyValue,
        k: &PyValue,
        v: &PyValue,
        slot_mapping: &PyValue,
        token_seq: &PyValue,
        positions: &PyValue,
        block_tables: &PyValue,
        layer: u32,
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        scale: Option<f32>,
        window: u32,
        softcap: f32,
    ) -> PyResult<PyValue> {
        let meta = AttentionMeta {
            slot_mapping: self.vid(py, slot_mapping)?,
            token_seq: self.vid(py, token_seq)?,
            positions: self.vid(py, positions)?,
            block_tables: self.vid(py, block_tables)?,
        };
        let cfg = AttentionConfig {
            layer,
            n_heads,
            n_kv_heads,
            head_dim,
            scale: scale.unwrap_or_else(|| 1.0 / (head_dim.max(1) as f32).sqrt()),
            window,
            softcap,
        };
        let (q, k, v) = (self.vid(py, q)?, self.vid(py, k)?, self.vid(py, v)?);
        self.rec(py, |t| t.paged_attention(q, k, v, meta, cfg))
    }

    /// `kind(x)` elementwise: "relu", "gelu_erf", "tanh", "sigmoid", "neg", "exp", "sqrt",
    /// "rsqrt", "abs", "log", "step" or "gelu_erf_grad".
    fn unary(&mut self, py: Python<'_>, x: &PyValue, kind: &str) -> PyResult<PyValue> {
        let k = UnaryKind::ALL.into_iter().find(|k| k.name() == kind);
        let k = k.ok_or_else(|| bad_kind(py, "unary", kind))?;
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.unary(x, k))
    }

    /// `a kind b` ("add", "sub", "mul", "div") with numpy broadcasting; either operand may be
    /// a stored float weight.
    fn binary(
        &mut self,
        py: Python<'_>,
        a: &PyValue,
        b: &PyValue,
        kind: &str,
    ) -> PyResult<PyValue> {
        let k = binary_kind(py, "binary", kind)?;
        let (a, b) = (self.vid(py, a)?, self.vid(py, b)?);
        self.rec(py, |t| t.binary(a, b, k))
    }

    /// `x kind value` elementwise, or `value kind x` when `reverse`.
    #[pyo3(signature = (x, kind, value, *, reverse=false))]
    fn scalar(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        kind: &str,
        value: f32,
        reverse: bool,
    ) -> PyResult<PyValue> {
        let k = binary_kind(py, "scalar", kind)?;
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.scalar(x, k, value, reverse))
    }

    /// Layer norm over the last dim, with optional `weight` and `bias` [D].
    #[pyo3(signature = (x, weight, bias, eps))]
    fn layer_norm(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        weight: Option<&PyValue>,
        bias: Option<&PyValue>,
        eps: f32,
    ) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        let w = weight.map(|w| self.vid(py, w)).transpose()?;
        let b = bias.map(|b| self.vid(py, b)).transpose()?;
        self.rec(py, |t| t.layer_norm(x, w, b, eps))
    }

    /// Axes reordered: output axis `i` is input axis `perm[i]`.
    fn permute(&mut self, py: Python<'_>, x: &PyValue, perm: Vec<usize>) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.permute(x, perm))
    }

    /// `a` [.., M, K] times `b` [.., K, N] -> [.., M, N], batch dims broadcast.
    fn batch_matmul(&mut self, py: Python<'_>, a: &PyValue, b: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, a, b, Tracer::batch_matmul)
    }

    /// "sum", "mean" or "max" over the last dim -> [.., 1].
    fn reduce(&mut self, py: Python<'_>, x: &PyValue, kind: &str) -> PyResult<PyValue> {
        let k = ReduceKind::ALL
            .into_iter()
            .find(|k| k.name().strip_prefix("reduce_") == Some(kind));
        let k = k.ok_or_else(|| bad_kind(py, "reduce", kind))?;
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.reduce(x, k))
    }

    /// -inf above the causal diagonal of the last two dims.
    fn causal_mask(&mut self, py: Python<'_>, x: &PyValue) -> PyResult<PyValue> {
        self.unary_op(py, x, Tracer::causal_mask)
    }

    fn reshape(&mut self, py: Python<'_>, x: &PyValue, shape: Vec<usize>) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.reshape(x, shape))
    }

    /// `x[.., start:end, ..]` along `axis`.
    fn slice(
        &mut self,
        py: Python<'_>,
        x: &PyValue,
        axis: usize,
        start: usize,
        end: usize,
    ) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.slice(x, axis, start, end))
    }

    fn concat(
        &mut self,
        py: Python<'_>,
        xs: Vec<PyRef<'_, PyValue>>,
        axis: usize,
    ) -> PyResult<PyValue> {
        let ids = xs
            .iter()
            .map(|x| self.vid(py, x))
            .collect::<PyResult<Vec<_>>>()?;
        self.rec(py, |t| t.concat(&ids, axis))
    }

    /// Rows of `x` [T, D] picked by `rows` [R] -> [R, D].
    fn gather_rows(&mut self, py: Python<'_>, x: &PyValue, rows: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, x, rows, Tracer::gather_rows)
    }

    /// `src` [T, D] added into `rows` zero rows by `ids` [T] -> [rows, D], in order of `t`
    /// (the adjoint of `gather_rows`).
    fn scatter_add_rows(
        &mut self,
        py: Python<'_>,
        src: &PyValue,
        ids: &PyValue,
        rows: usize,
    ) -> PyResult<PyValue> {
        let (src, ids) = (self.vid(py, src)?, self.vid(py, ids)?);
        self.rec(py, |t| t.scatter_add_rows(src, ids, rows))
    }

    /// One token id per row of `logits` [S, V] -> [S] i32 (-1: no usable token), from
    /// per-row inputs.
    #[pyo3(signature = (logits, *, temperature, top_k, top_p, min_p, uniform))]
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &mut self,
        py: Python<'_>,
        logits: &PyValue,
        temperature: &PyValue,
        top_k: &PyValue,
        top_p: &PyValue,
        min_p: &PyValue,
        uniform: &PyValue,
    ) -> PyResult<PyValue> {
        let params = SampleInputs {
            temperature: self.vid(py, temperature)?,
            top_k: self.vid(py, top_k)?,
            top_p: self.vid(py, top_p)?,
            min_p: self.vid(py, min_p)?,
            uniform: self.vid(py, uniform)?,
        };
        let l = self.vid(py, logits)?;
        self.rec(py, |t| t.sample(l, params))
    }

    /// Penalties and logit bias over a sparse per-row id list -> [S, V].
    #[pyo3(signature = (logits, *, ids, counts, bias, repetition, presence, frequency))]
    #[allow(clippy::too_many_arguments)]
    fn adjust_logits(
        &mut self,
        py: Python<'_>,
        logits: &PyValue,
        ids: &PyValue,
        counts: &PyValue,
        bias: &PyValue,
        repetition: &PyValue,
        presence: &PyValue,
        frequency: &PyValue,
    ) -> PyResult<PyValue> {
        let adjust = AdjustInputs {
            ids: self.vid(py, ids)?,
            counts: self.vid(py, counts)?,
            bias: self.vid(py, bias)?,
            repetition: self.vid(py, repetition)?,
            presence: self.vid(py, presence)?,
            frequency: self.vid(py, frequency)?,
        };
        let l = self.vid(py, logits)?;
        self.rec(py, |t| t.adjust_logits(l, adjust))
    }

    /// Disallowed tokens (clear bits of `mask` [S, ceil(V/32)] i32) to -inf -> [S, V].
    fn mask_logits(
        &mut self,
        py: Python<'_>,
        logits: &PyValue,
        mask: &PyValue,
    ) -> PyResult<PyValue> {
        self.binary_op(py, logits, mask, Tracer::mask_logits)
    }

    /// The ids of each row's `k` largest values -> [S, k] i32.
    fn top_k_ids(&mut self, py: Python<'_>, x: &PyValue, k: usize) -> PyResult<PyValue> {
        let x = self.vid(py, x)?;
        self.rec(py, |t| t.top_k_ids(x, k))
    }

    /// `log_softmax(logits)` at `ids` [S, K] -> [S, K] f32.
    fn logprobs(&mut self, py: Python<'_>, logits: &PyValue, ids: &PyValue) -> PyResult<PyValue> {
        self.binary_op(py, logits, ids, Tracer::logprobs)
    }

    /// Names `v` as a graph output.
    fn output(&mut self, py: Python<'_>, name: &str, v: &PyValue) -> PyResult<()> {
        let v = self.vid(py, v)?;
        self.tracer(py)?
            .output(name, v)
            .map_err(|e| trace_error(py, e))
    }

    /// The finished graph; the tracer accepts no further calls.
    fn finish(&mut self, py: Python<'_>) -> PyResult<PyGraph> {
        let t = self.take(py)?;
        Ok(PyGraph {
            inner: std::sync::Arc::new(t.finish()),
        })
    }
}
