//! K-quant integer dots: every ISA and thread count gives the scalar path's bits, within the
//! module's bound of the exact product, on real and synthetic weights.

use poot_core::DType;

use crate::kernels::qact::{quantize_row_q8k, BlockQ8K, QK_K};
use crate::testutil::{real_slices, reference, synthetic_weights, Rng};
use crate::Isa;

#[test]
fn q8k_rounding_bound_and_block_sums() {
    let x = Rng::new(3).vec(2 * QK_K, -4.0, 4.0);
    let mut q = vec![BlockQ8K::default(); 2];
    quantize_row_q8k(&x, &mut q);
    for (xb, b) in x.chunks_exact(QK_K).zip(&q) {
        for (i, (&v, &qv)) in xb.iter().zip(&b.qs).enumerate() {
            assert!(qv != -128);
            let err = (v - b.d * f32::from(qv)).abs();
            assert!(
                err <= 0.5 * b.d.abs() * (1.0 + 1e-6),
                "{i}: {v} {qv} {}",
                b.d
            );
        }
        for (j, s) in b.bsums.iter().enumerate() {
            let want: i16 = b.qs[16 * j..16 * j + 16]
                .iter()
                .map(|&v| i16::from(v))
                .sum();
            assert_eq!(*s, want);
        }
    }
    let mut z = [BlockQ8K::default()];
    quantize_row_q8k(&[0.0; QK_K], &mut z);
    assert_eq!((z[0].d, z[0].qs), (0.0, [0; QK_K]));
}

use crate::kernels::matmul::q8::tests::run;

/// Exact products in f64 with the module's bound, per output.
fn exact_and_bound(
    dt: DType,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let wf = reference(dt, w, n * k);
    let nb = k / QK_K;
    let (mut want, mut tol) = (vec![0.0; t * n], vec![0.0; t * n]);
    for tok in 0..t {
        let xr = &x[tok * k..(tok + 1) * k];
        let mut q = vec![BlockQ8K::default(); nb];
        quantize_row_q8k(xr, &mut q);
        for row in 0..n {
            let (mut exact, mut round, mut mass) = (0.0f64, 0.0f64, 0.0f64);
            for i in 0..k {
                let (wv, b) = (f64::from(wf[row * k + i]), &q[i / QK_K]);
                exact += wv * f64::from(xr[i]);
                round += wv.abs() * 0.5 * f64::from(b.d).abs() * (1.0 + 2f64.powi(-20));
                mass += (wv * f64::from(b.d) * f64::from(b.qs[i % QK_K])).abs();
            }
            want[tok * n + row] = exact;
            tol[tok * n + row] = round + (nb + 2) as f64 * 2f64.powi(-23) * mass;
        }
    }
    (want, tol)
}

fn check(name: &str, dt: DType, w: &[u8], n: usize, k: usize, seed: u32) {
    let mut worst = 0.0f64;
    for t in [1, 3] {
        let mut rng = Rng::new(seed + t as u32);
        let x: Vec<f32> = (0..t * k)
            .map(|i| rng.uniform(-1.0, 1.0) * if i % 37 == 0 { 8.0 } else { 1.0 })
            .collect();
        let (want, tol) = exact_and_bound(dt, &x, t, k, w, n);
        let first = run(Isa::Scalar, 1, dt, &x, t, k, w, n);
        for isa in Isa::available() {
            for threads in [1, 3] {
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
            worst = worst.max(err / tol[i]);
            assert!(
                err <= tol[i],
                "{name} t={t} [{i}]: |{} - {}| = {err:e} > {:e}",
                first[i],
                want[i],
                tol[i]
            );
        }
    }
    eprintln!("{name}: worst error {worst:.3} of the bound");
    assert!(
        worst > 0.01,
        "{name}: bound is loose by {:.0}x",
        1.0 / worst
    );
}

#[test]
fn synthetic_k_quants_within_the_bound_on_every_path() {
    for dt in [DType::Q4_K, DType::Q6_K] {
        let w = synthetic_weights(dt, 9, 2 * QK_K, 11);
        check(&format!("synthetic {dt}"), dt, &w, 9, 2 * QK_K, 21);
    }
}

#[test]
fn real_k_quant_slices_within_the_bound() {
    let Some(g) = real_slices() else { return };
    for t in g.tensors() {
        if !matches!(t.dtype, DType::Q4_K | DType::Q6_K) {
            continue;
        }
        let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
        check(&t.name, t.dtype, g.tensor_bytes(t), n.min(64), k, 5);
    }
}
