//! Plain floats and ggml's 32-element "legacy" blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Each function decodes one block and mirrors `dequantize_row_*` in `ggml-quants.c`: the
//! quant becomes an exact small integer, then one `f32` multiply (`q * d`) and, for the types
//! with a min, one add (`q * d + m`), unfused. See the module above for the exactness claim.

use super::f16_at;
use super::layout::{bfloat16, float16, float32, q4_0 as l40, q4_1 as l41, q5_0 as l50};
use super::layout::{f8_s as l8s, q4_z as l4z, q5_1 as l51, q8_0 as l80, q8_z as l8z};

/// One little-endian `f32`, bits unchanged (NaN payloads included).
pub fn f32(b: &[u8; float32::BYTES], y: &mut [f32; 1]) {
    y[0] = f32::from_le_bytes(*b);
}

/// One little-endian `f16`, converted exactly.
pub fn f16(b: &[u8; float16::BYTES], y: &mut [f32; 1]) {
    y[0] = f16_at(b, float16::X.offset);
}

/// One little-endian `bf16`: its bits become the high half of the `f32` (exact, NaNs kept).
pub fn bf16(b: &[u8; bfloat16::BYTES], y: &mut [f32; 1]) {
    y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
}

/// Q4_0: `y = (q - 8) * d`.
pub fn q4_0(b: &[u8; l40::BYTES], y: &mut [f32; l40::ELEMS]) {
    let d = f16_at(b, l40::D.offset);
    let (lo, hi) = y.split_at_mut(l40::ELEMS / 2);
    for ((&q, lo), hi) in b[l40::QS.range()].iter().zip(lo).zip(hi) {
        let x0 = i32::from(q & 0x0F) - 8;
        let x1 = i32::from(q >> 4) - 8;
        *lo = x0 as f32 * d;
        *hi = x1 as f32 * d;
    }
}

/// Q4_Z: `y = (q - z) * d`; `q - z` is a small integer, so the one multiply is exact.
pub fn q4_z(b: &[u8; l4z::BYTES], y: &mut [f32; l4z::ELEMS]) {
    let d = f16_at(b, l4z::D.offset);
    let z = i32::from(b[l4z::Z.offset]);
    let (lo, hi) = y.split_at_mut(l4z::ELEMS / 2);
    for ((&q, lo), hi) in b[l4z::QS.range()].iter().zip(lo).zip(hi) {
        *lo = (i32::from(q & 0x0F) - z) as f32 * d;
        *hi = (i32::from(q >> 4) - z) as f32 * d;
    }
}

/// Q8_Z: `y = (q - z) * d`, exact as Q4_Z's (`|q - z| <= 256`).
pub fn q8_z(b: &[u8; l8z::BYTES], y: &mut [f32; l8z::ELEMS]) {
    let d = f16_at(b, l8z::D.offset);
    let z = i32::from(u16::from_le_bytes([b[l8z::Z.offset], b[l8z::Z.offset + 1]]));
    for (&q, y) in b[l8z::QS.range()].iter().zip(y.iter_mut()) {
        *y = (i32::from(q) - z) as f32 * d;
    }
}

/// F8_S: `y = e4m3(q) * d`, one f32 multiply (exact when `d` has at most 20 significant bits,
/// as f16 and bf16 scales do; rounded once, to nearest, otherwise).
pub fn f8_s(b: &[u8; l8s::BYTES], y: &mut [f32; l8s::ELEMS]) {
    let o = l8s::D.offset;
    let d = f32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    for (&q, y) in b[l8s::QS.range()].iter().zip(y.iter_mut()) {
        *y = super::hf_fp8::e4m3_to_f32(q) * d;
    }
}

