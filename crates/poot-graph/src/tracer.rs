//! The Tracer: model definitions call it op by op, and it records equations under a budget.
//!
//! Invariants: a step longer than `TraceLimits::max_tokens` is refused in `Tracer::new`, before
//! any model code runs. Before each equation is recorded, its cost (one value, one equation,
//! any literal bytes and owned records) is added to the running totals and checked; the first
//! excess returns `TraceError::Budget` and nothing of the refused equation is allocated. Every
//! operand's dtype and shape is checked here, so a finished `Graph` is well-typed.

use std::sync::Arc;

use poot_core::DType;

use crate::error::TraceError;
use crate::ir::{Graph, Op, ValueId, ValueInfo};
use crate::limits::{Resource, TraceLimits};

mod attention;
mod cast;
mod moe;
mod sample;
mod tensor;

pub use tensor::MAX_RANK;

/// Where the tracer looks up stored tensors: dtype and row-major shape by name.
pub trait WeightCatalog: Send + Sync {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)>;
}

/// Running totals of the budgeted resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub values: usize,
    pub equations: usize,
    pub literal_bytes: usize,
    pub records: usize,
}

/// Records one step's graph. See the module docs for the budget rules.
pub struct Tracer {
    limits: TraceLimits,
    catalog: Arc<dyn WeightCatalog>,
    graph: Graph,
    usage: Usage,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("limits", &self.limits)
            .field("usage", &self.usage)
            .field("step_tokens", &self.graph.step_tokens)
            .finish()
    }
}

fn shape_err(op: &'static str, detail: impl Into<String>) -> TraceError {
    TraceError::Shape {
        op,
        detail: detail.into(),
    }
}

fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

impl Tracer {
    /// Starts a trace of a step of `step_tokens` tokens; refuses steps above `max_tokens`.
    pub fn new(
        limits: TraceLimits,
        step_tokens: usize,
        catalog: Arc<dyn WeightCatalog>,
    ) -> Result<Self, TraceError> {
        if step_tokens > limits.max_tokens {
            return Err(TraceError::Budget {
                resource: Resource::Tokens,
                limit: limits.max_tokens as u64,
                total: step_tokens as u64,
            });
        }
        let graph = Graph {
            step_tokens,
            ..Graph::default()
        };
        Ok(Self {
            limits,
            catalog,
            graph,
            usage: Usage::default(),
        })
    }

    pub fn step_tokens(&self) -> usize {
        self.graph.step_tokens
    }

