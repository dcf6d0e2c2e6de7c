//! ggml's 256-element k-quant super-blocks: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
//!
//! Each function decodes one super-block and mirrors `dequantize_row_*` in `ggml-quants.c`,
//! including where the sub-block scale is folded in: the scale products (`d * sc`,
//! `dmin * m`) come first, then the quant, then the min is subtracted. (The products are exact
//! in `f32` at these widths; the subtraction is the one rounding step, see the parent module.)

use super::f16_at;
use super::layout::{q2_k as l2, q3_k as l3, q4_k as l4, q5_k as l5, q6_k as l6, q8_k as l8};

/// Q2_K: sub-block s of 16 has `dl = d * (sc & 15)`, `ml = dmin * (sc >> 4)`; `y = dl * q - ml`.
pub fn q2_k(b: &[u8; l2::BYTES], y: &mut [f32; l2::ELEMS]) {
    let d = f16_at(b, l2::D.offset);
    let min = f16_at(b, l2::DMIN.offset);
    let scales = &b[l2::SCALES.range()];
    let mut is = 0;
    for (q, y) in b[l2::QS.range()]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(128))
    {
        for (j, y) in y.chunks_exact_mut(32).enumerate() {
            let shift = 2 * j;
            for (q, y) in q.chunks_exact(16).zip(y.chunks_exact_mut(16)) {
                let sc = scales[is];
                is += 1;
                let dl = d * f32::from(sc & 0xF);
                let ml = min * f32::from(sc >> 4);
                for (&q, y) in q.iter().zip(y) {
                    *y = dl * f32::from((q >> shift) & 3) - ml;
                }
            }
        }
    }
}

/// Q3_K's 6-bit scale `k` (0..16), unpacked as ggml's `kmask` shuffle does, minus 32.
fn q3_k_scale(s: &[u8], k: usize) -> i32 {
    let low = if k < 8 { s[k] & 0xF } else { s[k - 8] >> 4 };
    let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    i32::from(low | high << 4) - 32
}

