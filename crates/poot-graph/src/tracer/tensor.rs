//! General tensor ops for graphs that do not come from poot's own model definitions (a
//! `torch.export` graph lowered by `poot.torch_frontend`): elementwise functions, numpy
//! broadcasting arithmetic, scalar arithmetic, layer norm, permutes, batched matmuls of two
//! activations and a causal mask.
//!
//! Every rule is checked here, so a runtime sees only well-typed operands: activations are f32;
//! where an op says so an operand may also be a stored float weight (read through the runtime's
//! decoder), and the result is always an f32 activation.

use poot_core::DType;

use super::{is_float, shape_err, Tracer};
use crate::error::TraceError;
use crate::ir::{broadcast_shape, BinaryKind, Op, ReduceKind, UnaryKind, ValueId, ValueInfo};

/// Most axes a permute or batched matmul handles (the runtime keeps index arithmetic on the
/// stack).
pub const MAX_RANK: usize = 8;

impl Tracer {
    /// An f32 activation or a stored float weight.
    fn float_operand(
        &self,
        op: &'static str,
        v: ValueId,
        what: &str,
    ) -> Result<ValueInfo, TraceError> {
        let info = self.info(v)?.clone();
        let stored = matches!(self.graph.op(v), Op::Weight { .. });
        let ok = if stored {
            is_float(info.dtype)
        } else {
            info.dtype == DType::F32
        };
        if !ok {
            return Err(shape_err(op, format!("{what} has dtype {}", info.dtype)));
        }
        if info.shape.len() > MAX_RANK {
            return Err(shape_err(
                op,
                format!("{what} has rank {} (at most {MAX_RANK})", info.shape.len()),
            ));
        }
        Ok(info)
    }

    /// `kind(x)` elementwise.
    pub fn unary(&mut self, x: ValueId, kind: UnaryKind) -> Result<ValueId, TraceError> {
        let out = self.act(kind.name(), x, "x", None)?;
        self.push(Op::Unary { x, kind }, out, 0, 0)
    }

    /// `a kind b` with numpy broadcasting; either may be a stored float weight.
    pub fn binary(
        &mut self,
        a: ValueId,
        b: ValueId,
        kind: BinaryKind,
    ) -> Result<ValueId, TraceError> {
        let op = kind.binary_name();
        let ai = self.float_operand(op, a, "a")?;
        let bi = self.float_operand(op, b, "b")?;
        let shape = broadcast_shape(&ai.shape, &bi.shape).ok_or_else(|| {
            shape_err(
                op,
                format!("{:?} and {:?} do not broadcast", ai.shape, bi.shape),
            )
        })?;
        let [a, b] = self.read_stored([a, b])?;
        self.push(
            Op::Binary { a, b, kind },
            ValueInfo::new(DType::F32, shape),
            0,
            0,
        )
    }

    /// `x kind value` (or `value kind x` when `reverse`) elementwise.
    pub fn scalar(
        &mut self,
        x: ValueId,
        kind: BinaryKind,
        value: f32,
        reverse: bool,
    ) -> Result<ValueId, TraceError> {
        let out = self.act(kind.scalar_name(), x, "x", None)?;
        self.push(
            Op::Scalar {
                x,
                kind,
                value,
                reverse,
            },
            out,
            0,
            0,
        )
    }

    /// Layer norm over the last dim of `x`, with optional `weight` and `bias` [D] (stored float
    /// weights or f32 activations).
    pub fn layer_norm(
        &mut self,
        x: ValueId,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
        eps: f32,
    ) -> Result<ValueId, TraceError> {
        const OP: &str = "layer_norm";
        let xi = self.act(OP, x, "x", None)?;
        let d = *xi
            .shape
            .last()
            .ok_or_else(|| shape_err(OP, "x must have rank >= 1"))?;
        for (what, v) in [("weight", weight), ("bias", bias)] {
            if let Some(v) = v {
                let info = self.float_operand(OP, v, what)?;
                if info.shape != [d] {
                    return Err(shape_err(
                        OP,
                        format!("{what} {:?} for rows of {d}", info.shape),
                    ));
                }
            }
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(shape_err(
                OP,
                format!("eps must be finite and >= 0, got {eps}"),
            ));
        }
        let weight = self.read_stored_opt(weight)?;
        let bias = self.read_stored_opt(bias)?;
        self.push(
            Op::LayerNorm {
                x,
                weight,
                bias,
                eps,
            },
            xi,
            0,
            0,
        )
    }

