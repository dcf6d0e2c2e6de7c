//! The 8-row FP8 layout and its matmul: the layout rebuilds every stored row; the scale span
//! is 4 blocks exactly when every row's scale repeats over each run of 4; a span is shifted
//! exactly when none of its 8 rows' codes is subnormal; every ISA, thread count and token
//! count gives, bit for bit, the reference for the layout's spans (`dot_scalar_span`), tiny
//! activations included; on ordinary values that is, with one block a span, the stored
//! layout's result (and so its bound, `f8_tests.rs`), and with 4, within `f8r.rs`'s bound of
//! the exact float64 product; every finite code reads exactly in both widenings; a tensor
//! with a NaN code is not re-laid. Fixtures shared with the stored layout's tests.

use poot_core::quant::hf_fp8::e4m3_to_f32;
use poot_core::quant::layout::f8_s;
use poot_core::DType;

use crate::kernels::arch::generic::f8dot_generic::dot_scalar_span;
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::f8::tests::{activations, every_code, exact_and_bound, run};
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::repack_f8::{is_subnormal_code, scale_span, RepackedF8};
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

/// `w` with the subnormal codes of row `r`, block `b` made zero where `keep(r, b)` is false
/// (random codes are 5% subnormal: every span holds some; real checkpoints' rarely do).
fn clear_subnormals(mut w: Vec<u8>, nb: usize, keep: impl Fn(usize, usize) -> bool) -> Vec<u8> {
    for (i, blk) in w.chunks_exact_mut(f8_s::BYTES).enumerate() {
        if !keep(i / nb, i % nb) {
            for q in blk[f8_s::QS.range()].iter_mut() {
                if is_subnormal_code(*q) {
                    *q &= 0x80;
                }
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

/// The weights of every case: per-block and block-128 scales, each with every span holding
/// subnormal codes, none, and a mix (group 0 all shifted; the last group's first half).
fn cases(n: usize, k: usize, seed: u32) -> Vec<Vec<u8>> {
    let nb = k / 32;
    let stored = synthetic_weights(DType::F8_S, n, k, seed);
    let mut out = vec![];
    for w in [stored.clone(), wide_scales(stored, n, nb)] {
        let last = (n - 1) / 8 * 8;
        out.push(clear_subnormals(w.clone(), nb, |r, b| {
            r >= 8 && !(r >= last && b < nb / 2)
        }));
        out.push(clear_subnormals(w.clone(), nb, |_, _| false));
        out.push(w);
    }
    out
}

#[test]
fn the_layout_rebuilds_every_stored_row() {
    for (n, k) in [(13, 96), (8, 32), (3, 64), (13, 256), (9, 128), (24, 512)] {
        let nb = k / 32;
        for w in cases(n, k, 7) {
            let rp = RepackedF8::new(&w, n, nb).expect("no NaN codes");
            let span = scale_span(&w, n, nb);
            assert_eq!(rp.span, span);
            assert_eq!(rp.bytes(), n.div_ceil(8) * nb / span * (32 + 256 * span));
            // Shifted exactly where the span's rows hold no subnormal code.
            let rb = nb * f8_s::BYTES;
            for (i, &shifted) in rp.shifted.iter().enumerate() {
                let (g, p) = (i / (nb / span), i % (nb / span));
                let sub = (8 * g..n.min(8 * g + 8)).any(|r| {
                    let blocks = &w[r * rb + p * span * f8_s::BYTES..][..span * f8_s::BYTES];
                    let codes = blocks.chunks_exact(f8_s::BYTES).flat_map(|b| &b[4..]);
                    codes.copied().any(is_subnormal_code)
                });
                assert_eq!(shifted, !sub, "n={n} k={k} group {g} span {p}");
            }
            let mut row = vec![0u8; rb];
            for r in 0..n {
                rp.stored_row(r, &mut row);
                assert_eq!(row, w[r * rb..(r + 1) * rb], "n={n} k={k} row {r}");
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

/// Every ISA and thread count (1..3) against the reference for the layout's spans; returns it.
fn check_every_path(w: &[u8], n: usize, k: usize, x: &[f32], t: usize) -> Vec<f32> {
    let rp = RepackedF8::new(w, n, k / 32).expect("no NaN codes");
    let rb = k / 32 * f8_s::BYTES;
    let want: Vec<f32> = (0..t * n)
        .map(|i| {
            let (tok, r) = (i / n, i % n);
            let row = &w[r * rb..(r + 1) * rb];
            let shifted = rp.group_shifted(r / 8);
            dot_scalar_span(row, &x[tok * k..(tok + 1) * k], rp.span, shifted)
        })
        .collect();
    for isa in Isa::available() {
        let rp = repack_for(Numerics::Ggml, isa, w, DType::F8_S, n, k)
            .unwrap()
            .expect("F8_S is re-laid under ggml numerics");
        for threads in [1, 2, 3] {
            let got = relaid(isa, threads, x, t, k, &rp);
            assert_eq!(
                bits(&got),
                bits(&want),
                "n={n} k={k} t={t}: {isa:?} x{threads}"
            );
        }
    }
    want
}

#[test]
fn every_isa_and_token_count_matches_the_reference_bit_for_bit() {
    // 13 rows: a group and a ragged one; 24: three groups over 3 threads; t up to 11: one
    // token, passes of 2..8, and a full pass plus a partial one.
    for (n, k) in [(13, 96), (24, 256), (8, 32), (13, 512)] {
        for w in cases(n, k, 11 + n as u32) {
            let span = scale_span(&w, n, k / 32);
            for t in [1, 2, 3, 8, 11] {
                let x = activations(t, k, 70 + t as u32);
                let want = check_every_path(&w, n, k, &x, t);
                if span == 1 {
                    // Ordinary values: the stored layout's result, bit for bit.
                    let stored = run(Isa::Scalar, 1, &x, t, k, &w, n);
                    assert_eq!(bits(&want), bits(&stored), "n={n} k={k} t={t}");
                } else {
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
fn tiny_activations_stay_bit_identical() {
    // Activations near 2^-100: the shifted scaling's products are f32 subnormals, rounded
    // the same way on every path (the F16C scaling may differ there, as documented).
    let (n, k) = (16, 256);
    for w in cases(n, k, 9) {
        for t in [1, 3] {
            let x: Vec<f32> = activations(t, k, 5)
                .iter()
                .map(|v| v * 2f32.powi(-100))
                .collect();
            check_every_path(&w, n, k, &x, t);
        }
    }
}

#[test]
fn every_finite_code_reads_exactly() {
    // One-hot activations: each output is a code's value. 8 rows of one block (span 1), and
    // the same bytes as one row of 8 blocks with one scale (span 4); with the subnormal codes
    // (F16C spans), and without them (shifted spans).
    let finite = |code: usize| if code & 0x7f == 0x7f { 0 } else { code as u8 };
    for sub in [true, false] {
        let w = clear_subnormals(every_code(0), 8, |_, _| sub);
        let code_at = |i: usize| {
            if sub || !is_subnormal_code(finite(i)) {
                finite(i)
            } else {
                finite(i) & 0x80
            }
        };
        for isa in Isa::available() {
            let rows = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, 8, 32)
                .unwrap()
                .unwrap();
            assert!(matches!(&rows, Repack::F8(r) if r.span == 1 && r.shifted[0] != sub));
            for j in 0..32 {
                let mut x = vec![0.0f32; 32];
                x[j] = 1.0;
                for (r, &got) in relaid(isa, 1, &x, 1, 32, &rows).iter().enumerate() {
                    let want = e4m3_to_f32(code_at(32 * r + j));
                    assert_eq!(got, want, "{isa:?} span 1 code {:#04x}", 32 * r + j);
                }
            }
            let one = repack_for(Numerics::Ggml, isa, &w, DType::F8_S, 1, 256)
                .unwrap()
                .unwrap();
            assert!(matches!(&one, Repack::F8(r) if r.span == 4 && r.shifted[0] != sub));
            for code in 0..256 {
                let mut x = vec![0.0f32; 256];
                x[code] = 1.0;
                let got = relaid(isa, 1, &x, 1, 256, &one)[0];
                // A -0 code times +0 activations elsewhere sums to +0: compare values.
                assert_eq!(
                    got,
                    e4m3_to_f32(code_at(code)),
                    "{isa:?} span 4 code {code:#04x}"
                );
            }
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
