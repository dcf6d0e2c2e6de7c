//! The exact-numerics attention ([`Numerics::Exact`](crate::kernels::ggml::Numerics)) after the KV
//! write and validation (`attention/mod.rs`): every token attends to its sequence's positions
//! `0..=position` read back from the cache.
//!
//! Per output head: scores `s_p = dot(q, k_p) * scale`, `dot` in 8 `f32` lanes of separate
//! multiplies and adds (lane `i % 8`), the lanes summed as `((0+4) + (1+5)) + ((2+6) + (3+7))`,
//! then the `head_dim % 8` tail in order; `m = max_p s_p`; `e_p = expf(s_p - m)` with ggml's
//! `expf` (within 1.95 ulp of `exp`); `sum` of the `e_p` in position order; `out = (sum_p e_p
//! * v_p) * (1 / sum)`, each output element's terms added in position order.
//!
//! Two paths compute exactly that, so they give the same bits (tested):
//! - [`grouped_avx2`] (AVX2, an `f32` cache, `head_dim % 8 == 0`): one task per token and KV
//!   head runs the KV head's query heads together, so each K and V row is read once per group
//!   instead of once per head, in `ymm` registers (the per-head path's loops compiled to SSE
//!   with spills; measurements: `docs/performance-history.md`, "Measurements behind the kernels").
//! - [`head`]: any element type and head size, one task per token and query head.
//!
//! Results do not depend on the thread count. Scratch: `group * (max position + 1)` floats per
//! thread.

use crate::kernels::attention::kv::{kv_row_of, AttentionInputs, AttentionShape, KvElem};
use crate::kernels::ggml;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Isa;
use crate::pool::{SharedMut, ThreadPool};

/// Query heads per KV head [`grouped_avx2`] takes (more take the per-head path).
const MAX_GROUP: usize = 64;

/// Every token's attention into `out` (`[t, n_heads, head_dim]`); `inputs` and the caches were
/// validated by `attention/mod.rs` (every table entry a token reads is a block in range).
pub(crate) fn attend<T: KvElem>(
    s: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    (k_cache, v_cache): (&[T], &[T]),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let fma = Isa::detect() != Isa::Scalar;
    let group = s.n_heads / s.n_kv_heads;
    #[cfg(target_arch = "x86_64")]
    if let (true, true, Some(kc), Some(vc)) = (
        fma,
        s.head_dim.is_multiple_of(8) && group <= MAX_GROUP,
        T::as_f32(k_cache),
        T::as_f32(v_cache),
    ) {
        let gd = group * s.head_dim;
        let t = inputs.positions.len();
        let shared = SharedMut::new(out);
        // KV head by KV head: the tasks a core runs in a row read the same rows, which then
        // stay in its L2 (token-major order cycled through every head's rows, the whole
        // layer's cache, from L3).
        pool.for_each_init(
            t * s.n_kv_heads,
            || Scratch::<f32>::zeroed(0),
            |scores, i| {
                let (kvh, tok) = (i / t, i % t);
                let idx = tok * s.n_kv_heads + kvh;
                // SAFETY: task `i` is claimed once and `idx` is a distinct chunk of `out` for
                // every `i` (a bijection of `0..t * n_kv_heads`).
                let o = unsafe { shared.slice_mut(idx * gd..(idx + 1) * gd) };
                let len = inputs.positions[tok] as usize + 1;
                let q = &inputs.q[idx * gd..(idx + 1) * gd];
                let row_of = kv_row_of(s, inputs, tok, kvh);
                scores.clear();
                scores.resize(group * len, 0.0);
                // SAFETY: `fma` means a SIMD path was detected, and every one includes AVX2 and
                // FMA; the shapes are `grouped_avx2`'s (head_dim % 8 == 0 checked above).
                unsafe { grouped_avx2(s, q, (kc, vc), row_of, len, scores, o) };
            },
        );
        return;
    }
    pool.for_each_chunk_mut(
        out,
        s.head_dim,
        || Scratch::<f32>::zeroed(0),
        |scores, idx, o| {
            let (tok, h) = (idx / s.n_heads, idx % s.n_heads);
            let len = inputs.positions[tok] as usize + 1;
            let q = &inputs.q[idx * s.head_dim..(idx + 1) * s.head_dim];
            let row_of = kv_row_of(s, inputs, tok, h / group);
            head(fma, s, q, (k_cache, v_cache), row_of, len, 0.0, scores, o);
        },
    );
}