    pub fn limits(&self) -> &TraceLimits {
        &self.limits
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The type of a value already in the trace.
    pub fn info(&self, v: ValueId) -> Result<&ValueInfo, TraceError> {
        self.graph
            .values
            .get(v.index())
            .ok_or(TraceError::BadValue { id: v.0 })
    }

    fn check(resource: Resource, limit: usize, total: usize) -> Result<(), TraceError> {
        if total > limit {
            return Err(TraceError::Budget {
                resource,
                limit: limit as u64,
                total: total as u64,
            });
        }
        Ok(())
    }

    /// Checks the budget for one more equation with `literal_bytes` and `records`, then
    /// records it. Nothing is pushed when a check fails.
    fn push(
        &mut self,
        op: Op,
        info: ValueInfo,
        literal_bytes: usize,
        records: usize,
    ) -> Result<ValueId, TraceError> {
        let next = Usage {
            values: self.usage.values + 1,
            equations: self.usage.equations + 1,
            literal_bytes: self.usage.literal_bytes.saturating_add(literal_bytes),
            records: self.usage.records.saturating_add(records),
        };
        Self::check(
            Resource::Equations,
            self.limits.max_equations,
            next.equations,
        )?;
        Self::check(Resource::Values, self.limits.max_values, next.values)?;
        Self::check(
            Resource::LiteralBytes,
            self.limits.max_literal_bytes,
            next.literal_bytes,
        )?;
        Self::check(Resource::Records, self.limits.max_records, next.records)?;
        let id = ValueId(self.graph.equations.len() as u32);
        self.graph.equations.push(op);
        self.graph.values.push(info);
        self.usage = next;
        Ok(id)
    }

    /// Checks a literal of `n` f32s against the budget without recording it, so a caller can
    /// refuse before converting its data.
    pub fn check_literal(&self, n: usize) -> Result<(), TraceError> {
        let bytes = n.saturating_mul(4);
        Self::check(
            Resource::LiteralBytes,
            self.limits.max_literal_bytes,
            self.usage.literal_bytes.saturating_add(bytes),
        )
    }

    /// A runtime input.
    pub fn input(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Result<ValueId, TraceError> {
        if self.graph.inputs().any(|(n, _, _)| n == name) {
            return Err(TraceError::DuplicateInput {
                name: name.to_owned(),
            });
        }
        self.push(
            Op::Input {
                name: name.to_owned(),
            },
            ValueInfo::new(dtype, shape),
            0,
            1,
        )
    }

    /// A handle to a stored tensor; the same name gives the same value.
    pub fn weight(&mut self, name: &str) -> Result<ValueId, TraceError> {
        if let Some((_, id, _)) = self.graph.weights().find(|(n, _, _)| *n == name) {
            return Ok(id);
        }
        let (dtype, shape) =
            self.catalog
                .describe(name)
                .ok_or_else(|| TraceError::UnknownWeight {
                    name: name.to_owned(),
                })?;
        self.push(
            Op::Weight {
                name: name.to_owned(),
            },
            ValueInfo::new(dtype, shape),
            0,
            1,
        )
    }

    /// True when the checkpoint has a tensor of this name (for optional biases, tied heads).
    pub fn has_weight(&self, name: &str) -> bool {
        self.catalog.describe(name).is_some()
    }

    /// A small f32 constant of the given shape.
    pub fn literal(&mut self, data: &[f32], shape: Vec<usize>) -> Result<ValueId, TraceError> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(shape_err(
                "literal",
                format!("{} values for shape {shape:?}", data.len()),
            ));
        }
        self.check_literal(data.len())?;
        let op = Op::Literal {
            data: data.to_vec(),
        };
        self.push(op, ValueInfo::new(DType::F32, shape), data.len() * 4, 1)
    }

    fn expect(
        &self,
        op: &'static str,
        v: ValueId,
        what: &str,
        dtype_ok: impl Fn(DType) -> bool,
        rank: Option<usize>,
    ) -> Result<ValueInfo, TraceError> {
        let info = self.info(v)?.clone();
        if !dtype_ok(info.dtype) {
            return Err(shape_err(op, format!("{what} has dtype {}", info.dtype)));
        }
        if let Some(r) = rank {
            if info.shape.len() != r {
                return Err(shape_err(
                    op,
                    format!("{what} must have rank {r}, got {:?}", info.shape),
                ));
            }
        }
        Ok(info)
    }

    fn act(
        &self,
        op: &'static str,
        v: ValueId,
        what: &str,
        rank: Option<usize>,
    ) -> Result<ValueInfo, TraceError> {
        self.expect(op, v, what, |d| d == DType::F32, rank)
    }

    fn ids(
        &self,
        op: &'static str,
        v: ValueId,
        what: &str,
        rank: usize,
    ) -> Result<ValueInfo, TraceError> {
        self.expect(op, v, what, |d| d == DType::I32, Some(rank))
    }

    /// A stored weight, or a cast of one (`Tracer::cast`).
    fn stored(&self, op: &'static str, v: ValueId, what: &str) -> Result<ValueInfo, TraceError> {
        if self.graph.stored_source(v).is_none() {
            return Err(shape_err(op, format!("{what} must be a stored weight")));
        }
        self.info(v).cloned()
    }

    /// Rows of a stored table [V, D] by ids [T] -> [T, D] f32.
    pub fn embedding(&mut self, table: ValueId, ids: ValueId) -> Result<ValueId, TraceError> {
        let t = self.stored("embedding", table, "table")?;
        let i = self.ids("embedding", ids, "ids", 1)?;
        if t.shape.len() != 2 {
            return Err(shape_err(
                "embedding",
                format!("table must be [V, D], got {:?}", t.shape),
            ));
        }
        let out = ValueInfo::new(DType::F32, vec![i.shape[0], t.shape[1]]);
        let [table] = self.read_stored([table])?;
        self.push(Op::Embedding { table, ids }, out, 0, 0)
    }

