//! The portable form of the FP8 row dot (`F8_S` weight rows against `f32` activations), the
//! reference the x86 loops over the stored and the 8-row layouts are bit-identical to.
//!
//! Float order, for a scale span of `s` blocks (`32 * s` values under one scale: `s = 1` for
//! the stored layout and any tensor; `s = 4` for the 8-row layout of a tensor whose scale is
//! constant over 128 values): lane `l < 8` holds elements `l + 8c` (`c < 4s`) of each span;
//! per span and lane, `inner = e[l] * x[l]`, then one FMA per `c = 1..4s` in order, then
//! `acc[l] = fma(256 * d, inner, acc[l])` with `d` the span's scale; `hsum8` of `acc` at the
//! end. `e` is the E4M3 value over 256 (what F16C gives for the byte moved into an f16's bits:
//! exact), so the widening never rounds and only these steps do.

use poot_core::quant::hf_fp8::e4m3_to_f32;

use crate::kernels::ggml::hsum8;

/// Bytes of one `F8_S` block: an f32 scale, then 32 E4M3 bytes.
pub(crate) const F8_BLOCK: usize = 36;

/// The E4M3 byte's value over 256, exactly (a power-of-two step; the smallest subnormal,
/// `2^-9`, stays a normal f32). NaN codes stay NaN.
#[inline(always)]
pub(crate) fn e4m3_over_256(q: u8) -> f32 {
    e4m3_to_f32(q) * (1.0 / 256.0)
}

/// The portable reference over stored blocks: one `F8_S` weight row (`x.len() / 32` blocks)
/// against one row of activations, one scale span a block.
pub(crate) fn dot_scalar(w: &[u8], x: &[f32]) -> f32 {
    dot_scalar_span(w, x, 1)
}

/// The reference with spans of `span` blocks (see the module docs): each span's scale is its
/// first block's (the caller has checked that its other blocks carry the same one).
///
/// # Panics
/// If `span` is 0 or the block count (`x.len() / 32`) is not a multiple of it.
pub(crate) fn dot_scalar_span(w: &[u8], x: &[f32], span: usize) -> f32 {
    let nb = x.len() / 32;
    assert!(span > 0 && nb.is_multiple_of(span), "f8 span");
    let mut acc = [0.0f32; 8];
    for (ws, xs) in w[..nb * F8_BLOCK]
        .chunks_exact(span * F8_BLOCK)
        .zip(x.chunks_exact(32 * span))
    {
        let d = f32::from_le_bytes([ws[0], ws[1], ws[2], ws[3]]) * 256.0;
        // Element `i` of the span: block `i / 32`, byte `i % 32` after its scale.
        let e = |i: usize| e4m3_over_256(ws[i / 32 * F8_BLOCK + 4 + i % 32]);
        for (l, acc) in acc.iter_mut().enumerate() {
            let mut inner = e(l) * xs[l];
            for c in 1..4 * span {
                inner = e(8 * c + l).mul_add(xs[8 * c + l], inner);
            }
            *acc = d.mul_add(inner, *acc);
        }
    }
    hsum8(&acc)
}