/// One query head `q` over positions `0..len` (rows at `row_of(p)`) into `o` (see the module
/// docs). `softcap > 0` replaces each score `s` by `tanh(s * (1 / softcap)) * softcap` (llama.cpp's
/// order) before the softmax; `0` leaves the scores as they are.
#[allow(clippy::too_many_arguments, reason = "one head's inputs")]
pub(crate) fn head<T: KvElem>(
    fma: bool,
    s: &AttentionShape,
    q: &[f32],
    (k_cache, v_cache): (&[T], &[T]),
    row_of: impl Fn(usize) -> usize,
    len: usize,
    softcap: f32,
    scores: &mut Scratch<f32>,
    o: &mut [f32],
) {
    let hd = s.head_dim;
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for p in 0..len {
        let r = row_of(p);
        let mut sc = dot_kv(q, &k_cache[r..r + hd]) * s.scale;
        if softcap > 0.0 {
            sc = (sc * (1.0 / softcap)).tanh() * softcap;
        }
        max = max.max(sc);
        scores.push(sc);
    }
    exp_shifted(fma, scores, max);
    let mut sum = 0.0f32;
    for sc in scores.iter() {
        sum += *sc;
    }
    o.fill(0.0);
    for (p, &e) in scores.iter().enumerate() {
        let r = row_of(p);
        for (acc, &v) in o.iter_mut().zip(&v_cache[r..r + hd]) {
            *acc += e * v.to_f32();
        }
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x *= inv);
}

/// [`head`] for the `g = o.len() / head_dim` query heads of one KV head at once (`q` holds
/// them in order), an `f32` cache, `head_dim % 8 == 0`: the same operations per output, so
/// the same bits. `scores` holds `g * len` floats (head `i`'s at `i * len`).
///
/// # Safety
/// The caller detected AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn grouped_avx2(
    s: &AttentionShape,
    q: &[f32],
    (k_cache, v_cache): (&[f32], &[f32]),
    row_of: impl Fn(usize) -> usize,
    len: usize,
    scores: &mut [f32],
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = s.head_dim;
    let g = o.len() / hd;
    assert!(hd.is_multiple_of(8) && q.len() == g * hd && scores.len() == g * len);
    assert!(g <= MAX_GROUP && len > 0);
    // Scores 8 positions at a time: each position's 8 lanes in its own register, the 8 lane
    // sums done together (`sums8`, the same additions as `lane_sum`).
    let whole = len - len % 8;
    let mut rows = [0usize; 8];
    for p0 in (0..whole).step_by(8) {
        for (j, r) in rows.iter_mut().enumerate() {
            *r = row_of(p0 + j);
        }
        for i in 0..g {
            let qi = &q[i * hd..(i + 1) * hd];
            // SAFETY: 8 floats at each offset c < hd of `qi` and of every row (validated rows
            // of `hd` floats; hd % 8 == 0, asserted); 8 scores from `i * len + p0` (p0 + 8 <=
            // len); AVX2 by this function's contract.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in (0..hd).step_by(8) {
                    let qv = _mm256_loadu_ps(qi.as_ptr().add(c));
                    for (a, &r) in acc.iter_mut().zip(&rows) {
                        let kv = _mm256_loadu_ps(k_cache[r..r + hd].as_ptr().add(c));
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(qv, kv));
                    }
                }
                let sums = _mm256_mul_ps(sums8(&acc), _mm256_set1_ps(s.scale));
                _mm256_storeu_ps(scores.as_mut_ptr().add(i * len + p0), sums);
            }
        }
    }
    // The last `len % 8` positions one at a time, in `dot_kv`'s order (the same additions).
    for p in whole..len {
        let r = row_of(p);
        for i in 0..g {
            scores[i * len + p] = dot_kv(&q[i * hd..(i + 1) * hd], &k_cache[r..r + hd]) * s.scale;
        }
    }
    let mut inv = [0.0f32; MAX_GROUP];
    for (i, si) in scores.chunks_exact_mut(len).enumerate() {
        let max = si.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        exp_shifted(true, si, max);
        let mut sum = 0.0f32;
        for e in si.iter() {
            sum += *e;
        }
        inv[i] = 1.0 / sum;
    }
    // V by blocks of positions (their rows stay in L1 while every head reads them), each
    // head's outputs 64 at a time in 8 registers across the block: each output still adds
    // its terms in position order from 0, so the same bits as one pass.
    o.fill(0.0);
    let mut rows = [0usize; PB];
    for p0 in (0..len).step_by(PB) {
        let pe = (p0 + PB).min(len);
        for (j, r) in rows[..pe - p0].iter_mut().enumerate() {
            *r = row_of(p0 + j);
        }
        let rows = &rows[..pe - p0];
        for (i, oi) in o.chunks_exact_mut(hd).enumerate() {
            let e = &scores[i * len + p0..i * len + pe];
            for c0 in (0..hd).step_by(64) {
                let w = 64.min(hd - c0);
                // SAFETY: every row is `hd` floats of `v_cache` (validated), `oi` holds `hd`,
                // and `c0 + w <= hd` with `w % 8 == 0`; AVX2 by this function's contract.
                unsafe { v_block(v_cache, rows, c0, e, &mut oi[c0..c0 + w]) };
            }
        }
    }
    for (oi, &f) in o.chunks_exact_mut(hd).zip(&inv) {
        oi.iter_mut().for_each(|x| *x *= f);
    }
}

