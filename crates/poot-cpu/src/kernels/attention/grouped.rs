//! The ggml attention path for grouped query heads over an f16 cache (every step): each
//! KV head's query heads run together, so every K and V row is widened once per group, in
//! blocks that stay in L1. Every head's arithmetic is `attention::ggml_heads::head`'s (8-lane dots in
//! the same order, the same softmax, 8 V lanes folded by `hsum8`), so outputs are bit-identical
//! to the per-head path (tested here). Split from `attention/ggml_heads.rs`, which keeps the per-head
//! path, its softmax and its scratch.

#[cfg(target_arch = "x86_64")]
use crate::kernels::arch::x86::attention::{
    scores_one, scores_pair, v_heads_avx2, v_lanes_avx512, widen16,
};
#[cfg(target_arch = "x86_64")]
use crate::kernels::attention::ggml_heads::softmax_round;
use crate::kernels::attention::kv::KvElem;
#[cfg(target_arch = "x86_64")]
use crate::kernels::scratch::AttnGuard;
#[cfg(target_arch = "x86_64")]
use crate::kernels::scratch::AttnScratch as Scratch;

/// [`head`]'s arithmetic for a tile of `lens.len()` tokens
/// of one sequence and the `g` query heads that share one KV head, over an f16 cache: each K
/// and V row is widened once for the whole tile (all its tokens and heads) instead of once
/// per token and head. Token `j`'s heads are `q_of(j)` (`g * hd` values), it attends over
/// positions `0..lens[j]`, and its results go to `o[j * g * hd..][..g * hd]`. Every head's
/// arithmetic is `head`'s (8-lane dots in the same order, the same softmax, 8 V lanes folded
/// by `hsum8`), so `o` is bit-identical to one call of `head` per token and head (tested).
/// Needs `hd % 8 == 0`.
///
/// How: positions go in blocks of [`PB`], widened into a block of scratch that stays in L1
/// while every token and head uses it (`arch/x86/attention.rs` has the loops). Scores for
/// two heads at a time, 4 positions a step (one K row load serves both heads), each
/// position's 8 FMA lanes in its own register and the 8 folds done together (the same
/// additions as `hsum8`); an odd group's last head alone, 8 positions a step. The softmax is
/// `head`'s. V on AVX2: lane by lane, tiles of up to 4 heads by 16 outputs, each of `head`'s
/// lane-major accumulators (position `p` in lane `p % 8`) loaded, run over the block's
/// positions below the token's `len` and stored back; `head`'s positions from `len` to the
/// next multiple of 8 add `fma(0, 0, acc) = acc`, so skipping them changes nothing. On
/// AVX-512, V 16 (or 32) outputs at a time per head, over the positions to that multiple of 8,
/// with zero rows and weights there (the tile's block may hold later tokens' rows, so that
/// group runs from a zeroed copy). Tiles of tokens: widening per token and KV head had been a
/// large share of a long prefill's attention.
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
    caches: (&[half::f16], &[half::f16]),
    row_of: F,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    // AVX-512 widens 16 halves per instruction and runs V 16 outputs at a time. One token
    // with at most 3 query heads per KV head reads the rows in place; more heads would need a
    // second pass over the rows (registers hold 3 heads' V sums), which was slower than one
    // widened block from about 2048 positions (`attn_bench`, 4 and 8 heads per KV head).
    let f = crate::CpuFeatures::get();
    let one = lens.len() == 1 && g <= crate::kernels::attention::grouped_one::MAX_HEADS;
    if hd.is_multiple_of(16) && f.avx512f && f.avx512vl && one {
        // SAFETY: AVX-512F and VL detected just above, the rest by this function's contract.
        unsafe {
            crate::kernels::attention::grouped_one::heads_one(
                hd,
                g,
                q_of(0),
                lens[0],
                caches,
                row_of,
                scale,
                s,
                o,
            )
        }
    } else if hd.is_multiple_of(16) && f.avx512f {
        // SAFETY: AVX-512F detected just above, the rest by this function's contract.
        unsafe { heads_f16_512(hd, g, q_of, lens, caches, row_of, scale, s, o) }
    } else {
        // SAFETY: AVX2, FMA and F16C by this function's contract.
        unsafe { heads_body::<Q, F, false>(hd, g, q_of, lens, caches, row_of, scale, s, o) }
    }
}

/// [`heads_f16`] with AVX-512F enabled, so that the row widening inlines into the loops over
/// a block's rows (a call per 64-half row had been a sixth of a decode step's attention) and
/// the compiler may use the wider registers elsewhere (the order of every operation stays
/// the one written, so the bits do not change).
///
/// # Safety
/// The caller detected AVX2, FMA, F16C and AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
unsafe fn heads_f16_512<'q, Q: Fn(usize) -> &'q [f32], F: Fn(usize) -> usize>(
    hd: usize,
    g: usize,
    q_of: Q,
    lens: &[usize],
    caches: (&[half::f16], &[half::f16]),
    row_of: F,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    // SAFETY: the features of this function's contract, AVX-512F included.
    unsafe { heads_body::<Q, F, true>(hd, g, q_of, lens, caches, row_of, scale, s, o) }
}

