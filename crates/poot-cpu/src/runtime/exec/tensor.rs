//! The general tensor ops (`Op::Unary`, `Binary`, `Scalar`, `LayerNorm`, `Reduce`, `Permute`,
//! `BatchMatMul`, `CausalMask`, `ScatterAddRows`): operands read through `Exec::floats` (an activation borrowed,
//! a stored float weight decoded or borrowed as f32), one kernel call each, single-threaded
//! (these graphs are small; a pool split is future work).

use poot_graph::{Op, ValueId};
use poot_runtime::RuntimeError;

use super::{kerr, Buf, Exec};
use crate::kernels;

impl Exec<'_> {
    pub(super) fn tensor_op(&mut self, op: &Op, out_shape: &[usize]) -> Result<Buf, RuntimeError> {
        let numel: usize = out_shape.iter().product();
        let name = op.name();
        let mut out = self.arena.zeros(numel);
        let shape = |s: &Self, v: ValueId| s.shape(v).to_vec();
        match op {
            Op::Unary { x, kind } => {
                kernels::tensor::unary(*kind, &self.floats(*x, name)?, &mut out)
            }
            Op::Scalar {
                x,
                kind,
                value,
                reverse,
            } => {
                kernels::tensor::scalar(*kind, &self.floats(*x, name)?, *value, *reverse, &mut out)
            }
            Op::Binary { a, b, kind } => {
                let (sa, sb) = (shape(self, *a), shape(self, *b));
                let (av, bv) = (self.floats(*a, name)?, self.floats(*b, name)?);
                kernels::tensor::binary(*kind, &av, &sa, &bv, &sb, &mut out)
            }
            Op::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => {
                let d = *out_shape.last().unwrap_or(&1);
                let xv = self.floats(*x, name)?;
                let wv = weight.map(|w| self.floats(w, name)).transpose()?;
                let bv = bias.map(|b| self.floats(b, name)).transpose()?;
                kernels::layer_norm::layer_norm(
                    &xv,
                    d,
                    wv.as_deref(),
                    bv.as_deref(),
                    *eps,
                    &mut out,
                )
            }
            Op::Permute { x, perm } => {
                let sx = shape(self, *x);
                kernels::tensor::permute(&self.floats(*x, name)?, &sx, perm, &mut out)
            }
            Op::BatchMatMul { a, b } => {
                let (sa, sb) = (shape(self, *a), shape(self, *b));
                let (av, bv) = (self.floats(*a, name)?, self.floats(*b, name)?);
                kernels::bmm::batch_matmul(&av, &sa, &bv, &sb, &mut out)
            }
            Op::Reduce { x, kind } => {
                let d = *self.shape(*x).last().unwrap_or(&1);
                kernels::tensor::reduce(*kind, &self.floats(*x, name)?, d, &mut out)
            }
            Op::ScatterAddRows { src, ids, rows } => {
                let d = out_shape[1];
                let ids = self.i32(*ids, name)?;
                kernels::scatter::scatter_add_rows(
                    &self.floats(*src, name)?,
                    ids,
                    d,
                    *rows,
                    &mut out,
                )
            }
            Op::CausalMask { x } => {
                out.copy_from_slice(&self.floats(*x, name)?);
                let r = out_shape.len();
                kernels::tensor::causal_mask(&mut out, out_shape[r - 2], out_shape[r - 1])
            }
            _ => {
                return Err(RuntimeError::Kernel {
                    op: name,
                    detail: "not a tensor op".into(),
                })
            }
        }
        .map_err(kerr(name))?;
        Ok(Buf::F32(out))
    }
}
