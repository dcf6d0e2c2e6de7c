//! The mixture-of-experts ops on the device (the router's expert ids are `top_k`, shared with
//! the sampling step): the router's probabilities at them (`gather_cols`, also an act-order
//! layer's column permutation), the packed expert matmul (`moe_matmul`) and the weighted
//! combination (`moe_combine`).
//!
//! Invariants: `moe_matmul` binds the stored [E, N, K] tensor as uploaded (whole rows per part,
//! see `weights`) and reads only the rows of experts some slot chose, each once per 8 of its
//! slots (`moe_matmul.wgsl`); no expert table is built. Ids that are host inputs are checked
//! against E on the host before anything is recorded (a typed error, as on the CPU); stored
//! ids (an act-order layer's `input_perm`, one row for every row of x) are checked once when
//! the plan is compiled (`plan::check_gather_ids`) and bound as uploaded; ids made on the
//! device (a router's `top_k`) cannot be, and an id outside 0..E (only -1, from a row of NaN
//! logits) gives that token a NaN row instead of the CPU's error (see the shaders).

use std::sync::Arc;

use poot_core::DType;
use poot_graph::ValueId;
use poot_runtime::RuntimeError;

use super::{kernel_err, lane_grid, Exec};
use crate::gpu::Buffer;
use crate::kernels::Kernel;

type Out = Result<Option<Arc<Buffer>>, RuntimeError>;

impl Exec<'_> {
    /// A typed error when the host ids `ids` hold one outside `0..n`.
    fn check_host_ids(&self, op: &'static str, ids: ValueId, n: usize) -> Result<(), RuntimeError> {
        if let Some(iv) = self.host_i32(ids) {
            if let Some(&bad) = iv.iter().find(|&&id| id < 0 || id as usize >= n) {
                return Err(kernel_err(op, format!("id {bad} outside 0..{n}")));
            }
        }
        Ok(())
    }

    pub(super) fn moe_matmul(
        &mut self,
        out_bytes: u64,
        x: ValueId,
        w: ValueId,
        ids: ValueId,
    ) -> Out {
        const OP: &str = "moe_matmul";
        let wt = self.plan.weights[&w.index()].clone();
        let (n_exp, n, k) = {
            let s = self.shape(w);
            (s[0], s[1], s[2])
        };
        let (t, per_tok) = (self.shape(ids)[0], self.shape(ids)[1]);
        let slots = t * per_tok;
        self.check_host_ids(OP, ids, n_exp)?;
        let shared_x = u32::from(self.shape(x)[0] == t);
        let out = self.alloc(out_bytes)?;
        let (xb, ib) = (self.buf(x, OP)?, self.buf(ids, OP)?);
        let groups_x = n.div_ceil(8).max(1);
        if groups_x > 65535 || n_exp > 65535 {
            return Err(kernel_err(
                OP,
                format!("{n_exp} experts of {n} rows is over the dispatch grid"),
            ));
        }
        for part in &wt.parts {
            if part.rows == 0 || n == 0 {
                continue;
            }
            // The experts whose rows this part holds (possibly only some of their rows).
            let e_lo = part.row0 / n;
            let e_hi = (part.row0 + part.rows - 1) / n;
            let words = [
                n as u32,
                k as u32,
                slots as u32,
                per_tok as u32,
                wt.row_bytes as u32,
                part.row0 as u32,
                part.rows as u32,
                k.div_ceil(32) as u32,
                e_lo as u32,
                shared_x,
                0,
                0,
            ];
            let grid = [groups_x as u32, (e_hi - e_lo + 1) as u32, 1];
            let bufs = vec![part.buffer.clone(), xb.clone(), ib.clone(), out.clone()];
            self.dispatch(Kernel::MoeMatMul, wt.dtype, bufs, &words, grid)?;
        }
        Ok(Some(out))
    }

    /// `y[r, j] = x[r, ids[r, j]]`; ids of one row apply to every row of x (an act-order
    /// layer's `input_perm`, a stored I32 tensor bound as uploaded and checked at compile).
    pub(super) fn gather_cols(&mut self, out_bytes: u64, x: ValueId, ids: ValueId) -> Out {
        const OP: &str = "gather_cols";
        let (rows, e) = (self.shape(x)[0], self.shape(x)[1]);
        let (id_rows, k) = (self.shape(ids)[0], self.shape(ids)[1]);
        self.check_host_ids(OP, ids, e)?;
        let ib = match self.plan.weights.get(&ids.index()) {
            Some(w) => match &w.parts[..] {
                [part] => part.buffer.clone(),
                _ => {
                    return Err(kernel_err(
                        OP,
                        "stored ids split over several buffers".into(),
                    ))
                }
            },
            None => self.buf(ids, OP)?,
        };
        let out = self.alloc(out_bytes)?;
        let (grid, lanes_x) = lane_grid(rows * k);
        // Row stride of the ids: 0 broadcasts one row to every row of x.
        let id_stride = if id_rows == 1 { 0 } else { k };
        let words = [rows as u32, e as u32, k as u32, lanes_x, id_stride as u32];
        let bufs = vec![self.buf(x, OP)?, ib, out.clone()];
        self.dispatch(Kernel::GatherCols, DType::F32, bufs, &words, grid)?;
        Ok(Some(out))
    }

    pub(super) fn moe_combine(&mut self, out_bytes: u64, y: ValueId, weights: ValueId) -> Out {
        let d = self.shape(y)[1];
        let (t, k) = (self.shape(weights)[0], self.shape(weights)[1]);
        let out = self.alloc(out_bytes)?;
        let (grid, lanes_x) = lane_grid(t * d);
        let words = [t as u32, d as u32, k as u32, lanes_x];
        let bufs = vec![
            self.buf(y, "moe_combine")?,
            self.buf(weights, "moe_combine")?,
            out.clone(),
        ];
        self.dispatch(Kernel::MoeCombine, DType::F32, bufs, &words, grid)?;
        Ok(Some(out))
    }
}
