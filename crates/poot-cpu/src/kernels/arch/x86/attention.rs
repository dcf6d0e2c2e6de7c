//! The inner loops of the grouped ggml prefill attention (its `heads_f16`, the only caller):
//! scores of one or two query heads over a block of widened K rows, and the V pass into
//! `head`'s lane-major accumulators, on AVX2 (and the AVX-512 V loop). Each output sees the
//! per-head ggml attention's operations in its order, so results are bit-identical to the
//! per-head path (`attention/grouped_tests.rs`).
//!
//! Invariant (soundness): every `unsafe fn` here is reached only from `heads_f16`, after the
//! caller detected the features its `target_feature` names.

/// One head's scaled scores over a block's first `row.len()` positions (rows of `hd = q.len()`
/// floats in `kb`): 8 positions at a time, each position's 8 FMA lanes in its own register,
/// folded together by [`hsum8x8`], then the last `len % 8` one by one ([`score_at`]); returns
/// their max.
///
/// # Safety
/// AVX2, FMA detected; `kb` holds `row.len()` rows of `q.len()` floats; `q.len() % 8 == 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores_one(kb: &[f32], q: &[f32], scale: f32, row: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    let (hd, n) = (q.len(), row.len());
    assert!(kb.len() >= n * hd && hd.is_multiple_of(8));
    let mut mh = f32::NEG_INFINITY;
    let mut p = 0;
    // SAFETY: rows p + jj < n of `hd` floats in `kb`, scores p..p + 8 <= n (asserted).
    unsafe {
        let scale8 = _mm256_set1_ps(scale);
        let mut max8 = _mm256_set1_ps(f32::NEG_INFINITY);
        while p + 8 <= n {
            let mut acc = [_mm256_setzero_ps(); 8];
            for i in (0..hd).step_by(8) {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                for (jj, a) in acc.iter_mut().enumerate() {
                    let k = _mm256_loadu_ps(kb.as_ptr().add((p + jj) * hd + i));
                    *a = _mm256_fmadd_ps(k, qv, *a);
                }
            }
            let x = _mm256_mul_ps(hsum8x8(acc), scale8);
            max8 = _mm256_max_ps(max8, x);
            _mm256_storeu_ps(row.as_mut_ptr().add(p), x);
            p += 8;
        }
        let mut m8 = [0.0f32; 8];
        _mm256_storeu_ps(m8.as_mut_ptr(), max8);
        for v in m8 {
            mh = mh.max(v);
        }
    }
    for (pp, x) in row.iter_mut().enumerate().skip(p) {
        // SAFETY: pp < n (as above).
        *x = unsafe { score_at(kb, q, pp) } * scale;
        mh = mh.max(*x);
    }
    mh
}

/// [`scores_one`] for two heads, 4 positions at a time: each K row load serves both heads'
/// FMAs (6 loads per 8 FMAs, against 9 per 8 alone); the 8 registers (4 positions of the
/// first head, then of the second) fold by one [`hsum8x8`], the same additions as
/// `hsum8` each. Returns both maxes.
///
/// # Safety
/// As [`scores_one`], for both heads; the rows have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores_pair(
    kb: &[f32],
    (q0, q1): (&[f32], &[f32]),
    scale: f32,
    (row0, row1): (&mut [f32], &mut [f32]),
) -> (f32, f32) {
    use std::arch::x86_64::*;
    let (hd, n) = (q0.len(), row0.len());
    assert!(kb.len() >= n * hd && hd.is_multiple_of(8) && q1.len() == hd && row1.len() == n);
    let (mut m0, mut m1) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    let mut p = 0;
    // SAFETY: rows p + jj < n of `hd` floats in `kb`, scores p..p + 4 <= n (asserted).
    unsafe {
        let scale8 = _mm256_set1_ps(scale);
        let mut max8 = _mm256_set1_ps(f32::NEG_INFINITY);
        while p + 4 <= n {
            let mut acc = [_mm256_setzero_ps(); 8];
            for i in (0..hd).step_by(8) {
                let (a, b) = (
                    _mm256_loadu_ps(q0.as_ptr().add(i)),
                    _mm256_loadu_ps(q1.as_ptr().add(i)),
                );
                for jj in 0..4 {
                    let k = _mm256_loadu_ps(kb.as_ptr().add((p + jj) * hd + i));
                    acc[jj] = _mm256_fmadd_ps(k, a, acc[jj]);
                    acc[4 + jj] = _mm256_fmadd_ps(k, b, acc[4 + jj]);
                }
            }
            let x = _mm256_mul_ps(hsum8x8(acc), scale8);
            max8 = _mm256_max_ps(max8, x);
            _mm_storeu_ps(row0.as_mut_ptr().add(p), _mm256_castps256_ps128(x));
            _mm_storeu_ps(row1.as_mut_ptr().add(p), _mm256_extractf128_ps::<1>(x));
            p += 4;
        }
        let mut m8 = [0.0f32; 8];
        _mm256_storeu_ps(m8.as_mut_ptr(), max8);
        for (l, v) in m8.into_iter().enumerate() {
            if l < 4 {
                m0 = m0.max(v);
            } else {
                m1 = m1.max(v);
            }
        }
    }
    for pp in p..n {
        // SAFETY: pp < n (as above).
        let (x0, x1) = unsafe { (score_at(kb, q0, pp), score_at(kb, q1, pp)) };
        row0[pp] = x0 * scale;
        row1[pp] = x1 * scale;
        (m0, m1) = (m0.max(row0[pp]), m1.max(row1[pp]));
    }
    (m0, m1)
}