/// Positions per block of [`grouped_avx2`]'s V pass (32 rows of a 64-wide head: 8 KiB).
const PB: usize = 32;

/// `o[d] += e[j] * v_j[c0 + d]` for the rows `v_j` at `rows[j]`, `j` in order, `o` up to 64
/// floats (a multiple of 8) held in registers across the rows.
///
/// # Safety
/// AVX2 enabled; `rows[j] + c0 + o.len() <= v_cache.len()` for every row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn v_block(v_cache: &[f32], rows: &[usize], c0: usize, e: &[f32], o: &mut [f32]) {
    use std::arch::x86_64::*;
    let nj = o.len() / 8;
    assert!(o.len().is_multiple_of(8) && nj <= 8 && e.len() == rows.len());
    // SAFETY: the loads and stores stay inside `o` and the rows (the caller's contract).
    unsafe {
        let op = o.as_mut_ptr();
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, a) in acc.iter_mut().enumerate().take(nj) {
            *a = _mm256_loadu_ps(op.add(8 * j));
        }
        for (&r, &ep) in rows.iter().zip(e) {
            let ev = _mm256_set1_ps(ep);
            let v = v_cache.as_ptr().add(r + c0);
            // The same loop twice: with a count the compiler sees (64-wide heads, the common
            // case) it unrolls and keeps all eight accumulators in registers.
            if nj == 8 {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(ev, _mm256_loadu_ps(v.add(8 * j))));
                }
            } else {
                for (j, a) in acc.iter_mut().enumerate().take(nj) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(ev, _mm256_loadu_ps(v.add(8 * j))));
                }
            }
        }
        for (j, a) in acc.iter().enumerate().take(nj) {
            _mm256_storeu_ps(op.add(8 * j), *a);
        }
    }
}

/// [`lane_sum`] of 8 registers at once, lane `j` of the result from `acc[j]`: each register's
/// halves added (`0+4, 1+5, 2+6, 3+7`), those 4-lane vectors transposed by fours, then `(0 +
/// 1) + (2 + 3)` of the transposed rows, the same additions in the same order.
///
/// # Safety
/// The caller enabled AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums8(acc: &[std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 by this function's contract; register operations only.
    unsafe {
        let h = |v: __m256| _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let quad = |t: [__m128; 4]| {
            let (a, b) = (_mm_unpacklo_ps(t[0], t[1]), _mm_unpackhi_ps(t[0], t[1]));
            let (c, d) = (_mm_unpacklo_ps(t[2], t[3]), _mm_unpackhi_ps(t[2], t[3]));
            let (r0, r1) = (_mm_movelh_ps(a, c), _mm_movehl_ps(c, a));
            let (r2, r3) = (_mm_movelh_ps(b, d), _mm_movehl_ps(d, b));
            _mm_add_ps(_mm_add_ps(r0, r1), _mm_add_ps(r2, r3))
        };
        let lo = quad([h(acc[0]), h(acc[1]), h(acc[2]), h(acc[3])]);
        let hi = quad([h(acc[4]), h(acc[5]), h(acc[6]), h(acc[7])]);
        _mm256_set_m128(hi, lo)
    }
}

/// `dot(q, k)` in 8 lanes (see the module docs).
#[inline]
fn dot_kv<T: KvElem>(q: &[f32], k: &[T]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (qc, kc) = (q.chunks_exact(8), k.chunks_exact(8));
    let (qt, kt) = (qc.remainder(), kc.remainder());
    for (a, b) in qc.zip(kc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l].to_f32();
        }
    }
    let mut s = lane_sum(&acc);
    for (a, b) in qt.iter().zip(kt) {
        s += a * b.to_f32();
    }
    s
}

