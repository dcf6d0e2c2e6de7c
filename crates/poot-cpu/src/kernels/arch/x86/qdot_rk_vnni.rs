//! VNNI paths of the 8-row interleaved k-quant dot (`arch/x86/qdot_rk.rs`): the same layout,
//! tiles and float steps, with `vpdpbusd` (unsigned weight bytes times signed Q8_K bytes,
//! four products summed into each `i32` lane) for the integer dots.
//!
//! Why: the one-token Q4_K and Q6_K kernels are compute-bound on one core (they read 16-24
//! GB/s from L3): `maddubs` gives `i16` pairs that need a second add (Q4_K) or a widening
//! `madd` and an add (Q6_K) per product vector; `vpdpbusd` does the whole step in one
//! instruction, taking the broadcast activation word straight from memory.
//!
//! Numerics: every integer step is exact, so each super-block yields, per row, exactly the
//! `sumi` (and Q4_K's `summ`) of `matmul::qdot_k::q4k_ints`/`q6k_ints`, and the float steps are
//! the AVX2 kernel's (`acc = fma(d * dy, sumi, acc)` per row and token in block order). Results
//! are bit-identical to `arch::x86::qdot_rk::group` on AVX2 and to `matmul::qdot_k::dot_scalar`
//! (`matmul/rk_tests.rs` checks every ISA, ragged rows and the extreme quants).
//!
//! Exactness: Q4_K's low nibbles (0..15) give per 32-value sub-block `|p| <= 15 * 127 * 32 =
//! 60960`; its high nibbles are dotted in place (`q & 0xf0`, 16 times the nibble, saving a
//! shift per vector), `|16 p| <= 975360`, times a scale below 64 and summed over 4 sub-blocks:
//! below `2^28`, then shifted back by 4 (exact: a multiple of 16). Q6_K quants (0..63) give
//! `|p| <= 63 * 127 * 16` per 16-value sub-block, corrected by `32 * bsum` as the AVX2 path.
//! `vpdpbusd` does not saturate (unlike `vpdpbusds`), and no sum comes near `2^31`.
//!
//! Invariant (soundness): reached only through `qdot_rk::group` with a `Checked` AVX-512 token
//! after [`available`] was true (AVX-512 VNNI and VL detected).

use std::arch::x86_64::*;

use super::qdot_rk::{bcast, pick_masks, q4k_mins, q4k_scales, q6k_unpack};
use crate::kernels::blocks::KKind;
use crate::kernels::blocks::RG;
use crate::kernels::matmul::repack_k::{q4k, q6k};
use crate::kernels::qact::BlockQ8K;

/// Whether this CPU has the 256-bit VNNI dot.
pub(crate) fn available() -> bool {
    crate::CpuFeatures::get().vnni256()
}

/// `qdot_rk::group` on VNNI for `T` tokens (`T` one of its tiles).
///
/// # Safety
/// [`available`] and AVX2/FMA/F16C hold; `grp` holds `nb` super-blocks of `kind`, `a` holds
/// `T * nb` blocks and `out` `8 T` floats.
pub(super) unsafe fn group<const T: usize>(
    kind: KKind,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    out: &mut [f32],
) {
    // SAFETY: the caller's contract is each kernel's.
    unsafe {
        match kind {
            KKind::Q4_K => q4k_vnni::<T>(grp, nb, a, out),
            KKind::Q6_K => q6k_vnni::<T>(grp, nb, a, out),
        }
    }
}