/// Position `pp`'s unscaled score (row `pp` of `kb` against `q`): 8 FMA lanes, then `hsum8`'s
/// additions.
///
/// # Safety
/// AVX2, FMA detected; row `pp` of `q.len()` floats (a multiple of 8) in `kb`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn score_at(kb: &[f32], q: &[f32], pp: usize) -> f32 {
    use std::arch::x86_64::*;
    let hd = q.len();
    assert!(kb.len() >= (pp + 1) * hd);
    // SAFETY: as asserted; AVX2/FMA enabled here.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in (0..hd).step_by(8) {
            let k = _mm256_loadu_ps(kb.as_ptr().add(pp * hd + i));
            acc = _mm256_fmadd_ps(k, _mm256_loadu_ps(q.as_ptr().add(i)), acc);
        }
        crate::kernels::ggml::hsum8v(acc)
    }
}

/// `dst = src` widened 16 halves at a time (`src.len() % 16 == 0`; exact, as every widening).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn widen16(src: &[half::f16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    assert!(src.len().is_multiple_of(16) && dst.len() >= src.len());
    for (i, c) in src.chunks_exact(16).enumerate() {
        // SAFETY: 16 halves at `c`, 16 floats at `dst[16 i..]` (asserted); AVX-512F enabled.
        unsafe {
            let h = _mm256_loadu_si256(c.as_ptr().cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(16 * i), _mm512_cvtph_ps(h));
        }
    }
}

/// `hsum8` of each of 8 registers, together: `out[j] = ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`
/// of `acc[j]`, the same additions in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn hsum8x8(acc: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // `[lo(a) + hi(a) | lo(b) + hi(b)]`: each half `[a0+a4, a1+a5, a2+a6, a3+a7]`.
    let pair = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let (s01, s23) = (pair(acc[0], acc[1]), pair(acc[2], acc[3]));
    let (s45, s67) = (pair(acc[4], acc[5]), pair(acc[6], acc[7]));
    // `[p0 + p2, p1 + p3]` of each: lanes of (0, 2 | 1, 3) and (4, 6 | 5, 7).
    let quad = |a: __m256, b: __m256| {
        let (a, b) = (_mm256_castps_pd(a), _mm256_castps_pd(b));
        _mm256_add_ps(
            _mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
            _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)),
        )
    };
    let (t0123, t4567) = (quad(s01, s23), quad(s45, s67));
    // `q0 + q1` of each: [s0, s2, s4, s6 | s1, s3, s5, s7].
    let r = _mm256_hadd_ps(t0123, t4567);
    _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Pass 2 of [`heads_f16`] on AVX2 for token `j`'s `g` heads over the block's first `n`
