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

/// [`head`]'s batched path (two or more tokens in the step) for the `g = q.len() / hd` query
/// heads that share one KV head, over an f16 cache: each K and V row is widened once for all
/// `g` heads instead of once per head. Every head's arithmetic is `head`'s (8-lane dots in the
/// same order, the same softmax, 8 V lanes folded by `hsum8`), so `o` is bit-identical to `g`
/// calls of `head` (tested). Needs `hd % 8 == 0`.
///
/// How: positions go in blocks of [`PB`], widened into a block of scratch that stays in L1
/// while every head uses it. Scores 8 positions at a time, each position's 8 FMA lanes in its
/// own register, the 8 folds done together by [`hsum8x8`] (the same additions as `hsum8`). V in
/// registers: for each head and 8 (or 16, AVX-512) outputs, the 8 lane accumulators (position
/// `p` in lane `p % 8`, `head`'s lane-major layout) are loaded, run over the block's positions
/// and stored back; the same FMAs per output in the same order. Widening all rows into one
/// buffer instead measured no faster: the heads re-read it from L2.
///
/// # Safety
/// The caller detected AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
pub(crate) unsafe fn heads_f16<F: Fn(usize) -> usize>(
    hd: usize,
    q: &[f32],
    k_cache: &[half::f16],
    v_cache: &[half::f16],
    row_of: F,
    len: usize,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    assert!(hd > 0 && hd.is_multiple_of(8) && q.len() == o.len() && q.len().is_multiple_of(hd));
    let g = q.len() / hd;
    s.q.clear();
    s.q.extend(q.iter().map(|&v| half::f16::from_f32(v).to_f32()));
    // Scores and V rows run to a multiple of 8, the padding zeros: `fma(0, 0, acc) = acc` for
    // every accumulator (they start at +0, so are never -0), so no loop needs a tail of lanes.
    let len8 = len.next_multiple_of(8);
    s.k.resize(PB * hd, 0.0);
    s.scores.clear();
    s.scores.resize(g * len8, 0.0);
    let mut max = [f32::NEG_INFINITY; 64];
    assert!(g <= max.len(), "at most 64 query heads per KV head");
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
    for p0 in (0..len).step_by(PB) {
        let n = PB.min(len - p0);
        for p in 0..n {
            let kr = &k_cache[row_of(p0 + p)..][..hd];
            widen(kr, &mut s.k[p * hd..(p + 1) * hd]);
        }
        let kb = &s.k[..];
        for (h, mh) in max.iter_mut().enumerate().take(g) {
            let qh = &s.q[h * hd..(h + 1) * hd];
            let row = &mut s.scores[h * len8 + p0..h * len8 + p0 + n];
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
                        for (j, a) in acc.iter_mut().enumerate() {
                            let k = _mm256_loadu_ps(kb.as_ptr().add((p + j) * hd + i));
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
                    let v =
                        _mm_add_ps(_mm256_extractf128_ps::<1>(acc), _mm256_castps256_ps128(acc));
                    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                    *x = _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v))) * scale;
                    *mh = mh.max(*x);
                }
            }
        }
    }
    for (h, &mh) in max.iter().enumerate().take(g) {
        softmax_round::<half::f16, true>(&mut s.scores[h * len8..h * len8 + len], mh);
    }
    // Pass 2: V, into `head`'s 8 lane-major accumulators per head (`acc[(h * 8 + l) * hd + d]`).
    s.acc.clear();
    s.acc.resize(g * 8 * hd, 0.0);
    for p0 in (0..len8).step_by(PB) {
        let n = PB.min(len8 - p0);
        for p in 0..n {
            let vb = &mut s.k[p * hd..(p + 1) * hd];
            if p0 + p < len {
                widen(&v_cache[row_of(p0 + p)..][..hd], vb);
            } else {
                vb.fill(0.0);
            }
        }
        for h in 0..g {
            let w = &s.scores[h * len8 + p0..h * len8 + p0 + n];
            let acc = &mut s.acc[h * 8 * hd..(h + 1) * 8 * hd];
            // SAFETY: AVX-512F detected for `wide`, AVX2/FMA enabled here; shapes as asserted
            // by the callee.
            unsafe {
                if wide {
                    v_lanes_avx512(&s.k, w, hd, acc);
                } else {
                    v_lanes_avx2(&s.k, w, hd, acc);
                }
            }
        }
    }
    for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
        for (d, od) in oh.iter_mut().enumerate() {
            *od = hsum8(&std::array::from_fn(|l| s.acc[(h * 8 + l) * hd + d]));
        }
    }
}

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