/// Shuffle masks that zero-extend byte `j` of every 32-bit lane to the whole lane: per lane
/// the bytes `[4l + j, 0x80, 0x80, 0x80]`.
#[inline(always)]
unsafe fn pick32_masks() -> [__m256i; 4] {
    // SAFETY: register-only AVX2 ops; AVX2 enabled by the caller.
    unsafe {
        let lane = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
        std::array::from_fn(|j| {
            let base = (0x8080_8000u32 + j as u32) as i32;
            _mm256_add_epi32(lane, _mm256_set1_epi32(base))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4k_vnni<const T: usize>(grp: &[u8], nb: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let sb = RG * KKind::Q4_K.block_bytes();
    // SAFETY: bounds per the caller's contract; the features are this function's.
    unsafe {
        let gp = grp.as_ptr();
        let m4 = _mm256_set1_epi8(0x0f);
        let mh = _mm256_set1_epi8(0xf0u8 as i8);
        let pick = pick_masks();
        let pick32 = pick32_masks();
        let ahead = crate::kernels::simd::prefetch_ahead();
        let mut acc = [_mm256_setzero_ps(); T];
        let mut accm = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let s = gp.add(b * sb);
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let (sc, mn) = q4k_scales(s);
            // Low-nibble sub-blocks' scaled sums, and the high ones' times 16.
            let mut isum = [_mm256_setzero_si256(); T];
            let mut isum16 = [_mm256_setzero_si256(); T];
            let q = s.add(q4k::QS);
            for c in 0..4 {
                let mut lo = [_mm256_setzero_si256(); T];
                let mut hi = [_mm256_setzero_si256(); T];
                for w in 0..8 {
                    let v = _mm256_loadu_si256(q.add(32 * (8 * c + w)).cast());
                    let wl = _mm256_and_si256(v, m4);
                    let wh = _mm256_and_si256(v, mh);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr().add(64 * c + 4 * w);
                        lo[j] = _mm256_dpbusd_epi32(lo[j], wl, bcast(y));
                        hi[j] = _mm256_dpbusd_epi32(hi[j], wh, bcast(y.add(32)));
                    }
                }
                // Sub-blocks 2c (low nibbles) and 2c + 1 (high): scale bytes 2c % 4 and
                // (2c + 1) % 4 of vector c / 2.
                let sl = _mm256_shuffle_epi8(sc[c / 2], pick32[(2 * c) % 4]);
                let sh = _mm256_shuffle_epi8(sc[c / 2], pick32[(2 * c + 1) % 4]);
                for j in 0..T {
                    isum[j] = _mm256_add_epi32(isum[j], _mm256_mullo_epi32(lo[j], sl));
                    isum16[j] = _mm256_add_epi32(isum16[j], _mm256_mullo_epi32(hi[j], sh));
                }
            }
            let msum = q4k_mins(mn, &pick, &ab);
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(s.add(q4k::D).cast()));
            let dm8 = _mm256_cvtph_ps(_mm_loadu_si128(s.add(q4k::DMIN).cast()));
            for j in 0..T {
                let sumi = _mm256_add_epi32(isum[j], _mm256_srai_epi32::<4>(isum16[j]));
                let dy = _mm256_set1_ps(ab[j].d);
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(d8, dy), _mm256_cvtepi32_ps(sumi), acc[j]);
                accm[j] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dm8, dy), _mm256_cvtepi32_ps(msum[j]), accm[j]);
            }
        }
        for j in 0..T {
            _mm256_storeu_ps(out.as_mut_ptr().add(RG * j), _mm256_sub_ps(acc[j], accm[j]));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q6k_vnni<const T: usize>(grp: &[u8], nb: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let sb = RG * KKind::Q6_K.block_bytes();
    // SAFETY: bounds per the caller's contract; the features are this function's.
    unsafe {
        let gp = grp.as_ptr();
        let ahead = crate::kernels::simd::prefetch_ahead();
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let s = gp.add(b * sb);
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let mut isum = [_mm256_setzero_si256(); T];
            for n in 0..2 {
                for half in 0..2 {
                    // As the AVX2 kernel: quant vector g of words 4 half..4 half + 4 is all in
                    // sub-block 8n + 2g + half.
                    let mut p = [[_mm256_setzero_si256(); T]; 4];
                    for w in 4 * half..4 * half + 4 {
                        let qv = q6k_unpack(s.add(q6k::QS + 96 * (8 * n + w)));
                        for j in 0..T {
                            let y = ab[j].qs.as_ptr().add(128 * n + 4 * w);
                            for (g, &qg) in qv.iter().enumerate() {
                                p[g][j] = _mm256_dpbusd_epi32(p[g][j], qg, bcast(y.add(32 * g)));
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
            _mm256_storeu_ps(out.as_mut_ptr().add(RG * j), *v);
        }
    }
}