/// Q3_K: `dl = d * (sc - 32)` per sub-block of 16; `y = dl * (q - (hmask bit ? 0 : 4))`.
pub fn q3_k(b: &[u8; l3::BYTES], y: &mut [f32; l3::ELEMS]) {
    let d_all = f16_at(b, l3::D.offset);
    let scales = &b[l3::SCALES.range()];
    let hm = &b[l3::HMASK.range()];
    let mut is = 0;
    let mut m = 1u8;
    for (q, y) in b[l3::QS.range()]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(128))
    {
        for (j, y) in y.chunks_exact_mut(32).enumerate() {
            let shift = 2 * j;
            for (half, y) in y.chunks_exact_mut(16).enumerate() {
                let dl = d_all * q3_k_scale(scales, is) as f32;
                is += 1;
                for (l, y) in (16 * half..).zip(y) {
                    let lowq = i32::from((q[l] >> shift) & 3);
                    let sub = if hm[l] & m != 0 { 0 } else { 4 };
                    *y = dl * (lowq - sub) as f32;
                }
            }
            m <<= 1;
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of Q4_K/Q5_K.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: `d1 = d * sc`, `m1 = dmin * m` per sub-block of 32; `y = d1 * q - m1`.
pub fn q4_k(b: &[u8; l4::BYTES], y: &mut [f32; l4::ELEMS]) {
    let d = f16_at(b, l4::D.offset);
    let min = f16_at(b, l4::DMIN.offset);
    let scales = &b[l4::SCALES.range()];
    for (c, (q, y)) in b[l4::QS.range()]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc, m) = scale_min_k4(2 * c, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(2 * c + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let (lo, hi) = y.split_at_mut(32);
        for ((&q, lo), hi) in q.iter().zip(lo).zip(hi) {
            *lo = d1 * f32::from(q & 0xF) - m1;
            *hi = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// Q5_K: as Q4_K, with each quant's fifth bit from `qh` (bit `s` for sub-block `s`).
pub fn q5_k(b: &[u8; l5::BYTES], y: &mut [f32; l5::ELEMS]) {
    let d = f16_at(b, l5::D.offset);
    let min = f16_at(b, l5::DMIN.offset);
    let scales = &b[l5::SCALES.range()];
    let qh = &b[l5::QH.range()];
    for (c, (ql, y)) in b[l5::QS.range()]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc, m) = scale_min_k4(2 * c, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(2 * c + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let (lo, hi) = y.split_at_mut(32);
        for (((&ql, &qh), lo), hi) in ql.iter().zip(qh).zip(lo).zip(hi) {
            let h1 = if qh & u1 != 0 { 16 } else { 0 };
            let h2 = if qh & u2 != 0 { 16 } else { 0 };
            *lo = d1 * f32::from((ql & 0xF) + h1) - m1;
            *hi = d2 * f32::from((ql >> 4) + h2) - m2;
        }
    }
}

/// Q6_K: `y = d * sc * (q - 32)` per sub-block of 16, evaluated as `(d * sc) * q`.
pub fn q6_k(b: &[u8; l6::BYTES], y: &mut [f32; l6::ELEMS]) {
    let d = f16_at(b, l6::D.offset);
    let ql = b[l6::QL.range()].chunks_exact(64);
    let qh = b[l6::QH.range()].chunks_exact(32);
    let sc = b[l6::SCALES.range()].chunks_exact(8);
    for (((ql, qh), sc), y) in ql.zip(qh).zip(sc).zip(y.chunks_exact_mut(128)) {
        let sc = |i: usize| f32::from(sc[i] as i8);
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc(is) * q1 as f32;
            y[l + 32] = d * sc(is + 2) * q2 as f32;
            y[l + 64] = d * sc(is + 4) * q3 as f32;
            y[l + 96] = d * sc(is + 6) * q4 as f32;
        }
    }
}

/// Q8_K: `y = d * q`, `d` an `f32`; `bsums` is only for dot products and is not read.
pub fn q8_k(b: &[u8; l8::BYTES], y: &mut [f32; l8::ELEMS]) {
    let o = l8::D.offset;
    let d = f32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    for (&q, y) in b[l8::QS.range()].iter().zip(y) {
        *y = d * f32::from(q as i8);
    }
}

#[cfg(test)]
mod tests {
    //! Each test packs logical values (per-element quants, per-sub-block scales) with an
    //! encoder written from ggml's quantize side, then checks the decoder element by element.

    use super::*;
    use crate::quant::legacy::tests::f16_le;

    /// Deterministic bytes (xorshift), so failures reproduce.
    fn noise(seed: u32, n: usize) -> Vec<u8> {
        let mut s = seed.max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 24) as u8
            })
            .collect()
    }

    fn put(b: &mut [u8], f: crate::quant::layout::Field, bytes: &[u8]) {
        b[f.range()].copy_from_slice(bytes);
    }

    #[test]
    fn q2_k_layout() {
        let (d, dmin) = (0.5, 0.25);
        let q: Vec<u8> = noise(1, 256).iter().map(|v| v & 3).collect();
        let sc = noise(2, 16);
        let mut b = [0u8; l2::BYTES];
        put(&mut b, l2::SCALES, &sc);
        let mut qs = [0u8; 64];
        for (i, &v) in q.iter().enumerate() {
            let (n, r) = (i / 128, i % 128);
            qs[n * 32 + r % 32] |= v << (2 * (r / 32));
        }
        put(&mut b, l2::QS, &qs);
        put(&mut b, l2::D, &f16_le(d));
        put(&mut b, l2::DMIN, &f16_le(dmin));
        let mut y = [0.0; 256];
        q2_k(&b, &mut y);
        for i in 0..256 {
            let s = sc[i / 16];
            let want = d * f32::from(s & 0xF) * f32::from(q[i]) - dmin * f32::from(s >> 4);
            assert_eq!(y[i], want, "element {i}");
        }
    }

    #[test]
    fn q3_k_layout() {
        let d = -0.75;
        let q: Vec<u8> = noise(3, 256).iter().map(|v| v & 7).collect();
        let sc: Vec<u8> = noise(4, 16).iter().map(|v| v & 63).collect();
        let mut b = [0u8; l3::BYTES];
        let (mut hmask, mut qs, mut scales) = ([0u8; 32], [0u8; 64], [0u8; 12]);
        for (i, &v) in q.iter().enumerate() {
            let (n, r) = (i / 128, i % 128);
            qs[n * 32 + r % 32] |= (v & 3) << (2 * (r / 32));
            // ggml stores q + 4 in three bits; the high bit set means "no -4".
            hmask[i % 32] |= (v >> 2) << (i / 32);
        }
        for (k, &s) in sc.iter().enumerate() {
            let (byte, shift) = if k < 8 { (k, 0) } else { (k - 8, 4) };
            scales[byte] |= (s & 0xF) << shift;
            scales[8 + k % 4] |= (s >> 4) << (2 * (k / 4));
        }
        put(&mut b, l3::HMASK, &hmask);
        put(&mut b, l3::QS, &qs);
        put(&mut b, l3::SCALES, &scales);
        put(&mut b, l3::D, &f16_le(d));
        let mut y = [0.0; 256];
        q3_k(&b, &mut y);
        for i in 0..256 {
            let dl = d * (i32::from(sc[i / 16]) - 32) as f32;
            assert_eq!(y[i], dl * (i32::from(q[i]) - 4) as f32, "element {i}");
        }
    }

    /// Packs 8 6-bit scales and mins as ggml's `quantize_row_q4_K_ref` does.
    fn pack_k4(sc: &[u8], m: &[u8]) -> [u8; 12] {
        let mut p = [0u8; 12];
        for j in 0..8 {
            if j < 4 {
                p[j] = sc[j];
                p[j + 4] = m[j];
            } else {
                p[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
                p[j - 4] |= (sc[j] >> 4) << 6;
                p[j] |= (m[j] >> 4) << 6;
            }
        }
        p
    }

    #[test]
    fn scale_min_k4_inverts_the_packing() {
        let sc: Vec<u8> = noise(5, 8).iter().map(|v| v & 63).collect();
        let m: Vec<u8> = noise(6, 8).iter().map(|v| v & 63).collect();
        let p = pack_k4(&sc, &m);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &p), (sc[j], m[j]), "sub-block {j}");
        }
    }

    /// Random Q4_K/Q5_K contents: quants below `1 << bits`, 6-bit scales and mins.
    fn k_block(seed: u32, bits: u32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let q = noise(seed, 256).iter().map(|v| v % (1 << bits)).collect();
        let sc = noise(seed + 1, 8).iter().map(|v| v & 63).collect();
        let m = noise(seed + 2, 8).iter().map(|v| v & 63).collect();
        (q, sc, m)
    }

    #[test]
    fn q4_k_layout() {
        let (d, dmin) = (0.125, -0.5);
        let (q, sc, m) = k_block(7, 4);
        let mut b = [0u8; l4::BYTES];
        let mut qs = [0u8; 128];
        for (i, &v) in q.iter().enumerate() {
            qs[(i / 64) * 32 + i % 32] |= v << (4 * ((i / 32) % 2));
        }
        put(&mut b, l4::D, &f16_le(d));
        put(&mut b, l4::DMIN, &f16_le(dmin));
        put(&mut b, l4::SCALES, &pack_k4(&sc, &m));
        put(&mut b, l4::QS, &qs);
        let mut y = [0.0; 256];
        q4_k(&b, &mut y);
        for i in 0..256 {
            let s = i / 32;
            let want = (d * f32::from(sc[s])) * f32::from(q[i]) - dmin * f32::from(m[s]);
            assert_eq!(y[i], want, "element {i}");
        }
    }

    #[test]
    fn q5_k_layout() {
        let (d, dmin) = (0.0625, 0.75);
        let (q, sc, m) = k_block(10, 5);
        let mut b = [0u8; l5::BYTES];
        let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
        for (i, &v) in q.iter().enumerate() {
            qs[(i / 64) * 32 + i % 32] |= (v & 0xF) << (4 * ((i / 32) % 2));
            qh[i % 32] |= (v >> 4) << (i / 32);
        }
        put(&mut b, l5::D, &f16_le(d));
        put(&mut b, l5::DMIN, &f16_le(dmin));
        put(&mut b, l5::SCALES, &pack_k4(&sc, &m));
        put(&mut b, l5::QH, &qh);
        put(&mut b, l5::QS, &qs);
        let mut y = [0.0; 256];
        q5_k(&b, &mut y);
        for i in 0..256 {
            let s = i / 32;
            let want = (d * f32::from(sc[s])) * f32::from(q[i]) - dmin * f32::from(m[s]);
            assert_eq!(y[i], want, "element {i}");
        }
    }

    #[test]
    fn q6_k_layout() {
        let d = 0.375;
        let q: Vec<u8> = noise(13, 256).iter().map(|v| v & 63).collect();
        let sc: Vec<i8> = noise(14, 16).iter().map(|&v| v as i8).collect();
        let mut b = [0u8; l6::BYTES];
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for (i, &v) in q.iter().enumerate() {
            let (n, r) = (i / 128, i % 128);
            let (t, l) = (r / 32, r % 32);
            ql[n * 64 + (t % 2) * 32 + l] |= (v & 0xF) << (4 * (t / 2));
            qh[n * 32 + l] |= (v >> 4) << (2 * t);
        }
        put(&mut b, l6::QL, &ql);
        put(&mut b, l6::QH, &qh);
        put(
            &mut b,
            l6::SCALES,
            &sc.iter().map(|&s| s as u8).collect::<Vec<_>>(),
        );
        put(&mut b, l6::D, &f16_le(d));
        let mut y = [0.0; 256];
        q6_k(&b, &mut y);
        for i in 0..256 {
            let want = d * f32::from(sc[i / 16]) * (i32::from(q[i]) - 32) as f32;
            assert_eq!(y[i], want, "element {i}");
        }
        assert!(sc.iter().any(|&s| s < 0), "negative scales are exercised");
    }

    #[test]
    fn q8_k_layout() {
        let d = 1.0e-3f32;
        let q = noise(15, 256);
        let mut b = [0u8; l8::BYTES];
        put(&mut b, l8::D, &d.to_le_bytes());
        put(&mut b, l8::QS, &q);
        put(&mut b, l8::BSUMS, &[0xAB; 32]);
        let mut y = [0.0; 256];
        q8_k(&b, &mut y);
        for i in 0..256 {
            assert_eq!(y[i], d * f32::from(q[i] as i8), "element {i}");
        }
    }
}