/// Q4_1: `y = q * d + m`.
pub fn q4_1(b: &[u8; l41::BYTES], y: &mut [f32; l41::ELEMS]) {
    let d = f16_at(b, l41::D.offset);
    let m = f16_at(b, l41::M.offset);
    let (lo, hi) = y.split_at_mut(l41::ELEMS / 2);
    for ((&q, lo), hi) in b[l41::QS.range()].iter().zip(lo).zip(hi) {
        let x0 = i32::from(q & 0x0F);
        let x1 = i32::from(q >> 4);
        *lo = x0 as f32 * d + m;
        *hi = x1 as f32 * d + m;
    }
}

/// The 32 fifth bits of a Q5 block, bit j for element j.
fn qh_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Q5_0: `y = (q - 16) * d`, with q's fifth bit from `qh`.
pub fn q5_0(b: &[u8; l50::BYTES], y: &mut [f32; l50::ELEMS]) {
    let d = f16_at(b, l50::D.offset);
    let qh = qh_at(b, l50::QH.offset);
    let (lo, hi) = y.split_at_mut(l50::ELEMS / 2);
    for (j, ((&q, lo), hi)) in b[l50::QS.range()].iter().zip(lo).zip(hi).enumerate() {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        let x0 = (u32::from(q & 0x0F) | xh0) as i32 - 16;
        let x1 = (u32::from(q >> 4) | xh1) as i32 - 16;
        *lo = x0 as f32 * d;
        *hi = x1 as f32 * d;
    }
}

/// Q5_1: `y = q * d + m`, with q's fifth bit from `qh`.
pub fn q5_1(b: &[u8; l51::BYTES], y: &mut [f32; l51::ELEMS]) {
    let d = f16_at(b, l51::D.offset);
    let m = f16_at(b, l51::M.offset);
    let qh = qh_at(b, l51::QH.offset);
    let (lo, hi) = y.split_at_mut(l51::ELEMS / 2);
    for (j, ((&q, lo), hi)) in b[l51::QS.range()].iter().zip(lo).zip(hi).enumerate() {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        let x0 = u32::from(q & 0x0F) | xh0;
        let x1 = u32::from(q >> 4) | xh1;
        *lo = x0 as f32 * d + m;
        *hi = x1 as f32 * d + m;
    }
}

