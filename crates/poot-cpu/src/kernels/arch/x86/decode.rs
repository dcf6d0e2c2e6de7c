//! Explicit AVX2 block decoders for the formats real checkpoints use most.
//!
//! Invariant: bit-identical to `decode.rs` (and so to poot-core's reference): quants become
//! exact `i32`s, then the same `f32` multiply and add/subtract in the same order, never fused
//! (`_mm256_mul_ps` then `_mm256_add_ps`). The tests compare every block of the real slices.
//!
//! Formats without an explicit decoder here (Q2_K, Q3_K, Q8_K, F32) fall back to the portable
//! code compiled under the same target features. Cost: O(elements), no allocation; each block
//! is read once from `src` and written once to `dst`.

#![allow(
    clippy::needless_range_loop,
    reason = "fixed block geometry reads clearest with indices"
)]

use std::arch::x86_64::*;

use crate::kernels::decode::{decode_run, f16_to_f32};
use crate::kernels::format::Format;

/// Calls the block decoder `$f` on every whole block of format `$fmt` (`bb` bytes, `be` values)
/// that both `$src` and `$dst` hold. A macro so the decoder is called directly and inlined.
macro_rules! each {
    ($src:expr, $dst:expr, $fmt:expr, $f:ident) => {{
        let (bb, be) = const { ($fmt.block_bytes(), $fmt.block_elems()) };
        let blocks = ($src.len() / bb).min($dst.len() / be);
        for i in 0..blocks {
            // SAFETY: block i spans src[i*bb..(i+1)*bb] and dst[i*be..(i+1)*be], in bounds
            // since i < blocks; the decoder reads exactly bb bytes and writes exactly be values,
            // and its target features are this function's.
            unsafe { $f($src.as_ptr().add(i * bb), $dst.as_mut_ptr().add(i * be)) }
        }
    }};
}

/// Decodes `dst.len()` values of `p` from `src` (whole blocks, see `decode_run`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_avx2(p: Format, src: &[u8], dst: &mut [f32]) {
    match p {
        Format::F16 => f16_row(src, dst),
        Format::BF16 => bf16_row(src, dst),
        Format::Q4_0 => each!(src, dst, Format::Q4_0, q4_0),
        Format::Q4_1 => each!(src, dst, Format::Q4_1, q4_1),
        Format::Q5_0 => each!(src, dst, Format::Q5_0, q5_0),
        Format::Q5_1 => each!(src, dst, Format::Q5_1, q5_1),
        Format::Q8_0 => each!(src, dst, Format::Q8_0, q8_0),
        Format::Q4_K => each!(src, dst, Format::Q4_K, q4_k),
        Format::Q5_K => each!(src, dst, Format::Q5_K, q5_k),
        Format::Q6_K => each!(src, dst, Format::Q6_K, q6_k),
        Format::F32 => f32_row(src, dst),
        Format::Q2_K | Format::Q3_K | Format::Q8_K | Format::Q4_Z | Format::Q8_Z | Format::F8_S => {
            decode_run(p, src, dst)
        }
    }
}

/// The f16 at `b + off` as f32, with F16C (exact, as `f16_to_f32`).
#[inline(always)]
fn f16_at(b: *const u8, off: usize) -> f32 {
    // SAFETY: every caller passes a block pointer with `off + 2` inside the block, and runs
    // with F16C enabled (all decoders here are `#[target_feature(enable = "...,f16c")]`).
    unsafe {
        let h = u16::from_le(b.add(off).cast::<u16>().read_unaligned());
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

/// Eight bytes at `p` zero-extended to `i32` lanes.
#[inline(always)]
unsafe fn u8x8(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 8 readable bytes at `p`; AVX2 is enabled in every caller.
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
}

/// Low 64 bits of `v` zero-extended from `u8` to `i32` lanes.
#[inline(always)]
unsafe fn lo8(v: __m128i) -> __m256i {
    // SAFETY: register-only AVX2 op; AVX2 is enabled in every caller.
    unsafe { _mm256_cvtepu8_epi32(v) }
}

/// High 64 bits of `v` zero-extended from `u8` to `i32` lanes.
#[inline(always)]
unsafe fn hi8(v: __m128i) -> __m256i {
    // SAFETY: register-only AVX2 ops; AVX2 is enabled in every caller.
    unsafe { _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)) }
}