    /// `x` with its axes reordered: output axis `i` is input axis `perm[i]`.
    pub fn permute(&mut self, x: ValueId, perm: Vec<usize>) -> Result<ValueId, TraceError> {
        const OP: &str = "permute";
        let xi = self.float_operand(OP, x, "x")?;
        let mut seen = vec![false; xi.shape.len()];
        let valid = perm.len() == xi.shape.len()
            && perm
                .iter()
                .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(shape_err(
                OP,
                format!(
                    "{perm:?} is not a permutation of the axes of {:?}",
                    xi.shape
                ),
            ));
        }
        let shape = perm.iter().map(|&p| xi.shape[p]).collect();
        let [x] = self.read_stored([x])?;
        self.push(
            Op::Permute { x, perm },
            ValueInfo::new(DType::F32, shape),
            0,
            1,
        )
    }

    /// `a` [.., M, K] times `b` [.., K, N] -> [.., M, N], batch dims broadcast.
    pub fn batch_matmul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId, TraceError> {
        const OP: &str = "batch_matmul";
        let ai = self.float_operand(OP, a, "a")?;
        let bi = self.float_operand(OP, b, "b")?;
        let (ra, rb) = (ai.shape.len(), bi.shape.len());
        let bad = || shape_err(OP, format!("a {:?} times b {:?}", ai.shape, bi.shape));
        if ra < 2 || rb < 2 || ai.shape[ra - 1] != bi.shape[rb - 2] {
            return Err(bad());
        }
        let mut shape =
            broadcast_shape(&ai.shape[..ra - 2], &bi.shape[..rb - 2]).ok_or_else(bad)?;
        shape.extend([ai.shape[ra - 2], bi.shape[rb - 1]]);
        let [a, b] = self.read_stored([a, b])?;
        self.push(
            Op::BatchMatMul { a, b },
            ValueInfo::new(DType::F32, shape),
            0,
            0,
        )
    }

    /// `kind` over the last dim of `x` -> [.., 1].
    pub fn reduce(&mut self, x: ValueId, kind: ReduceKind) -> Result<ValueId, TraceError> {
        let mut out = self.act(kind.name(), x, "x", None)?;
        match out.shape.last_mut() {
            Some(d) if *d > 0 => *d = 1,
            _ => {
                return Err(shape_err(
                    kind.name(),
                    format!("x must have a non-empty last dim, got {:?}", out.shape),
                ))
            }
        }
        self.push(Op::Reduce { x, kind }, out, 0, 0)
    }

    /// -inf above the causal diagonal of the last two dims (see `Op::CausalMask`).
    pub fn causal_mask(&mut self, x: ValueId) -> Result<ValueId, TraceError> {
        let out = self.act("causal_mask", x, "x", None)?;
        if out.shape.len() < 2 {
            return Err(shape_err(
                "causal_mask",
                format!("x must have rank >= 2, got {:?}", out.shape),
            ));
        }
        self.push(Op::CausalMask { x }, out, 0, 0)
    }

    /// `src` [T, D] summed into `rows` rows by `ids` [T] -> [rows, D] (see
    /// `Op::ScatterAddRows`).
    pub fn scatter_add_rows(
        &mut self,
        src: ValueId,
        ids: ValueId,
        rows: usize,
    ) -> Result<ValueId, TraceError> {
        const OP: &str = "scatter_add_rows";
        let s = self.act(OP, src, "src", Some(2))?;
        let i = self.ids(OP, ids, "ids", 1)?;
        if i.shape[0] != s.shape[0] {
            return Err(shape_err(
                OP,
                format!("{} ids for {} rows of src", i.shape[0], s.shape[0]),
            ));
        }
        if rows == 0 {
            return Err(shape_err(OP, "rows must be at least 1"));
        }
        let out = ValueInfo::new(DType::F32, vec![rows, s.shape[1]]);
        self.push(Op::ScatterAddRows { src, ids, rows }, out, 0, 0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use poot_core::DType;

    use crate::ir::{BinaryKind, Op, UnaryKind};
    use crate::{TraceError, TraceLimits, Tracer, WeightCatalog};

    struct One;

    impl WeightCatalog for One {
        fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
            match name {
                "w" => Some((DType::BF16, vec![6])),
                "q" => Some((DType::Q8_0, vec![32])),
                _ => None,
            }
        }
    }

    fn tracer() -> Tracer {
        Tracer::new(TraceLimits::default(), 1, Arc::new(One)).unwrap()
    }

    fn is_shape_err(r: Result<crate::ValueId, TraceError>) -> bool {
        matches!(r, Err(TraceError::Shape { .. }))
    }

    #[test]
    fn shapes_of_the_tensor_ops() {
        let mut t = tracer();
        let x = t.input("x", DType::F32, vec![2, 3, 6]).unwrap();
        let w = t.weight("w").unwrap();
        let b = t.binary(w, x, BinaryKind::Sub).unwrap();
        assert_eq!(t.info(b).unwrap().shape, [2, 3, 6]);
        assert_eq!(t.info(b).unwrap().dtype, DType::F32);
        let p = t.permute(x, vec![0, 2, 1]).unwrap();
        assert_eq!(t.info(p).unwrap().shape, [2, 6, 3]);
        let m = t.batch_matmul(x, p).unwrap();
        assert_eq!(t.info(m).unwrap().shape, [2, 3, 3]);
        let c = t.causal_mask(m).unwrap();
        let u = t.unary(c, UnaryKind::Relu).unwrap();
        let s = t.scalar(u, BinaryKind::Div, 2.0, true).unwrap();
        let n = t.layer_norm(x, Some(w), None, 1e-5).unwrap();
        let r = t.reduce(n, crate::ir::ReduceKind::Mean).unwrap();
        assert_eq!(t.info(r).unwrap().shape, [2, 3, 1]);
        assert_eq!(t.info(n).unwrap().shape, [2, 3, 6]);
        let g = t.finish();
        assert_eq!(g.op(s).name(), "scalar_div");
        assert_eq!(g.op(u).name(), "relu");
        assert!(matches!(g.op(n), Op::LayerNorm { bias: None, .. }));
        assert_eq!(g.op(n).operands().len(), 2);
    }

    #[test]
    fn refuses_bad_operands() {
        let mut t = tracer();
        let x = t.input("x", DType::F32, vec![2, 3]).unwrap();
        let ids = t.input("ids", DType::I32, vec![3]).unwrap();
        let y = t.input("y", DType::F32, vec![4, 3]).unwrap();
        let q = t.weight("q").unwrap();
        assert!(is_shape_err(t.binary(x, y, BinaryKind::Add)));
        assert!(is_shape_err(t.binary(x, ids, BinaryKind::Add)));
        assert!(
            is_shape_err(t.binary(x, q, BinaryKind::Add)),
            "packed weights are refused"
        );
        assert!(is_shape_err(t.unary(ids, UnaryKind::Exp)));
        assert!(is_shape_err(t.permute(x, vec![0, 0])));
        assert!(is_shape_err(t.permute(x, vec![0])));
        assert!(is_shape_err(t.batch_matmul(x, x)));
        assert!(is_shape_err(t.causal_mask(ids)));
        assert!(is_shape_err(t.reduce(ids, crate::ir::ReduceKind::Sum)));
        assert!(is_shape_err(t.layer_norm(x, Some(y), None, 1e-5)));
        assert!(is_shape_err(t.layer_norm(x, None, None, f32::NAN)));
        // Nothing of a refused call was recorded.
        assert_eq!(t.usage().equations, 4);
    }

    #[test]
    fn scatter_add_rows_shapes_and_refusals() {
        let mut t = tracer();
        let src = t.input("src", DType::F32, vec![3, 5]).unwrap();
        let ids = t.input("ids", DType::I32, vec![3]).unwrap();
        let short = t.input("short", DType::I32, vec![2]).unwrap();
        let y = t.scatter_add_rows(src, ids, 7).unwrap();
        assert_eq!(t.info(y).unwrap().shape, [7, 5]);
        assert!(is_shape_err(t.scatter_add_rows(src, short, 7)));
        assert!(is_shape_err(t.scatter_add_rows(src, ids, 0)));
        assert!(is_shape_err(t.scatter_add_rows(ids, ids, 7)));
        assert!(is_shape_err(t.scatter_add_rows(src, src, 7)));
        let g = t.finish();
        assert_eq!(g.op(y).name(), "scatter_add_rows");
        assert_eq!(g.op(y).operands(), vec![src, ids]);
    }
}