/// Q8_0: `y = q * d`.
pub fn q8_0(b: &[u8; l80::BYTES], y: &mut [f32; l80::ELEMS]) {
    let d = f16_at(b, l80::D.offset);
    for (&q, y) in b[l80::QS.range()].iter().zip(y) {
        *y = f32::from(q as i8) * d;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use half::f16 as h;

    /// Little-endian bytes of `x` as an f16; `x` must be exactly representable.
    pub(in crate::quant) fn f16_le(x: f32) -> [u8; 2] {
        let v = h::from_f32(x);
        assert_eq!(v.to_f32(), x, "{x} is not an exact f16");
        v.to_bits().to_le_bytes()
    }

    /// Packs 32 4-bit quants the legacy way: byte j = q[j] | q[j + 16] << 4.
    fn nibbles(q: &[u8; 32]) -> [u8; 16] {
        std::array::from_fn(|j| q[j] | q[j + 16] << 4)
    }

    /// Quants that hit every nibble value and both halves differently.
    fn quants(range: u8) -> [u8; 32] {
        std::array::from_fn(|i| (i as u8 * 7 + 3) % range)
    }

    #[test]
    fn floats_decode_bits() {
        let mut y = [0.0];
        f32(&(-2.5f32).to_bits().to_le_bytes(), &mut y);
        assert_eq!(y[0], -2.5);
        f32(&0x7fa0_0001u32.to_le_bytes(), &mut y);
        assert_eq!(y[0].to_bits(), 0x7fa0_0001, "f32 NaN payloads must survive");
        f16(&f16_le(-0.375), &mut y);
        assert_eq!(y[0], -0.375);
        f16(&0x0001u16.to_le_bytes(), &mut y);
        assert_eq!(y[0], 2f32.powi(-24), "smallest f16 subnormal");
        f16(&0xfc00u16.to_le_bytes(), &mut y);
        assert_eq!(y[0], f32::NEG_INFINITY);
        bf16(&0x3fc0u16.to_le_bytes(), &mut y);
        assert_eq!(y[0], 1.5);
        bf16(&0xff81u16.to_le_bytes(), &mut y);
        assert_eq!(
            y[0].to_bits(),
            0xff81_0000,
            "bf16 is a shift, NaNs included"
        );
    }

    #[test]
    fn q4_0_centres_on_eight() {
        let q = quants(16);
        let mut b = [0u8; l40::BYTES];
        b[l40::D.range()].copy_from_slice(&f16_le(0.5));
        b[l40::QS.range()].copy_from_slice(&nibbles(&q));
        let mut y = [0.0; 32];
        q4_0(&b, &mut y);
        for i in 0..32 {
            assert_eq!(y[i], (f32::from(q[i]) - 8.0) * 0.5, "element {i}");
        }
        assert_eq!(y[0], -2.5, "q[0] = 3");
    }

    #[test]
    fn q4_1_adds_the_min() {
        let q = quants(16);
        let mut b = [0u8; l41::BYTES];
        b[l41::D.range()].copy_from_slice(&f16_le(0.25));
        b[l41::M.range()].copy_from_slice(&f16_le(-1.0));
        b[l41::QS.range()].copy_from_slice(&nibbles(&q));
        let mut y = [0.0; 32];
        q4_1(&b, &mut y);
        for i in 0..32 {
            assert_eq!(y[i], f32::from(q[i]) * 0.25 - 1.0, "element {i}");
        }
    }

    /// A Q5 block's `qh` and `qs` for 32 5-bit quants.
    fn five_bits(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (i, &v)| h | u32::from(v >> 4) << i);
        (qh.to_le_bytes(), nibbles(&q.map(|v| v & 0x0F)))
    }

    #[test]
    fn q5_0_takes_the_fifth_bit_from_qh() {
        let q = quants(32);
        let (qh, qs) = five_bits(&q);
        let mut b = [0u8; l50::BYTES];
        b[l50::D.range()].copy_from_slice(&f16_le(-0.125));
        b[l50::QH.range()].copy_from_slice(&qh);
        b[l50::QS.range()].copy_from_slice(&qs);
        let mut y = [0.0; 32];
        q5_0(&b, &mut y);
        for i in 0..32 {
            assert_eq!(y[i], (f32::from(q[i]) - 16.0) * -0.125, "element {i}");
        }
        assert!(q.iter().any(|&v| v >= 16) && q[16..].iter().any(|&v| v >= 16));
    }

    #[test]
    fn q5_1_takes_the_fifth_bit_from_qh_and_adds_the_min() {
        let q = quants(32);
        let (qh, qs) = five_bits(&q);
        let mut b = [0u8; l51::BYTES];
        b[l51::D.range()].copy_from_slice(&f16_le(2.0));
        b[l51::M.range()].copy_from_slice(&f16_le(0.5));
        b[l51::QH.range()].copy_from_slice(&qh);
        b[l51::QS.range()].copy_from_slice(&qs);
        let mut y = [0.0; 32];
        q5_1(&b, &mut y);
        for i in 0..32 {
            assert_eq!(y[i], f32::from(q[i]) * 2.0 + 0.5, "element {i}");
        }
    }

    #[test]
    fn q8_0_is_signed() {
        let q: [i8; 32] = std::array::from_fn(|i| (i as i8 - 16) * 8);
        let mut b = [0u8; l80::BYTES];
        b[l80::D.range()].copy_from_slice(&f16_le(0.0625));
        for (dst, v) in b[l80::QS.range()].iter_mut().zip(q) {
            *dst = v as u8;
        }
        let mut y = [0.0; 32];
        q8_0(&b, &mut y);
        for i in 0..32 {
            assert_eq!(y[i], f32::from(q[i]) * 0.0625, "element {i}");
        }
        assert_eq!(y[0], -8.0);
    }
}