/// The 8 lanes of a dot summed as `((0+4) + (1+5)) + ((2+6) + (3+7))`.
#[inline(always)]
fn lane_sum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// `s[p] = expf(s[p] - max)` with ggml's `expf`, 8 lanes at a time where `fma`
/// (bit-identical to the scalar [`ggml::expf`] lane by lane, so the result does not depend on
/// the path).
fn exp_shifted(fma: bool, s: &mut [f32], max: f32) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: `fma` means a SIMD path was detected, and every one includes AVX2 and FMA.
        unsafe { exp_shifted_avx2(s, max) };
        done = s.len() - s.len() % 8;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = fma;
    for v in &mut s[done..] {
        *v = ggml::expf(*v - max);
    }
}

/// [`exp_shifted`]'s whole groups of 8.
///
/// # Safety
/// The caller detected AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(s: &mut [f32], max: f32) {
    use std::arch::x86_64::*;
    for c in s.chunks_exact_mut(8) {
        // SAFETY: AVX2 and FMA, this function's contract; 8 floats in `c`. In registers (an
        // array round trip stalls on store-to-load forwarding).
        unsafe {
            let x = _mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), _mm256_set1_ps(max));
            _mm256_storeu_ps(c.as_mut_ptr(), ggml::expf8(x));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// The grouped path (where this CPU has it) against the per-head one, bit for bit: two
    /// sequences on scattered blocks, GQA groups of 1 to 4, head sizes below and past 64 (the
    /// V pass's register width), positions crossing blocks, past 8 (the `expf` groups) and
    /// past 32 (the V pass's blocks), scores far apart (the slow `expf` lanes).
    #[test]
    fn grouped_path_is_bit_identical_to_the_per_head_path() {
        let shapes = [(8, 2, 16), (4, 4, 8), (12, 3, 64), (6, 2, 24), (4, 2, 136)];
        for (n_heads, n_kv_heads, hd) in shapes {
            let s = AttentionShape {
                n_heads,
                n_kv_heads,
                head_dim: hd,
                block_size: 8,
                num_blocks: 12,
                max_blocks_per_seq: 6,
                scale: 0.7,
            };
            let rows = s.num_blocks * s.block_size * n_kv_heads * hd;
            let mut rng = Rng::new(hd as u32 + n_heads as u32);
            let k = rng.vec(rows, -3.0, 3.0);
            let v = rng.vec(rows, -1.0, 1.0);
            let tables = vec![7, 2, 9, 0, 11, 4, 1, 10, 3, 6, 8, 5];
            // Past one block of the V pass (32 positions) too.
            let positions = vec![0, 3, 8, 22, 5, 17, 40, 47];
            let token_seq = vec![0, 0, 0, 0, 1, 1, 0, 1];
            let t = positions.len();
            let mut q = rng.vec(t * n_heads * hd, -4.0, 4.0);
            q[..hd].iter_mut().for_each(|x| *x *= 40.0);
            let inputs = AttentionInputs {
                q: &q,
                k: &[],
                v: &[],
                slot_mapping: &[],
                token_seq: &token_seq,
                positions: &positions,
                block_tables: &tables,
            };
            let pool = ThreadPool::new(2).unwrap();
            let mut got = vec![f32::NAN; t * n_heads * hd];
            attend(&s, &inputs, (&k[..], &v[..]), &mut got, &pool);
            let fma = Isa::detect() != Isa::Scalar;
            let mut scores = Scratch::<f32>::zeroed(0);
            for (idx, want) in got.chunks_exact(hd).enumerate() {
                let (tok, h) = (idx / n_heads, idx % n_heads);
                let qh = &q[idx * hd..(idx + 1) * hd];
                let row_of = kv_row_of(&s, &inputs, tok, h / (n_heads / n_kv_heads));
                let len = positions[tok] as usize + 1;
                let mut o = vec![f32::NAN; hd];
                head(
                    fma,
                    &s,
                    qh,
                    (&k[..], &v[..]),
                    row_of,
                    len,
                    0.0,
                    &mut scores,
                    &mut o,
                );
                for (d, (a, b)) in o.iter().zip(want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{n_heads}/{n_kv_heads}x{hd} {idx} {d}"
                    );
                }
            }
        }
    }
}