    /// RMS norm over the last dim of `x`, scaled by `weight` [D].
    pub fn rms_norm(
        &mut self,
        x: ValueId,
        weight: ValueId,
        eps: f32,
    ) -> Result<ValueId, TraceError> {
        let xi = self.act("rms_norm", x, "x", None)?;
        let wi = self.expect("rms_norm", weight, "weight", is_float, Some(1))?;
        if xi.shape.last() != wi.shape.first() {
            return Err(shape_err(
                "rms_norm",
                format!("x {:?} vs weight {:?}", xi.shape, wi.shape),
            ));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(shape_err(
                "rms_norm",
                format!("eps must be finite and >= 0, got {eps}"),
            ));
        }
        let [weight] = self.read_stored([weight])?;
        self.push(Op::RmsNorm { x, weight, eps }, xi, 0, 0)
    }

    /// `x` [T, K] times a stored weight [N, K] -> [T, N]; a stored 1-D [K] is the one-row
    /// matrix [1, K] -> [T, 1] (its bytes are already that matrix's).
    ///
    /// A weight `<prefix>.weight` whose store also holds `<prefix>.input_perm` (I32 `[1, K]`:
    /// an act-order layer whose columns were re-laid sorted by group, see
    /// `poot_core::quant::hf`) multiplies `x` with its columns gathered in that order, so every
    /// model gets the permutation without knowing about it.
    pub fn matmul(&mut self, x: ValueId, w: ValueId) -> Result<ValueId, TraceError> {
        let source = self.graph.stored_source(w).unwrap_or(w);
        let perm = match self.graph.op(source) {
            Op::Weight { name } => name
                .strip_suffix(".weight")
                .map(|p| format!("{p}.input_perm"))
                .filter(|p| self.catalog.describe(p).is_some()),
            _ => None,
        };
        let x = match perm {
            Some(p) => {
                let ids = self.weight(&p)?;
                self.gather_cols(x, ids)?
            }
            None => x,
        };
        let xi = self.act("matmul", x, "x", Some(2))?;
        let wi = self.stored("matmul", w, "w")?;
        let (n, k) = wi.matrix();
        if !matches!(wi.shape.len(), 1 | 2) || k != xi.shape[1] {
            return Err(shape_err(
                "matmul",
                format!("x {:?} vs w {:?} (w is [N, K] or [K])", xi.shape, wi.shape),
            ));
        }
        let out = ValueInfo::new(DType::F32, vec![xi.shape[0], n]);
        let [w] = self.read_stored([w])?;
        self.push(Op::MatMul { x, w }, out, 0, 0)
    }

    fn broadcast(&self, op: &'static str, a: ValueId, b: ValueId) -> Result<ValueInfo, TraceError> {
        let ai = self.act(op, a, "a", None)?;
        let bi = self.expect(op, b, "b", is_float, None)?;
        let row = ai.shape.last().copied().unwrap_or(1);
        let ok = bi.shape == ai.shape || bi.numel() == row && bi.shape.last() == Some(&row);
        if !ok {
            return Err(shape_err(
                op,
                format!("cannot broadcast {:?} onto {:?}", bi.shape, ai.shape),
            ));
        }
        Ok(ai)
    }

    pub fn add(&mut self, a: ValueId, b: ValueId) -> Result<ValueId, TraceError> {
        let out = self.broadcast("add", a, b)?;
        let [b] = self.read_stored([b])?;
        self.push(Op::Add { a, b }, out, 0, 0)
    }

    pub fn mul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId, TraceError> {
        let out = self.broadcast("mul", a, b)?;
        let [b] = self.read_stored([b])?;
        self.push(Op::Mul { a, b }, out, 0, 0)
    }

    pub fn silu(&mut self, x: ValueId) -> Result<ValueId, TraceError> {
        let out = self.act("silu", x, "x", None)?;
        self.push(Op::Silu { x }, out, 0, 0)
    }

    pub fn gelu(&mut self, x: ValueId) -> Result<ValueId, TraceError> {
        let out = self.act("gelu", x, "x", None)?;
        self.push(Op::Gelu { x }, out, 0, 0)
    }

