//! The 8-row FP8 layout and its matmul: the layout rebuilds every stored row; every ISA, thread
//! count and token count gives, bit for bit, the stored layout's portable result (and so its
//! error bound, `f8_tests.rs`); a tensor with a NaN code is not re-laid.

use poot_core::quant::layout::f8_s;
use poot_core::DType;

use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::repack_f8::RepackedF8;
use crate::kernels::matmul::{matmul_repacked, repack_for};
use crate::testutil::{synthetic_weights, Rng};
use crate::{Isa, ThreadPool};

fn stored(isa: Isa, x: &[f32], t: usize, k: usize, w: &[u8], n: usize) -> Vec<u32> {
    let out = crate::kernels::matmul::q8::tests::run(isa, 1, DType::F8_S, x, t, k, w, n);
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_layout_rebuilds_every_stored_row() {
    for (n, k) in [(13, 96), (8, 32), (3, 64)] {
        let w = synthetic_weights(DType::F8_S, n, k, 7);
        let rp = RepackedF8::new(&w, n, k / 32).expect("no NaN codes");
        assert_eq!(rp.bytes(), n.div_ceil(8) * (k / 32) * 288);
        let rb = k / 32 * f8_s::BYTES;
        let mut row = vec![0u8; rb];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            assert_eq!(row, w[r * rb..(r + 1) * rb], "n={n} k={k} row {r}");
        }
    }
}

#[test]
fn every_isa_and_token_count_matches_the_stored_rows_bit_for_bit() {
    // 13 rows: a group and a ragged one; 24: three groups over 3 threads; t up to 11: one
    // token, passes of 2..8, and a full pass plus a partial one.
    // (A single block a row repeats its scale trivially: the grouped layout, `f8g_tests.rs`.)
    for (n, k) in [(13, 96), (24, 256), (8, 64)] {
        let w = synthetic_weights(DType::F8_S, n, k, 11 + n as u32);
        for t in [1, 2, 3, 8, 11] {
            let mut rng = Rng::new(70 + t as u32);
            let x: Vec<f32> = (0..t * k)
                .map(|i| rng.uniform(-1.0, 1.0) * if i % 37 == 0 { 8.0 } else { 1.0 })
                .collect();
            let want = stored(Isa::Scalar, &x, t, k, &w, n);
            for isa in Isa::available() {
                let rp = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, n, k)
                    .unwrap()
                    .expect("F8_S is re-laid under ggml numerics");
                assert!(matches!(rp, Repack::F8(_)), "{isa:?}");
                for threads in [1, 2, 3] {
                    let pool = ThreadPool::new(threads).unwrap();
                    let mut out = vec![f32::NAN; t * n];
                    matmul_repacked(isa, &x, t, k, &rp, &mut out, &pool).unwrap();
                    let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "n={n} k={k} t={t}: {isa:?} x{threads}");
                }
            }
        }
    }
}

#[test]
fn every_finite_code_reads_exactly() {
    // One row per 32 codes (scale 1), one-hot activations: each output is a code's value.
    let n = 8;
    let mut w = vec![0u8; n * f8_s::BYTES];
    for (r, blk) in w.chunks_exact_mut(f8_s::BYTES).enumerate() {
        blk[f8_s::D.range()].copy_from_slice(&1.0f32.to_le_bytes());
        for j in 0..32 {
            let code = (32 * r + j) as u8;
            blk[f8_s::QS.offset + j] = if code & 0x7f == 0x7f { 0 } else { code };
        }
    }
    for isa in Isa::available() {
        let rp = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, n, 32)
            .unwrap()
            .unwrap();
        let pool = ThreadPool::new(1).unwrap();
        for j in 0..32 {
            let mut x = vec![0.0f32; 32];
            x[j] = 1.0;
            let mut out = vec![f32::NAN; n];
            matmul_repacked(isa, &x, 1, 32, &rp, &mut out, &pool).unwrap();
            for (r, &got) in out.iter().enumerate() {
                let code = (32 * r + j) as u8;
                let code = if code & 0x7f == 0x7f { 0 } else { code };
                let want = poot_core::quant::hf_fp8::e4m3_to_f32(code);
                assert_eq!(got, want, "{isa:?} code {code:#04x}");
            }
        }
    }
}

#[test]
fn a_nan_code_keeps_the_stored_layout() {
    for nan in [0x7f, 0xff] {
        let mut w = synthetic_weights(DType::F8_S, 9, 64, 3);
        w[f8_s::BYTES * 5 + f8_s::QS.offset + 17] = nan;
        assert!(RepackedF8::new(&w, 9, 2).is_none());
        for isa in Isa::available() {
            let rp = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, 9, 64).unwrap();
            assert!(rp.is_none(), "{isa:?} {nan:#04x}");
        }
    }
}
