//! The ggml-numerics matmuls: the activation rows quantized to Q8_0/Q8_1 blocks
//! (`quant_q8.wgsl`), then integer block dots against the packed weight (`matmul_q8.wgsl`);
//! for Q4_K/Q6_K, Q8_K blocks (`quant_q8k.wgsl`) and super-block dots (`matmul_q8k.wgsl`).
//!
//! Invariants: only taken for weights with an integer decoder and `k % 32 == 0`
//! (`WgpuRuntime::q8_matmul`); Q4_1 weights pair with Q8_1 activations (with the block sums),
//! the others with Q8_0, as ggml's `vec_dot_type`s do. The quantized activations live in a
//! scratch buffer that goes back to the pool right after the matmul is recorded: passes run in
//! recording order, so a later writer of that buffer runs after the matmul has read it.

use std::sync::Arc;

use poot_core::DType;
use poot_runtime::RuntimeError;

use super::{lane_grid, Exec};
use crate::gpu::Buffer;
use crate::kernels::Kernel;
use crate::weights::GpuWeight;

/// Words per quantized block: 32 i8 quants in 8 words, then `d` and `s` (see `quant_q8.wgsl`).
const BLOCK_WORDS: u64 = 10;
/// Tokens per lane in `matmul_q8.wgsl` (its `TT`).
const TT: usize = 4;
/// Words per Q8_K block: 64 words of quants, `d`, 16 sums (see `quant_q8k.wgsl`).
const K_BLOCK_WORDS: u64 = 81;

impl Exec<'_> {
    /// Records `out[t, n] = W[n] . x[t]` with ggml's quantized activations and integer dots.
    pub(super) fn matmul_q8(
        &mut self,
        wt: &GpuWeight,
        xb: Arc<Buffer>,
        out: Arc<Buffer>,
        t: usize,
        k: usize,
        n: usize,
    ) -> Result<(), RuntimeError> {
        let chunks = k / 32;
        let blocks = t * chunks;
        let qa = self.alloc(blocks as u64 * BLOCK_WORDS * 4)?;
        let with_sum = u32::from(wt.dtype == DType::Q4_1);
        let (grid, lanes_x) = lane_grid(blocks);
        self.dispatch(
            Kernel::QuantQ8,
            DType::F32,
            vec![xb, qa.clone()],
            &[blocks as u32, with_sum, lanes_x],
            grid,
        )?;
        for part in &wt.parts {
            // One lane per row: workgroups of 64 rows, wrapped into y past 65535.
            let groups = part.rows.div_ceil(64).max(1);
            let gx = groups.min(65535);
            let grid = [
                gx as u32,
                groups.div_ceil(gx) as u32,
                t.div_ceil(TT).max(1) as u32,
            ];
            let words = [
                part.rows as u32,
                k as u32,
                t as u32,
                wt.row_bytes as u32,
                part.row0 as u32,
                n as u32,
                chunks as u32,
                gx as u32,
            ];
            let bufs = vec![part.buffer.clone(), qa.clone(), out.clone()];
            self.dispatch(Kernel::MatMulQ8, wt.dtype, bufs, &words, grid)?;
        }
        let size = qa.size();
        self.free.entry(size).or_default().push(qa);
        Ok(())
    }

    /// Records `out[t, n] = W[n] . x[t]` for Q4_K/Q6_K with Q8_K activations and exact
    /// super-block integer dots (the CPU runtime's `qdot_k.rs` order).
    pub(super) fn matmul_q8k(
        &mut self,
        wt: &GpuWeight,
        xb: Arc<Buffer>,
        out: Arc<Buffer>,
        t: usize,
        k: usize,
        n: usize,
    ) -> Result<(), RuntimeError> {
        let per_row = k / 256;
        let blocks = t * per_row;
        let qa = self.alloc(blocks as u64 * K_BLOCK_WORDS * 4)?;
        let (grid, lanes_x) = lane_grid(blocks);
        self.dispatch(
            Kernel::QuantQ8K,
            DType::F32,
            vec![xb, qa.clone()],
            &[blocks as u32, lanes_x, 0, 0],
            grid,
        )?;
        for part in &wt.parts {
            // One lane per row and token: workgroups of 64 rows, wrapped into y past 65535.
            let groups = part.rows.div_ceil(64).max(1);
            let gx = groups.min(65535);
            let grid = [gx as u32, groups.div_ceil(gx) as u32, t.max(1) as u32];
            let words = [
                part.rows as u32,
                k as u32,
                t as u32,
                wt.row_bytes as u32,
                part.row0 as u32,
                n as u32,
                per_row as u32,
                gx as u32,
            ];
            let bufs = vec![part.buffer.clone(), qa.clone(), out.clone()];
            self.dispatch(Kernel::MatMulQ8K, wt.dtype, bufs, &words, grid)?;
        }
        let size = qa.size();
        self.free.entry(size).or_default().push(qa);
        Ok(())
    }
}