/// Stores `q * d` (and `+ m` when `m` is given) at `y`, unfused, as the reference computes.
#[inline(always)]
unsafe fn store_scaled(y: *mut f32, q: __m256i, d: __m256, m: Option<__m256>) {
    // SAFETY: the caller guarantees 8 writable floats at `y`; AVX2 is enabled in every caller.
    unsafe {
        let v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
        let v = match m {
            Some(m) => _mm256_add_ps(v, m),
            None => v,
        };
        _mm256_storeu_ps(y, v);
    }
}

/// Q4_0/Q4_1 nibble quants of a 16-byte `qs` as four 8-lane `i32` groups, element order.
#[inline(always)]
unsafe fn nibbles32(qs: *const u8) -> [__m256i; 4] {
    // SAFETY: the caller guarantees 16 readable bytes at `qs`; AVX2 is enabled in every caller.
    unsafe {
        let v = _mm_loadu_si128(qs.cast());
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
        [lo8(lo), hi8(lo), lo8(hi), hi8(hi)]
    }
}

/// Q5 fifth bits for elements `8g..8g + 8`, as `0` or `16` per lane.
#[inline(always)]
unsafe fn fifth_bits(qh: u32, g: usize) -> __m256i {
    // SAFETY: register-only AVX2 ops; AVX2 is enabled in every caller.
    unsafe {
        let shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let shifts = _mm256_add_epi32(shifts, _mm256_set1_epi32(8 * g as i32));
        let bits = _mm256_srlv_epi32(_mm256_set1_epi32(qh as i32), shifts);
        _mm256_slli_epi32::<4>(_mm256_and_si256(bits, _mm256_set1_epi32(1)))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4_0(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes an 18-byte block and 32 writable floats; AVX2 is enabled there.
    unsafe {
        let d = _mm256_set1_ps(f16_at(b, 0));
        let eight = _mm256_set1_epi32(8);
        for (g, q) in nibbles32(b.add(2)).into_iter().enumerate() {
            store_scaled(y.add(8 * g), _mm256_sub_epi32(q, eight), d, None);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4_1(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 20-byte block and 32 writable floats; AVX2 is enabled there.
    unsafe {
        let d = _mm256_set1_ps(f16_at(b, 0));
        let m = _mm256_set1_ps(f16_at(b, 2));
        for (g, q) in nibbles32(b.add(4)).into_iter().enumerate() {
            store_scaled(y.add(8 * g), q, d, Some(m));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q5_0(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 22-byte block and 32 writable floats; AVX2 is enabled there.
    unsafe {
        let d = _mm256_set1_ps(f16_at(b, 0));
        let qh = b.add(2).cast::<u32>().read_unaligned().to_le();
        let sixteen = _mm256_set1_epi32(16);
        for (g, q) in nibbles32(b.add(6)).into_iter().enumerate() {
            let q = _mm256_or_si256(q, fifth_bits(qh, g));
            store_scaled(y.add(8 * g), _mm256_sub_epi32(q, sixteen), d, None);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q5_1(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 24-byte block and 32 writable floats; AVX2 is enabled there.
    unsafe {
        let d = _mm256_set1_ps(f16_at(b, 0));
        let m = _mm256_set1_ps(f16_at(b, 2));
        let qh = b.add(4).cast::<u32>().read_unaligned().to_le();
        for (g, q) in nibbles32(b.add(8)).into_iter().enumerate() {
            let q = _mm256_or_si256(q, fifth_bits(qh, g));
            store_scaled(y.add(8 * g), q, d, Some(m));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q8_0(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 34-byte block and 32 writable floats; AVX2 is enabled there.
    unsafe {
        let d = _mm256_set1_ps(f16_at(b, 0));
        for g in 0..4 {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + 8 * g).cast()));
            store_scaled(y.add(8 * g), q, d, None);
        }
    }
}

/// ggml's `get_scale_min_k4` over the 12 packed scale bytes at `q`.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K/Q5_K: `(d * sc) * q - dmin * m` per 32-element sub-block; `qh` adds Q5_K's fifth bit.
#[inline(always)]
unsafe fn k4(b: *const u8, y: *mut f32, qs_off: usize, qh: Option<*const u8>) {
    // SAFETY: the callers pass a whole Q4_K (144 bytes) or Q5_K (176 bytes) block, whose
    // scales are bytes 4..16, quants `qs_off..qs_off + 128` and fifth bits 16..48, and 256
    // writable floats; AVX2 is enabled in every caller.
    unsafe {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales = &*b.add(4).cast::<[u8; 12]>();
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        for c in 0..4 {
            let v = _mm256_loadu_si256(b.add(qs_off + 32 * c).cast());
            let mut lo = _mm256_and_si256(v, mask);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
            if let Some(qh) = qh {
                let h = _mm256_loadu_si256(qh.cast());
                let h1 =
                    _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * c as i32)), one);
                let h2 = _mm256_and_si256(
                    _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                    one,
                );
                lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(h1));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(h2));
            }
            for (s, q) in [(2 * c, lo), (2 * c + 1, hi)] {
                let (sc, m) = scale_min_k4(s, scales);
                let dl = _mm256_set1_ps(d * f32::from(sc));
                let ml = _mm256_set1_ps(dmin * f32::from(m));
                let (q0, q1) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
                let out = y.add(32 * s);
                for (g, qi) in [lo8(q0), hi8(q0), lo8(q1), hi8(q1)].into_iter().enumerate() {
                    let v = _mm256_mul_ps(dl, _mm256_cvtepi32_ps(qi));
                    _mm256_storeu_ps(out.add(8 * g), _mm256_sub_ps(v, ml));
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4_k(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 144-byte Q4_K block and 256 writable floats.
    unsafe { k4(b, y, 16, None) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q5_k(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 176-byte Q5_K block (fifth bits at 16..48) and 256 floats.
    unsafe { k4(b, y, 48, Some(b.add(16))) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6_k(b: *const u8, y: *mut f32) {
    // SAFETY: `each` passes a 210-byte Q6_K block (ql 0..128, qh 128..192, scales 192..208,
    // d 208..210) and 256 writable floats; AVX2 is enabled there.
    unsafe {
        let d = f16_at(b, 208);
        let (m4, m3) = (_mm256_set1_epi32(0xF), _mm256_set1_epi32(3));
        let off = _mm256_set1_epi32(32);
        for n in 0..2 {
            let (ql, qh, sc) = (b.add(64 * n), b.add(128 + 32 * n), b.add(192 + 8 * n));
            for g in 0..4 {
                let l = 8 * g;
                let s = |i: usize| _mm256_set1_ps(d * f32::from(*sc.add(l / 16 + i) as i8));
                let (a, c, h) = (u8x8(ql.add(l)), u8x8(ql.add(l + 32)), u8x8(qh.add(l)));
                let hb = |shift: i32| {
                    let v = _mm256_srlv_epi32(h, _mm256_set1_epi32(shift));
                    _mm256_slli_epi32::<4>(_mm256_and_si256(v, m3))
                };
                let q1 = _mm256_or_si256(_mm256_and_si256(a, m4), hb(0));
                let q2 = _mm256_or_si256(_mm256_and_si256(c, m4), hb(2));
                let q3 = _mm256_or_si256(_mm256_srli_epi32::<4>(a), hb(4));
                let q4 = _mm256_or_si256(_mm256_srli_epi32::<4>(c), hb(6));
                let o = y.add(128 * n + l);
                for (i, q) in [q1, q2, q3, q4].into_iter().enumerate() {
                    store_scaled(o.add(32 * i), _mm256_sub_epi32(q, off), s(2 * i), None);
                }
            }
        }
    }
}

/// F16 to f32 with F16C, 8 at a time (exact; NaN payloads kept like `f16_to_f32`).
#[target_feature(enable = "avx2,f16c")]
fn f16_row(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so bytes 2i..2i+16 lie in `src` and floats i..i+8 in `dst`.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = f16_to_f32(u16::from_le_bytes([src[2 * j], src[2 * j + 1]]));
    }
}

/// Little-endian f32 bytes to f32, 8 at a time (a plain copy on x86-64).
#[target_feature(enable = "avx2")]
fn f32_row(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 4);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so bytes 4i..4i+32 lie in `src` and floats i..i+8 in `dst`.
        unsafe {
            let v = _mm256_loadu_ps(src.as_ptr().add(4 * i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        let b = [src[4 * j], src[4 * j + 1], src[4 * j + 2], src[4 * j + 3]];
        dst[j] = f32::from_le_bytes(b);
    }
}

/// BF16 to f32: each value's bits become the high half (exact, NaNs kept).
#[target_feature(enable = "avx2")]
fn bf16_row(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so bytes 2i..2i+16 lie in `src` and floats i..i+8 in `dst`.
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.as_ptr().add(2 * i).cast()));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm256_slli_epi32::<16>(h));
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = f32::from_bits(u32::from(u16::from_le_bytes([src[2 * j], src[2 * j + 1]])) << 16);
    }
}
