//! The one-token (decode) ggml attention path over an f16 cache with grouped query heads: a
//! task runs several query heads of one KV head together, so every K and V row is widened once
//! per task instead of once per query head, and each head's 32 lanes live in two 512-bit
//! registers instead of four 256-bit ones.
//!
//! Numerics: every head's arithmetic is `attention_ggml::head`'s one-token order (ggml's
//! `ggml_vec_dot_f16`: 32 lanes over `head_dim`, the `(0 + 2) + (1 + 3)` fold and two
//! `hadd`s for the scores; the same softmax; V rows added into lane `p % 32`, folded by
//! `fold32`), lane for lane, so outputs are bit-identical to it (tested).
//!
//! Applies to one token, `head_dim % 32 == 0`, 2 to 64 query heads per KV head, an f16 cache
//! and AVX-512F; otherwise the caller keeps the per-head path. A task is a run of two or more
//! of a KV head's query heads, short enough for four tasks per pool thread so that the pool
//! balances (Llama-3.2-1B on 2 threads: whole KV heads of 4; SmolLM2 on one thread: runs of 2
//! and 1); where that leaves runs of one head (SmolLM2 and Qwen2-0.5B on 2 threads), the caller
//! keeps the per-head path. In a 1B Q4_0 decode step on 2 threads: 86-105 -> 76-88 us a
//! layer.
//!
//! Cost: the per-head path's FMAs and a fraction of its widening (one per run of query heads
//! instead of one per query head); scratch: `g * (len + 32 * head_dim)` floats per task.

use super::attention_ggml::{softmax_round, Scratch};
use super::ggml::fold32;
use super::scratch::AttnGuard;

