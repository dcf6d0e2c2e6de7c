//! Activation rows quantized to ggml's Q8_0 / Q8_1 blocks, as llama.cpp's x86 build does it.
//!
//! Per block of 32 values: `amax = max |x|`, `d = amax / 127`, `id = 127 / amax` (0 when
//! `amax == 0`), `q = round_half_even(x * id)` (`_mm256_round_ps`), and for Q8_1 the sum
//! `s = d * sum(q)`; `d` and `s` are stored as f16 (round to nearest even). This is ggml's
//! `quantize_row_q8_0` / `quantize_row_q8_1` for x86 (AVX and AVX2 builds share it), which
//! differs from ggml's portable reference (`1 / d` and `roundf`) in the last bit of `id` and in
//! ties, so it is what matching llama.cpp's x86 results needs.
//!
//! Invariant: `|q| <= 127` for finite input (so the sign trick of the integer dots never
//! overflows), and `d`, `s` hold the f16-rounded values widened to `f32` (exact), which is what
//! ggml's dots read back. Error: `|x - d * q| <= 0.51 * d + amax * 2^-11` per value (rounding to
//! the grid, and `d` rounded to f16). Cost: O(len), no allocation.

use half::f16;

/// Values per block.
pub const QK8: usize = 32;

/// One quantized block of 32 activations (Q8_0, or Q8_1 with `s`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(8))]
pub struct BlockQ8 {
    pub qs: [i8; QK8],
    /// The scale, f16-rounded.
    pub d: f32,
    /// Q8_1 only: `d * sum(qs)`, f16-rounded (0 for Q8_0).
    pub s: f32,
}

impl Default for BlockQ8 {
    fn default() -> Self {
        BlockQ8 {
            qs: [0; QK8],
            d: 0.0,
            s: 0.0,
        }
    }
}

#[inline(always)]
fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Quantizes `x` (whole blocks: `x.len() == 32 * out.len()`) into `out`; `with_sum` fills `s`
/// (Q8_1). See the module docs for the arithmetic.
///
/// # Panics
/// If the lengths disagree (internal invariant; callers size `out` from `x`).
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8], with_sum: bool) {
    assert_eq!(x.len(), out.len() * QK8, "quantize_row_q8 lengths");
    #[cfg(target_arch = "x86_64")]
    let f = crate::CpuFeatures::get();
    if f.avx2 && f.f16c {
        // SAFETY: AVX2 (which implies SSE4.1's `roundps`) and F16C were just detected.
        unsafe { quantize_avx2(x, out, with_sum) };
        return;
    }
    quantize(x, out, with_sum);
}

/// [`quantize`] in AVX2 registers: the same IEEE steps (`|x|` maxima in lanes, then across them;
/// `x * id` rounded half-even by `vroundps`; saturating packs, which are the clamp), so the same
/// bits, about 10x faster than the scalar loop (whose per-value rounding and clamp did not
/// vectorize: 3.6 ns a value, a tenth of a 512-token prefill). Eight blocks share their
/// divisions and their f16 roundings (`vdivps`, `vcvtps2ph` to nearest even, exact like the
/// scalar steps lane by lane): per block, two scalar divisions and four conversions through
/// `half` had been most of a decode step's quantizing (about 2% of its time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn quantize_avx2(x: &[f32], out: &mut [BlockQ8], with_sum: bool) {
    for (xs, ys) in x.chunks(8 * QK8).zip(out.chunks_mut(8)) {
        // SAFETY: AVX2 and F16C are enabled here; `xs` holds `32 * ys.len()` values (the
        // caller's lengths agree) and `ys` at most 8 blocks.
        unsafe { quantize8_avx2(xs, ys, with_sum) };
    }
}