/// positions (rows of `hd` floats in `v`, weights `scores[(j * g + h) * stride + p0..]`):
/// `acc[((j * g + h) * 8 + l) * hd + d] = fma(v[p][d], w_h[p], .)` for the positions `p % 8
/// == l` in order, `head`'s lane-major V loop, so every accumulator sees the same FMAs in the
/// same order. Positions from `n` to the next multiple of 8 are skipped, where `head` adds
/// `fma(0, 0, acc) = acc` (accumulators start at +0 and never become -0).
///
/// How: lane by lane, tiles of up to 4 heads by 16 outputs (8 accumulators in registers): per
/// position two row loads and a broadcast weight per head serve 8 FMAs. One head and 8 outputs
/// at a time had needed a row load and a broadcast per FMA, which bound the loop by loads.
///
/// # Safety
/// AVX2 and FMA detected; `v` holds `n * hd` floats, `scores` `(j * g + g - 1) * stride + p0
/// + n` and `acc` `(j + 1) * g * 8 * hd` (asserted); `hd % 8 == 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn v_heads_avx2(
    v: &[f32],
    (scores, stride, p0): (&[f32], usize, usize),
    acc: &mut [f32],
    (j, g, hd): (usize, usize, usize),
    n: usize,
) {
    assert!(v.len() >= n * hd && hd.is_multiple_of(8) && p0 + n <= stride);
    assert!(scores.len() >= (j + 1) * g * stride && acc.len() >= (j + 1) * g * 8 * hd);
    let mut h0 = 0;
    while h0 < g {
        let hh = (g - h0).min(4);
        let w = |h: usize| scores[(j * g + h0 + h) * stride + p0..].as_ptr();
        let base = acc.as_mut_ptr();
        // In bounds: heads h0 + h < g of token j (asserted above).
        let a = |h: usize| base.wrapping_add((j * g + h0 + h) * 8 * hd);
        for d0 in (0..hd).step_by(16) {
            let two = d0 + 16 <= hd;
            // SAFETY: as this function's contract; heads h0..h0 + hh < g, outputs d0 + 16 (or
            // 8) <= hd.
            unsafe {
                match (hh, two) {
                    (4, true) => {
                        v_tile::<4, 2>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (4, false) => {
                        v_tile::<4, 1>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (3, true) => {
                        v_tile::<3, 2>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (3, false) => {
                        v_tile::<3, 1>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (2, true) => {
                        v_tile::<2, 2>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (2, false) => {
                        v_tile::<2, 1>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (_, true) => {
                        v_tile::<1, 2>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                    (_, false) => {
                        v_tile::<1, 1>(v, std::array::from_fn(w), hd, d0, n, std::array::from_fn(a))
                    }
                }
            }
        }
        h0 += hh;
    }
}

/// [`v_heads_avx2`]'s tile: `H` heads (weights at `w[h]`, lane accumulators at `a[h]`) by `D`
/// runs of 8 outputs from `d0`, lane by lane over positions `l, l + 8, .. < n`.
///
/// # Safety
/// As [`v_heads_avx2`], for the tile's heads and outputs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn v_tile<const H: usize, const D: usize>(
    v: &[f32],
    w: [*const f32; H],
    hd: usize,
    d0: usize,
    n: usize,
    a: [*mut f32; H],
) {
    use std::arch::x86_64::*;
    let vp = v.as_ptr();
    for l in 0..n.min(8) {
        // SAFETY: the caller's contract: lane l's outputs d0..d0 + 8 D of each head, rows p <
        // n, weights p < n.
        unsafe {
            let at = |h: usize, dd: usize| a[h].add(l * hd + d0 + 8 * dd);
            let mut r: [[__m256; D]; H] =
                std::array::from_fn(|h| std::array::from_fn(|dd| _mm256_loadu_ps(at(h, dd))));
            let mut p = l;
            while p < n {
                let x: [__m256; D] =
                    std::array::from_fn(|dd| _mm256_loadu_ps(vp.add(p * hd + d0 + 8 * dd)));
                for (h, rh) in r.iter_mut().enumerate() {
                    let wv = _mm256_broadcast_ss(&*w[h].add(p));
                    for (dd, acc) in rh.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(x[dd], wv, *acc);
                    }
                }
                p += 8;
            }
            for (h, rh) in r.iter().enumerate() {
                for (dd, acc) in rh.iter().enumerate() {
                    _mm256_storeu_ps(at(h, dd), *acc);
                }
            }
        }
    }
}

/// `head`'s lane-major V loop on AVX-512, 16 outputs at a time (`hd % 16 == 0`):
/// `acc[l * hd + d] = fma(v[p][d], w[p], .)` over the block's positions `p % 8 == l` in order;
/// `w.len()` is a multiple of 8 (zero weights pad it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) fn v_lanes_avx512(v: &[f32], w: &[f32], hd: usize, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    let len = w.len();
    assert!(v.len() >= len * hd && acc.len() >= 8 * hd && hd.is_multiple_of(16));
    assert!(len.is_multiple_of(8));
    // 32 outputs at a time where they divide `hd`: each weight's broadcast then serves two
    // FMAs (one broadcast and one row load per FMA had made this loop bound by loads).
    let mut d0 = 0;
    while d0 + 32 <= hd {
        // SAFETY: rows `p < len` of `hd` floats in `v`, 8 rows of `hd` in `acc` (asserted);
        // AVX-512F enabled here; d0 + 32 <= hd.
        unsafe {
            let mut a: [[__m512; 8]; 2] = std::array::from_fn(|c| {
                std::array::from_fn(|l| _mm512_loadu_ps(acc.as_ptr().add(l * hd + d0 + 16 * c)))
            });
            for (p8, w8) in w.chunks_exact(8).enumerate() {
                for j in 0..8 {
                    let wj = _mm512_set1_ps(w8[j]);
                    let row = v.as_ptr().add((8 * p8 + j) * hd + d0);
                    for (c, a) in a.iter_mut().enumerate() {
                        a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(16 * c)), wj, a[j]);
                    }
                }
            }
            for (c, a) in a.iter().enumerate() {
                for (l, a) in a.iter().enumerate() {
                    _mm512_storeu_ps(acc.as_mut_ptr().add(l * hd + d0 + 16 * c), *a);
                }
            }
        }
        d0 += 32;
    }
    for d in (d0..hd).step_by(16) {
        // SAFETY: as above.
        unsafe {
            let mut a: [__m512; 8] =
                std::array::from_fn(|l| _mm512_loadu_ps(acc.as_ptr().add(l * hd + d)));
            for (p8, w8) in w.chunks_exact(8).enumerate() {
                for (j, a) in a.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(v.as_ptr().add((8 * p8 + j) * hd + d));
                    *a = _mm512_fmadd_ps(x, _mm512_set1_ps(w8[j]), *a);
                }
            }
            for (l, a) in a.iter().enumerate() {
                _mm512_storeu_ps(acc.as_mut_ptr().add(l * hd + d), *a);
            }
        }
    }
}
