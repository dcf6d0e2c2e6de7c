//! The portable forms of the FP8 row dot (`F8_S` weight rows against `f32` activations), the
//! references the x86 loops over the stored and the 8-row layouts are bit-identical to.
//!
//! Float order, for a scale span of `s` blocks (`32 * s` values under one scale: `s = 1` for
//! the stored layout and any tensor; `s = 4` for the 8-row layout of a tensor whose scale is
//! constant over 128 values): lane `l < 8` holds elements `l + 8c` (`c < 4s`) of each span;
//! per span and lane, `inner = e[l] * x[l]`, then one FMA per `c = 1..4s` in order, then
//! `acc[l] = fma(D, inner, acc[l])`; `hsum8` of `acc` at the end.
//!
//! Operands, per span one of two exact scalings of the same values:
//! - F16C: `e` is the E4M3 value over 256 (what F16C gives for the byte moved into an f16's
//!   bits), `x` as given, `D = 256 d`;
//! - shifted: `e` is the E4M3 value times `2^-120` (the byte's bits moved into an f32's: its
//!   exponent field is E4M3's), `x * 2^64`, and `D = d * 2^56`. The 8-row layout takes it for
//!   spans without subnormal codes, so every `e` is a normal f32 or zero.
//!
//! Every operand is exact and the scalings differ by powers of two, so the two give the same
//! result, bit for bit, unless an intermediate leaves f32's normal range in one of them and
//! not the other: a product `|e x|` below `2^-70` (the shifted form rounds it as an f32
//! subnormal), or `|x| >= 2^64` (its `x * 2^64` overflows). The stored layout's dot
//! ([`dot_scalar`]) takes F16C's for every span.

use poot_core::quant::hf_fp8::e4m3_to_f32;

use crate::kernels::ggml::hsum8;

/// Bytes of one `F8_S` block: an f32 scale, then 32 E4M3 bytes.
pub(crate) const F8_BLOCK: usize = 36;

/// `2^64`: the shifted scaling's activation factor (exact in f32).
pub(crate) const X_SCALE: f32 = f32::from_bits((127 + 64) << 23);

/// `2^56`: the shifted scaling's factor on each scale (`256 * 2^120 / 2^64`).
pub(crate) const D_SCALE: f32 = f32::from_bits((127 + 56) << 23);

/// The E4M3 byte's value over 256, exactly (a power-of-two step; the smallest subnormal,
/// `2^-9`, stays a normal f32). NaN codes stay NaN.
#[inline(always)]
pub(crate) fn e4m3_over_256(q: u8) -> f32 {
    e4m3_to_f32(q) * (1.0 / 256.0)
}

/// The E4M3 byte's value times `2^-120`: its sign, exponent and mantissa bits moved to an
/// f32's sign, low exponent and top mantissa bits (exact; a subnormal code would give an f32
/// subnormal, a NaN code a finite value: the shifted spans hold neither).
#[inline(always)]
pub(crate) fn e4m3_shifted(q: u8) -> f32 {
    f32::from_bits((u32::from(q & 0x80) << 24) | (u32::from(q & 0x7f) << 20))
}

/// The stored reference: one `F8_S` weight row (`x.len() / 32` blocks) against one row of
/// activations, one scale span a block, F16C's scaling.
pub(crate) fn dot_scalar(w: &[u8], x: &[f32]) -> f32 {
    dot_scalar_span(w, x, 1, &[])
}

/// The reference with spans of `span` blocks (see the module docs), span `p` in the shifted
/// scaling where `shifted[p]` (absent: F16C's). Each span's scale is its first block's (the
/// caller has checked that its other blocks carry the same one).
///
/// # Panics
/// If `span` is 0 or the block count (`x.len() / 32`) is not a multiple of it.
pub(crate) fn dot_scalar_span(w: &[u8], x: &[f32], span: usize, shifted: &[bool]) -> f32 {
    let nb = x.len() / 32;
    assert!(span > 0 && nb.is_multiple_of(span), "f8 span");
    let mut acc = [0.0f32; 8];
    for (p, (wsp, xsp)) in w[..nb * F8_BLOCK]
        .chunks_exact(span * F8_BLOCK)
        .zip(x.chunks_exact(32 * span))
        .enumerate()
    {
        let (widen, xs, ds): (fn(u8) -> f32, f32, f32) = if shifted.get(p) == Some(&true) {
            (e4m3_shifted, X_SCALE, D_SCALE)
        } else {
            (e4m3_over_256, 1.0, 256.0)
        };
        let d = f32::from_le_bytes([wsp[0], wsp[1], wsp[2], wsp[3]]) * ds;
        // Element `i` of the span: block `i / 32`, byte `i % 32` after its scale.
        let e = |i: usize| widen(wsp[i / 32 * F8_BLOCK + 4 + i % 32]);
        for (l, acc) in acc.iter_mut().enumerate() {
            let mut inner = e(l) * (xsp[l] * xs);
            for c in 1..4 * span {
                inner = e(8 * c + l).mul_add(xsp[8 * c + l] * xs, inner);
            }
            *acc = d.mul_add(inner, *acc);
        }
    }
    hsum8(&acc)
}
