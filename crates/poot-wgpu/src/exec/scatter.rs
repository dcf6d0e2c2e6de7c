//! `scatter_add_rows` on the device (`scatter_add.wgsl`): no float atomics, one lane per
//! output element adding its rows in order of the ids, so the result is deterministic and
//! equals the CPU runtime's bit for bit.
//!
//! Invariants: ids the host knows (a graph input, or a reshape of one) are checked against
//! the row count before anything is recorded, a typed error as on the CPU; ids made on the
//! device cannot be, and one outside the rows is dropped (see the shader).

use std::sync::Arc;

use poot_core::DType;
use poot_graph::ValueId;
use poot_runtime::RuntimeError;

use super::{kernel_err, lane_grid, Exec};
use crate::gpu::Buffer;
use crate::kernels::Kernel;

impl Exec<'_> {
    pub(super) fn scatter_add_rows(
        &mut self,
        out_bytes: u64,
        src: ValueId,
        ids: ValueId,
        rows: usize,
    ) -> Result<Option<Arc<Buffer>>, RuntimeError> {
        const OP: &str = "scatter_add_rows";
        let (t, d) = (self.shape(src)[0], self.shape(src)[1]);
        let known = self.plan.root[ids.index()];
        if let Some(iv) = self.host_i32(ValueId(known as u32)) {
            if let Some((at, &bad)) = iv
                .iter()
                .enumerate()
                .find(|(_, &id)| id < 0 || id as usize >= rows)
            {
                return Err(kernel_err(
                    OP,
                    format!("ids[{at}] = {bad} outside 0..{rows}"),
                ));
            }
        }
        let lanes = rows.checked_mul(d).filter(|&n| n <= u32::MAX as usize);
        let Some(lanes) = lanes.filter(|_| t <= u32::MAX as usize) else {
            return Err(kernel_err(
                OP,
                format!("[{rows}, {d}] from {t} rows is too large"),
            ));
        };
        let out = self.alloc(out_bytes)?;
        let (grid, lanes_x) = lane_grid(lanes);
        let words = [rows as u32, d as u32, t as u32, lanes_x];
        let bufs = vec![self.floats(src, OP)?, self.buf(ids, OP)?, out.clone()];
        self.dispatch(Kernel::ScatterAdd, DType::F32, bufs, &words, grid)?;
        Ok(Some(out))
    }
}
