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

/// 4 activation bytes at `p`, broadcast to every 32-bit lane.
#[inline(always)]
pub(super) unsafe fn bcast(p: *const i8) -> __m256i {
    // SAFETY: 4 readable bytes at `p` (caller); AVX enabled by the caller.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Shuffle masks that copy byte `j` of every 32-bit lane into both of its 16-bit halves
/// (zero-extended): per lane the bytes `[4l + j, 0x80, 4l + j, 0x80]`.
#[inline(always)]
pub(super) unsafe fn pick_masks() -> [__m256i; 4] {
    // SAFETY: register-only AVX2 ops; AVX2 enabled by the caller.
    unsafe {
        let lane = _mm256_setr_epi32(
            0, 0x4_0004, 0x8_0008, 0xc_000c, 0, 0x4_0004, 0x8_0008, 0xc_000c,
        );
        std::array::from_fn(|j| {
            let base = (0x8000_8000u32 + 0x1_0001 * j as u32) as i32;
            _mm256_add_epi32(lane, _mm256_set1_epi32(base))
        })
    }
}

/// Bits 6-7 of every byte of `w`, moved to bits 4-5 (the high bits of scales and mins 4-7).
#[inline(always)]
unsafe fn top2(w: __m256i, k3: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 ops; AVX2 enabled by the caller.
    unsafe { _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(w), k3)) }
}

/// ggml's 12-byte scale unpacking (its kmask1..3) of the Q4_K super-block at `s`, one row per
/// lane: the bytes of `sc[0]`, `sc[1]` are sub-blocks 0-3, 4-7's scales; `mn[0]`, `mn[1]`
/// their mins.
#[inline(always)]
pub(super) unsafe fn q4k_scales(s: *const u8) -> ([__m256i; 2], [__m256i; 2]) {
    // SAFETY: the super-block's 96 scale bytes are readable (caller); AVX2 enabled by it.
    unsafe {
        let k1 = _mm256_set1_epi32(0x3f3f_3f3f);
        let k2 = _mm256_set1_epi32(0x0f0f_0f0f);
        let k3 = _mm256_set1_epi32(0x0303_0303);
        let w0 = _mm256_loadu_si256(s.add(q4k::SCALES).cast());
        let w1 = _mm256_loadu_si256(s.add(q4k::SCALES + 32).cast());
        let w2 = _mm256_loadu_si256(s.add(q4k::SCALES + 64).cast());
        let sc = [
            _mm256_and_si256(w0, k1),
            _mm256_or_si256(_mm256_and_si256(w2, k2), top2(w0, k3)),
        ];
        let mn = [
            _mm256_and_si256(w1, k1),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(w2), k2),
                top2(w1, k3),
            ),
        ];
        (sc, mn)
    }
}

/// Q4_K's `summ` per row and token: the sum over sub-blocks `m` of `min_m * (bsums[2m] +
/// bsums[2m + 1])`, with `mn` from [`q4k_scales`].
#[inline(always)]
pub(super) unsafe fn q4k_mins<const T: usize>(
    mn: [__m256i; 2],
    pick: &[__m256i; 4],
    ab: &[&BlockQ8K; T],
) -> [__m256i; T] {
    // SAFETY: reads the `bsums` of `T` blocks (references); AVX2 enabled by the caller.
    unsafe {
        let mut msum = [_mm256_setzero_si256(); T];
        for m in 0..8 {
            let mp = _mm256_shuffle_epi8(mn[m / 4], pick[m % 4]);
            for j in 0..T {
                let pair = ab[j].bsums.as_ptr().add(2 * m).cast::<i32>();
                let bs = _mm256_set1_epi32(pair.read_unaligned());
                msum[j] = _mm256_add_epi32(msum[j], _mm256_madd_epi16(mp, bs));
            }
        }
        msum
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

/// The 6-bit quants (0..63) of the Q6_K word triple at `qs` (layout: `repack_k::q6k::QS`), 8
/// rows' 4 bytes each per vector: vector `g` holds elements `32 g + 4 w..+4` of the half.
#[inline(always)]
pub(super) unsafe fn q6k_unpack(qs: *const u8) -> [__m256i; 4] {
    // SAFETY: 96 readable bytes at `qs` (caller); AVX2 enabled by the caller.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let ql0 = _mm256_loadu_si256(qs.cast());
        let ql1 = _mm256_loadu_si256(qs.add(32).cast());
        let qh = _mm256_loadu_si256(qs.add(64).cast());
        // As `arch::x86::qdot_k::unpack_q6k`: masks before shifts keep bits in bytes.
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(0x30)),
            ),
        ]
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
