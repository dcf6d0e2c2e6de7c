//! The ggml-numerics matmul against the exact f64 product with the unquantized activations,
//! with the bound of the module docs, on real and synthetic weights; and its determinism
//! across ISAs and thread counts.

use poot_core::DType;

use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::matmul_numerics;
use crate::kernels::qact::{quantize_row_q8, BlockQ8};
use crate::testutil::{real_slices, reference, synthetic_weights, Rng};
use crate::{Isa, ThreadPool};

/// Per output: the exact value of `x` (`[t, k]`) times the decoded `w` (`[n, k]`), and the
/// bound of `matmul/q8.rs`' module docs.
fn exact_and_bound(
    dt: DType,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let wf = reference(dt, w, n * k);
    let (rb, bb) = (w.len() / n, dt.block_bytes() as usize);
    let q4_1 = dt == DType::Q4_1;
    let gamma = (k / 32 + 4) as f64 * 2f64.powi(-24) * 1.01 + 2f64.powi(-22);
    let (mut want, mut tol) = (vec![0.0; t * n], vec![0.0; t * n]);
    for tok in 0..t {
        let xr = &x[tok * k..(tok + 1) * k];
        let mut q = vec![BlockQ8::default(); k / 32];
        quantize_row_q8(xr, &mut q, q4_1);
        for row in 0..n {
            let wr = &wf[row * k..(row + 1) * k];
            let (mut exact, mut bound, mut mass) = (0.0f64, 0.0f64, 0.0f64);
            for (b, blk) in q.iter().enumerate() {
                let xb = &xr[b * 32..b * 32 + 32];
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let e = 0.51 * f64::from(blk.d) + f64::from(amax) * 2f64.powi(-11);
                for (i, (&wv, &xv)) in wr[b * 32..b * 32 + 32].iter().zip(xb).enumerate() {
                    let wv = f64::from(wv);
                    exact += wv * f64::from(xv);
                    bound += wv.abs() * e;
                    mass += (wv * f64::from(blk.d) * f64::from(blk.qs[i])).abs();
                }
                if q4_1 {
                    let at = row * rb + b * bb + 2;
                    let m = half::f16::from_le_bytes([w[at], w[at + 1]]).to_f64();
                    let sum_q: i32 = blk.qs.iter().map(|&v| i32::from(v)).sum();
                    let s = f64::from(blk.d) * f64::from(sum_q);
                    bound += (m * s).abs() * 2f64.powi(-10) * 1.01;
                    mass += (m * s).abs();
                }
            }
            want[tok * n + row] = exact;
            tol[tok * n + row] = bound + gamma * mass;
        }
    }
    (want, tol)
}

/// The matmul under ggml numerics on `isa` with `threads` (also the FP8 and k-quant tests'
/// runner, and the reference of `f8r_tests.rs` for FP8).
#[allow(clippy::too_many_arguments, reason = "mirrors matmul_numerics")]
pub(in crate::kernels::matmul) fn run(
    isa: Isa,
    threads: usize,
    dt: DType,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    n: usize,
) -> Vec<f32> {
    let pool = ThreadPool::new(threads).unwrap();
    let mut out = vec![f32::NAN; t * n];
    matmul_numerics(Numerics::Ggml, isa, x, t, k, w, dt, n, &mut out, &pool).unwrap();
    out
}