/// [`heads_f16`]'s body; `WIDE`: AVX-512F's widening and V loop (`hd % 16 == 0`).
///
/// # Safety
/// As [`heads_f16`], and AVX-512F detected when `WIDE`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
unsafe fn heads_body<'q, Q: Fn(usize) -> &'q [f32], F: Fn(usize) -> usize, const WIDE: bool>(
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
    let tt = lens.len();
    assert!(hd > 0 && hd.is_multiple_of(8) && g > 0 && o.len() == tt * g * hd);
    assert!(g <= 64, "at most 64 query heads per KV head");
    s.q.clear();
    s.q.resize(tt * g * hd, 0.0);
    for (j, dst) in s.q.chunks_exact_mut(g * hd).enumerate() {
        // SAFETY: AVX2 and F16C, as this function's own contract.
        unsafe { crate::kernels::arch::x86::fdot16::f16_round_into(q_of(j), dst) };
    }
    let max_len = lens.iter().copied().max().unwrap_or(0);
    // Scores and V rows run to a multiple of 8, the padding zeros: `fma(0, 0, acc) = acc` for
    // every accumulator (they start at +0, so are never -0), so no loop needs a tail of lanes.
    // Token j's scores start at `j * g * stride`, head h's `h * stride` after that.
    let stride = max_len.next_multiple_of(8);
    s.k.resize(PB * hd, 0.0);
    s.scores.clear();
    s.scores.resize(tt * g * stride, 0.0);
    let widen = |src: &[half::f16], dst: &mut [f32]| {
        if WIDE {
            // SAFETY: AVX-512F detected (`WIDE`, this function's contract).
            unsafe { widen16(src, dst) }
        } else {
            // SAFETY: F16C, by this function's contract.
            unsafe { crate::kernels::attention::kv::f16_to_f32_f16c(src, dst) }
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
            // Heads two at a time (a K row load serves both), the last one of an odd group
            // alone.
            let mut h = 0;
            while h < g {
                let two = h + 1 < g;
                let q = |h: usize| &s.q[(j * g + h) * hd..(j * g + h + 1) * hd];
                let at = (j * g + h) * stride + p0;
                // Head h's row, and head h + 1's one `stride` further on.
                let (mine, next) = s.scores[at..].split_at_mut(if two { stride } else { n });
                let (row0, row1) = (&mut mine[..n], &mut next[..if two { n } else { 0 }]);
                // SAFETY: `n` rows of `hd` floats in `kb`, `hd` in each query, `n` scores in
                // each row; AVX2/FMA/F16C enabled here.
                let (m0, m1) = unsafe {
                    if two {
                        scores_pair(kb, (q(h), q(h + 1)), scale, (row0, row1))
                    } else {
                        (scores_one(kb, q(h), scale, row0), f32::NEG_INFINITY)
                    }
                };
                maxes[j][h] = maxes[j][h].max(m0);
                if two {
                    maxes[j][h + 1] = maxes[j][h + 1].max(m1);
                }
                h += if two { 2 } else { 1 };
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
            if !WIDE {
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
                // SAFETY: AVX-512F detected (`WIDE`); shapes as asserted by the callee.
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
    // Each output is `hsum8` of its 8 lane accumulators: the same additions, 8 outputs at a
    // time (`((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`, float addition commuting bit for bit).
    for (jh, oh) in o.chunks_exact_mut(hd).enumerate() {
        let acc = &s.acc[jh * 8 * hd..(jh + 1) * 8 * hd];
        for (d, od) in oh.chunks_exact_mut(8).enumerate() {
            use std::arch::x86_64::*;
            // SAFETY: 8 rows of `hd` floats in `acc`, 8 outputs from `8 d < hd` (hd % 8 == 0);
            // AVX by this function's contract.
            unsafe {
                let l = |i: usize| _mm256_loadu_ps(acc.as_ptr().add(i * hd + 8 * d));
                let lo = _mm256_add_ps(_mm256_add_ps(l(0), l(4)), _mm256_add_ps(l(2), l(6)));
                let hi = _mm256_add_ps(_mm256_add_ps(l(1), l(5)), _mm256_add_ps(l(3), l(7)));
                _mm256_storeu_ps(od.as_mut_ptr(), _mm256_add_ps(lo, hi));
            }
        }
    }
}

/// Tokens per tile of [`heads_f16`].
pub(crate) const TILE: usize = 16;

/// Positions per block of [`heads_f16`] (64 rows of 64 floats: 16 KiB).
const PB: usize = 64;

/// The ggml path over an f16 cache with grouped query heads: runs [`heads_f16`] on the pool
/// for every KV head and every run of up to [`TILE`] consecutive tokens of one sequence, and
/// returns `true`; returns `false` (nothing written) where it does not apply: no F16C, no GQA,
/// `head_dim % 8 != 0`, or an f32 cache. Inputs are
/// validated by the caller (`paged_attention_numerics`). Allocates nothing: task `i` takes
/// tokens `i * TILE..` and splits them where the sequence changes.
#[allow(
    clippy::too_many_arguments,
    reason = "one attention call's validated operands"
)]
pub(crate) fn paged_grouped<T: KvElem>(
    fma: bool,
    s: &crate::kernels::attention::kv::AttentionShape,
    inputs: &crate::kernels::attention::kv::AttentionInputs<'_>,
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
                let row_of = crate::kernels::attention::kv::kv_row_of(s, inputs, a, kvh);
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
#[path = "grouped_tests.rs"]
mod tests;
