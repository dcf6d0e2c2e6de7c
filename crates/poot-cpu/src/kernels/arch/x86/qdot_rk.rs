//! AVX2 paths of the 8-row interleaved k-quant dot (`matmul/repack_k.rs`, `matmul/rk.rs`).
//!
//! One 256-bit register holds 4 quant bytes of each of 8 rows (one row per 32-bit lane).
//! `maddubs` of the unsigned 4/6-bit quants with a broadcast activation word gives each row's
//! pair sums; Q4_K adds the 8 words of a 32-value sub-block in `i16` and applies the sub-block
//! scale with one `madd`, Q6_K widens each word with `madd` and applies `scale * (sum - 32 *
//! bsum)` per 16-value sub-block with `mullo`. So every super-block yields, per row, exactly
//! the integers `sumi` (and Q4_K's `summ`) of `matmul::qdot_k::q4k_ints`/`q6k_ints`, and the float
//! steps are `blocks::finish`'s lane by lane: `acc = fma(d * dy, sumi, acc)` in block order, one
//! chain per row and token. Results are bit-identical to `matmul::qdot_k::dot_scalar` on the stored
//! rows, for any number of tokens per pass.
//!
//! Exactness: Q4_K pair sums are at most `2 * 15 * 127 = 3810`, 8 of them `30480 < 2^15`;
//! scales and mins are below 64 and block sums of 32 activations below `2^12`, so every `madd`
//! and the super-block sums stay far inside `i32`. Q6_K pairs are at most `2 * 63 * 127`, widened
//! at once; `|scale * (sum - 32 bsum)|` is below `2^24` per sub-block.
//!
//! On an AVX-512 path with VNNI (`CpuFeatures::vnni256`), [`group`] runs the same tiles with
//! `vpdpbusd` for the integer dots instead (`arch/x86/qdot_rk_vnni.rs`): the same integers, so
//! the same bits.
//!
//! Invariant (soundness): reached only through [`group`] with a `Checked` AVX2 or AVX-512 token
//! (AVX2, FMA, F16C detected).

use std::arch::x86_64::*;

use super::qdot_rk_parts::{bcast, pick_masks, q4k_mins, q4k_scales, q6k_unpack};
use crate::kernels::blocks::KKind;
use crate::kernels::blocks::RG;
use crate::kernels::matmul::repack_k::{q4k, q6k};
use crate::kernels::qact::BlockQ8K;
use crate::kernels::simd::Checked;

/// Tokens one [`group`] call takes when `left` are left: 16 vector registers hold 4 tokens'
/// Q4_K accumulators, 2 tokens' Q6_K ones (4 per token).
pub(crate) fn tile_tokens(kind: KKind, left: usize) -> usize {
    match (kind, left) {
        (_, 0 | 1) => 1,
        (KKind::Q4_K, 4..) => 4,
        _ => 2,
    }
}

