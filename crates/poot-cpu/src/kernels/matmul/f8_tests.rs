//! The FP8 matmul: every ISA and thread count bit-identical to the portable loop, within the
//! module's bound of the exact float64 product of the dequantized weights (`e4m3(q) * d` in
//! f64) with the activations; every E4M3 code widened exactly; NaN codes give NaN.

use poot_core::quant::hf_fp8::e4m3_to_f32;
use poot_core::quant::layout::f8_s;
use poot_core::DType;

use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::MatmulPath;
use crate::testutil::{synthetic_weights, Rng};
use crate::Isa;

/// The stored-layout FP8 matmul under ggml numerics on `isa` with `threads`.
fn run(isa: Isa, threads: usize, x: &[f32], t: usize, k: usize, w: &[u8], n: usize) -> Vec<f32> {
    crate::kernels::matmul::q8::tests::run(isa, threads, DType::F8_S, x, t, k, w, n)
}

/// Per output: the exact f64 product and the module's bound.
fn exact_and_bound(x: &[f32], t: usize, k: usize, w: &[u8], n: usize) -> (Vec<f64>, Vec<f64>) {
    let rb = k / 32 * f8_s::BYTES;
    let gamma = (k / 32 + 8) as f64 * 2f64.powi(-24) * 1.01;
    let (mut want, mut tol) = (vec![0.0; t * n], vec![0.0; t * n]);
    for tok in 0..t {
        for row in 0..n {
            let (mut exact, mut mass) = (0.0f64, 0.0f64);
            for i in 0..k {
                let blk = &w[row * rb + i / 32 * f8_s::BYTES..][..f8_s::BYTES];
                let d = f32::from_le_bytes(blk[f8_s::D.range()].try_into().unwrap());
                let wv = f64::from(e4m3_to_f32(blk[f8_s::QS.offset + i % 32])) * f64::from(d);
                let p = wv * f64::from(x[tok * k + i]);
                exact += p;
                mass += p.abs();
            }
            want[tok * n + row] = exact;
            tol[tok * n + row] = gamma * mass;
        }
    }
    (want, tol)
}

#[test]
fn every_isa_is_bit_identical_and_within_the_bound() {
    // 13 rows: three groups of 4 and a ragged one; t = 1, 2, 3, 5: both token tiles.
    for (n, k) in [(13, 96), (8, 256)] {
        let w = synthetic_weights(DType::F8_S, n, k, 11);
        for t in [1, 2, 3, 5] {
            let mut rng = Rng::new(40 + t as u32);
            let x: Vec<f32> = (0..t * k)
                .map(|i| rng.uniform(-1.0, 1.0) * if i % 37 == 0 { 8.0 } else { 1.0 })
                .collect();
            let first = run(Isa::Scalar, 1, &x, t, k, &w, n);
            for isa in Isa::available() {
                for threads in [1, 2, 3] {
                    let got = run(isa, threads, &x, t, k, &w, n);
                    let same = got
                        .iter()
                        .zip(&first)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "n={n} k={k} t={t}: {isa:?} x{threads} differs from scalar"
                    );
                }
            }
            let (want, tol) = exact_and_bound(&x, t, k, &w, n);
            for i in 0..t * n {
                let err = (f64::from(first[i]) - want[i]).abs();
                assert!(
                    err <= tol[i],
                    "t={t} [{i}]: |{} - {}| = {err:e} > {:e}",
                    first[i],
                    want[i],
                    tol[i]
                );
            }
        }
    }
}

/// One row of `k = 256` (scale 1) with code `c` at column `c`, the NaN codes replaced by `nan`.
fn every_code(nan: u8) -> Vec<u8> {
    let mut w = vec![0u8; 8 * f8_s::BYTES];
    for (b, blk) in w.chunks_exact_mut(f8_s::BYTES).enumerate() {
        blk[f8_s::D.range()].copy_from_slice(&1.0f32.to_le_bytes());
        for j in 0..32 {
            let code = (32 * b + j) as u8;
            blk[f8_s::QS.offset + j] = if code & 0x7f == 0x7f { nan } else { code };
        }
    }
    w
}

#[test]
fn every_e4m3_code_reads_exactly() {
    // Against one-hot activations the output is the code's value, exactly.
    let w = every_code(0);
    for isa in Isa::available() {
        for code in (0..256usize).filter(|c| c & 0x7f != 0x7f) {
            let mut x = vec![0.0f32; 256];
            x[code] = 1.0;
            let got = run(isa, 1, &x, 1, 256, &w, 1)[0];
            // A -0 code times +0 activations elsewhere sums to +0: compare values.
            assert_eq!(got, e4m3_to_f32(code as u8), "{isa:?} code {code:#04x}");
        }
    }
}

#[test]
fn nan_codes_give_nan() {
    for nan in [0x7f, 0xff] {
        let w = every_code(nan);
        let x = vec![1.0f32; 256];
        for isa in Isa::available() {
            let got = run(isa, 1, &x, 1, 256, &w, 1)[0];
            assert!(got.is_nan(), "{isa:?} code {nan:#04x}: {got}");
        }
    }
}

#[test]
fn fp8_takes_its_path_under_ggml_only() {
    assert_eq!(
        MatmulPath::choose(Numerics::Ggml, DType::F8_S),
        MatmulPath::F8
    );
    assert_eq!(
        MatmulPath::choose(Numerics::Exact, DType::F8_S),
        MatmulPath::Decoded
    );
}
