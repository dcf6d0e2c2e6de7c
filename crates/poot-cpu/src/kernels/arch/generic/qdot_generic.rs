//! The portable form of the integer block dot of stored weight rows with Q8 activations
//! (`arch/x86/qdot.rs`'s loops; the numerics are stated with the stored-row matmul): one weight row
//! against one activation row in ggml's order ([`dot_scalar`]: 8 exact lane sums a block,
//! `fma(dw * dy, lane, acc)`, `hsum8`, Q4_1's `summs`), and, for the tests, the block order
//! ([`dot_scalar_blocks`]). Bit-identical to the x86 loops (tested in `matmul/qdot_tests.rs`).
//!
//! Why here: the stored-row matmul runs it without SIMD; it is the reference the repacked
//! layouts' loops are tested against, and the template of a new ISA's `arch/<arch>/qdot.rs`.

use crate::kernels::decode::f16_at;
use crate::kernels::format::Format;
use crate::kernels::ggml::hsum8;
use crate::kernels::qact::{BlockQ8, QK8};

/// The 32 integer weights of one block (Q4_0, Q4_1, Q5_0 or Q8_0), its scale and (Q4_1) its
/// offset `m`.
fn unpack(kind: Format, b: &[u8]) -> ([i8; QK8], f32, f32) {
    let mut q = [0i8; QK8];
    let d = f16_at(b, 0);
    let mut m = 0.0;
    match kind {
        Format::Q4_0 | Format::Q4_1 => {
            let (qs, off) = if kind == Format::Q4_0 {
                (&b[2..18], 8)
            } else {
                m = f16_at(b, 2);
                (&b[4..20], 0)
            };
            for j in 0..16 {
                q[j] = (qs[j] & 15) as i8 - off;
                q[j + 16] = (qs[j] >> 4) as i8 - off;
            }
        }
        Format::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let hi = |e: usize| (((qh >> e) & 1) << 4) as u8;
                q[j] = ((b[6 + j] & 15) | hi(j)) as i8 - 16;
                q[j + 16] = ((b[6 + j] >> 4) | hi(j + 16)) as i8 - 16;
            }
        }
        Format::Q8_0 => {
            for (v, &byte) in q.iter_mut().zip(&b[2..34]) {
                *v = byte as i8;
            }
        }
        // The nibbles without the zero point (`b[2]`), which `dot_scalar_blocks` folds in as
        // `-z * sum(y)`: `q - z` need not fit an `i8` for every stored `z`.
        Format::Q4_Z => {
            for j in 0..16 {
                q[j] = (b[3 + j] & 15) as i8;
                q[j + 16] = (b[3 + j] >> 4) as i8;
            }
        }
        other => unreachable!("{other:?} has no signed Q8 dot"),
    }
    (q, d, m)
}

/// The portable reference: one weight row (`a.len()` blocks) against one activation row.
pub(crate) fn dot_scalar(kind: Format, w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (wb, ab) in w.chunks_exact(kind.block_bytes()).zip(a) {
        let (q, d, m) = unpack(kind, wb);
        let scale = d * ab.d;
        for (l, acc) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4)
                .map(|e| i32::from(q[e]) * i32::from(ab.qs[e]))
                .sum();
            *acc = scale.mul_add(lane as f32, *acc);
        }
        summs = m.mul_add(ab.s, summs);
    }
    if kind.act_sum() {
        hsum8(&acc) + summs
    } else {
        hsum8(&acc)
    }
}

/// The block order of multi-token matmuls (`matmul/r8.rs`): each block's 32 products summed
/// exactly in `i32`, then `acc = fma(dw * dx, sum, acc)` block after block. Q4_0, Q5_0 and
/// Q8_0, and Q4_Z on the 8-row layout (`sum(q * y) - z * sum(y)`, exact) (not Q4_1, which
/// keeps ggml's order: see `matmul/r8.rs`). The reference of that order
/// on stored rows, for the tests: the block order only runs on the repacked layout, whose
/// portable loop is the 8-row generic loop's `group_blocks`.
#[cfg(test)]
pub(crate) fn dot_scalar_blocks(kind: Format, w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(kind != Format::Q4_1);
    let mut acc = 0.0f32;
    for (wb, ab) in w.chunks_exact(kind.block_bytes()).zip(a) {
        let (q, d, _) = unpack(kind, wb);
        let mut sum: i32 = q
            .iter()
            .zip(&ab.qs)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        if kind == Format::Q4_Z {
            sum -= i32::from(wb[2]) * ab.qs.iter().map(|&y| i32::from(y)).sum::<i32>();
        }
        acc = (d * ab.d).mul_add(sum as f32, acc);
    }
    acc
}
