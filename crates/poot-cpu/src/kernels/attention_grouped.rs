//! The batched ggml attention path for grouped query heads over an f16 cache (prefill): each
//! KV head's query heads run together, so every K and V row is widened once per group, in
//! blocks that stay in L1. Every head's arithmetic is `attention_ggml::head`'s (8-lane dots in
//! the same order, the same softmax, 8 V lanes folded by `hsum8`), so outputs are bit-identical
//! to the per-head path (tested here). Split from `attention_ggml.rs`, which keeps the per-head
//! path, its softmax and its scratch.

use super::attention::KvElem;
#[cfg(target_arch = "x86_64")]
use super::attention_ggml::{softmax_round, Scratch};
#[cfg(target_arch = "x86_64")]
use super::ggml::hsum8;
#[cfg(target_arch = "x86_64")]
use super::scratch::AttnGuard;

/// [`head`]'s batched path (two or more tokens in the step) for a tile of `lens.len()` tokens
/// of one sequence and the `g` query heads that share one KV head, over an f16 cache: each K
/// and V row is widened once for the whole tile (all its tokens and heads) instead of once
/// per token and head. Token `j`'s heads are `q_of(j)` (`g * hd` values), it attends over
/// positions `0..lens[j]`, and its results go to `o[j * g * hd..][..g * hd]`. Every head's
/// arithmetic is `head`'s (8-lane dots in the same order, the same softmax, 8 V lanes folded
/// by `hsum8`), so `o` is bit-identical to one call of `head` per token and head (tested).
/// Needs `hd % 8 == 0`.
///
/// How: positions go in blocks of [`PB`], widened into a block of scratch that stays in L1
/// while every token and head uses it. Scores 8 positions at a time, each position's 8 FMA
/// lanes in its own register, the 8 folds done together by [`hsum8x8`] (the same additions as
/// `hsum8`). V in registers: for each token, head and 8 (or 16, AVX-512) outputs, the 8 lane
/// accumulators (position `p` in lane `p % 8`, `head`'s lane-major layout) are loaded, run
/// over the block's positions and stored back; the same FMAs per output in the same order. A
/// token's positions from its `len` to the next multiple of 8 weigh zero against zero rows,
/// as in `head` (the tile's block may hold later tokens' rows there, so that group runs from
/// a zeroed copy). Tiles of tokens: widening per token and KV head had been a quarter of a
/// 512-token prefill's attention on a Zen 5.
///
/// # Safety
/// The caller detected AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
pub(crate) unsafe fn heads_f16<'q, Q: Fn(usize) -> &'q [f32], F: Fn(usize) -> usize>(
    hd: usize,
    g: usize,
    q_of: Q,
    lens: &[usize],
    (k_cache, v_cache): (&[half::f16], &[half::f16]),
    row_of: F,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    let tt = lens.len();
    assert!(hd > 0 && hd.is_multiple_of(8) && g > 0 && o.len() == tt * g * hd);
    assert!(g <= 64, "at most 64 query heads per KV head");
    s.q.clear();
    s.q.resize(tt * g * hd, 0.0);
    for (j, dst) in s.q.chunks_exact_mut(g * hd).enumerate() {
        // SAFETY: AVX2 and F16C, as this function's own contract.
        unsafe { super::fdot16_x86::f16_round_into(q_of(j), dst) };
    }
    let max_len = lens.iter().copied().max().unwrap_or(0);
    // Scores and V rows run to a multiple of 8, the padding zeros: `fma(0, 0, acc) = acc` for
    // every accumulator (they start at +0, so are never -0), so no loop needs a tail of lanes.
    // Token j's scores start at `j * g * stride`, head h's `h * stride` after that.
    let stride = max_len.next_multiple_of(8);
    s.k.resize(PB * hd, 0.0);
    s.scores.clear();
    s.scores.resize(tt * g * stride, 0.0);
    // AVX-512 widens 16 halves per instruction and runs V 16 outputs at a time.
    let wide = hd.is_multiple_of(16) && std::arch::is_x86_feature_detected!("avx512f");
    let widen = |src: &[half::f16], dst: &mut [f32]| {
        if wide {
            // SAFETY: AVX-512F detected (`wide`).
            unsafe { widen16(src, dst) }
        } else {
            super::attention::f16_to_f32_f16c(src, dst)
        }
    };
    // Pass 1: scores.
    let mut maxes = [[f32::NEG_INFINITY; 64]; TILE];
    assert!(tt <= TILE, "at most {TILE} tokens per tile");
    for p0 in (0..max_len).step_by(PB) {
        let n = PB.min(max_len - p0);
        for p in 0..n {
            let kr = &k_cache[row_of(p0 + p)..][..hd];
            widen(kr, &mut s.k[p * hd..(p + 1) * hd]);
        }
        let kb = &s.k[..];
        for (j, &len) in lens.iter().enumerate() {
            if len <= p0 {
                continue;
            }
            let n = PB.min(len - p0);
            for (h, mh) in maxes[j].iter_mut().enumerate().take(g) {
                let qh = &s.q[(j * g + h) * hd..(j * g + h + 1) * hd];
                let at = (j * g + h) * stride + p0;
                let row = &mut s.scores[at..at + n];
                // SAFETY: `n` rows of `hd` floats in `kb`, `hd` in `qh`, `n` scores in `row`;
                // AVX2/FMA/F16C enabled here.
                unsafe {
                    let scale8 = _mm256_set1_ps(scale);
                    let mut max8 = _mm256_set1_ps(f32::NEG_INFINITY);
                    let mut p = 0;
                    while p + 8 <= n {
                        let mut acc = [_mm256_setzero_ps(); 8];
                        for i in (0..hd).step_by(8) {
                            let qv = _mm256_loadu_ps(qh.as_ptr().add(i));
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
                        *mh = mh.max(v);
                    }
                    for (pp, x) in row.iter_mut().enumerate().skip(p) {
                        let mut acc = _mm256_setzero_ps();
                        for i in (0..hd).step_by(8) {
                            let k = _mm256_loadu_ps(kb.as_ptr().add(pp * hd + i));
                            acc = _mm256_fmadd_ps(k, _mm256_loadu_ps(qh.as_ptr().add(i)), acc);
                        }
                        let v = _mm_add_ps(
                            _mm256_extractf128_ps::<1>(acc),
                            _mm256_castps256_ps128(acc),
                        );
                        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                        *x = _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v))) * scale;
                        *mh = mh.max(*x);
                    }
                }
            }
        }
    }
    for (j, &len) in lens.iter().enumerate() {
        for (h, &mh) in maxes[j].iter().enumerate().take(g) {
            let at = (j * g + h) * stride;
            softmax_round::<half::f16, true>(&mut s.scores[at..at + len], mh);
        }
    }
    // Pass 2: V, into `head`'s 8 lane-major accumulators per token and head
    // (`acc[((j * g + h) * 8 + l) * hd + d]`); `s.k` holds the block's rows and, after them, 8
    // rows for a ragged group.
    s.acc.clear();
    s.acc.resize(tt * g * 8 * hd, 0.0);
    s.k.resize((PB + 8) * hd, 0.0);
    let (block, last) = s.k.split_at_mut(PB * hd);
    for p0 in (0..stride).step_by(PB) {
        let n = PB.min(stride - p0);
        for p in 0..n {
            let vb = &mut block[p * hd..(p + 1) * hd];
            if p0 + p < max_len {
                widen(&v_cache[row_of(p0 + p)..][..hd], vb);
            } else {
                vb.fill(0.0);
            }
        }
        for (j, &len) in lens.iter().enumerate() {
            if !wide {
                if len > p0 {
                    let n = PB.min(len - p0);
                    let (scores, acc) = (&s.scores[..], &mut s.acc[..]);
                    // SAFETY: AVX2/FMA enabled here; `v_heads_avx2`'s shapes hold: the
                    // block's `n <= PB` rows, token j's `g` heads of weights (`stride` each,
                    // `p0 + n <= len <= stride`) and lane accumulators (`8 * hd` each).
                    unsafe { v_heads_avx2(block, (scores, stride, p0), acc, (j, g, hd), n) };
                }
                continue;
            }
            let len8 = len.next_multiple_of(8);
            if len8 <= p0 {
                continue;
            }
            let n = PB.min(len8 - p0);
            // The group holding `len` when it is not whole: later positions' rows may be in
            // the block, so it runs from a copy with those rows zeroed (as `head` sees them).
            let ragged = len % 8 != 0 && len8 <= p0 + n;
            let full = if ragged { n - 8 } else { n };
            for h in 0..g {
                let at = (j * g + h) * stride + p0;
                let acc = &mut s.acc[(j * g + h) * 8 * hd..(j * g + h + 1) * 8 * hd];
                // SAFETY: AVX-512F detected (`wide`); shapes as asserted by the callee.
                let v = |rows: &[f32], w: &[f32], acc: &mut [f32]| unsafe {
                    v_lanes_avx512(rows, w, hd, acc);
                };
                if full > 0 {
                    v(block, &s.scores[at..at + full], acc);
                }
                if ragged {
                    let keep = len - (p0 + full);
                    last[..keep * hd].copy_from_slice(&block[full * hd..(full + keep) * hd]);
                    last[keep * hd..].fill(0.0);
                    v(last, &s.scores[at + full..at + full + 8], acc);
                }
            }
        }
    }
    for (jh, oh) in o.chunks_exact_mut(hd).enumerate() {
        for (d, od) in oh.iter_mut().enumerate() {
            *od = hsum8(&std::array::from_fn(|l| s.acc[(jh * 8 + l) * hd + d]));
        }
    }
}

