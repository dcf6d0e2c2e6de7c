//! The one-token (decode) ggml attention path over an f16 cache with grouped query heads: a
//! task runs several query heads of one KV head together, so every K and V row is widened once
//! per task instead of once per query head, and each head's 32 lanes live in two 512-bit
//! registers instead of four 256-bit ones.
//!
//! Numerics: every head's arithmetic is `attention::ggml::head`'s one-token order (ggml's
//! `ggml_vec_dot_f16`: 32 lanes over `head_dim`, the `(0 + 2) + (1 + 3)` fold and two
//! `hadd`s for the scores; the same softmax; V rows added into lane `p % 32`, folded by
//! `fold32`), lane for lane, so outputs are bit-identical to it (tested).
//!
//! Applies to one token, `head_dim % 32 == 0`, 2 to 64 query heads per KV head and an f16
//! cache, in 512-bit registers with AVX-512F ([`heads_decode`]) and in 256-bit ones with AVX2
//! ([`heads_decode_avx2`]); otherwise the caller keeps the per-head path. A task is a run of
//! two or more of a KV head's query heads, short enough for four tasks per pool thread where
//! the heads allow (Llama-3.2-1B on 2 threads: whole KV heads of 4; SmolLM2 and Qwen2-0.5B:
//! runs of 2 and a last run of 1).
//!
//! The cache rows of a decode step come from DRAM, so [`cache_rows`] prefetches them a few
//! positions ahead. Measurements of both: `docs/performance-history.md`, "Measurements behind the
//! kernels". Each head's 32 lane rows are folded eight outputs at a time ([`fold32_rows`]), also by
//! the per-head path.
//!
//! Cost: the per-head path's FMAs and a fraction of its widening (one per run of query heads
//! instead of one per query head); scratch: `g * (len + 32 * head_dim)` floats per task.

use crate::kernels::arch::x86::attention::fold32_rows;
use crate::kernels::attention::ggml::softmax_round;
use crate::kernels::scratch::AttnGuard;
use crate::kernels::scratch::AttnScratch as Scratch;

/// Runs [`heads_decode`] for every run of query heads of a one-token step on the pool and
/// returns `true`, or returns `false` (nothing written) where it does not apply (see the
/// module docs). Called by `attention::grouped::paged_grouped`, which checked the shared
/// conditions (F16 cache, FMA, 2 to 64 query heads per KV head); inputs are validated by
/// `paged_attention_numerics`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn paged_decode(
    s: &crate::kernels::attention::kv::AttentionShape,
    inputs: &crate::kernels::attention::kv::AttentionInputs<'_>,
    (kc, vc): (&[half::f16], &[half::f16]),
    out: &mut [f32],
    pool: &crate::ThreadPool,
) -> bool {
    let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads.max(1));
    if hd == 0 || !hd.is_multiple_of(32) {
        return false;
    }
    let avx512 = crate::CpuFeatures::get().avx512f;
    // Tasks are runs of `run` query heads of one KV head, at least four tasks per thread
    // (whole KV heads as tasks had let the pool's second thread, waking late, end the call:
    // SmolLM2's 3 KV heads on 2 threads, 24 -> 44 us a decode layer), but at least two heads
    // a run: a run of one shares no widening (on the Zen 5 it measured slower than the
    // per-head path). Runs of two against the per-head path on 2 Zen 3 threads: SmolLM2
    // 31-41 us a call either way, Qwen2-0.5B 50-53 -> 44-45 (`attn_bench`: 15-22 against
    // 25-26 us and 21-22 against 34-49 at 64 positions).
    let run = group.min((s.n_heads / (4 * pool.n_threads())).max(2));
    let per_kv = group.div_ceil(run);
    let kv_row = s.n_kv_heads * hd;
    let len = inputs.positions[0] as usize + 1;
    let shared = crate::pool::SharedMut::new(out);
    pool.for_each_init(s.n_kv_heads * per_kv, AttnGuard::take, |scratch, task| {
        let (kvh, part) = (task / per_kv, task % per_kv);
        let row_of = crate::kernels::attention::kv::kv_row_of(s, inputs, 0, kvh);
        // Query heads h0..h1 of the step (KV head kvh's are kvh * group.. in order).
        let h0 = kvh * group + part * run;
        let h1 = (h0 + run).min((kvh + 1) * group);
        let q = &inputs.q[h0 * hd..h1 * hd];
        // SAFETY: query heads h0..h1 belong to this task only.
        let o = unsafe { shared.slice_mut(h0 * hd..h1 * hd) };
        let rows = (row_of, s.block_size, kv_row);
        // SAFETY: the caller's `fma` means a SIMD `Isa` was detected (AVX2, FMA, F16C);
        // `avx512` says AVX-512F was detected above.
        unsafe {
            if avx512 {
                heads_decode(hd, q, (kc, vc), rows, len, s.scale, scratch, o)
            } else {
                heads_decode_avx2(hd, q, (kc, vc), rows, len, s.scale, scratch, o)
            }
        };
    });
    true
}

