//! Kernel-side block decoders: one packed block (or a run of plain floats) to `f32`.
//!
//! Invariant: every decoder here is bit-identical to poot-core's reference
//! (`poot_core::quant::dequantize`): the same `f32` operations in the same order, unfused (Rust
//! never contracts `a * b + c` on its own). The tests check every block of the real slices.
//!
//! The code is written for the autovectorizer: fixed-size arrays, no bounds checks inside the
//! element loops, one scale per inner loop. `decode_run` is `#[inline(always)]` so the SIMD
//! paths (see `simd.rs`) instantiate it inside `#[target_feature]` functions and get AVX2 or
//! AVX-512 code from the same source. Cost: O(elements), no allocation.

use crate::kernels::format::Format;

/// Exact `f16` bits to `f32` (NaNs keep their payload with the quiet bit set, as F16C does).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    if exp == 0x1f {
        let quiet = if man == 0 { 0 } else { 0x0040_0000 };
        f32::from_bits(sign | 0x7f80_0000 | quiet | (man << 13))
    } else if exp == 0 {
        // Zero or subnormal: man * 2^-24, exact in f32.
        let v = man as f32 * (1.0 / 16_777_216.0);
        if sign != 0 {
            -v
        } else {
            v
        }
    } else {
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
    }
}

/// The little-endian f16 at byte `off` of `b`, as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Runs a block decoder over whole blocks of `$fmt` (its block shape from [`Format`]). A macro,
/// not a generic over `Fn`: a direct call to an `#[inline(always)]` function is what gets
/// inlined (and vectorized) inside the SIMD `#[target_feature]` wrappers; an `Fn::call` shim was
/// left outlined, compiled for SSE2.
macro_rules! each_block {
    ($src:expr, $dst:expr, $f:ident, $fmt:expr) => {{
        let (bb, be) = const { ($fmt.block_bytes(), $fmt.block_elems()) };
        for (b, y) in $src.chunks_exact(bb).zip($dst.chunks_exact_mut(be)) {
            // `chunks_exact` yields exactly `bb` bytes and `be` values, the sizes of the
            // decoder's arrays (the tests decode every format); these cannot fail.
            $f(
                b.try_into().expect("whole block"),
                y.try_into().expect("whole block"),
            )
        }
    }};
}

