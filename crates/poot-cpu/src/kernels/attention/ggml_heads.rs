//! One (token, head) of paged attention in llama.cpp's CPU arithmetic (non-flash path, f16 KV
//! cache, AVX2 build), for [`Numerics::Ggml`](crate::kernels::ggml::Numerics).
//!
//! ggml computes `kq = mul_mat(K, q)`, `p = soft_max_ext(kq, mask, scale)`, `o = mul_mat(V^T,
//! p)` over `n_kv` cache cells (a multiple of 256; cells past the sequence are masked to `-inf`
//! and hold zeros). Reproduced here, per step:
//! 1. `q` is rounded to the cache element (f16: `vec_dot_type` of F16 weights).
//! 2. `kq_p = dot(q, k_p)`: llamafile tinyBLAS's order (llama.cpp's order for a step of two or
//!    more tokens), 8 FMA lanes over `head_dim` then `hsum8`, where `head_dim % 8 == 0`;
//!    otherwise ggml's `ggml_vec_dot_f16`: 32 lanes (`i % 32`), folded `(0+2) + (1+3)` by
//!    8-lane groups, then `hsum8_hadd`, then a tail of `head_dim % 32` products in `f64`.
//! 3. `x_p = kq_p * scale`, `m = max x_p`, `e_p = expf(x_p - m)` with ggml's vector `expf`,
//!    `sum` in `f64` of `hsum8` over aligned groups of 8, `p_p = e_p * (1 / sum) as f32`, then
//!    `p_p` rounded to the cache element.
//! 4. `o_d = dot(v_d, p)` over positions: 8 lanes (`p % 8`) then `hsum8` where `head_dim % 4
//!    == 0`, otherwise `ggml_vec_dot_f16`'s 32 lanes (`p % 32`) and its fold.
//!
//! Batch invariance: the order depends on `head_dim` only, never on how many tokens share the
//! step. llama.cpp takes its one-token order (32 lanes) when a step holds one token, so its
//! answer to a prompt changes with the batch around it and with the chunking of a prefill;
//! poot keeps tinyBLAS's order for every step instead, so a decode step's attention is not
//! llama.cpp's bits but within the f16 rounding bound below of them (prefill steps are).
//!
//! Masked cells contribute exact zeros (`fma(0, 0, acc) = acc`), so iterating only over the
//! sequence's positions `0..len` gives ggml's values bit for bit.
//!
//! Error vs exact attention over the f32 inputs: the f16 rounding of `q`, `k`, `v` and `p`
//! (relative `2^-11` each) dominates; the kernel tests bound it by `2^-9 * (|q||k| scale) +
//! 2^-9 * max |v|` on the output. Cost: as the exact path, plus `head_dim * 32` floats of
//! scratch.

use crate::kernels::attention::kv::KvElem;
use crate::kernels::ggml::{dot_lanes32, dot_lanes8, expf, fold32, hsum8};
use crate::kernels::scratch::AttnScratch as Scratch;

/// Attends one query head `q` over positions `0..len` (cache rows at `row_of(p)`, `q.len()`
/// values each) into `o`; `fma` says the CPU
/// has FMA (the arithmetic is the same either way; see the module docs).
#[allow(clippy::too_many_arguments, reason = "one head's inputs")]
pub(crate) fn head<T: KvElem, F: Fn(usize) -> usize>(
    fma: bool,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    row_of: F,
    len: usize,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: callers pass `fma` true only when a SIMD `Isa` was detected, which includes
        // AVX2, FMA and F16C.
        return unsafe { head_fma(q, k_cache, v_cache, row_of, len, scale, s, o) };
    }
    let _ = fma;
    head_body::<T, F, false>(q, k_cache, v_cache, row_of, len, scale, s, o);
}

/// [`head_body`] compiled with FMA, so `mul_add` is one instruction and the lane loops
/// vectorize.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, reason = "one head's inputs")]
fn head_fma<T: KvElem, F: Fn(usize) -> usize>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    row_of: F,
    len: usize,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    head_body::<T, F, true>(q, k_cache, v_cache, row_of, len, scale, s, o);
}