/// `out[j * 8 + r]` = row `r` of group `grp` (`nb` super-blocks of `kind`) dotted with token
/// `j` (blocks `a[j * nb..(j + 1) * nb]`), for `j < t`, `t` from [`tile_tokens`].
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_rk` sizes them).
pub(crate) fn group(
    ck: Checked,
    kind: KKind,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
) {
    assert!(grp.len() >= nb * RG * kind.block_bytes(), "qdot_rk group");
    assert!(t >= 1 && t <= tile_tokens(kind, t) && a.len() >= t * nb && out.len() >= t * RG);
    // SAFETY: the `Checked` token proves AVX2/FMA/F16C (module invariant); the kernels read
    // `nb` super-blocks of `grp`, blocks `j * nb + b` of `a` for `j < T` and write `8 T`
    // floats of `out`, all inside the slices by the asserts.
    unsafe {
        if ck.isa().avx512() && super::qdot_rk_vnni::available() {
            // SAFETY (as above, plus): VNNI and VL detected (`available`).
            use super::qdot_rk_vnni::group as vnni;
            match t {
                4 => vnni::<4>(kind, grp, nb, a, out),
                2 => vnni::<2>(kind, grp, nb, a, out),
                _ => vnni::<1>(kind, grp, nb, a, out),
            }
            return;
        }
        match (kind, t) {
            (KKind::Q4_K, 4) => q4k_avx2::<4>(grp, nb, a, out),
            (KKind::Q4_K, 2) => q4k_avx2::<2>(grp, nb, a, out),
            (KKind::Q4_K, _) => q4k_avx2::<1>(grp, nb, a, out),
            (KKind::Q6_K, 2) => q6k_avx2::<2>(grp, nb, a, out),
            (KKind::Q6_K, _) => q6k_avx2::<1>(grp, nb, a, out),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_avx2<const T: usize>(grp: &[u8], nb: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let sb = RG * KKind::Q4_K.block_bytes();
    // SAFETY: bounds asserted by `group`; AVX2/FMA/F16C enabled on this function.
    unsafe {
        let gp = grp.as_ptr();
        let m4 = _mm256_set1_epi8(0x0f);
        let pick = pick_masks();
        let ahead = crate::kernels::simd::prefetch_ahead();
        let mut acc = [_mm256_setzero_ps(); T];
        let mut accm = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let s = gp.add(b * sb);
            // The hardware prefetcher follows a group's sequential super-blocks; this only
            // starts the next lines early.
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let (sc, mn) = q4k_scales(s);
            let mut isum = [_mm256_setzero_si256(); T];
            let q = s.add(q4k::QS);
            for c in 0..4 {
                let mut lo = [_mm256_setzero_si256(); T];
                let mut hi = [_mm256_setzero_si256(); T];
                for w in 0..8 {
                    let v = _mm256_loadu_si256(q.add(32 * (8 * c + w)).cast());
                    let wl = _mm256_and_si256(v, m4);
                    let wh = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr().add(64 * c + 4 * w);
                        lo[j] = _mm256_add_epi16(lo[j], _mm256_maddubs_epi16(wl, bcast(y)));
                        hi[j] = _mm256_add_epi16(hi[j], _mm256_maddubs_epi16(wh, bcast(y.add(32))));
                    }
                }
                // Sub-blocks 2c (low nibbles) and 2c + 1 (high): scale bytes 2c % 4 and
                // (2c + 1) % 4 of vector c / 2.
                let sl = _mm256_shuffle_epi8(sc[c / 2], pick[(2 * c) % 4]);
                let sh = _mm256_shuffle_epi8(sc[c / 2], pick[(2 * c + 1) % 4]);
                for j in 0..T {
                    let p = _mm256_add_epi32(
                        _mm256_madd_epi16(lo[j], sl),
                        _mm256_madd_epi16(hi[j], sh),
                    );
                    isum[j] = _mm256_add_epi32(isum[j], p);
                }
            }
            let msum = q4k_mins(mn, &pick, &ab);
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(s.add(q4k::D).cast()));
            let dm8 = _mm256_cvtph_ps(_mm_loadu_si128(s.add(q4k::DMIN).cast()));
            for j in 0..T {
                let dy = _mm256_set1_ps(ab[j].d);
                acc[j] =
                    _mm256_fmadd_ps(_mm256_mul_ps(d8, dy), _mm256_cvtepi32_ps(isum[j]), acc[j]);
                accm[j] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dm8, dy), _mm256_cvtepi32_ps(msum[j]), accm[j]);
            }
        }
        for j in 0..T {
            _mm256_storeu_ps(out.as_mut_ptr().add(RG * j), _mm256_sub_ps(acc[j], accm[j]));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_avx2<const T: usize>(grp: &[u8], nb: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let sb = RG * KKind::Q6_K.block_bytes();
    // SAFETY: bounds asserted by `group`; AVX2/FMA/F16C enabled on this function.
    unsafe {
        let gp = grp.as_ptr();
        let ones = _mm256_set1_epi16(1);
        let ahead = crate::kernels::simd::prefetch_ahead();
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let s = gp.add(b * sb);
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let mut isum = [_mm256_setzero_si256(); T];
            for n in 0..2 {
                for half in 0..2 {
                    // Words w = 4 half..4 half + 4 of this 128-value half: quant vector g holds
                    // elements 128n + 32g + 4w..+4, all in sub-block 8n + 2g + half.
                    let mut p = [[_mm256_setzero_si256(); T]; 4];
                    for w in 4 * half..4 * half + 4 {
                        let qv = q6k_unpack(s.add(q6k::QS + 96 * (8 * n + w)));
                        for j in 0..T {
                            let y = ab[j].qs.as_ptr().add(128 * n + 4 * w);
                            for (g, &qg) in qv.iter().enumerate() {
                                let pg = _mm256_maddubs_epi16(qg, bcast(y.add(32 * g)));
                                p[g][j] = _mm256_add_epi32(p[g][j], _mm256_madd_epi16(pg, ones));
                            }
                        }
                    }
                    for (g, pg) in p.iter().enumerate() {
                        let si = 8 * n + 2 * g + half;
                        let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            s.add(q6k::SCALES + 8 * si).cast(),
                        ));
                        for j in 0..T {
                            let off = _mm256_set1_epi32(32 * i32::from(ab[j].bsums[si]));
                            let v = _mm256_mullo_epi32(_mm256_sub_epi32(pg[j], off), sc);
                            isum[j] = _mm256_add_epi32(isum[j], v);
                        }
                    }
                }
            }
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(s.add(q6k::D).cast()));
            for j in 0..T {
                let dy = _mm256_set1_ps(ab[j].d);
                acc[j] =
                    _mm256_fmadd_ps(_mm256_mul_ps(d8, dy), _mm256_cvtepi32_ps(isum[j]), acc[j]);
            }
        }
        for (j, v) in acc.iter().enumerate() {
            // `blocks::finish`'s min accumulator stays +0 for Q6_K, and `x - 0.0 == x`.
            _mm256_storeu_ps(out.as_mut_ptr().add(RG * j), *v);
        }
    }
}