    /// `cap * tanh(x / cap)` elementwise; `cap` must be positive and finite.
    pub fn softcap(&mut self, x: ValueId, cap: f32) -> Result<ValueId, TraceError> {
        let out = self.act("softcap", x, "x", None)?;
        if !(cap.is_finite() && cap > 0.0) {
            return Err(shape_err(
                "softcap",
                format!("cap must be positive and finite, got {cap}"),
            ));
        }
        self.push(Op::Softcap { x, cap }, out, 0, 0)
    }

    pub fn softmax(&mut self, x: ValueId) -> Result<ValueId, TraceError> {
        let out = self.act("softmax", x, "x", None)?;
        self.push(Op::Softmax { x }, out, 0, 0)
    }

    pub fn reshape(&mut self, x: ValueId, shape: Vec<usize>) -> Result<ValueId, TraceError> {
        let xi = self.info(x)?.clone();
        if shape.iter().product::<usize>() != xi.numel() {
            return Err(shape_err("reshape", format!("{:?} to {shape:?}", xi.shape)));
        }
        let out = ValueInfo::new(xi.dtype, shape.clone());
        self.push(Op::Reshape { x, shape }, out, 0, 1)
    }

    pub fn slice(
        &mut self,
        x: ValueId,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<ValueId, TraceError> {
        let mut out = self.info(x)?.clone();
        let dim = *out
            .shape
            .get(axis)
            .ok_or_else(|| shape_err("slice", format!("axis {axis} of {:?}", out.shape)))?;
        if start >= end || end > dim {
            return Err(shape_err(
                "slice",
                format!("{start}..{end} of a dim of {dim}"),
            ));
        }
        out.shape[axis] = end - start;
        self.push(
            Op::Slice {
                x,
                axis,
                start,
                end,
            },
            out,
            0,
            0,
        )
    }

    pub fn concat(&mut self, xs: &[ValueId], axis: usize) -> Result<ValueId, TraceError> {
        let first = xs
            .first()
            .ok_or_else(|| shape_err("concat", "no operands"))?;
        let mut out = self.info(*first)?.clone();
        if axis >= out.shape.len() {
            return Err(shape_err(
                "concat",
                format!("axis {axis} of {:?}", out.shape),
            ));
        }
        let mut total = 0usize;
        for x in xs {
            let xi = self.info(*x)?;
            let same_rest = xi.shape.len() == out.shape.len()
                && xi
                    .shape
                    .iter()
                    .zip(&out.shape)
                    .enumerate()
                    .all(|(i, (a, b))| i == axis || a == b);
            if xi.dtype != out.dtype || !same_rest {
                return Err(shape_err(
                    "concat",
                    format!("{:?} with {:?} on axis {axis}", xi.shape, out.shape),
                ));
            }
            total += xi.shape[axis];
        }
        out.shape[axis] = total;
        self.push(
            Op::Concat {
                xs: xs.to_vec(),
                axis,
            },
            out,
            0,
            1,
        )
    }

    /// Rows of `x` [T, D] picked by `rows` [R] -> [R, D].
    pub fn gather_rows(&mut self, x: ValueId, rows: ValueId) -> Result<ValueId, TraceError> {
        let xi = self.act("gather_rows", x, "x", Some(2))?;
        let ri = self.ids("gather_rows", rows, "rows", 1)?;
        let out = ValueInfo::new(DType::F32, vec![ri.shape[0], xi.shape[1]]);
        self.push(Op::GatherRows { x, rows }, out, 0, 0)
    }

    /// Names `v` as a graph output.
    pub fn output(&mut self, name: &str, v: ValueId) -> Result<(), TraceError> {
        self.info(v)?;
        if self.graph.outputs.iter().any(|(n, _)| n == name) {
            return Err(TraceError::DuplicateOutput {
                name: name.to_owned(),
            });
        }
        let records = self.usage.records.saturating_add(1);
        Self::check(Resource::Records, self.limits.max_records, records)?;
        self.usage.records = records;
        self.graph.outputs.push((name.to_owned(), v));
        Ok(())
    }

    /// The finished graph.
    pub fn finish(self) -> Graph {
        self.graph
    }
}