/// Up to 8 blocks of [`quantize_avx2`].
///
/// # Safety
/// AVX2 and F16C enabled; `x.len() == 32 * out.len()`, `out.len() <= 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize8_avx2(x: &[f32], out: &mut [BlockQ8], with_sum: bool) {
    use std::arch::x86_64::*;
    let n = out.len();
    // SAFETY: every load reads inside block `b < n` of `x`, every store inside `out[b].qs` or
    // the local arrays; the features are the caller's.
    unsafe {
        let load = |b: usize| -> [__m256; 4] {
            std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(QK8 * b + 8 * i)))
        };
        let sign = _mm256_set1_ps(-0.0);
        let mut amax = [0.0f32; 8];
        for (b, a) in amax.iter_mut().enumerate().take(n) {
            // `max(a, m)` keeps `m` where `a` is NaN, as the scalar fold's `f32::max` does; no
            // lane is NaN, so the order of the maxima does not matter.
            let mut m = _mm256_setzero_ps();
            for vi in load(b) {
                m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
            }
            let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            *a = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        }
        let am = _mm256_loadu_ps(amax.as_ptr());
        let k127 = _mm256_set1_ps(127.0);
        let d = _mm256_div_ps(am, k127);
        // `127 / amax`, and 0 where `amax == 0` (never NaN).
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(am, _mm256_setzero_ps());
        let id = _mm256_andnot_ps(zero, _mm256_div_ps(k127, am));
        let (mut ids, mut ds) = ([0.0f32; 8], [0.0f32; 8]);
        _mm256_storeu_ps(ids.as_mut_ptr(), id);
        _mm256_storeu_ps(ds.as_mut_ptr(), round_f16x8(d));
        let mut sums = [0i32; 8];
        for b in 0..n {
            let v = load(b);
            let idb = _mm256_set1_ps(ids[b]);
            let r: [__m256i; 4] = std::array::from_fn(|i| {
                let q = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[i], idb),
                );
                // A NaN converts to `i32::MIN` here but to 0 through the scalar `as i32`.
                _mm256_cvtps_epi32(_mm256_and_ps(q, _mm256_cmp_ps::<_CMP_ORD_Q>(q, q)))
            });
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(r[0], r[1]),
                _mm256_packs_epi32(r[2], r[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(out[b].qs.as_mut_ptr().cast(), p);
            if with_sum {
                let s =
                    _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
                let s4 = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
                let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
                let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b10_11_00_01>(s4));
                sums[b] = _mm_cvtsi128_si32(s4);
            }
        }
        // `d * sum` with the unrounded `d`, then rounded to f16 (exact sums: |sum| <= 32 * 127).
        let mut ss = [0.0f32; 8];
        if with_sum {
            let sum = _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.as_ptr().cast()));
            _mm256_storeu_ps(ss.as_mut_ptr(), round_f16x8(_mm256_mul_ps(d, sum)));
        }
        for (b, yb) in out.iter_mut().enumerate() {
            yb.d = ds[b];
            yb.s = ss[b];
        }
    }
}

/// Each lane rounded to f16 (nearest even) and widened back: [`round_f16`] lane by lane.
/// (`arch/x86/fdot16.rs` has the same step on arrays, but it sits above this module: the
/// kernels' scratch needs the activation blocks defined here.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn round_f16x8(v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
}

/// [`quantize_row_q8`] split over the pool when `x` is long (a prefill's rows): blocks are
/// independent, so any split gives the same bits.
pub(crate) fn quantize_rows_q8(
    x: &[f32],
    out: &mut [BlockQ8],
    with_sum: bool,
    pool: &crate::ThreadPool,
) {
    assert_eq!(x.len(), out.len() * QK8, "quantize_rows_q8 lengths");
    const CHUNK: usize = 1024;
    if out.len() < 2 * CHUNK || pool.n_threads() < 2 {
        quantize_row_q8(x, out, with_sum);
        return;
    }
    pool.for_each_chunk_mut(
        out,
        CHUNK,
        || (),
        |_, i, o| {
            let at = i * CHUNK * QK8;
            quantize_row_q8(&x[at..at + o.len() * QK8], o, with_sum);
        },
    );
}

#[inline(always)]
fn quantize(x: &[f32], out: &mut [BlockQ8], with_sum: bool) {
    for (xb, yb) in x.chunks_exact(QK8).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            // |v * id| <= 127 up to rounding, so the cast never saturates for finite input.
            let r = (v * id).round_ties_even() as i32;
            sum += r;
            *q = r.clamp(-128, 127) as i8;
        }
        yb.d = round_f16(d);
        yb.s = if with_sum {
            round_f16(d * sum as f32)
        } else {
            0.0
        };
    }
}

/// Values per super-block.
pub(crate) const QK_K: usize = 256;

/// One Q8_K activation block.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub(crate) struct BlockQ8K {
    pub(crate) qs: [i8; QK_K],
    pub(crate) bsums: [i16; 16],
    /// `-32 * bsums[s]` as `i32`: the Q6_K dot's offset term (its quants are stored `+ 32`),
    /// kept here so the 8-row loop starts each sub-block's sum from it with one broadcast load
    /// instead of converting and subtracting per sub-block and row group.
    pub(crate) q6_offsets: [i32; 16],
    pub(crate) d: f32,
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            qs: [0; QK_K],
            bsums: [0; 16],
            q6_offsets: [0; 16],
            d: 0.0,
        }
    }
}

