//! x86 paths of the 8-row interleaved integer dot (`matmul/repack.rs`, `matmul/r8.rs`).
//!
//! One 256-bit register holds 4 quant bytes of each of 8 rows (one row per 32-bit lane), so each
//! integer step yields ggml's lane sum `l` for 8 rows at once; the float steps are ggml's, per
//! row: `acc[l] = fma(dw * dy, lane_l, acc[l])` block after block, then
//! `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))` (`hsum_float_8`), plus Q4_1's
//! `summs = fma(m, s, summs)`. So results are bit-identical to `matmul::qdot::dot_scalar`.
//!
//! Integer steps: Q4 nibbles are unsigned (`0..16`) against the signed activations, so
//! `maddubs` + `madd` (AVX2) or `vpdpbusd` (VNNI) apply directly; Q4_0's `-8` offset is folded
//! in as `-8 * sum(y)` over the lane's 4 activations, precomputed per block (`corr`). Q8_0 on
//! VNNI flips the sign bit (`w + 128`, unsigned) and folds `-128 * sum(y)` the same way; on AVX2
//! it takes the sign trick (`|w|` times `y * sign(w)`), as `arch/x86/qdot.rs` does. Every lane sum
//! is exact in `i32`, so only the float steps above decide the result.
//!
//! Invariant (soundness): reached only through `matmul_r8` with a `Checked` AVX2 or AVX-512
//! token (AVX2, FMA, F16C detected), and the VNNI variant only after `avx512vnni` and
//! `avx512vl` were detected.

use std::arch::x86_64::*;

use crate::kernels::blocks::QKind;
use crate::kernels::blocks::{header_bytes, superblock_bytes, RG};
use crate::kernels::qact::BlockQ8;

/// Whether this CPU has the 256-bit VNNI dot (`vpdpbusd ymm`).
pub(crate) fn has_vnni() -> bool {
    crate::CpuFeatures::get().vnni256()
}

/// Tokens one call handles: VNNI machines have 32 vector registers (16 accumulators fit);
/// the block order needs 2 registers per token, not 8. Q8_0's AVX2 block order takes 3: its
/// 8 chunks a block each load and sign-fold the weights once for every token of the tile,
/// which took a little less CPU than 2 (Q4_0 and Q5_0 measured alike with 2 and 3, so they keep
/// 2).
pub(crate) fn tile_tokens(vnni: bool, kind: QKind, blocks: bool) -> usize {
    match (vnni, blocks) {
        (true, true) => 4,
        (false, true) if kind == QKind::Q8_0 => 3,
        (false, true) | (true, false) => 2,
        (false, false) => 1,
    }
}

