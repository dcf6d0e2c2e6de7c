//! The 8-row FP8 layout and its matmul: the layout rebuilds every stored row; the scale span
//! is 4 blocks exactly when every row's scale repeats over each run of 4; every ISA, thread
//! count and token count gives, bit for bit, the portable reference for the layout's span
//! (with one block a span, the stored layout's result, and so its bound, `f8_tests.rs`; with
//! 4, within `f8r.rs`'s bound of the exact float64 product); a tensor with a NaN code is not
//! re-laid. Fixtures shared with the stored layout's tests.

use poot_core::quant::hf_fp8::e4m3_to_f32;
use poot_core::quant::layout::f8_s;
use poot_core::DType;

use crate::kernels::arch::generic::f8dot_generic::dot_scalar_span;
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::f8::tests::{activations, every_code, exact_and_bound, run};
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::repack_f8::{scale_span, RepackedF8};
use crate::kernels::matmul::{matmul_repacked, repack_for};
use crate::testutil::synthetic_weights;
use crate::{Isa, ThreadPool};

/// `w` (`n` rows of `nb` blocks) with each block's scale replaced by the scale of the first
/// block of its run of 4 (as a block-128 checkpoint's).
fn wide_scales(mut w: Vec<u8>, n: usize, nb: usize) -> Vec<u8> {
    for row in w.chunks_exact_mut(nb * f8_s::BYTES).take(n) {
        for run in row.chunks_exact_mut(4 * f8_s::BYTES) {
            let d: [u8; 4] = run[f8_s::D.range()].try_into().unwrap();
            for blk in run.chunks_exact_mut(f8_s::BYTES) {
                blk[f8_s::D.range()].copy_from_slice(&d);
            }
        }
    }
    w
}

/// The 8-row matmul of `rp` on `isa` and `threads`.
fn relaid(isa: Isa, threads: usize, x: &[f32], t: usize, k: usize, rp: &Repack) -> Vec<f32> {
    let pool = ThreadPool::new(threads).unwrap();
    let mut out = vec![f32::NAN; t * rp.n()];
    matmul_repacked(isa, x, t, k, rp, &mut out, &pool).unwrap();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_layout_rebuilds_every_stored_row() {
    for (n, k) in [(13, 96), (8, 32), (3, 64), (13, 256), (9, 128)] {
        let nb = k / 32;
        for (wide, w) in [
            (false, synthetic_weights(DType::F8_S, n, k, 7)),
            (
                true,
                wide_scales(synthetic_weights(DType::F8_S, n, k, 7), n, nb),
            ),
        ] {
            let rp = RepackedF8::new(&w, n, nb).expect("no NaN codes");
            let span = if wide && nb.is_multiple_of(4) { 4 } else { 1 };
            assert_eq!(rp.span, span, "n={n} k={k} wide={wide}");
            assert_eq!(rp.bytes(), n.div_ceil(8) * nb / span * (32 + 256 * span));
            let rb = nb * f8_s::BYTES;
            let mut row = vec![0u8; rb];
            for r in 0..n {
                rp.stored_row(r, &mut row);
                assert_eq!(
                    row,
                    w[r * rb..(r + 1) * rb],
                    "n={n} k={k} wide={wide} row {r}"
                );
            }
        }
    }
}

#[test]
fn the_span_is_wide_only_when_every_scale_repeats() {
    let (n, nb) = (9, 8);
    let w = wide_scales(synthetic_weights(DType::F8_S, n, 32 * nb, 5), n, nb);
    assert_eq!(scale_span(&w, n, nb), 4);
    // One block of the last row with another scale (its bits, not its value: -0 is not 0).
    let mut odd = w.clone();
    let at = ((n - 1) * nb + 6) * f8_s::BYTES;
    odd[at + 3] ^= 0x80;
    assert_eq!(scale_span(&odd, n, nb), 1);
    // Per-channel scales over 6 blocks: not a whole number of 4-block runs.
    let mut chan = synthetic_weights(DType::F8_S, n, 32 * 6, 5);
    for row in chan.chunks_exact_mut(6 * f8_s::BYTES) {
        let d: [u8; 4] = row[f8_s::D.range()].try_into().unwrap();
        for blk in row.chunks_exact_mut(f8_s::BYTES) {
            blk[f8_s::D.range()].copy_from_slice(&d);
        }
    }
    assert_eq!(scale_span(&chan, n, 6), 1);
}

#[test]
fn every_isa_and_token_count_matches_the_reference_bit_for_bit() {
    // 13 rows: a group and a ragged one; 24: three groups over 3 threads; t up to 11: one
    // token, passes of 2..8, and a full pass plus a partial one. Per-block scales (span 1:
    // the stored layout's result) and block-128 ones (span 4, where k allows).
    for (n, k) in [(13, 96), (24, 256), (8, 32), (13, 512)] {
        let nb = k / 32;
        let stored = synthetic_weights(DType::F8_S, n, k, 11 + n as u32);
        for w in [stored.clone(), wide_scales(stored, n, nb)] {
            let span = scale_span(&w, n, nb);
            let rb = nb * f8_s::BYTES;
            for t in [1, 2, 3, 8, 11] {
                let x = activations(t, k, 70 + t as u32);
                let want: Vec<f32> = if span == 1 {
                    run(Isa::Scalar, 1, &x, t, k, &w, n)
                } else {
                    (0..t * n)
                        .map(|i| {
                            let (tok, r) = (i / n, i % n);
                            let xt = &x[tok * k..(tok + 1) * k];
                            dot_scalar_span(&w[r * rb..(r + 1) * rb], xt, span)
                        })
                        .collect()
                };
                for isa in Isa::available() {
                    let rp = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, n, k)
                        .unwrap()
                        .expect("F8_S is re-laid under ggml numerics");
                    assert!(matches!(&rp, Repack::F8(r) if r.span == span), "{isa:?}");
                    for threads in [1, 2, 3] {
                        let got = relaid(isa, threads, &x, t, k, &rp);
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "n={n} k={k} span={span} t={t}: {isa:?} x{threads}"
                        );
                    }
                }
                if span == 4 {
                    // 16 roundings a span and one for its scaled sum, then 3 for the lane sum.
                    let (exact, tol) = exact_and_bound(&x, t, k, &w, n, k / 128 + 20);
                    for i in 0..t * n {
                        let err = (f64::from(want[i]) - exact[i]).abs();
                        assert!(err <= tol[i], "k={k} t={t} [{i}]: {err:e} > {:e}", tol[i]);
                    }
                }
            }
        }
    }
}