/// Decodes `dst.len()` elements of `p` from `src`.
///
/// The caller guarantees `src.len() == bytes_for(dst.len())` (whole blocks); on a mismatch
/// only the whole blocks both sides hold are decoded (never out of bounds).
#[inline(always)]
pub(crate) fn decode_run(p: Format, src: &[u8], dst: &mut [f32]) {
    match p {
        Format::F32 => {
            for (b, y) in src.chunks_exact(4).zip(dst) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Format::F16 => {
            for (b, y) in src.chunks_exact(2).zip(dst) {
                *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Format::BF16 => {
            for (b, y) in src.chunks_exact(2).zip(dst) {
                *y = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        Format::Q4_0 => each_block!(src, dst, q4_0, Format::Q4_0),
        Format::Q4_1 => each_block!(src, dst, q4_1, Format::Q4_1),
        Format::Q5_0 => each_block!(src, dst, q5_0, Format::Q5_0),
        Format::Q5_1 => each_block!(src, dst, q5_1, Format::Q5_1),
        Format::Q8_0 => each_block!(src, dst, q8_0, Format::Q8_0),
        Format::Q2_K => each_block!(src, dst, q2_k, Format::Q2_K),
        Format::Q3_K => each_block!(src, dst, q3_k, Format::Q3_K),
        Format::Q4_K => each_block!(src, dst, q4_k, Format::Q4_K),
        Format::Q5_K => each_block!(src, dst, q5_k, Format::Q5_K),
        Format::Q6_K => each_block!(src, dst, q6_k, Format::Q6_K),
        Format::Q8_K => each_block!(src, dst, q8_k, Format::Q8_K),
        Format::Q4_Z => each_block!(src, dst, q4_z, Format::Q4_Z),
        Format::Q8_Z => each_block!(src, dst, q8_z, Format::Q8_Z),
        Format::F8_S => each_block!(src, dst, f8_s, Format::F8_S),
    }
}

#[inline(always)]
fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// poot's FP8 block (`poot_core::quant::layout::f8_s`): `y = e4m3(q) * d`, the E4M3 byte
/// decoded exactly (`poot_core::quant::hf_fp8::e4m3_to_f32`), then one f32 multiply.
#[inline(always)]
fn f8_s(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..32 {
        y[j] = poot_core::quant::hf_fp8::e4m3_to_f32(b[4 + j]) * d;
    }
}

/// poot's GPTQ/AWQ block (`poot_core::quant::layout::q4_z`): `y = (q - z) * d`.
#[inline(always)]
fn q4_z(b: &[u8; 19], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let z = i32::from(b[2]);
    for j in 0..16 {
        let q = b[3 + j];
        y[j] = (i32::from(q & 0x0F) - z) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - z) as f32 * d;
    }
}

/// poot's 8-bit GPTQ block (`poot_core::quant::layout::q8_z`): `y = (q - z) * d`.
#[inline(always)]
fn q8_z(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let z = i32::from(u16::from_le_bytes([b[2], b[3]]));
    for j in 0..32 {
        y[j] = (i32::from(b[4 + j]) - z) as f32 * d;
    }
}

#[inline(always)]
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = i32::from(q & 0x0F) as f32 * d + m;
        y[j + 16] = i32::from(q >> 4) as f32 * d + m;
    }
}

#[inline(always)]
fn qh_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = qh_at(b, 2);
    for j in 0..16 {
        let q = b[6 + j];
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((u32::from(q & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = ((u32::from(q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

#[inline(always)]
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = qh_at(b, 4);
    for j in 0..16 {
        let q = b[8 + j];
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (u32::from(q & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = (u32::from(q >> 4) | h1) as f32 * d + m;
    }
}

#[inline(always)]
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        y[j] = f32::from(b[2 + j] as i8) * d;
    }
}

#[inline(always)]
fn q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let (d, min) = (f16_at(b, 80), f16_at(b, 82));
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let sc = b[n * 8 + j * 2 + h];
                let dl = d * f32::from(sc & 0xF);
                let ml = min * f32::from(sc >> 4);
                let base = n * 128 + j * 32 + h * 16;
                for l in 0..16 {
                    let q = (b[16 + n * 32 + h * 16 + l] >> (2 * j)) & 3;
                    y[base + l] = dl * f32::from(q) - ml;
                }
            }
        }
    }
}

#[inline(always)]
fn q3_k_scale(s: &[u8], k: usize) -> i32 {
    let low = if k < 8 { s[k] & 0xF } else { s[k - 8] >> 4 };
    let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    i32::from(low | high << 4) - 32
}

#[inline(always)]
fn q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let d_all = f16_at(b, 108);
    let scales = &b[96..108];
    for n in 0..2 {
        for j in 0..4 {
            let m = 1u8 << (n * 4 + j);
            for h in 0..2 {
                let dl = d_all * q3_k_scale(scales, n * 8 + j * 2 + h) as f32;
                let base = n * 128 + j * 32 + h * 16;
                for l in 0..16 {
                    let i = h * 16 + l;
                    let lowq = i32::from((b[32 + n * 32 + i] >> (2 * j)) & 3);
                    let sub = if b[i] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * (lowq - sub) as f32;
                }
            }
        }
    }
}

#[inline(always)]
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

#[inline(always)]
fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for c in 0..4 {
        let (sc, m) = scale_min_k4(2 * c, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(2 * c + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        for l in 0..32 {
            let q = b[16 + c * 32 + l];
            y[c * 64 + l] = d1 * f32::from(q & 0xF) - m1;
            y[c * 64 + 32 + l] = d2 * f32::from(q >> 4) - m2;
        }
    }
}

#[inline(always)]
fn q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for c in 0..4 {
        let (sc, m) = scale_min_k4(2 * c, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min_k4(2 * c + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        for l in 0..32 {
            let (ql, qh) = (b[48 + c * 32 + l], b[16 + l]);
            let h1 = ((qh >> (2 * c)) & 1) << 4;
            let h2 = ((qh >> (2 * c + 1)) & 1) << 4;
            y[c * 64 + l] = d1 * f32::from((ql & 0xF) | h1) - m1;
            y[c * 64 + 32 + l] = d2 * f32::from((ql >> 4) | h2) - m2;
        }
    }
}

#[inline(always)]
fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (n * 64, 128 + n * 32, 192 + n * 8);
        for half in 0..2 {
            let s = |i: usize| d * f32::from(b[sc + half + i] as i8);
            let (s1, s2, s3, s4) = (s(0), s(2), s(4), s(6));
            for l in half * 16..half * 16 + 16 {
                let (a, c, h) = (b[ql + l], b[ql + l + 32], b[qh + l]);
                let q1 = i32::from((a & 0xF) | ((h & 3) << 4)) - 32;
                let q2 = i32::from((c & 0xF) | (((h >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((a >> 4) | (((h >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((c >> 4) | (((h >> 6) & 3) << 4)) - 32;
                let o = n * 128 + l;
                y[o] = s1 * q1 as f32;
                y[o + 32] = s2 * q2 as f32;
                y[o + 64] = s3 * q3 as f32;
                y[o + 96] = s4 * q4 as f32;
            }
        }
    }
}

#[inline(always)]
fn q8_k(b: &[u8; 292], y: &mut [f32; 256]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..256 {
        y[j] = d * f32::from(b[4 + j] as i8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            assert_eq!(f16_to_f32(h).to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}
