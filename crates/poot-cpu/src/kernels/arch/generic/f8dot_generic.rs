//! The portable form of the FP8 row dot (`F8_S` weight rows against `f32` activations,
//! `arch/x86/f8dot.rs`'s loops, in the same float order): per 32-value block, 8
//! lanes (lane `l` holds elements `l, l + 8, l + 16, l + 24`) of `inner = e_l * x_l` then 3
//! FMAs, `acc[l] = fma(256 * d, inner, acc[l])`, and `hsum8` at the end, where `e` is the
//! E4M3 value over 256 (what F16C gives for the byte moved into an f16's bits: exact).
//! Bit-identical to the x86 loops (the matmul's tests compare them).

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

/// The portable reference: one `F8_S` weight row (`x.len() / 32` blocks) against one row of
/// activations.
pub(crate) fn dot_scalar(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, xb) in w.chunks_exact(F8_BLOCK).zip(x.chunks_exact(32)) {
        let d = f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]) * 256.0;
        let q = &wb[4..F8_BLOCK];
        for (l, acc) in acc.iter_mut().enumerate() {
            let mut inner = e4m3_over_256(q[l]) * xb[l];
            for c in 1..4 {
                inner = e4m3_over_256(q[8 * c + l]).mul_add(xb[8 * c + l], inner);
            }
            *acc = d.mul_add(inner, *acc);
        }
    }
    hsum8(&acc)
}
