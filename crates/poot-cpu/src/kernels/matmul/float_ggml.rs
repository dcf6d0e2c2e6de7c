//! The ggml-numerics matmul for F16 and F32 weights (llama.cpp's AVX2 build).
//!
//! ggml multiplies F16 weights with activations rounded to f16 (`vec_dot_type` F16) and F32
//! weights with the f32 activations, in one of two orders: with `k % 8 == 0`, `n % 4 == 0`,
//! llamafile's tinyBLAS (8 FMA lanes, `ggml::dot_lanes8`); otherwise `ggml_vec_dot_f16` / `_f32`
//! (32 lanes, then a tail in `f64` / fused into the `f32` sum, `ggml::dot_lanes32` /
//! `dot_lanes32_f32`). Reproduced bit for bit; weight decoding is exact. llama.cpp takes
//! tinyBLAS only for two or more tokens; here the shape alone picks the order, for one token
//! too (`matmul/float.rs`), so that a token's result does not depend on the tokens beside it.
//!
//! Bound vs the exact product: F32 weights `(k / 8 + 4) * 2^-24 * sum |w x|`; F16 weights add
//! the activation rounding, `2^-11 * sum |w x|` (the tests assert both).
//!
//! Cost: `2 * t * n * k` flops; memory: a row block of scratch per thread (as `matmul/mod.rs`),
//! plus the rounded activations (`t * k`) for F16.

use crate::kernels::scratch::Scratch;

use crate::kernels::format::Format;
use crate::kernels::ggml::{dot_lanes32, dot_lanes32_f32, dot_lanes8, Numerics};
use crate::kernels::matmul::decoded::{BLOCK_FLOATS, TOKEN_TILE};
use crate::kernels::matmul::float::{self, Order};
use crate::kernels::matmul::lanes8;
use crate::kernels::simd::{self, Checked, Isa, NR};
use crate::pool::{SharedMut, ThreadPool};

/// See the module docs. Shapes were validated by `matmul_numerics`; `p` is F16 or F32.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_float_ggml(
    ck: Checked,
    p: Format,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let tiny = k.is_multiple_of(8) && n.is_multiple_of(4);
    let order = if tiny { Order::Lanes8 } else { Order::Lanes32 };
    if float::applies(ck, p, t, k, order) {
        let mut rounded = Scratch::<f32>::zeroed(0);
        let x = rounded_for(ck, p, x, &mut rounded);
        float::gemv_float(ck, order, p, x, k, (w, row_bytes, n), out, pool);
        return;
    }
    if tiny && lanes8::applies(ck, p, t, k) {
        let f = lanes8::matmul_lanes8;
        f(
            ck,
            (p, Numerics::Ggml),
            x,
            (t, k),
            (w, row_bytes, n),
            out,
            pool,
        );
        return;
    }
    let mut rounded = Scratch::<f32>::zeroed(0);
    let x = rounded_for(ck, p, x, &mut rounded);
    let f16 = p == Format::F16;
    let fma = matches!(ck.isa(), Isa::Avx2 | Isa::Avx512 | Isa::Amx);
    // Row blocks and token tiles as in `matmul_cached` (activations stay in cache).
    let block = (BLOCK_FLOATS / k / NR).clamp(1, 16) * NR;
    let blocks = n.div_ceil(block);
    let (per_task, tasks) = pool.split(blocks);
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || (Scratch::zeroed(block * k), Scratch::zeroed(NR * TOKEN_TILE)),
        |(rows, res), task| {
            for b in task * per_task..((task + 1) * per_task).min(blocks) {
                let n0 = b * block;
                let nr = block.min(n - n0);
                for r in 0..nr {
                    let src = &w[(n0 + r) * row_bytes..(n0 + r + 1) * row_bytes];
                    simd::decode(ck, p, src, &mut rows[r * k..(r + 1) * k]);
                }
                for tok0 in (0..t).step_by(TOKEN_TILE) {
                    let tt = TOKEN_TILE.min(t - tok0);
                    let xs = &x[tok0 * k..(tok0 + tt) * k];
                    for q in (0..nr).step_by(NR) {
                        let quad = &rows[q * k..(q + NR) * k];
                        let live = NR.min(nr - q);
                        for tok in 0..tt {
                            for r in 0..live {
                                let row = &quad[r * k..(r + 1) * k];
                                let xr = &xs[tok * k..(tok + 1) * k];
                                res[tok * NR + r] = dot(fma, tiny, f16, row, xr);
                            }
                        }
                        for tok in 0..tt {
                            for r in 0..live {
                                let i = (tok0 + tok) * n + n0 + q + r;
                                // SAFETY: row n0 + q + r belongs to this task's blocks only,
                                // so no other task writes index i.
                                unsafe { shared.write(i, res[tok * NR + r]) };
                            }
                        }
                    }
                }
            }
        },
    );
}