/// `head`'s one-token path for `g = q.len() / hd` query heads that share one KV head,
/// over positions `0..len` into `o` (`g * hd` values, heads in order); see the module docs.
/// `rows = (row_of, run, stride)`: position `p`'s cache row starts at `row_of(p)`, and within
/// each run of `run` positions from a multiple of `run` (a KV block) the rows are `stride`
/// apart, so `row_of` (a block-table lookup with a division) runs once per block.
///
/// # Safety
/// The caller detected AVX-512F, AVX2, FMA and F16C; `hd % 32 == 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
pub(crate) unsafe fn heads_decode<F: Fn(usize) -> usize>(
    hd: usize,
    q: &[f32],
    (k_cache, v_cache): (&[half::f16], &[half::f16]),
    (row_of, run, stride): (F, usize, usize),
    len: usize,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 and F16C, as this function's own contract.
    let g = unsafe { prepare(hd, q, o.len(), run, len, s) };
    let rows = |cache: &[half::f16], f: &mut dyn FnMut(usize, usize)| {
        cache_rows(len, (&row_of, run, stride), cache, hd, f)
    };
    let mut max = [f32::NEG_INFINITY; 64];
    // SAFETY: every load and store below reads or writes 16 floats (or halves) at an offset
    // `i + 16 * c < hd` inside a row of `hd`, of `s.k` (hd floats), of a head's `s.q` (g * hd)
    // or of a lane's accumulator row (`s.acc`: g * 32 * hd); the features are this function's.
    unsafe {
        // Scores: lane `l` of ggml's 32 is lane `l % 16` of `a[l / 16]`, so each lane runs the
        // same FMAs in the same order as `dot_f16c`'s four 8-lane registers.
        rows(k_cache, &mut |p, r| {
            let kr = &k_cache[r..][..hd];
            for i in (0..hd).step_by(16) {
                let h = _mm256_loadu_si256(kr.as_ptr().add(i).cast());
                _mm512_storeu_ps(s.k.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            for (h, mh) in max.iter_mut().enumerate().take(g) {
                let qh = s.q.as_ptr().add(h * hd);
                let mut a = [_mm512_setzero_ps(); 2];
                for i in (0..hd).step_by(32) {
                    for (c, a) in a.iter_mut().enumerate() {
                        let k = _mm512_loadu_ps(s.k.as_ptr().add(i + 16 * c));
                        *a = _mm512_fmadd_ps(k, _mm512_loadu_ps(qh.add(i + 16 * c)), *a);
                    }
                }
                // `(acc0 + acc2) + (acc1 + acc3)`, then the 128-bit halves, then two `hadd`s.
                let u = _mm512_add_ps(a[0], a[1]);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(u)));
                let v = _mm256_add_ps(_mm512_castps512_ps256(u), hi);
                let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let x = _mm_hadd_ps(x, x);
                let kq = _mm_cvtss_f32(_mm_hadd_ps(x, x));
                let x = kq * scale;
                *mh = mh.max(x);
                s.scores[h * len + p] = x;
            }
        });
        for (h, &mh) in max.iter().enumerate().take(g) {
            softmax_round::<half::f16, true>(&mut s.scores[h * len..(h + 1) * len], mh);
        }
        // V: head h's lane-major accumulators at `acc[(h * 32 + lane) * hd + d]`, position p
        // into lane `p % 32`, as `axpy_f16c` adds it.
        s.acc.clear();
        s.acc.resize(g * 32 * hd, 0.0);
        rows(v_cache, &mut |p, r| {
            let vr = &v_cache[r..][..hd];
            for i in (0..hd).step_by(16) {
                let h = _mm256_loadu_si256(vr.as_ptr().add(i).cast());
                _mm512_storeu_ps(s.k.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            for h in 0..g {
                let w = _mm512_set1_ps(s.scores[h * len + p]);
                let acc = s.acc.as_mut_ptr().add((h * 32 + (p & 31)) * hd);
                for i in (0..hd).step_by(16) {
                    let v = _mm512_loadu_ps(s.k.as_ptr().add(i));
                    _mm512_storeu_ps(
                        acc.add(i),
                        _mm512_fmadd_ps(v, w, _mm512_loadu_ps(acc.add(i))),
                    );
                }
            }
        });
    }
    for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
        // SAFETY: AVX2 by this function's contract; `hd % 8 == 0`.
        unsafe { fold32_rows(&s.acc[h * 32 * hd..(h + 1) * 32 * hd], oh) };
    }
}

/// [`heads_decode`] in 256-bit registers, for AVX2 machines: the same per-lane FMAs, folds and
/// softmax in the same order (ggml's 32 lanes are four `ymm`s here, as in `dot_f16c`), so the
/// outputs are bit-identical to `attention::ggml::head` too (tested). Each K and V row is
/// widened once per task into `s.k` instead of once per query head.
///
/// # Safety
/// The caller detected AVX2, FMA and F16C; `hd % 32 == 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
pub(crate) unsafe fn heads_decode_avx2<F: Fn(usize) -> usize>(
    hd: usize,
    q: &[f32],
    (k_cache, v_cache): (&[half::f16], &[half::f16]),
    (row_of, run, stride): (F, usize, usize),
    len: usize,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 and F16C, as this function's own contract.
    let g = unsafe { prepare(hd, q, o.len(), run, len, s) };
    let rows = |cache: &[half::f16], f: &mut dyn FnMut(usize, usize)| {
        cache_rows(len, (&row_of, run, stride), cache, hd, f)
    };
    let mut max = [f32::NEG_INFINITY; 64];
    // SAFETY: every load and store below reads or writes 8 floats (or halves) at an offset
    // `i + 8 * c < hd` inside a row of `hd`, of `s.k` (hd floats), of a head's `s.q` (g * hd)
    // or of a lane's accumulator row (`s.acc`: g * 32 * hd); the features are this function's.
    unsafe {
        rows(k_cache, &mut |p, r| {
            let kr = &k_cache[r..][..hd];
            for i in (0..hd).step_by(8) {
                let h = _mm_loadu_si128(kr.as_ptr().add(i).cast());
                _mm256_storeu_ps(s.k.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            for (h, mh) in max.iter_mut().enumerate().take(g) {
                let qh = s.q.as_ptr().add(h * hd);
                let mut a = [_mm256_setzero_ps(); 4];
                for i in (0..hd).step_by(32) {
                    for (c, a) in a.iter_mut().enumerate() {
                        let k = _mm256_loadu_ps(s.k.as_ptr().add(i + 8 * c));
                        *a = _mm256_fmadd_ps(k, _mm256_loadu_ps(qh.add(i + 8 * c)), *a);
                    }
                }
                // `(acc0 + acc2) + (acc1 + acc3)`, then the 128-bit halves, then two `hadd`s.
                let v = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
                let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let x = _mm_hadd_ps(x, x);
                let kq = _mm_cvtss_f32(_mm_hadd_ps(x, x));
                let x = kq * scale;
                *mh = mh.max(x);
                s.scores[h * len + p] = x;
            }
        });
        for (h, &mh) in max.iter().enumerate().take(g) {
            softmax_round::<half::f16, true>(&mut s.scores[h * len..(h + 1) * len], mh);
        }
        s.acc.clear();
        s.acc.resize(g * 32 * hd, 0.0);
        rows(v_cache, &mut |p, r| {
            let vr = &v_cache[r..][..hd];
            for i in (0..hd).step_by(8) {
                let h = _mm_loadu_si128(vr.as_ptr().add(i).cast());
                _mm256_storeu_ps(s.k.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            for h in 0..g {
                let w = _mm256_set1_ps(s.scores[h * len + p]);
                let acc = s.acc.as_mut_ptr().add((h * 32 + (p & 31)) * hd);
                for i in (0..hd).step_by(8) {
                    let v = _mm256_loadu_ps(s.k.as_ptr().add(i));
                    _mm256_storeu_ps(
                        acc.add(i),
                        _mm256_fmadd_ps(v, w, _mm256_loadu_ps(acc.add(i))),
                    );
                }
            }
        });
        for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
            fold32_rows(&s.acc[h * 32 * hd..(h + 1) * 32 * hd], oh);
        }
    }
}

/// The grouped paths' shared start: checks the shapes, rounds the `g = q.len() / hd` query
/// heads to f16 into `s.q`, sizes `s.k` (one widened row) and `s.scores` (`g * len`); returns
/// `g`.
///
/// # Safety
/// The caller detected AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prepare(
    hd: usize,
    q: &[f32],
    out_len: usize,
    run: usize,
    len: usize,
    s: &mut Scratch,
) -> usize {
    assert!(hd > 0 && hd.is_multiple_of(32) && q.len() == out_len && q.len().is_multiple_of(hd));
    let g = q.len() / hd;
    assert!(g <= 64 && run > 0, "at most 64 query heads per KV head");
    s.q.clear();
    s.q.resize(q.len(), 0.0);
    // SAFETY: AVX2 and F16C, as this function's own contract.
    unsafe { crate::kernels::arch::x86::fdot16::f16_round_into(q, &mut s.q) };
    s.k.resize(hd, 0.0);
    s.scores.clear();
    s.scores.resize(g * len, 0.0);
    g
}

/// Calls `f(p, row)` for every position `p < len` in order, `row` the offset of its `hd` cache
/// elements (see [`heads_decode`] for `row_of, run, stride`), and prefetches the row
/// [`PREFETCH`] positions ahead into L1. Why: the cache rows of a decode step come from DRAM
/// (every weight streamed since evicted them), a KV head's slice of a row is only `2 * hd`
/// bytes at a `stride` of a whole row, which the hardware prefetchers do not follow, and the
/// dots between two rows are too short for the core to keep enough misses in flight.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn cache_rows<F: Fn(usize) -> usize>(
    len: usize,
    (row_of, run, stride): (&F, usize, usize),
    cache: &[half::f16],
    hd: usize,
    f: &mut dyn FnMut(usize, usize),
) {
    let d = PREFETCH;
    let fetch = |row: usize| {
        // Past the cache's end (never, for validated rows) a prefetch only fetches a useless
        // line; `wrapping_add` keeps the pointer arithmetic defined.
        let bytes = hd * std::mem::size_of::<half::f16>();
        crate::kernels::simd::prefetch_range(cache.as_ptr().wrapping_add(row).cast(), bytes);
    };
    let mut next = if len > 0 { row_of(0) } else { 0 };
    for p0 in (0..len).step_by(run) {
        let (base, n) = (next, run.min(len - p0));
        if p0 + run < len {
            next = row_of(p0 + run);
        }
        for i in 0..n {
            let j = i + d;
            if j < n {
                fetch(base + j * stride);
            } else if j >= run && p0 + j < len && j - run < run {
                fetch(next + (j - run) * stride);
            }
            f(p0 + i, base + i * stride);
        }
    }
}

/// How many positions ahead [`cache_rows`] prefetches: 4 to 8 did best (the dots between two
/// rows are short, so a far prefetch lands too early; see the module docs' measurements).
const PREFETCH: usize = 6;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::attention::ggml::head;
    use crate::kernels::ggml::fold32;
    use crate::testutil::Rng;
    use half::f16;

    #[test]
    fn vector_fold_is_bit_identical_to_fold32() {
        if crate::Isa::detect() == crate::Isa::Scalar {
            return;
        }
        let mut rng = Rng::new(4);
        for hd in [8, 32, 64, 128] {
            // Mixed magnitudes, so the fold's order shows in the low bits.
            let acc: Vec<f32> = rng
                .vec(32 * hd, -1.0, 1.0)
                .into_iter()
                .enumerate()
                .map(|(i, v)| v * [1.0, 1e4, 1e-3, 3e7][i % 4])
                .collect();
            let mut got = vec![f32::NAN; hd];
            // SAFETY: a SIMD Isa (AVX2) was detected; hd % 8 == 0.
            unsafe { fold32_rows(&acc, &mut got) };
            for (d, g) in got.iter().enumerate() {
                let want = fold32(&std::array::from_fn(|l| acc[l * hd + d]));
                assert_eq!(g.to_bits(), want.to_bits(), "hd={hd} d={d}");
            }
        }
    }

    #[test]
    fn grouped_decode_is_bit_identical_to_the_per_head_path() {
        if crate::Isa::detect() == crate::Isa::Scalar {
            return;
        }
        let avx512 = crate::CpuFeatures::get().avx512f;
        let mut rng = Rng::new(21);
        for (hd, g, len) in [
            (64, 4, 1),
            (64, 3, 37),
            (64, 7, 200),
            (128, 4, 33),
            (32, 2, 300),
        ] {
            // Two KV heads per cache row; this group reads the second (offset hd).
            let (kv_heads, slots) = (2, (len + 5usize).next_multiple_of(16));
            let row = kv_heads * hd;
            let (kc, vc) = (
                rng.f16_vec(slots * row, -2.0, 2.0),
                rng.f16_vec(slots * row, -2.0, 2.0),
            );
            // Blocks of 16 slots in a scrambled order: position p in block `p / 16`'s
            // `(b * 5 + 2) % blocks`-th block, offset `p % 16`.
            let blocks = slots / 16;
            let slot = |p: usize| ((p / 16 * 5 + 2) % blocks) * 16 + p % 16;
            let row_of = |p: usize| slot(p) * row + hd;
            let q = rng.vec(g * hd, -3.0, 3.0);
            let scale = (hd as f32).powf(-0.5);
            let mut want = vec![0.0f32; g * hd];
            let mut sc = Scratch::default();
            for h in 0..g {
                let (qh, oh) = (&q[h * hd..(h + 1) * hd], &mut want[h * hd..(h + 1) * hd]);
                head(true, qh, &kc, &vc, row_of, len, scale, false, &mut sc, oh);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            for wide in [false, avx512] {
                let mut got = vec![f32::NAN; g * hd];
                let mut gs = Scratch::default();
                let caches = (&kc[..], &vc[..]);
                let rows = (row_of, 16, row);
                // SAFETY: a SIMD Isa (AVX2, FMA, F16C) detected, AVX-512F where `wide`;
                // hd % 32 == 0.
                unsafe {
                    if wide {
                        heads_decode(hd, &q, caches, rows, len, scale, &mut gs, &mut got)
                    } else {
                        heads_decode_avx2(hd, &q, caches, rows, len, scale, &mut gs, &mut got)
                    }
                };
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "hd={hd} g={g} len={len} avx512={wide}"
                );
            }
        }
    }

    /// One decode token through `paged_attention_numerics` (ggml numerics): 4 KV heads of 3
    /// query heads on 1 thread (whole KV heads a task), 16 KV heads of 2 on 2 threads (runs
    /// of 2), and SmolLM2's and Qwen2-0.5B's heads on 2 threads (runs of 2 and a last run of
    /// 1), against `head` per query head.
    #[test]
    fn paged_decode_matches_the_per_head_path() {
        use crate::kernels::attention::kv::{
            block_slot, AttentionInputs, AttentionShape, KvCacheMut,
        };
        use crate::kernels::attention::paged_attention_numerics;
        use crate::kernels::ggml::Numerics;
        if crate::Isa::detect() == crate::Isa::Scalar {
            return;
        }
        for (nh, nkv, threads) in [(12, 4, 1), (32, 16, 2), (9, 3, 2), (14, 2, 2)] {
            let (hd, bs) = (64, 16);
            let shape = AttentionShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                block_size: bs,
                num_blocks: 9,
                max_blocks_per_seq: 6,
                scale: 0.125,
            };
            // Sequence 1 (the step's) in blocks 8, 3, 5, 0, 6; it holds 70 positions, the step's
            // token is position 70.
            let tables: Vec<i32> = vec![1, 2, 4, 7, -1, -1, 8, 3, 5, 0, 6, -1];
            let mut rng = Rng::new(5);
            let row = nkv * hd;
            let cache: Vec<f16> = rng.f16_vec(shape.num_blocks * bs * row, -2.0, 2.0);
            let (q, k, v) = (
                rng.vec(nh * hd, -2.0, 2.0),
                rng.vec(row, -2.0, 2.0),
                rng.vec(row, -2.0, 2.0),
            );
            let slot_of = |p: usize| block_slot(&tables[6..], bs, p);
            let slots = [slot_of(70) as i32];
            let inputs = AttentionInputs {
                q: &q,
                k: &k,
                v: &v,
                slot_mapping: &slots,
                token_seq: &[1],
                positions: &[70],
                block_tables: &tables,
            };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let (mut kc, mut vc) = (cache.clone(), cache.clone());
            let mut out = vec![f32::NAN; nh * hd];
            let pool = crate::ThreadPool::new(threads).unwrap();
            let kv = KvCacheMut {
                k: &mut kc,
                v: &mut vc,
            };
            paged_attention_numerics(Numerics::Ggml, &shape, &inputs, kv, &mut out, &pool).unwrap();
            let mut sc = Scratch::default();
            let mut want = vec![0.0f32; hd];
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let row_of = |p: usize| slot_of(p) * row + kvh * hd;
                let qh = &q[h * hd..(h + 1) * hd];
                head(
                    true, qh, &kc, &vc, row_of, 71, 0.125, false, &mut sc, &mut want,
                );
                assert_eq!(
                    bits(&out[h * hd..(h + 1) * hd]),
                    bits(&want),
                    "x{threads} head {h}"
                );
            }
        }
    }
}