/// `out[j * 8 + r]` = row `r` of group `grp` dotted with token `j` in the block order of
/// `matmul::qdot::dot_scalar_blocks` (Q4_0, Q5_0 and Q8_0), for `j < t` (up to [`tile_tokens`]);
/// `corr[j * nb + b][0]` holds block `b`'s whole correction (`matmul_r8`).
///
/// # Panics
/// As [`group`].
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn group_blocks(
    vnni: bool,
    kind: QKind,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    assert!(grp.len() >= nb * superblock_bytes(kind));
    assert!(
        t >= 1 && t <= tile_tokens(vnni, kind, true) && a.len() >= t * nb && corr.len() >= t * nb
    );
    assert!(out.len() >= t * RG);
    macro_rules! go {
        ($k:literal) => {
            // SAFETY (every arm): AVX2/FMA/F16C by the module invariant, VNNI/VL by
            // `has_vnni` when `vnni`; the asserts above are the bounds every call reads within.
            match (vnni, t) {
                // SAFETY: see above.
                (true, 4) => unsafe { blocks_vnni::<$k, 4>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, 3) => unsafe { blocks_vnni::<$k, 3>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, 2) => unsafe { blocks_vnni::<$k, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, _) => unsafe { blocks_vnni::<$k, 1>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, 3) => unsafe { blocks_avx2::<$k, 3>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, 2) => unsafe { blocks_avx2::<$k, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, _) => unsafe { blocks_avx2::<$k, 1>(grp, nb, a, corr, out) },
            }
        };
    }
    match kind {
        QKind::Q4_0 => go!(0),
        QKind::Q5_0 => go!(2),
        QKind::Q8_0 => go!(3),
        QKind::Q4_1 => unreachable!("Q4_1 keeps ggml's order"),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blocks_avx2<const KIND: u8, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { blocks_body::<KIND, T, false>(grp, nb, a, corr, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn blocks_vnni<const KIND: u8, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's, VNNI included.
    unsafe { blocks_body::<KIND, T, true>(grp, nb, a, corr, out) }
}

/// See [`group_blocks`]: the same integer steps as [`body`], summed into one `i32` per row
/// and token for the whole block (exact: at most `32 * 128 * 128`), then one FMA.
#[inline(always)]
unsafe fn blocks_body<const KIND: u8, const T: usize, const VNNI: bool>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let kind = [QKind::Q4_0, QKind::Q4_1, QKind::Q5_0, QKind::Q8_0][KIND as usize];
    let (sb, hdr) = (superblock_bytes(kind), header_bytes(kind));
    // SAFETY: as `body` (bounds asserted by `group_blocks`, features enabled by the caller).
    unsafe {
        let gp = grp.as_ptr();
        let mut acc = [_mm256_setzero_ps(); T];
        let m4 = _mm256_set1_epi8(0x0f);
        // `body`'s stream prefetch: one token streams the weights from DRAM.
        let ahead = crate::kernels::simd::prefetch_ahead();
        for b in 0..nb {
            let s = gp.add(b * sb);
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(s.cast()));
            let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let mut isum: [__m256i; T] =
                std::array::from_fn(|j| _mm256_set1_epi32(corr.get_unchecked(j * nb + b)[0]));
            let q = s.add(hdr);
            if KIND == 3 {
                for c in 0..8 {
                    let w = _mm256_loadu_si256(q.add(32 * c).cast());
                    let u = if VNNI {
                        _mm256_xor_si256(w, _mm256_set1_epi8(-128))
                    } else {
                        _mm256_sign_epi8(w, w)
                    };
                    for j in 0..T {
                        let y = bcast(ab[j].qs.as_ptr().add(4 * c));
                        let y = if VNNI { y } else { _mm256_sign_epi8(y, w) };
                        isum[j] = lanes::<VNNI>(isum[j], u, y);
                    }
                }
            } else {
                // Without VNNI, `maddubs` pairs are added in `i16` across the 4 chunks (one sum
                // for the low nibbles, one for the high: at most 4 * 2 * 31 * 128 = 31744 for
                // Q5_0, so exact), then widened once: 2 `madd`s per block and token, not 8
                // (about 10% less CPU per Q4_0 prefill matmul on Zen 3).
                let widen_once = !VNNI && KIND != 3;
                let mut p16 = [[_mm256_setzero_si256(); 2]; T];
                for c in 0..4 {
                    let v = _mm256_loadu_si256(q.add(32 * c).cast());
                    let mut lo = _mm256_and_si256(v, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    if KIND == 2 {
                        let (bl, bh) = fifth_bits(s.add(16), c);
                        lo = _mm256_or_si256(lo, bl);
                        hi = _mm256_or_si256(hi, bh);
                    }
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr();
                        let (yl, yh) = (bcast(y.add(4 * c)), bcast(y.add(16 + 4 * c)));
                        if !widen_once {
                            isum[j] = lanes::<VNNI>(isum[j], lo, yl);
                            isum[j] = lanes::<VNNI>(isum[j], hi, yh);
                        } else {
                            let [pl, ph] = &mut p16[j];
                            *pl = _mm256_add_epi16(*pl, _mm256_maddubs_epi16(lo, yl));
                            *ph = _mm256_add_epi16(*ph, _mm256_maddubs_epi16(hi, yh));
                        }
                    }
                }
                if widen_once {
                    let ones = _mm256_set1_epi16(1);
                    for (isum, [pl, ph]) in isum.iter_mut().zip(&p16) {
                        let w = _mm256_add_epi32(
                            _mm256_madd_epi16(*pl, ones),
                            _mm256_madd_epi16(*ph, ones),
                        );
                        *isum = _mm256_add_epi32(*isum, w);
                    }
                }
            }
            for j in 0..T {
                let sc = _mm256_mul_ps(d8, _mm256_set1_ps(ab[j].d));
                acc[j] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[j]), acc[j]);
            }
        }
        for (j, v) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), *v);
        }
    }
}

