//! The mixture-of-experts tracer ops: a router's probabilities at its chosen experts
//! (`gather_cols`), the packed expert matmul (`moe_matmul`) and the weighted combination of
//! each token's expert outputs (`moe_combine`). Routing itself is `softmax` and `top_k_ids`.

use poot_core::DType;

use super::{shape_err, Tracer};
use crate::error::TraceError;
use crate::ir::{Op, ValueId, ValueInfo};

impl Tracer {
    /// `x` [T, E] at `ids` [T, k] (i32) -> [T, k]; `ids` [1, k] (an activation or a stored
    /// weight, such as an act-order layer's input permutation) picks the same columns of every
    /// row.
    pub fn gather_cols(&mut self, x: ValueId, ids: ValueId) -> Result<ValueId, TraceError> {
        let xi = self.act("gather_cols", x, "x", Some(2))?;
        let ii = self.ids("gather_cols", ids, "ids", 2)?;
        if ii.shape[0] != xi.shape[0] && ii.shape[0] != 1 {
            return Err(shape_err(
                "gather_cols",
                format!("ids {:?} for x {:?}", ii.shape, xi.shape),
            ));
        }
        let out = ValueInfo::new(DType::F32, vec![xi.shape[0], ii.shape[1]]);
        self.push(Op::GatherCols { x, ids }, out, 0, 0)
    }

    /// `x` [T or T * k, K] through the experts `ids` [T, k] of the stored `w` [E, N, K]
    /// -> [T * k, N] (see `Op::MoeMatMul`).
    pub fn moe_matmul(
        &mut self,
        x: ValueId,
        w: ValueId,
        ids: ValueId,
    ) -> Result<ValueId, TraceError> {
        const OP: &str = "moe_matmul";
        let xi = self.act(OP, x, "x", Some(2))?;
        let wi = self.stored(OP, w, "w")?;
        let ii = self.ids(OP, ids, "ids", 2)?;
        let (t, k) = (ii.shape[0], ii.shape[1]);
        let rows_ok = xi.shape[0] == t || xi.shape[0] == t * k;
        if wi.shape.len() != 3 || wi.shape[2] != xi.shape[1] || !rows_ok || k == 0 {
            return Err(shape_err(
                OP,
                format!(
                    "x {:?}, w {:?} (w is [E, N, K]), ids {:?} (x has T or T * k rows)",
                    xi.shape, wi.shape, ii.shape
                ),
            ));
        }
        let out = ValueInfo::new(DType::F32, vec![t * k, wi.shape[1]]);
        let [w] = self.read_stored([w])?;
        self.push(Op::MoeMatMul { x, w, ids }, out, 0, 0)
    }

    /// `y` [T * k, D] weighted by `weights` [T, k] and summed per token -> [T, D].
    pub fn moe_combine(&mut self, y: ValueId, weights: ValueId) -> Result<ValueId, TraceError> {
        let yi = self.act("moe_combine", y, "y", Some(2))?;
        let wi = self.act("moe_combine", weights, "weights", Some(2))?;
        if wi.shape[1] == 0 || yi.shape[0] != wi.shape[0] * wi.shape[1] {
            return Err(shape_err(
                "moe_combine",
                format!("y {:?} for weights {:?}", yi.shape, wi.shape),
            ));
        }
        let out = ValueInfo::new(DType::F32, vec![wi.shape[0], yi.shape[1]]);
        self.push(Op::MoeCombine { y, weights }, out, 0, 0)
    }
}