/// Every ISA and thread count gives the same bits, within the bound of the exact product.
pub(crate) fn check(name: &str, dt: DType, w: &[u8], n: usize, k: usize, seed: u32) {
    let mut worst = 0.0f64;
    for t in [1, 2, 5] {
        let mut rng = Rng::new(seed + t as u32);
        // Activations with outliers, like a transformer's: most small, a few large.
        let x: Vec<f32> = (0..t * k)
            .map(|i| rng.uniform(-1.0, 1.0) * if i % 37 == 0 { 8.0 } else { 1.0 })
            .collect();
        let (want, tol) = exact_and_bound(dt, &x, t, k, w, n);
        let first = run(Isa::Scalar, 1, dt, &x, t, k, w, n);
        for isa in Isa::available() {
            for threads in [1, 2, 3] {
                let got = run(isa, threads, dt, &x, t, k, w, n);
                let same = got
                    .iter()
                    .zip(&first)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} t={t}: {isa:?} x{threads} differs from scalar");
            }
        }
        for i in 0..t * n {
            let err = (f64::from(first[i]) - want[i]).abs();
            assert!(
                err <= tol[i],
                "{name} t={t} [{i}]: |{} - {}| = {err:e} > {:e}",
                first[i],
                want[i],
                tol[i]
            );
            worst = worst.max(err / tol[i]);
        }
    }
    assert!(
        worst > 0.01,
        "{name}: bound is loose by {:.0}x",
        1.0 / worst
    );
}

#[test]
fn real_slices_within_the_quantization_bound() {
    let Some(g) = real_slices() else { return };
    for t in g.tensors() {
        if !matches!(
            t.dtype,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0
        ) {
            continue;
        }
        let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
        check(&t.name, t.dtype, g.tensor_bytes(t), n, k, 5);
    }
}

#[test]
fn synthetic_ragged_rows_within_the_quantization_bound() {
    for dt in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0] {
        // 13 rows: three full groups of 4 and a ragged one; k = 96: three blocks.
        let w = synthetic_weights(dt, 13, 96, 9);
        check(&format!("synthetic {dt}"), dt, &w, 13, 96, 17);
    }
}

#[test]
fn other_dtypes_keep_the_exact_path() {
    let (n, k) = (5, 64);
    let x = Rng::new(2).vec(2 * k, -1.0, 1.0);
    let pool = ThreadPool::new(1).unwrap();
    // (BF16 has its own ggml path since its activations are rounded: `matmul/bf16.rs`.)
    for dt in [DType::Q5_1] {
        let k = if dt.block_elems() == 256 { 256 } else { k };
        let x = &x.iter().cycle().take(2 * k).copied().collect::<Vec<_>>();
        let w = synthetic_weights(dt, n, k, 4);
        let (mut a, mut b) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
        for (numerics, out) in [(Numerics::Exact, &mut a), (Numerics::Ggml, &mut b)] {
            matmul_numerics(numerics, Isa::detect(), x, 2, k, &w, dt, n, out, &pool).unwrap();
        }
        assert_eq!(a, b, "{dt}");
    }
}

#[test]
fn cached_activations_give_the_uncached_bits() {
    use crate::kernels::act_cache::ActCache;
    use crate::kernels::matmul::matmul_cached;
    let (t, k, n) = (3, 512, 8);
    let x = Rng::new(8).vec(t * k, -2.0, 2.0);
    let pool = ThreadPool::new(2).unwrap();
    let mut cache = ActCache::default();
    // Q4_0 then Q8_0 share Q8_0 activations, Q4_1 needs Q8_1, the k-quants Q8_K; a new key
    // (another input) requantizes.
    for (key, dt) in [
        (1, DType::Q4_0),
        (1, DType::Q8_0),
        (1, DType::Q4_1),
        (1, DType::Q4_K),
        (1, DType::Q6_K),
        (2, DType::Q4_0),
    ] {
        let xs: Vec<f32> = if key == 2 {
            x.iter().map(|v| v * 0.5).collect()
        } else {
            x.clone()
        };
        let w = synthetic_weights(dt, n, k, 3);
        let (mut a, mut b) = (vec![0.0; t * n], vec![0.0; t * n]);
        let isa = Isa::detect();
        matmul_numerics(Numerics::Ggml, isa, &xs, t, k, &w, dt, n, &mut a, &pool).unwrap();
        let c = Some((&mut cache, key));
        matmul_cached(Numerics::Ggml, isa, &xs, t, k, &w, dt, n, &mut b, &pool, c).unwrap();
        assert_eq!(a, b, "{dt} key {key}");
    }
}
