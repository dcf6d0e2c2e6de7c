//! The general tensor ops of lowered torch graphs: `Op::Unary` and `Op::Scalar` through
//! eltwise.wgsl (`eltwise1`), `Binary`, `Permute` and `CausalMask` through strided.wgsl,
//! `BatchMatMul` through bmm.wgsl, `LayerNorm` and `Reduce` through their own kernels. Weight
//! operands are decoded to f32 buffers first (`Exec::floats`); shapes and strides travel in the
//! dispatch's uniform words (rank <= 8, checked by the tracer).

use std::sync::Arc;

use poot_core::DType;
use poot_graph::{broadcast_shape, BinaryKind, Op, ReduceKind, ValueId};
use poot_runtime::RuntimeError;

use super::{kernel_err, lane_grid, Exec};
use crate::gpu::Buffer;
use crate::kernels::Kernel;

/// -inf's bits for the shaders (WGSL has no infinite constants).
const NEG_INF_BITS: u32 = 0xff80_0000;

/// `shape` as two vec4s of u32 (uniform arrays need 16-byte elements).
fn words8(v: &[usize]) -> [u32; 8] {
    let mut w = [0u32; 8];
    for (o, &x) in w.iter_mut().zip(v) {
        *o = x as u32;
    }
    w
}

/// Element strides of `shape` aligned at the right of `out` (rank `out.len()`), 0 where an
/// axis is broadcast.
fn strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let mut s = vec![0; out.len()];
    let mut step = 1;
    for i in (0..shape.len()).rev() {
        let axis = out.len() - shape.len() + i;
        s[axis] = if shape[i] == 1 && out[axis] != 1 {
            0
        } else {
            step
        };
        step *= shape[i];
    }
    s
}

