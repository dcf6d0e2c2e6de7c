//! x86 loops of the FP8 dot over 8-row interleaved weights (`matmul/repack_f8.rs`'s layout), on
//! AVX2 + FMA + F16C: one row per `f32` lane, so every vector op works on 8 rows at once.
//!
//! Float steps, per row, are the stored-row dot's (`arch/generic/f8dot_generic.rs`): for each
//! 32-value block and lane `l`, `inner = e_l * x_l`, then 3 FMAs over elements `l + 8c`, then
//! `acc_l = fma(256 * d, inner, acc_l)`; at the end `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))`
//! (`hsum8`). Here `acc_l` is a register of 8 rows, so those steps are the same operations on
//! the same values in the same order: bit-identical to the portable dot (tested).
//!
//! Widening: each byte, sign-extended to 16 bits, shifted left 7 and masked, is the f16 of its
//! value over 256 (`arch/x86/f8dot.rs`), which `vcvtph2ps` widens exactly. The layout holds no
//! NaN code (its invariant), so the NaN fix-up of the stored loop is not needed.
//!
//! Invariant (soundness): callers hold a `Checked` AVX2 or AVX-512 token (AVX2, FMA and F16C
//! detected); the entry functions assert the bounds the loops read.

use std::arch::x86_64::*;

use crate::kernels::blocks::RG;

/// Bytes of one superblock (`matmul/repack_f8.rs`'s `SUPERBLOCK`; restated here because the
/// per-ISA loops import nothing from the matmul family).
const SB: usize = 32 + 8 * 32;

/// Tokens per pass of [`group_tokens`]: each superblock is widened once per pass, and the
/// pass's activations (`TILE * k` floats) stay in L2 while the group's blocks stream by.
pub(crate) const TILE: usize = 8;

/// `out[j * 8 + r]` = row `r` of the group `g` (`nb` superblocks) dotted with token `j < t`
/// (`x[j * k..]`, `k = 32 * nb`), for `t <= TILE`.
///
/// # Panics
/// If `g`, `x` or `out` is shorter than that, or `t > TILE`.
pub(crate) fn group_tokens(g: &[u8], nb: usize, x: &[f32], t: usize, out: &mut [f32]) {
    let k = 32 * nb;
    assert!(t <= TILE && g.len() >= nb * SB && x.len() >= t * k && out.len() >= t * RG);
    if t == 1 {
        // SAFETY: AVX2/FMA/F16C by the module invariant; bounds asserted above.
        unsafe { one_avx2(g, nb, x, out) };
    } else if t > 1 {
        // SAFETY: as above.
        unsafe { tile_avx2(g, nb, x, k, t, out) };
    }
}

/// 16 codes at `p` as two vectors of their values over 256 (bytes 0..8, 8..16); no NaN code.
#[inline(always)]
unsafe fn widen16(p: *const u8) -> (__m256, __m256) {
    // SAFETY: 16 readable bytes at `p` (caller); AVX2 and F16C enabled by the caller.
    unsafe {
        let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()));
        let h = _mm256_and_si256(
            _mm256_slli_epi16::<7>(s),
            _mm256_set1_epi16(0xBF80u16 as i16),
        );
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
        )
    }
}

/// `hsum8`'s additions across the 8 lane accumulators, every row at once.
#[inline(always)]
unsafe fn finish(a: &[__m256; 8]) -> __m256 {
    // SAFETY: register-only AVX ops, enabled by the caller.
    unsafe {
        let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        _mm256_add_ps(lo, hi)
    }
}

/// The 8 rows' scales of the superblock at `s`, times 256 (exact, as the portable dot's).
#[inline(always)]
unsafe fn scales(s: *const u8) -> __m256 {
    // SAFETY: 32 readable bytes at `s` (caller); AVX enabled by the caller.
    unsafe { _mm256_mul_ps(_mm256_loadu_ps(s.cast()), _mm256_set1_ps(256.0)) }
}

/// One token: the 8 lane accumulators in registers, each code widened once.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_avx2(g: &[u8], nb: usize, x: &[f32], out: &mut [f32]) {
    let (gp, xp) = (g.as_ptr(), x.as_ptr());
    let ahead = crate::kernels::simd::prefetch_ahead();
    // SAFETY: superblock `b < nb` is inside `g` and activations `32b..32b + 32` inside `x`
    // (asserted by the caller); `out` holds 8 values; the features are enabled here.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for b in 0..nb {
            let s = gp.add(b * SB);
            // As the integer 8-row loops: the group's stream, a few lines ahead.
            crate::kernels::simd::prefetch_stream(s, SB, ahead);
            let d = scales(s);
            let xb = xp.add(32 * b);
            for (l, acc) in acc.iter_mut().enumerate() {
                let (e0, e1) = widen16(s.add(32 + 32 * l));
                let (e2, e3) = widen16(s.add(48 + 32 * l));
                let mut inner = _mm256_mul_ps(e0, _mm256_broadcast_ss(&*xb.add(l)));
                inner = _mm256_fmadd_ps(e1, _mm256_broadcast_ss(&*xb.add(l + 8)), inner);
                inner = _mm256_fmadd_ps(e2, _mm256_broadcast_ss(&*xb.add(l + 16)), inner);
                inner = _mm256_fmadd_ps(e3, _mm256_broadcast_ss(&*xb.add(l + 24)), inner);
                *acc = _mm256_fmadd_ps(d, inner, *acc);
            }
        }
        _mm256_storeu_ps(out.as_mut_ptr(), finish(&acc));
    }
}

/// `2..=TILE` tokens: each superblock widened once into 32 vectors on the stack, then every
/// token's 8 lane accumulators (kept in `acc`, L1) take its steps.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2(g: &[u8], nb: usize, x: &[f32], k: usize, t: usize, out: &mut [f32]) {
    let gp = g.as_ptr();
    // SAFETY: as `one_avx2`, for tokens `j < t` at `x[j * k..]` and `out[j * 8..]`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 8]; TILE];
        let mut w = [_mm256_setzero_ps(); 32];
        for b in 0..nb {
            let s = gp.add(b * SB);
            let d = scales(s);
            for l in 0..8 {
                let (e0, e1) = widen16(s.add(32 + 32 * l));
                let (e2, e3) = widen16(s.add(48 + 32 * l));
                w[4 * l..4 * l + 4].copy_from_slice(&[e0, e1, e2, e3]);
            }
            for (j, acc) in acc.iter_mut().enumerate().take(t) {
                let xb = x.as_ptr().add(j * k + 32 * b);
                for (l, acc) in acc.iter_mut().enumerate() {
                    let mut inner = _mm256_mul_ps(w[4 * l], _mm256_broadcast_ss(&*xb.add(l)));
                    for c in 1..4 {
                        let xv = _mm256_broadcast_ss(&*xb.add(l + 8 * c));
                        inner = _mm256_fmadd_ps(w[4 * l + c], xv, inner);
                    }
                    *acc = _mm256_fmadd_ps(d, inner, *acc);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate().take(t) {
            _mm256_storeu_ps(out.as_mut_ptr().add(j * RG), finish(acc));
        }
    }
}