/// The kernel body; `F16C`: the caller runs with AVX2, FMA and F16C enabled, so cache rows are
/// widened inline with `vcvtph2ps` (the same exact values as the portable conversion).
#[inline(always)]
#[allow(clippy::too_many_arguments, reason = "one head's inputs")]
fn head_body<T: KvElem, F: Fn(usize) -> usize, const F16C: bool>(
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    row_of: F,
    len: usize,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    let hd = q.len();
    s.q.clear();
    s.q.extend(q.iter().map(|&v| T::from_f32(v).to_f32()));
    s.k.resize(hd, 0.0);
    s.scores.clear();
    let tiny_kq = hd.is_multiple_of(8);
    let mut max = f32::NEG_INFINITY;
    for p in 0..len {
        let row = &k_cache[row_of(p)..][..hd];
        let fused = if F16C {
            // SAFETY: `F16C` is true only inside `head_fma` (AVX2, FMA, F16C enabled).
            unsafe { T::dot_f16c(row, &s.q, if tiny_kq { 8 } else { 32 }) }
        } else {
            None
        };
        if let Some(kq) = fused {
            let x = kq * scale;
            max = max.max(x);
            s.scores.push(x);
            continue;
        }
        widen::<T, F16C>(row, &mut s.k);
        let kq = if tiny_kq {
            dot_lanes8(&s.k, &s.q)
        } else {
            dot_lanes32(&s.k, &s.q)
        };
        let x = kq * scale;
        max = max.max(x);
        s.scores.push(x);
    }
    softmax_round::<T, F16C>(&mut s.scores, max);
    let lanes = if hd.is_multiple_of(4) { 8 } else { 32 };
    // Lane-major accumulators (`acc[lane * hd + d]`): the inner loop runs along `d`.
    s.acc.clear();
    s.acc.resize(hd * lanes, 0.0);
    for (p, &w) in s.scores.iter().enumerate() {
        let lane = p & (lanes - 1); // lanes is 8 or 32
        let row = &v_cache[row_of(p)..][..hd];
        // SAFETY: `F16C` is true only inside `head_fma` (AVX2, FMA, F16C enabled).
        if F16C && unsafe { T::axpy_f16c(row, w, &mut s.acc[lane * hd..(lane + 1) * hd]) } {
            continue;
        }
        widen::<T, F16C>(row, &mut s.k);
        for (a, &vd) in s.acc[lane * hd..(lane + 1) * hd].iter_mut().zip(&s.k) {
            *a = vd.mul_add(w, *a);
        }
    }
    for (d, o) in o.iter_mut().enumerate() {
        *o = if lanes == 8 {
            hsum8(&std::array::from_fn(|l| s.acc[l * hd + d]))
        } else {
            fold32(&std::array::from_fn(|l| s.acc[l * hd + d]))
        };
    }
}

/// Step 3 of the module docs on one head's scores (`max` their maximum), in place: ggml's
/// `expf`, the `f64` sum of `hsum8` groups, `p * (1 / sum)` rounded to the cache element.
#[inline(always)]
pub(crate) fn softmax_round<T: KvElem, const F16C: bool>(scores: &mut [f32], max: f32) {
    let mut sum = 0.0f64;
    for chunk in scores.chunks_mut(8) {
        let mut e = [0.0f32; 8];
        #[cfg(target_arch = "x86_64")]
        if F16C && chunk.len() == 8 {
            use std::arch::x86_64::*;
            // SAFETY: `F16C` is true only inside `head_fma` or `heads_f16` (AVX2, FMA, F16C
            // enabled); 8 floats in `chunk`. In registers: the array round trip had stalled
            // on store-to-load forwarding, a third of a prefill's attention on a Zen 3.
            unsafe {
                let x = _mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), _mm256_set1_ps(max));
                let e = crate::kernels::ggml::expf8(x);
                _mm256_storeu_ps(chunk.as_mut_ptr(), e);
                sum += f64::from(crate::kernels::ggml::hsum8v(e));
            }
            continue;
        }
        for (x, e) in chunk.iter_mut().zip(e.iter_mut()) {
            *x = expf(*x - max);
            *e = *x;
        }
        sum += f64::from(hsum8(&e));
    }
    let inv = (1.0 / sum) as f32;
    // SAFETY: `F16C` is true only inside `head_fma` or `heads_f16` (AVX2, FMA, F16C enabled).
    if !(F16C && unsafe { T::scale_round_f16c(scores, inv) }) {
        for x in scores.iter_mut() {
            *x = T::from_f32(*x * inv).to_f32();
        }
    }
}