/// Quantizes `x` (whole super-blocks) into Q8_K blocks `out`, as ggml's `quantize_row_q8_K`
/// (see `matmul/qdot_k.rs`'s module docs).
pub(crate) fn quantize_row_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            // |iscale * v| <= 127 up to rounding; the clamp keeps -128 out (sign tricks).
            *q = ((iscale * v).round_ties_even() as i32).clamp(-127, 127) as i8;
        }
        for (s, c) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = c.iter().map(|&q| i16::from(q)).sum();
        }
        for (o, &s) in yb.q6_offsets.iter_mut().zip(&yb.bsums) {
            *o = -32 * i32::from(s);
        }
        yb.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn grid_bound_ties_and_sum() {
        let mut rng = Rng::new(7);
        let x = rng.vec(32 * 64, -3.0, 3.0);
        let mut q = vec![BlockQ8::default(); 64];
        quantize_row_q8(&x, &mut q, true);
        for (xb, b) in x.chunks_exact(32).zip(&q) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sum: i32 = b.qs.iter().map(|&v| i32::from(v)).sum();
            assert_eq!(b.d, round_f16(amax / 127.0));
            assert_eq!(b.s, round_f16(amax / 127.0 * sum as f32));
            for (&v, &qv) in xb.iter().zip(&b.qs) {
                assert!(qv.unsigned_abs() <= 127);
                let err = (v - b.d * f32::from(qv)).abs();
                assert!(
                    err <= 0.51 * b.d + amax * 2f32.powi(-11),
                    "{v} {qv} {}",
                    b.d
                );
            }
        }
        // amax 127: id = 1, so 0.5 and 2.5 are ties that go to even; -0 and 0 give 0.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = 2.5;
        x[3] = -1.5;
        x[4] = -0.0;
        let mut b = [BlockQ8::default()];
        quantize_row_q8(&x, &mut b, false);
        assert_eq!(&b[0].qs[..5], &[127, 0, 2, -2, 0]);
        assert_eq!((b[0].d, b[0].s), (1.0, 0.0));
        // An all-zero block quantizes to zeros with d = 0.
        quantize_row_q8(&[0.0; 32], &mut b, true);
        assert_eq!(b[0], BlockQ8::default());
    }

    #[test]
    fn the_vector_and_pooled_paths_give_the_scalar_bits() {
        let mut rng = Rng::new(11);
        // Values at every scale, exact ties (x.5 after scaling by id = 1), zeros and a NaN.
        let mut x: Vec<f32> = (0..32 * 3000)
            .map(|i| rng.uniform(-1.0, 1.0) * 10f32.powi(i % 7 - 3))
            .collect();
        x[..32]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 - 15.5);
        x[31] = 127.0;
        x[32..64].fill(0.0);
        x[70] = f32::NAN;
        x[100] = f32::INFINITY;
        let bits = |v: &[BlockQ8]| -> Vec<(Vec<i8>, u32, u32)> {
            v.iter()
                .map(|b| (b.qs.to_vec(), b.d.to_bits(), b.s.to_bits()))
                .collect()
        };
        // Rows of 1 to 19 blocks: the vector path takes 8 blocks at a time, then the rest.
        for blocks in 1..20 {
            for with_sum in [false, true] {
                let xs = &x[..32 * blocks];
                let mut want = vec![BlockQ8::default(); blocks];
                quantize(xs, &mut want, with_sum);
                let mut got = vec![BlockQ8::default(); blocks];
                quantize_row_q8(xs, &mut got, with_sum);
                assert_eq!(bits(&got), bits(&want), "{blocks} blocks, sum {with_sum}");
            }
        }
        for with_sum in [false, true] {
            let mut want = vec![BlockQ8::default(); 3000];
            quantize(&x, &mut want, with_sum);
            let mut got = vec![BlockQ8::default(); 3000];
            quantize_row_q8(&x, &mut got, with_sum);
            let first_diff =
                |a: &[BlockQ8]| bits(a).iter().zip(bits(&want)).position(|(x, y)| *x != y);
            assert_eq!(first_diff(&got), None, "row path, sum {with_sum}");
            let pool = crate::ThreadPool::new(3).unwrap();
            let mut par = vec![BlockQ8::default(); 3000];
            quantize_rows_q8(&x, &mut par, with_sum, &pool);
            assert_eq!(first_diff(&par), None, "pooled, sum {with_sum}");
        }
    }
}
