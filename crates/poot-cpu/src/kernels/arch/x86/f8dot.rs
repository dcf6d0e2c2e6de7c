//! x86 loop of the FP8 row dot: `F8_S` weight rows against `f32` activations on AVX2 + F16C,
//! the E4M3 bytes widened in registers (never decoded to memory). Each byte, sign-extended to
//! 16 bits and shifted left 7, is the f16 of its value over 256 (E4M3's 4-bit exponent and 3
//! mantissa bits land in the f16's exponent and top mantissa bits; subnormals too), which
//! `vcvtph2ps` widens exactly; NaN codes get the f16 exponent of NaN. The float steps are
//! `arch/generic/f8dot_generic.rs`'s, so results are bit-identical to it.
//!
//! Layout: 4 weight rows against 2 tokens, then 1 (8 accumulators beside the 4 vectors of a
//! block's widened weights; the activations are read from L1 by the FMAs).
//!
//! Invariant (soundness): [`dot_rows`]' callers hold a `Checked` AVX2 or AVX-512 token (AVX2,
//! FMA and F16C detected).

#![allow(
    clippy::needless_range_loop,
    reason = "the row and token tiles index several arrays at once"
)]

use std::arch::x86_64::*;

use crate::kernels::arch::generic::f8dot_generic::F8_BLOCK;
use crate::kernels::ggml::hsum8v;

/// `out[j * nr + r] = dot(row r, token j)` for `nr <= 4` rows of `row_bytes` at `w` and `t`
/// rows of `k` activations at `x`.
pub(crate) fn dot_rows(
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    x: &[f32],
    k: usize,
    t: usize,
    out: &mut [f32],
) {
    let nb = k / 32;
    assert!(nr <= 4 && row_bytes >= nb * F8_BLOCK && x.len() >= t * k && out.len() >= t * nr);
    assert!(nr == 0 || w.len() >= (nr - 1) * row_bytes + nb * F8_BLOCK);
    if nr == 4 {
        let mut tok = 0;
        while tok + 2 <= t {
            // SAFETY: AVX2/FMA/F16C by the module invariant; rows 0..4 and tokens tok..tok+2
            // are inside `w` and `x` (asserted above).
            unsafe { rows_avx2::<4, 2>(w, row_bytes, &x[tok * k..], k, &mut out[tok * 4..]) };
            tok += 2;
        }
        if tok < t {
            // SAFETY: as above, one token.
            unsafe { rows_avx2::<4, 1>(w, row_bytes, &x[tok * k..], k, &mut out[tok * 4..]) };
        }
        return;
    }
    let mut one = [0.0f32];
    for tok in 0..t {
        for r in 0..nr {
            // SAFETY: as above, row r and token tok.
            unsafe {
                rows_avx2::<1, 1>(&w[r * row_bytes..], row_bytes, &x[tok * k..], k, &mut one)
            };
            out[tok * nr + r] = one[0];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<const R: usize, const T: usize>(
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    k: usize,
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { rows::<R, T>(w, row_bytes, x, k, out) }
}

/// 16 E4M3 bytes at `p` as two vectors of their values over 256 (elements 0..8, 8..16).
#[inline(always)]
unsafe fn widen16(p: *const u8) -> (__m256, __m256) {
    // SAFETY: 16 readable bytes at `p` (caller); AVX2 and F16C enabled by the caller.
    unsafe {
        let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()));
        // Bits 7..13 the exponent and mantissa, bit 15 the sign (from the sign extension).
        let h = _mm256_and_si256(
            _mm256_slli_epi16::<7>(s),
            _mm256_set1_epi16(0xBF80u16 as i16),
        );
        // 0x7f and 0xff (E4M3's NaNs) would read as 480: give them an f16 NaN's exponent.
        let nan = _mm256_cmpeq_epi16(
            _mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
            _mm256_set1_epi16(0x3f80),
        );
        let h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
        )
    }
}

/// `R` rows (at `w`, `row_bytes` apart) against `T` activation rows (`x`, `k` apart) into
/// `out[j * R + r]`. Each weight block is widened once and used for all `T` tokens.
#[inline(always)]
unsafe fn rows<const R: usize, const T: usize>(
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    k: usize,
    out: &mut [f32],
) {
    let nb = k / 32;
    debug_assert!(w.len() >= (R - 1) * row_bytes + nb * F8_BLOCK && x.len() >= (T - 1) * k + k);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let ahead = 4 * row_bytes;
    // SAFETY: block `b` of row `r` is bytes `r * row_bytes + b * 36 ..+ 36`, inside `w` for
    // `r < R`, `b < nb`; activations `j * k + 32 * b ..+ 32` are inside `x` for `j < T` (the
    // caller's contract); the features are enabled by the caller.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..nb {
            for r in 0..R {
                let p = wp.add(r * row_bytes + b * F8_BLOCK);
                // As in `qdot.rs`: ask for the next 4-row group's bytes now.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast());
                let d = _mm256_set1_ps(p.cast::<f32>().read_unaligned() * 256.0);
                let (e0, e1) = widen16(p.add(4));
                let (e2, e3) = widen16(p.add(20));
                for j in 0..T {
                    let xb = xp.add(j * k + 32 * b);
                    let mut inner = _mm256_mul_ps(e0, _mm256_loadu_ps(xb));
                    inner = _mm256_fmadd_ps(e1, _mm256_loadu_ps(xb.add(8)), inner);
                    inner = _mm256_fmadd_ps(e2, _mm256_loadu_ps(xb.add(16)), inner);
                    inner = _mm256_fmadd_ps(e3, _mm256_loadu_ps(xb.add(24)), inner);
                    acc[r][j] = _mm256_fmadd_ps(d, inner, acc[r][j]);
                }
            }
        }
        for r in 0..R {
            for j in 0..T {
                out[j * R + r] = hsum8v(acc[r][j]);
            }
        }
    }
}