#[test]
fn every_finite_code_reads_exactly() {
    // One-hot activations: each output is a code's value. 8 rows of one block (span 1), and
    // the same bytes as one row of 8 blocks with one scale (span 4).
    let w = every_code(0);
    let finite = |code: usize| if code & 0x7f == 0x7f { 0 } else { code as u8 };
    for isa in Isa::available() {
        let rows = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, 8, 32)
            .unwrap()
            .unwrap();
        assert!(matches!(&rows, Repack::F8(r) if r.span == 1));
        for j in 0..32 {
            let mut x = vec![0.0f32; 32];
            x[j] = 1.0;
            for (r, &got) in relaid(isa, 1, &x, 1, 32, &rows).iter().enumerate() {
                let want = e4m3_to_f32(finite(32 * r + j));
                assert_eq!(got, want, "{isa:?} span 1 code {:#04x}", 32 * r + j);
            }
        }
        let one = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, 1, 256)
            .unwrap()
            .unwrap();
        assert!(matches!(&one, Repack::F8(r) if r.span == 4));
        for code in 0..256 {
            let mut x = vec![0.0f32; 256];
            x[code] = 1.0;
            let got = relaid(isa, 1, &x, 1, 256, &one)[0];
            // A -0 code times +0 activations elsewhere sums to +0: compare values.
            assert_eq!(
                got,
                e4m3_to_f32(finite(code)),
                "{isa:?} span 4 code {code:#04x}"
            );
        }
    }
}

#[test]
fn a_nan_code_keeps_the_stored_layout() {
    for nan in [0x7f, 0xff] {
        for k in [64, 128] {
            let mut w = wide_scales(synthetic_weights(DType::F8_S, 9, k, 3), 9, k / 32);
            w[f8_s::BYTES * 5 + f8_s::QS.offset + 17] = nan;
            assert!(RepackedF8::new(&w, 9, k / 32).is_none());
            for isa in Isa::available() {
                let rp = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, 9, k).unwrap();
                assert!(rp.is_none(), "{isa:?} {nan:#04x}");
            }
        }
    }
}