/// `x` as ggml multiplies it with `p` weights: rounded to f16 (into `buf`) for F16, as given for
/// F32.
fn rounded_for<'a>(ck: Checked, p: Format, x: &'a [f32], buf: &'a mut Scratch<f32>) -> &'a [f32] {
    if p != Format::F16 {
        return x;
    }
    buf.resize(x.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    if ck.isa() != Isa::Scalar {
        // SAFETY: every SIMD path has AVX2 and F16C (`Checked` proves them).
        unsafe { crate::kernels::arch::x86::fdot16::f16_round_into(x, buf) };
        return buf;
    }
    let _ = ck;
    for (d, &v) in buf.iter_mut().zip(x) {
        *d = half::f16::from_f32(v).to_f32();
    }
    buf
}

/// One dot in the order `tiny` and the weight type pick; `fma` says the CPU has FMA (so
/// `mul_add` is one instruction rather than a libm call; the results are the same).
fn dot(fma: bool, tiny: bool, f16: bool, w: &[f32], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: `fma` is true only for a `Checked` AVX2/AVX-512 token, which proves FMA.
        return unsafe { dot_fma(tiny, f16, w, x) };
    }
    let _ = fma;
    dot_any(tiny, f16, w, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_fma(tiny: bool, f16: bool, w: &[f32], x: &[f32]) -> f32 {
    dot_any(tiny, f16, w, x)
}

#[inline(always)]
fn dot_any(tiny: bool, f16: bool, w: &[f32], x: &[f32]) -> f32 {
    match (tiny, f16) {
        (true, _) => dot_lanes8(w, x),
        (false, true) => dot_lanes32(w, x),
        (false, false) => dot_lanes32_f32(w, x),
    }
}

#[cfg(test)]
mod tests {
    use poot_core::DType;

    use crate::kernels::ggml::Numerics;
    use crate::kernels::matmul::matmul_numerics;
    use crate::testutil::{reference, synthetic_weights, Rng};
    use crate::{Isa, ThreadPool};

    #[test]
    fn f16_f32_within_bound_and_identical_across_isas_and_threads() {
        for dt in [DType::F16, DType::F32] {
            // k = 72: one 32-group plus a tail of 8 for the one-token order; n = 8 and 6:
            // tinyBLAS and, for 6 rows, vec_dot even with several tokens.
            // n = 72, k = 1024: two row blocks and several token tiles.
            // n = 36, k = 2056 with 29 tokens: the packed tiles' three k-chunks (the last
            // one 8 long), two full token groups and a partial one (`matmul/lanes8.rs`).
            for (n, k) in [(8, 72), (6, 72), (72, 1024), (36, 2056)] {
                let w = synthetic_weights(dt, n, k, 3);
                let wf = reference(dt, &w, n * k);
                let ts: &[usize] = if k > 2048 { &[2, 29] } else { &[1, 3, 9] };
                for &t in ts {
                    let x = Rng::new(t as u32).vec(t * k, -2.0, 2.0);
                    let mut first: Option<Vec<f32>> = None;
                    for isa in Isa::available() {
                        for threads in [1, 2] {
                            let pool = ThreadPool::new(threads).unwrap();
                            let mut out = vec![f32::NAN; t * n];
                            matmul_numerics(
                                Numerics::Ggml,
                                isa,
                                &x,
                                t,
                                k,
                                &w,
                                dt,
                                n,
                                &mut out,
                                &pool,
                            )
                            .unwrap();
                            match &first {
                                None => first = Some(out),
                                Some(f) => assert!(
                                    f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                                    "{dt} {isa:?} x{threads}"
                                ),
                            }
                        }
                    }
                    let got = first.unwrap();
                    let round = if dt == DType::F16 {
                        2f64.powi(-11)
                    } else {
                        0.0
                    };
                    for tok in 0..t {
                        for r in 0..n {
                            let (mut s, mut a) = (0.0f64, 0.0f64);
                            for i in 0..k {
                                let p = f64::from(wf[r * k + i]) * f64::from(x[tok * k + i]);
                                s += p;
                                a += p.abs();
                            }
                            let tol = ((k / 8 + 4) as f64 * 2f64.powi(-24) + round) * a;
                            let err = (f64::from(got[tok * n + r]) - s).abs();
                            assert!(
                                err <= tol,
                                "{dt} n={n} t={t} [{tok},{r}]: {err:e} > {tol:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}
