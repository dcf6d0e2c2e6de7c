//! The portable form of the grouped-scale FP8 dot (`matmul/repack_f8g.rs`'s layout against
//! prescaled `f32` activations; `arch/x86/f8dot_g.rs`'s loops, in the same float order).
//!
//! Per row: 8 lane accumulators; per span, 8 span lanes start at 0 and take, for each block
//! and `c < 4`, `blk[l] = fma(w(8c + l), x(8c + l), blk[l])`; then `acc[l] = fma(d * 2^72,
//! blk[l], acc[l])`; `hsum8` at the end. `w` is the code's value times `2^-120` (its byte,
//! sign-extended, shifted left 20 and masked, read as an `f32`: exact, subnormal codes
//! included), `x` the activation times [`X_SCALE`] (`2^48`), so each product is the true one
//! times `2^-72` (exact scalings: the rounding of every step is that of the unscaled sums
//! unless a product falls below `2^-54` in magnitude) and `d * 2^72` undoes it.
//! Bit-identical to the x86 loops (the matmul's tests compare them).

use crate::kernels::blocks::RG;
use crate::kernels::ggml::hsum8;

/// Blocks (of 32 codes) per span: one scale per row per span.
pub(crate) const SPAN: usize = 4;

/// Bytes of one block of 8 rows' codes.
pub(crate) const BLOCK8: usize = RG * 32;

/// The activations' prescale (exact unless `|x| >= 2^80`; callers take the stored-row dot for
/// tokens that large).
pub(crate) const X_SCALE: f32 = (1u64 << 48) as f32;

/// The scales' factor: `2^120` (the codes' offset) over [`X_SCALE`]; the layout stores each
/// scale times it (exact: the layout bounds the scales).
pub(crate) const D_SCALE: f32 = (1u128 << 72) as f32;

/// Spans of a row of `nb` blocks.
pub(crate) const fn spans(nb: usize) -> usize {
    nb.div_ceil(SPAN)
}

/// Bytes of one group of 8 rows of `nb` blocks.
pub(crate) const fn group_bytes(nb: usize) -> usize {
    spans(nb) * 32 + nb * BLOCK8
}

/// The byte of a row's 32 codes that holds element `e` (`8c + i` at `4i + c`: the x86 loops'
/// widening order, `arch/x86/f8dot_g.rs`).
#[inline(always)]
pub(crate) const fn code_pos(e: usize) -> usize {
    4 * (e % 8) + e / 8
}

/// The E4M3 code's value times `2^-120`, as the x86 loops widen it (no NaN code: the
/// layout's invariant).
#[inline(always)]
pub(crate) fn widen(q: u8) -> f32 {
    f32::from_bits(((q as i8 as i32) << 20) as u32 & 0x87F0_0000)
}

/// Row `r < 8` of group `grp` (`nb` blocks) dotted with one token's prescaled activations
/// `xs` (`32 * nb` of them).
pub(crate) fn row_dot(grp: &[u8], nb: usize, r: usize, xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut at = 0;
    for s in 0..spans(nb) {
        let d = &grp[at + 4 * r..at + 4 * r + 4];
        // Stored times 2^72 already (the layout's).
        let d = f32::from_le_bytes([d[0], d[1], d[2], d[3]]);
        at += 32;
        let mut blk = [0.0f32; 8];
        for b in SPAN * s..(SPAN * s + SPAN).min(nb) {
            let (q, xb) = (
                &grp[at + 32 * r..at + 32 * r + 32],
                &xs[32 * b..32 * b + 32],
            );
            for c in 0..4 {
                for (l, blk) in blk.iter_mut().enumerate() {
                    *blk = widen(q[code_pos(8 * c + l)]).mul_add(xb[8 * c + l], *blk);
                }
            }
            at += BLOCK8;
        }
        for (acc, blk) in acc.iter_mut().zip(blk) {
            *acc = d.mul_add(blk, *acc);
        }
    }
    hsum8(&acc)
}
