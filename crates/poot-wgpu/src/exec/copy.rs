//! `Op::Slice` and `Op::Concat`: strided copies through copy.wgsl, each tensor seen as
//! `[outer, axis * inner]` so one kernel serves every axis.

use std::sync::Arc;

use poot_core::DType;
use poot_graph::ValueId;
use poot_runtime::RuntimeError;

use super::{lane_grid, Exec};
use crate::gpu::Buffer;
use crate::kernels::Kernel;

impl Exec<'_> {
    /// `x[.., start..end, ..]` along `axis`.
    pub(super) fn slice(
        &mut self,
        out_bytes: u64,
        x: ValueId,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let s = self.shape(x);
        let outer: usize = s[..axis].iter().product();
        let inner: usize = s[axis + 1..].iter().product();
        let cols = (end - start) * inner;
        let out = self.alloc(out_bytes)?;
        let (grid, lanes_x) = lane_grid(outer * cols);
        let words = [
            outer as u32,
            cols as u32,
            (s[axis] * inner) as u32,
            (start * inner) as u32,
            cols as u32,
            0,
            lanes_x,
        ];
        let bufs = vec![self.buf(x, "slice")?, out.clone()];
        self.dispatch(Kernel::Copy, DType::F32, bufs, &words, grid)?;
        Ok(out)
    }

    /// `xs` joined along `axis` into a tensor of `shape`.
    pub(super) fn concat(
        &mut self,
        out_bytes: u64,
        xs: &[ValueId],
        axis: usize,
        shape: &[usize],
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let total = shape[axis] * inner;
        let out = self.alloc(out_bytes)?;
        let mut off = 0;
        for &x in xs {
            let cols = self.shape(x)[axis] * inner;
            let (grid, lanes_x) = lane_grid(outer * cols);
            let words = [
                outer as u32,
                cols as u32,
                cols as u32,
                0,
                total as u32,
                off as u32,
                lanes_x,
            ];
            let bufs = vec![self.buf(x, "concat")?, out.clone()];
            self.dispatch(Kernel::Copy, DType::F32, bufs, &words, grid)?;
            off += cols;
        }
        Ok(out)
    }
}