impl Exec<'_> {
    /// One eltwise.wgsl dispatch over `x` alone (`b` bound to `x` too) with `bn` and `code`.
    pub(super) fn eltwise1(
        &mut self,
        x: ValueId,
        op: &'static str,
        numel: usize,
        out_bytes: u64,
        bn: u32,
        code: u32,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let out = self.alloc(out_bytes)?;
        let xb = self.buf(x, op)?;
        let (grid, lanes_x) = lane_grid(numel);
        let words = [numel as u32, bn, code, lanes_x];
        self.dispatch(
            Kernel::Eltwise,
            DType::F32,
            vec![xb.clone(), xb, out.clone()],
            &words,
            grid,
        )?;
        Ok(out)
    }

    /// One strided.wgsl dispatch: `out[o] = f(a[ia], b[ib])` over `shape`.
    #[allow(clippy::too_many_arguments)]
    fn strided(
        &mut self,
        a: Arc<Buffer>,
        b: Arc<Buffer>,
        shape: &[usize],
        sa: &[usize],
        sb: &[usize],
        code: u32,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let n: usize = shape.iter().product();
        let out = self.alloc(n as u64 * 4)?;
        let (grid, lanes_x) = lane_grid(n);
        let mut words = vec![n as u32, shape.len() as u32, code, lanes_x];
        words.extend(words8(shape));
        words.extend(words8(sa));
        words.extend(words8(sb));
        words.extend([NEG_INF_BITS, 0, 0, 0]);
        self.dispatch(
            Kernel::Strided,
            DType::F32,
            vec![a, b, out.clone()],
            &words,
            grid,
        )?;
        Ok(out)
    }

    pub(super) fn tensor_op(&mut self, op: &Op, i: usize) -> Result<Arc<Buffer>, RuntimeError> {
        let name = op.name();
        let out_shape = self.plan.graph.values[i].shape.clone();
        let numel: usize = out_shape.iter().product();
        Ok(match op {
            Op::Binary { a, b, kind } => {
                let (sa, sb) = (self.shape(*a).to_vec(), self.shape(*b).to_vec());
                let shape = broadcast_shape(&sa, &sb)
                    .ok_or_else(|| kernel_err(name, format!("{sa:?} with {sb:?}")))?;
                let code = BinaryKind::ALL.iter().position(|k| k == kind).unwrap_or(0) as u32;
                let (ab, bb) = (self.floats(*a, name)?, self.floats(*b, name)?);
                let (ta, tb) = (strides(&sa, &shape), strides(&sb, &shape));
                self.strided(ab, bb, &shape, &ta, &tb, code)?
            }
            Op::Permute { x, perm } => {
                let sx = self.shape(*x).to_vec();
                let own = strides(&sx, &sx);
                let src: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
                let xb = self.floats(*x, name)?;
                self.strided(xb.clone(), xb, &out_shape, &src, &src, 4)?
            }
            Op::CausalMask { x } => {
                let own = strides(&out_shape, &out_shape);
                let xb = self.buf(*x, name)?;
                self.strided(xb.clone(), xb, &out_shape, &own, &own, 5)?
            }
            Op::BatchMatMul { a, b } => {
                let (sa, sb) = (self.shape(*a).to_vec(), self.shape(*b).to_vec());
                let (ra, rb) = (sa.len(), sb.len());
                let batch = broadcast_shape(&sa[..ra - 2], &sb[..rb - 2])
                    .ok_or_else(|| kernel_err(name, format!("{sa:?} with {sb:?}")))?;
                let (m, k, cols) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
                // Plane strides: element strides of the batch dims counted in planes.
                let plane = |s: &[usize]| -> Vec<usize> {
                    let mut st = vec![0; batch.len()];
                    let mut step = 1;
                    for i in (0..s.len()).rev() {
                        let axis = batch.len() - s.len() + i;
                        st[axis] = if s[i] == 1 { 0 } else { step };
                        step *= s[i];
                    }
                    st
                };
                let (pa, pb) = (plane(&sa[..ra - 2]), plane(&sb[..rb - 2]));
                let (ab, bb) = (self.floats(*a, name)?, self.floats(*b, name)?);
                let out = self.alloc(numel as u64 * 4)?;
                let (grid, lanes_x) = lane_grid(numel);
                let mut words = vec![numel as u32, batch.len() as u32, m as u32, lanes_x];
                words.extend([k as u32, cols as u32, 0, 0]);
                words.extend(words8(&batch));
                words.extend(words8(&pa));
                words.extend(words8(&pb));
                self.dispatch(
                    Kernel::Bmm,
                    DType::F32,
                    vec![ab, bb, out.clone()],
                    &words,
                    grid,
                )?;
                out
            }
            Op::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => {
                let d = *out_shape.last().unwrap_or(&1);
                let rows = numel / d.max(1);
                let xb = self.buf(*x, name)?;
                let wb = match weight {
                    Some(w) => self.floats(*w, name)?,
                    None => xb.clone(),
                };
                let bb = match bias {
                    Some(b) => self.floats(*b, name)?,
                    None => xb.clone(),
                };
                let flags = u32::from(weight.is_some()) | (u32::from(bias.is_some()) << 1);
                let out = self.alloc(numel as u64 * 4)?;
                let words = [d as u32, rows as u32, eps.to_bits(), flags];
                self.dispatch(
                    Kernel::LayerNorm,
                    DType::F32,
                    vec![xb, wb, bb, out.clone()],
                    &words,
                    [rows as u32, 1, 1],
                )?;
                out
            }
            Op::Reduce { x, kind } => {
                let d = *self.shape(*x).last().unwrap_or(&1);
                let rows = numel;
                let code = ReduceKind::ALL.iter().position(|k| k == kind).unwrap_or(0) as u32;
                let xb = self.buf(*x, name)?;
                let out = self.alloc(numel as u64 * 4)?;
                let words = [d as u32, rows as u32, code, NEG_INF_BITS];
                self.dispatch(
                    Kernel::Reduce,
                    DType::F32,
                    vec![xb, out.clone()],
                    &words,
                    [rows as u32, 1, 1],
                )?;
                out
            }
            _ => return Err(kernel_err(name, "not a tensor op".into())),
        })
    }
}