/// Runs [`heads_decode`] for every run of query heads of a one-token step on the pool and
/// returns `true`, or returns `false` (nothing written) where it does not apply (see the
/// module docs). Called by `attention_grouped::paged_grouped`, which checked the shared
/// conditions (F16 cache, FMA, 2 to 64 query heads per KV head); inputs are validated by
/// `paged_attention_numerics`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn paged_decode(
    s: &super::attention::AttentionShape,
    inputs: &super::attention::AttentionInputs<'_>,
    (kc, vc): (&[half::f16], &[half::f16]),
    out: &mut [f32],
    pool: &crate::ThreadPool,
) -> bool {
    let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads.max(1));
    if hd == 0 || !hd.is_multiple_of(32) || !std::arch::is_x86_feature_detected!("avx512f") {
        return false;
    }
    // Tasks are runs of `run` query heads of one KV head, at least four tasks per thread
    // (whole KV heads as tasks had let the pool's second thread, waking late, end the call:
    // SmolLM2's 3 KV heads on 2 threads, 24 -> 44 us a decode layer). A run of one head
    // shares no widening, and measured slower than the per-head path in the engine (SmolLM2
    // on 2 threads: 27-33 -> 32-47 us a layer), so that case keeps it.
    let run = group.min(s.n_heads / (4 * pool.n_threads()));
    if run < 2 {
        return false;
    }
    let per_kv = group.div_ceil(run);
    let kv_row = s.n_kv_heads * hd;
    let seq = inputs.token_seq[0] as usize;
    let table = &inputs.block_tables[seq * s.max_blocks_per_seq..];
    let len = inputs.positions[0] as usize + 1;
    let shared = crate::pool::SharedMut::new(out);
    pool.for_each_init(s.n_kv_heads * per_kv, AttnGuard::take, |scratch, task| {
        let (kvh, part) = (task / per_kv, task % per_kv);
        let row_of =
            |p: usize| super::attention::block_slot(table, s.block_size, p) * kv_row + kvh * hd;
        // Query heads h0..h1 of the step (KV head kvh's are kvh * group.. in order).
        let h0 = kvh * group + part * run;
        let h1 = (h0 + run).min((kvh + 1) * group);
        let q = &inputs.q[h0 * hd..h1 * hd];
        // SAFETY: query heads h0..h1 belong to this task only.
        let o = unsafe { shared.slice_mut(h0 * hd..h1 * hd) };
        let rows = (row_of, s.block_size, kv_row);
        // SAFETY: the caller's `fma` means a SIMD `Isa` was detected (AVX2, FMA, F16C);
        // AVX-512F was detected above.
        unsafe { heads_decode(hd, q, (kc, vc), rows, len, s.scale, scratch, o) };
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
    assert!(hd > 0 && hd.is_multiple_of(32) && q.len() == o.len() && q.len().is_multiple_of(hd));
    let g = q.len() / hd;
    assert!(g <= 64 && run > 0, "at most 64 query heads per KV head");
    let rows = |f: &mut dyn FnMut(usize, usize)| {
        for p0 in (0..len).step_by(run) {
            let base = row_of(p0);
            for i in 0..run.min(len - p0) {
                f(p0 + i, base + i * stride);
            }
        }
    };
    s.q.clear();
    s.q.resize(q.len(), 0.0);
    // SAFETY: AVX2 and F16C, as this function's own contract.
    unsafe { super::fdot16_x86::f16_round_into(q, &mut s.q) };
    s.k.resize(hd, 0.0);
    s.scores.clear();
    s.scores.resize(g * len, 0.0);
    let mut max = [f32::NEG_INFINITY; 64];
    // SAFETY: every load and store below reads or writes 16 floats (or halves) at an offset
    // `i + 16 * c < hd` inside a row of `hd`, of `s.k` (hd floats), of a head's `s.q` (g * hd)
    // or of a lane's accumulator row (`s.acc`: g * 32 * hd); the features are this function's.
    unsafe {
        // Scores: lane `l` of ggml's 32 is lane `l % 16` of `a[l / 16]`, so each lane runs the
        // same FMAs in the same order as `dot_f16c`'s four 8-lane registers.
        rows(&mut |p, r| {
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
        rows(&mut |p, r| {
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
        for (d, od) in oh.iter_mut().enumerate() {
            *od = fold32(&std::array::from_fn(|l| s.acc[(h * 32 + l) * hd + d]));
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::attention_ggml::head;
    use crate::testutil::Rng;
    use half::f16;

    #[test]
    fn grouped_decode_is_bit_identical_to_the_per_head_path() {
        if crate::Isa::detect() == crate::Isa::Scalar || !is_x86_feature_detected!("avx512f") {
            println!("no AVX-512F: nothing to run");
            return;
        }
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
            let cache = |rng: &mut Rng| -> Vec<f16> {
                rng.vec(slots * row, -2.0, 2.0)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect()
            };
            let (kc, vc) = (cache(&mut rng), cache(&mut rng));
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
            let mut got = vec![f32::NAN; g * hd];
            let mut gs = Scratch::default();
            let caches = (&kc[..], &vc[..]);
            let rows = (row_of, 16, row);
            // SAFETY: AVX-512F and a SIMD Isa (AVX2, FMA, F16C) detected; hd % 32 == 0.
            unsafe { heads_decode(hd, &q, caches, rows, len, scale, &mut gs, &mut got) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "hd={hd} g={g} len={len}");
        }
    }

    /// One decode token through `paged_attention_numerics` (ggml numerics): 4 KV heads of 3
    /// query heads on 1 thread (whole KV heads a task) and 16 KV heads of 2 on 2 threads (runs
    /// of 2), against `head` per query head.
    #[test]
    fn paged_decode_matches_the_per_head_path() {
        use crate::kernels::attention::{
            block_slot, paged_attention_numerics, AttentionInputs, AttentionShape, KvCacheMut,
        };
        use crate::kernels::ggml::Numerics;
        if crate::Isa::detect() == crate::Isa::Scalar || !is_x86_feature_detected!("avx512f") {
            return;
        }
        for (nh, nkv, threads) in [(12, 4, 1), (32, 16, 2)] {
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
            let cache: Vec<f16> = rng
                .vec(shape.num_blocks * bs * row, -2.0, 2.0)
                .into_iter()
                .map(f16::from_f32)
                .collect();
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
