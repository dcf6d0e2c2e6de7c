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

use super::qdot_rk_parts::{bcast, pick_masks, q4k_mins, q4k_scales, q6k_unpack};
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
/// [`available`], AVX-512F and AVX2/FMA/F16C hold (an AVX-512 `Checked` token); `grp` holds `nb` super-blocks of `kind`, `a` holds
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::qdot_k::dot_scalar;
    use crate::kernels::matmul::repack_k::RepackedK;
    use crate::kernels::qact::quantize_row_q8k;
    use crate::testutil::{synthetic_weights, Rng};
    use poot_core::DType;

    /// The VNNI kernel's bits for every tile against the portable dot on the stored rows
    /// (and so against the AVX2 kernel, which `matmul/rk_tests.rs` holds to the same).
    fn check(dt: DType, w: &[u8], n: usize, nb: usize, x: &[f32], t: usize) {
        let kind = KKind::new(dt).unwrap();
        let rp = RepackedK::new(kind, w, n, nb);
        let mut a = vec![BlockQ8K::default(); t * nb];
        for (xr, ar) in x.chunks_exact(nb * 256).zip(a.chunks_exact_mut(nb)) {
            quantize_row_q8k(xr, ar);
        }
        let rb = w.len() / n;
        let mut out = [f32::NAN; 4 * RG];
        for g in 0..rp.groups() {
            // SAFETY: the tests call this only after `runs()` (VNNI, VL, AVX-512F, AVX2, FMA,
            // F16C detected); the slices are the sizes `group` asks for.
            unsafe {
                match t {
                    4 => group::<4>(kind, rp.group(g), nb, &a, &mut out),
                    2 => group::<2>(kind, rp.group(g), nb, &a, &mut out),
                    _ => group::<1>(kind, rp.group(g), nb, &a, &mut out),
                }
            }
            for j in 0..t {
                for r in 0..RG.min(n - g * RG) {
                    let row = &w[(g * RG + r) * rb..][..rb];
                    let want = dot_scalar(kind, row, &a[j * nb..(j + 1) * nb]);
                    let got = out[j * RG + r];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{dt} row {} token {j}",
                        g * RG + r
                    );
                }
            }
        }
    }

    fn runs() -> bool {
        let f = crate::CpuFeatures::get();
        crate::testutil::isa_runs("vnni", available() && f.avx512f && f.avx2_fma_f16c())
    }

    #[test]
    fn every_tile_matches_the_portable_dot_on_ragged_rows() {
        if !runs() {
            return;
        }
        let mut rng = Rng::new(31);
        for dt in [DType::Q4_K, DType::Q6_K] {
            let tiles: &[usize] = if dt == DType::Q4_K {
                &[1, 2, 4]
            } else {
                &[1, 2]
            };
            for &(n, nb) in &[(8, 1), (13, 3), (21, 2), (5, 35)] {
                let w = synthetic_weights(dt, n, nb * 256, 7 + n as u32);
                for &t in tiles {
                    let x = rng.vec(t * nb * 256, -3.0, 3.0);
                    check(dt, &w, n, nb, &x, t);
                }
            }
        }
    }

    #[test]
    fn extreme_quants_scales_and_activations_stay_exact() {
        if !runs() {
            return;
        }
        // Every quant at its maximum, Q4_K scales and mins at 63 (the `16 p` sums' worst
        // case), Q6_K scales at +-127, activations at the Q8_K extremes of either sign.
        let (n, nb) = (11, 4);
        for dt in [DType::Q4_K, DType::Q6_K] {
            let mut w = synthetic_weights(dt, n, nb * 256, 3);
            let bb = KKind::new(dt).unwrap().block_bytes();
            for b in w.chunks_exact_mut(bb) {
                match dt {
                    DType::Q4_K => b[4..144].fill(0xff),
                    _ => {
                        b[..192].fill(0xff);
                        for (s, v) in b[192..208].iter_mut().enumerate() {
                            *v = if s % 2 == 0 { 0x7f } else { 0x81 };
                        }
                    }
                }
            }
            for sign in [1.0f32, -1.0] {
                let x: Vec<f32> = (0..2 * nb * 256)
                    .map(|i| if i % 5 == 0 { -sign * 1e3 } else { sign * 1e3 })
                    .collect();
                check(dt, &w, n, nb, &x, 2);
                check(dt, &w, n, nb, &x[..nb * 256], 1);
            }
        }
    }
}