/// `acc[l * hd + d] = fma(v[p][d], w[p], .)` over the block's positions `p % 8 == l` in
/// order (`head`'s V loop on its lane-major accumulators), 8 outputs at a time in registers;
/// `w.len()` is a multiple of 8 (zero weights pad it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn v_lanes_avx2(v: &[f32], w: &[f32], hd: usize, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    let len = w.len();
    assert!(v.len() >= len * hd && acc.len() >= 8 * hd && hd.is_multiple_of(8));
    assert!(len.is_multiple_of(8));
    for d in (0..hd).step_by(8) {
        // SAFETY: rows `p < len` of `hd` floats in `v`, 8 rows of `hd` in `acc` (asserted);
        // AVX2/FMA enabled here.
        unsafe {
            let mut a: [__m256; 8] =
                std::array::from_fn(|l| _mm256_loadu_ps(acc.as_ptr().add(l * hd + d)));
            for (p8, w8) in w.chunks_exact(8).enumerate() {
                for (j, a) in a.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(v.as_ptr().add((8 * p8 + j) * hd + d));
                    *a = _mm256_fmadd_ps(x, _mm256_set1_ps(w8[j]), *a);
                }
            }
            for (l, a) in a.iter().enumerate() {
                _mm256_storeu_ps(acc.as_mut_ptr().add(l * hd + d), *a);
            }
        }
    }
}

/// [`v_lanes_avx2`] 16 outputs at a time (`hd % 16 == 0`): each output's FMAs are the same.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn v_lanes_avx512(v: &[f32], w: &[f32], hd: usize, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    let len = w.len();
    assert!(v.len() >= len * hd && acc.len() >= 8 * hd && hd.is_multiple_of(16));
    assert!(len.is_multiple_of(8));
    for d in (0..hd).step_by(16) {
        // SAFETY: as `v_lanes_avx2`; AVX-512F enabled here.
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

/// The batched ggml path over an f16 cache with grouped query heads: runs [`heads_f16`] for
/// every (token, KV head) of the step on the pool and returns `true`, or returns `false`
/// (nothing written) where it does not apply: one token, no F16C, no GQA, `head_dim % 8 != 0`,
/// or an f32 cache. Inputs are validated by the caller (`paged_attention_numerics`).
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
        if t < 2 || !fma || !(2..=64).contains(&group) || !hd.is_multiple_of(8) {
            return false;
        }
        let kv_row = s.n_kv_heads * hd;
        pool.for_each_chunk_mut(out, group * hd, AttnGuard::take, |scratch, idx, o| {
            let (tok, kvh) = (idx / s.n_kv_heads, idx % s.n_kv_heads);
            let seq = inputs.token_seq[tok] as usize;
            let table = &inputs.block_tables[seq * s.max_blocks_per_seq..];
            let row_of =
                |p: usize| super::attention::block_slot(table, s.block_size, p) * kv_row + kvh * hd;
            let q0 = (tok * s.n_heads + kvh * group) * hd;
            let len = inputs.positions[tok] as usize + 1;
            let q = &inputs.q[q0..q0 + group * hd];
            // SAFETY: `fma` means a SIMD `Isa` was detected (AVX2, FMA, F16C).
            unsafe { heads_f16(hd, q, kc, vc, row_of, len, s.scale, scratch, o) };
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
mod tests {
    use super::*;
    use crate::kernels::attention_ggml::head;
    use crate::testutil::Rng;
    use half::f16;

    #[test]
    fn grouped_heads_are_bit_identical_to_the_per_head_path() {
        if crate::Isa::detect() == crate::Isa::Scalar {
            return;
        }
        let mut rng = Rng::new(12);
        for (hd, g, len) in [
            (64, 3, 1),
            (64, 3, 37),
            (64, 7, 200),
            (128, 4, 9),
            (72, 2, 50),
            (8, 2, 300),
        ] {
            // Two KV heads per cache row; this group reads the second (offset hd).
            let (kv_heads, slots) = (2, len + 5);
            let row = kv_heads * hd;
            let cache = |rng: &mut Rng| -> Vec<f16> {
                rng.vec(slots * row, -2.0, 2.0)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect()
            };
            let (kc, vc) = (cache(&mut rng), cache(&mut rng));
            // Scattered slots: position p lives at slot (p * 7) % slots... kept unique.
            let slot = |p: usize| (p * 7 + 3) % slots;
            let row_of = |p: usize| slot(p) * row + hd;
            let q = rng.vec(g * hd, -3.0, 3.0);
            let scale = (hd as f32).powf(-0.5);
            let mut want = vec![0.0f32; g * hd];
            let mut sc = Scratch::default();
            for h in 0..g {
                let (qh, oh) = (&q[h * hd..(h + 1) * hd], &mut want[h * hd..(h + 1) * hd]);
                head(true, qh, &kc, &vc, row_of, len, scale, true, &mut sc, oh);
            }
            let mut got = vec![f32::NAN; g * hd];
            let mut gs = Scratch::default();
            // SAFETY: a SIMD Isa was detected (AVX2, FMA, F16C).
            unsafe { heads_f16(hd, &q, &kc, &vc, row_of, len, scale, &mut gs, &mut got) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "hd={hd} g={g} len={len}");
        }
    }
}