/// One cache row to f32 (see [`head_body`]'s `F16C`).
#[inline(always)]
fn widen<T: KvElem, const F16C: bool>(src: &[T], dst: &mut [f32]) {
    if F16C {
        // SAFETY: `F16C` is true only inside `head_fma`, which runs with AVX2 and F16C
        // enabled after the caller detected them.
        unsafe { T::slice_to_f32_f16c(src, dst) }
    } else {
        T::slice_to_f32(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::attention::kv::{AttentionInputs, AttentionShape, KvCacheMut};
    use crate::kernels::attention::paged_attention_numerics;
    use crate::kernels::ggml::Numerics;
    use crate::testutil::Rng;
    use crate::ThreadPool;
    use half::f16;

    /// One sequence in one block; `t` new tokens at positions `p0..p0 + t` attend to all
    /// earlier ones (`hist` holds the f32 K/V rows the cache was written from).
    #[allow(clippy::too_many_arguments, reason = "a test scenario")]
    fn step(
        hd: usize,
        p0: usize,
        t: usize,
        rng: &mut Rng,
        cache: &mut (Vec<f16>, Vec<f16>),
        hist: &mut Vec<(Vec<f32>, Vec<f32>)>,
    ) {
        let (n_heads, n_kv) = (4, 2);
        let shape = AttentionShape {
            n_heads,
            n_kv_heads: n_kv,
            head_dim: hd,
            block_size: 64,
            num_blocks: 1,
            max_blocks_per_seq: 1,
            scale: (hd as f32).powf(-0.5),
        };
        let q = rng.vec(t * n_heads * hd, -2.0, 2.0);
        let k = rng.vec(t * n_kv * hd, -2.0, 2.0);
        let v = rng.vec(t * n_kv * hd, -1.0, 1.0);
        for i in 0..t {
            let r = i * n_kv * hd..(i + 1) * n_kv * hd;
            hist.push((k[r.clone()].to_vec(), v[r].to_vec()));
        }
        let pos: Vec<i32> = (p0..p0 + t).map(|p| p as i32).collect();
        let inputs = AttentionInputs {
            q: &q,
            k: &k,
            v: &v,
            slot_mapping: &pos,
            token_seq: &vec![0; t],
            positions: &pos,
            block_tables: &[0],
        };
        let mut outs = Vec::new();
        for threads in [1, 3] {
            let (mut kc, mut vc) = cache.clone();
            let mut out = vec![f32::NAN; t * n_heads * hd];
            let c = KvCacheMut {
                k: &mut kc,
                v: &mut vc,
            };
            let pool = ThreadPool::new(threads).unwrap();
            paged_attention_numerics(Numerics::Ggml, &shape, &inputs, c, &mut out, &pool).unwrap();
            outs.push(out);
            *cache = (kc, vc);
        }
        assert!(outs[0]
            .iter()
            .zip(&outs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // The bound of the module docs against exact attention over the f32 inputs.
        for i in 0..t {
            for h in 0..n_heads {
                let qh = &q[(i * n_heads + h) * hd..][..hd];
                let kvh = (h / (n_heads / n_kv)) * hd;
                let len = p0 + i + 1;
                let scores: Vec<f64> = hist[..len]
                    .iter()
                    .map(|(k, _)| {
                        let s: f64 = (0..hd)
                            .map(|d| f64::from(qh[d]) * f64::from(k[kvh + d]))
                            .sum();
                        s * f64::from(shape.scale)
                    })
                    .collect();
                let big_s = hist[..len]
                    .iter()
                    .map(|(k, _)| {
                        (0..hd)
                            .map(|d| f64::from((qh[d] * k[kvh + d]).abs()))
                            .sum::<f64>()
                    })
                    .fold(0.0, f64::max)
                    * f64::from(shape.scale);
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let tol = 2f64.powi(-9) * big_s + 2f64.powi(-9) + (len + 8) as f64 * 2f64.powi(-23);
                for d in 0..hd {
                    let want: f64 = (0..len)
                        .map(|p| e[p] / sum * f64::from(hist[p].1[kvh + d]))
                        .sum();
                    let got = f64::from(outs[0][(i * n_heads + h) * hd + d]);
                    assert!(
                        (got - want).abs() <= tol,
                        "hd {hd} tok {i} head {h} [{d}]: {got} vs {want}, bound {tol:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn prefill_then_decode_within_the_f16_bound_and_thread_independent() {
        // 64: both ggml orders; 12: the one-token dot for K (12 % 8 != 0); 8: all-tail dots.
        for hd in [64, 12, 8] {
            let mut rng = Rng::new(hd as u32);
            let mut cache = (vec![f16::ZERO; 64 * 2 * hd], vec![f16::ZERO; 64 * 2 * hd]);
            let mut hist = Vec::new();
            step(hd, 0, 13, &mut rng, &mut cache, &mut hist);
            for p in 13..40 {
                step(hd, p, 1, &mut rng, &mut cache, &mut hist);
            }
        }
    }

    /// The vector softmax (`F16C`, ggml's `expf` on 8 lanes and the register fold) gives the
    /// scalar one's bits: whole groups of 8 and a tail, scores far below the maximum (the
    /// blended slow path), an exact zero and the maximum itself.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_softmax_is_bit_identical_to_the_scalar_one() {
        use super::softmax_round;
        if !crate::testutil::isa_runs("avx2", crate::CpuFeatures::get().avx2_fma_f16c()) {
            return;
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        fn vector(x: &mut [f32], max: f32) {
            softmax_round::<f16, true>(x, max);
        }
        let mut rng = Rng::new(31);
        for len in [1, 7, 8, 13, 64, 203] {
            let mut x = rng.vec(len, -120.0, 3.0);
            x[len / 2] = 0.0;
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut want = x.clone();
            softmax_round::<f16, false>(&mut want, max);
            // SAFETY: AVX2, FMA and F16C were just detected.
            unsafe { vector(&mut x, max) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x), bits(&want), "len {len}");
        }
    }
}