/// Tokens per tile of [`heads_f16`].
pub(crate) const TILE: usize = 16;

/// Positions per block of [`heads_f16`] (64 rows of 64 floats: 16 KiB).
const PB: usize = 64;

/// `dst = src` widened 16 halves at a time (`src.len() % 16 == 0`; exact, as every widening).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn widen16(src: &[half::f16], dst: &mut [f32]) {
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
fn hsum8x8(acc: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
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
unsafe fn v_heads_avx2(
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
fn v_lanes_avx512(v: &[f32], w: &[f32], hd: usize, acc: &mut [f32]) {
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

/// The ggml paths over an f16 cache with grouped query heads: with two or more tokens, runs
/// [`heads_f16`] on the pool for every KV head and every run of up to [`TILE`] consecutive
/// tokens of one sequence, and returns `true`; with one token, `attention_decode`'s path
/// where it applies. Returns `false` (nothing written) where neither applies: no F16C, no GQA,
/// `head_dim % 8 != 0` (one token: see `attention_decode`), or an f32 cache. Inputs are
/// validated by the caller (`paged_attention_numerics`). Allocates nothing: task `i` takes
/// tokens `i * TILE..` and splits them where the sequence changes.
#[allow(
    clippy::too_many_arguments,
    reason = "one attention call's validated operands"
)]
pub(crate) fn paged_grouped<T: KvElem>(
    fma: bool,
    s: &super::attention::AttentionShape,
    inputs: &super::attention::AttentionInputs<'_>,
    k_cache: &[T],
    v_cache: &[T],
    t: usize,
    out: &mut [f32],
    pool: &crate::ThreadPool,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads.max(1));
        let (Some(kc), Some(vc)) = (T::as_f16(k_cache), T::as_f16(v_cache)) else {
            return false;
        };
        if !fma || !(2..=64).contains(&group) {
            return false;
        }
        if t == 1 {
            // One token: ggml's one-token order (`attention_decode.rs`).
            return super::attention_decode::paged_decode(s, inputs, (kc, vc), out, pool);
        }
        if !hd.is_multiple_of(8) {
            return false;
        }
        let tiles = t.div_ceil(TILE);
        let shared = crate::pool::SharedMut::new(out);
        pool.for_each_init(tiles * s.n_kv_heads, AttnGuard::take, |scratch, idx| {
            let (tile, kvh) = (idx / s.n_kv_heads, idx % s.n_kv_heads);
            let end = ((tile + 1) * TILE).min(t);
            let mut a = tile * TILE;
            while a < end {
                let seq = inputs.token_seq[a];
                let b = (a..end)
                    .find(|&i| inputs.token_seq[i] != seq)
                    .unwrap_or(end);
                let row_of = super::attention::kv_row_of(s, inputs, a, kvh);
                let q_at = |j: usize| ((a + j) * s.n_heads + kvh * group) * hd;
                let q_of = |j: usize| &inputs.q[q_at(j)..q_at(j) + group * hd];
                let mut lens = [0usize; TILE];
                for (j, l) in lens.iter_mut().enumerate().take(b - a) {
                    *l = inputs.positions[a + j] as usize + 1;
                }
                let mut o = std::mem::take(&mut scratch.o);
                o.clear();
                o.resize((b - a) * group * hd, 0.0);
                let lens = &lens[..b - a];
                // SAFETY: `fma` means a SIMD `Isa` was detected (AVX2, FMA, F16C).
                unsafe {
                    heads_f16(
                        hd,
                        group,
                        q_of,
                        lens,
                        (kc, vc),
                        row_of,
                        s.scale,
                        scratch,
                        &mut o,
                    )
                };
                for (j, oj) in o.chunks_exact(group * hd).enumerate() {
                    // SAFETY: token a + j's heads of KV head kvh belong to this task only
                    // (tasks split tokens by tile and heads by KV head).
                    let dst = unsafe { shared.slice_mut(q_at(j)..q_at(j) + group * hd) };
                    dst.copy_from_slice(oj);
                }
                scratch.o = o;
                a = b;
            }
        });
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (fma, s, inputs, k_cache, v_cache, t, out, pool);
        false
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[path = "attention_grouped_tests.rs"]
mod tests;