/// `out[j * 8 + r]` = row `r` of group `grp` (`nb` superblocks of `kind`) dotted with token `j`
/// (`a[j * nb..]`, corrections `corr[j * nb..]`) for `j < t` (1, or 2 with VNNI).
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_r8` sizes them).
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn group(
    vnni: bool,
    kind: QKind,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    assert!(grp.len() >= nb * superblock_bytes(kind));
    assert!(
        t >= 1 && t <= tile_tokens(vnni, kind, false) && a.len() >= t * nb && corr.len() >= t * nb
    );
    assert!(out.len() >= t * RG);
    macro_rules! go {
        ($k:literal) => {
            // SAFETY (all three): AVX2/FMA/F16C by the module invariant, VNNI/VL by `has_vnni`
            // when `vnni`; the asserts above are the bounds every call reads within.
            match (vnni, t) {
                // SAFETY: see above.
                (true, 2) => unsafe { group_vnni::<$k, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, _) => unsafe { group_vnni::<$k, 1>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, _) => unsafe { group_avx2::<$k>(grp, nb, a, corr, out) },
            }
        };
    }
    match kind {
        QKind::Q4_0 => go!(0),
        QKind::Q4_1 => go!(1),
        QKind::Q5_0 => go!(2),
        QKind::Q8_0 => go!(3),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const KIND: u8>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { body::<KIND, 1, false>(grp, nb, a, corr, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn group_vnni<const KIND: u8, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's, VNNI included.
    unsafe { body::<KIND, T, true>(grp, nb, a, corr, out) }
}

/// The 32-bit word at `p` in every lane.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m256i {
    // SAFETY: 4 readable bytes at `p` (caller); AVX enabled by the caller.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Exact per-lane `init + sum(u * s)` (4 byte products per lane), `u` unsigned with `u * s`
/// pairs that fit `i16` (`maddubs` cannot saturate: callers pass `u <= 15`, or `|w| <= 128`
/// against `|y| <= 127`).
#[inline(always)]
unsafe fn lanes<const VNNI: bool>(init: __m256i, u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: AVX2 (and for VNNI, AVX512-VNNI + VL) enabled by the caller.
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(init, u, s)
        } else {
            let p = _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(u, s));
            _mm256_add_epi32(p, init)
        }
    }
}

/// Q5_0's fifth bits of chunk `c` as `0x10` bytes, the low and the high nibbles', from the
/// 32 header bytes at `hb` (see `matmul/repack.rs`: byte `4r + i` holds bit `c` for chunk `c`'s low
/// nibble of row `r`'s byte `i`, bit `4 + c` for its high one). A 16-bit shift moves bit `c`
/// (or `4 + c`) of every byte to bit 4; what crosses from the neighbouring byte lands below
/// bit 4 (left shifts by 1-4) or above it (right shifts by 0-3), so the mask drops it.
#[inline(always)]
pub(crate) unsafe fn fifth_bits(hb: *const u8, c: usize) -> (__m256i, __m256i) {
    // SAFETY: 32 readable bytes at `hb` (caller); AVX2 enabled by the caller.
    unsafe {
        let h = _mm256_loadu_si256(hb.cast());
        let (lo, hi) = match c {
            0 => (_mm256_slli_epi16::<4>(h), h),
            1 => (_mm256_slli_epi16::<3>(h), _mm256_srli_epi16::<1>(h)),
            2 => (_mm256_slli_epi16::<2>(h), _mm256_srli_epi16::<2>(h)),
            _ => (_mm256_slli_epi16::<1>(h), _mm256_srli_epi16::<3>(h)),
        };
        let m = _mm256_set1_epi8(0x10);
        (_mm256_and_si256(lo, m), _mm256_and_si256(hi, m))
    }
}

/// KIND: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q8_0 (`arch/x86/qdot.rs`' numbering). See [`group`].
#[inline(always)]
unsafe fn body<const KIND: u8, const T: usize, const VNNI: bool>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let kind = [QKind::Q4_0, QKind::Q4_1, QKind::Q5_0, QKind::Q8_0][KIND as usize];
    let (sb, hdr) = (superblock_bytes(kind), header_bytes(kind));
    // SAFETY: superblock `b < nb` is inside `grp`, activation/correction `j * nb + b` inside
    // `a`/`corr` for `j < T`, and `out` holds `T * 8` values (asserted by `group`); the
    // features are enabled by the caller.
    unsafe {
        let gp = grp.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 8]; T];
        let mut summs = [_mm256_setzero_ps(); T];
        let m4 = _mm256_set1_epi8(0x0f);
        let ahead = crate::kernels::simd::prefetch_ahead();
        for b in 0..nb {
            let s = gp.add(b * sb);
            // The next group's stream starts far away; within a group the hardware prefetcher
            // follows the sequential superblocks, so a few lines ahead is enough.
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(s.cast()));
            let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let cj: [&[i32; 8]; T] = std::array::from_fn(|j| corr.get_unchecked(j * nb + b));
            // ggml's `dw * dy`, 8 rows at once.
            let sc: [__m256; T] =
                std::array::from_fn(|j| _mm256_mul_ps(d8, _mm256_set1_ps(ab[j].d)));
            if KIND == 1 {
                let m8 = _mm256_cvtph_ps(_mm_loadu_si128(s.add(16).cast()));
                for j in 0..T {
                    summs[j] = _mm256_fmadd_ps(m8, _mm256_set1_ps(ab[j].s), summs[j]);
                }
            }
            let q = s.add(hdr);
            if KIND == 3 {
                for c in 0..8 {
                    let w = _mm256_loadu_si256(q.add(32 * c).cast());
                    let u = if VNNI {
                        _mm256_xor_si256(w, _mm256_set1_epi8(-128))
                    } else {
                        _mm256_sign_epi8(w, w)
                    };
                    for j in 0..T {
                        let y = bcast(ab[j].qs.as_ptr().add(4 * c));
                        let l = if VNNI {
                            lanes::<true>(_mm256_set1_epi32(cj[j][c]), u, y)
                        } else {
                            lanes::<false>(_mm256_setzero_si256(), u, _mm256_sign_epi8(y, w))
                        };
                        acc[j][c] = _mm256_fmadd_ps(sc[j], _mm256_cvtepi32_ps(l), acc[j][c]);
                    }
                }
            } else {
                for c in 0..4 {
                    let v = _mm256_loadu_si256(q.add(32 * c).cast());
                    let mut lo = _mm256_and_si256(v, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    if KIND == 2 {
                        let (bl, bh) = fifth_bits(s.add(16), c);
                        lo = _mm256_or_si256(lo, bl);
                        hi = _mm256_or_si256(hi, bh);
                    }
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr();
                        let (il, ih) = if KIND == 0 || KIND == 2 {
                            (_mm256_set1_epi32(cj[j][c]), _mm256_set1_epi32(cj[j][4 + c]))
                        } else {
                            (_mm256_setzero_si256(), _mm256_setzero_si256())
                        };
                        let ll = lanes::<VNNI>(il, lo, bcast(y.add(4 * c)));
                        let lh = lanes::<VNNI>(ih, hi, bcast(y.add(16 + 4 * c)));
                        acc[j][c] = _mm256_fmadd_ps(sc[j], _mm256_cvtepi32_ps(ll), acc[j][c]);
                        acc[j][4 + c] =
                            _mm256_fmadd_ps(sc[j], _mm256_cvtepi32_ps(lh), acc[j][4 + c]);
                    }
                }
            }
        }
        for j in 0..T {
            let x = &acc[j];
            let lo = _mm256_add_ps(_mm256_add_ps(x[0], x[4]), _mm256_add_ps(x[2], x[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(x[1], x[5]), _mm256_add_ps(x[3], x[7]));
            let mut r = _mm256_add_ps(lo, hi);
            if KIND == 1 {
                r = _mm256_add_ps(r, summs[j]);
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), r);
        }
    }
}
