//! The grouped-scale FP8 layout: found only where each scale repeats over 128 columns, a
//! lossless re-lay (every stored row rebuilt) of fewer bytes; its matmul bit-identical to the
//! portable loop on every ISA, thread count, token count and ragged shape, within `f32`
//! rounding of the float64 product of the dequantized weights, exact code by code, and
//! unchanged by an activation too large for its prescale.

use poot_core::quant::hf_fp8::e4m3_to_f32;
use poot_core::quant::layout::f8_s;
use poot_core::DType;

use crate::kernels::arch::generic::f8dot_generic::dot_scalar;
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::repack_f8g::{group_bytes, RepackedF8G, SPAN};
use crate::kernels::matmul::{matmul_repacked, repack_for};
use crate::testutil::{synthetic_weights, Rng};
use crate::{Isa, ThreadPool};

const BB: usize = f8_s::BYTES;

/// `n x k` stored F8_S rows whose scale repeats over each span of 4 blocks (a 128x128-block or
/// per-channel FP8 checkpoint), some scales tiny and some codes subnormal or zero.
fn grouped(n: usize, k: usize, seed: u32) -> Vec<u8> {
    let mut w = synthetic_weights(DType::F8_S, n, k, seed);
    let nb = k / 32;
    for row in w.chunks_exact_mut(nb * BB) {
        for span in row.chunks_mut(SPAN * BB) {
            let d: [u8; 4] = span[..4].try_into().unwrap();
            for b in span.chunks_exact_mut(BB) {
                b[..4].copy_from_slice(&d);
                b[4] = 0x03; // subnormal
                b[5] = 0x80; // -0
            }
        }
    }
    w
}

fn run(isa: Isa, threads: usize, rp: &Repack, x: &[f32], t: usize, k: usize) -> Vec<f32> {
    let pool = ThreadPool::new(threads).unwrap();
    let mut out = vec![f32::NAN; t * rp.n()];
    matmul_repacked(isa, x, t, k, rp, &mut out, &pool).unwrap();
    out
}

fn acts(t: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..t * k)
        .map(|i| rng.uniform(-1.0, 1.0) * if i % 37 == 0 { 8.0 } else { 1.0 })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn relaid(isa: Isa, w: &[u8], n: usize, k: usize) -> Repack {
    repack_for(Numerics::Ggml, isa, w, DType::F8_S, n, k)
        .unwrap()
        .expect("F8_S is re-laid under ggml numerics")
}

#[test]
fn the_layout_rebuilds_every_stored_row_in_fewer_bytes() {
    // 18 blocks (SmolLM2's 576 columns: a last span of 2), 3 (one short span), 8.
    for (n, k) in [(13, 576), (8, 96), (3, 256)] {
        let w = grouped(n, k, 7);
        let nb = k / 32;
        let rp = RepackedF8G::new(&w, n, nb).expect("scales repeat over spans");
        assert_eq!(rp.bytes(), n.div_ceil(8) * group_bytes(nb));
        assert!(rp.bytes() < n.div_ceil(8) * 8 * nb * BB);
        let mut row = vec![0u8; nb * BB];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            assert_eq!(
                row,
                w[r * nb * BB..(r + 1) * nb * BB],
                "n={n} k={k} row {r}"
            );
        }
    }
}

#[test]
fn only_tensors_whose_scales_repeat_without_nan_codes_take_it() {
    let (n, k) = (9, 256);
    assert!(matches!(
        relaid(Isa::Scalar, &grouped(n, k, 1), n, k),
        Repack::F8G(_)
    ));
    // A scale a block (the synthetic weights'), a NaN code, a scale too large: the per-block
    // layout (or, for the NaN code, none).
    let per_block = synthetic_weights(DType::F8_S, n, k, 2);
    assert!(matches!(
        relaid(Isa::Scalar, &per_block, n, k),
        Repack::F8(_)
    ));
    let mut nan = grouped(n, k, 3);
    nan[BB * 5 + 4 + 17] = 0x7f;
    assert!(RepackedF8G::new(&nan, n, k / 32).is_none());
    let mut huge = grouped(n, k, 4);
    for b in huge[..SPAN * BB].chunks_exact_mut(BB) {
        b[..4].copy_from_slice(&1e20f32.to_le_bytes());
    }
    assert!(matches!(relaid(Isa::Scalar, &huge, n, k), Repack::F8(_)));
}

#[test]
fn every_isa_thread_and_token_count_matches_the_portable_loop_bit_for_bit() {
    // 13 rows: a group and a ragged one; 24: three groups over 3 threads; t up to 11: one
    // token, passes of 2..8, a full pass plus a partial one.
    for (n, k) in [(13, 576), (24, 256), (8, 96)] {
        let w = grouped(n, k, 11 + n as u32);
        for t in [1, 2, 3, 8, 11] {
            let x = acts(t, k, 70 + t as u32);
            let want = bits(&run(
                Isa::Scalar,
                1,
                &relaid(Isa::Scalar, &w, n, k),
                &x,
                t,
                k,
            ));
            for isa in Isa::available() {
                let rp = relaid(isa, &w, n, k);
                assert!(matches!(rp, Repack::F8G(_)), "{isa:?}");
                for threads in [1, 2, 3] {
                    let got = bits(&run(isa, threads, &rp, &x, t, k));
                    assert_eq!(got, want, "n={n} k={k} t={t}: {isa:?} x{threads}");
                }
                // Each token alone gives what it gave beside the others.
                for j in 0..t {
                    let one = run(isa, 1, &rp, &x[j * k..(j + 1) * k], 1, k);
                    assert_eq!(bits(&one), want[j * n..(j + 1) * n], "{isa:?} token {j}");
                }
            }
        }
    }
}

#[test]
fn results_are_within_f32_rounding_of_the_float64_product() {
    let (n, k, t) = (16, 576, 3);
    let w = grouped(n, k, 5);
    let x = acts(t, k, 6);
    let nb = k / 32;
    for isa in Isa::available() {
        let got = run(isa, 2, &relaid(isa, &w, n, k), &x, t, k);
        for j in 0..t {
            for r in 0..n {
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for b in 0..nb {
                    let blk = &w[(r * nb + b) * BB..(r * nb + b + 1) * BB];
                    let d = f32::from_le_bytes(blk[..4].try_into().unwrap()) as f64;
                    for e in 0..32 {
                        let p = e4m3_to_f32(blk[4 + e]) as f64 * d * x[j * k + 32 * b + e] as f64;
                        want += p;
                        mag += p.abs();
                    }
                }
                let err = (got[j * n + r] as f64 - want).abs();
                // Each of the k products and k + 8 sums rounds once (2^-24 relative).
                let bound = (2 * k + 16) as f64 * f32::EPSILON as f64 / 2.0 * mag;
                assert!(err <= bound, "{isa:?} token {j} row {r}: {err} > {bound}");
            }
        }
    }
}

#[test]
fn every_finite_code_reads_exactly() {
    // One row per 32 codes (scale 1), one-hot activations: each output is a code's value,
    // subnormal codes included.
    let n = 8;
    let mut w = vec![0u8; n * BB];
    for (r, blk) in w.chunks_exact_mut(BB).enumerate() {
        blk[f8_s::D.range()].copy_from_slice(&1.0f32.to_le_bytes());
        for j in 0..32 {
            let code = (32 * r + j) as u8;
            blk[f8_s::QS.offset + j] = if code & 0x7f == 0x7f { 0 } else { code };
        }
    }
    for isa in Isa::available() {
        let rp = relaid(isa, &w, n, 32);
        assert!(matches!(rp, Repack::F8G(_)));
        for j in 0..32 {
            let mut x = vec![0.0f32; 32];
            x[j] = 1.0;
            for (r, &got) in run(isa, 1, &rp, &x, 1, 32).iter().enumerate() {
                let code = (32 * r + j) as u8;
                let code = if code & 0x7f == 0x7f { 0 } else { code };
                assert_eq!(got, e4m3_to_f32(code), "{isa:?} code {code:#04x}");
            }
        }
    }
}

#[test]
fn a_token_too_large_for_the_prescale_takes_the_stored_dot_alone() {
    let (n, k, t) = (11, 256, 3);
    let w = grouped(n, k, 9);
    let mut x = acts(t, k, 10);
    x[k + 5] = 3e23; // 2^78 is about 3.0e23
    for isa in Isa::available() {
        let rp = relaid(isa, &w, n, k);
        let got = run(isa, 2, &rp, &x, t, k);
        let mut row = vec![0u8; k / 32 * BB];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            let want = dot_scalar(&row, &x[k..2 * k]);
            assert_eq!(got[n + r].to_bits(), want.to_bits(), "{isa:?} row {r}");
            assert!(got[n + r].is_finite());
        }
        for j in [0, 2] {
            let one = run(isa, 1, &rp, &x[j * k..(j + 1) * k], 1, k);
            assert_eq!(
                bits(&one),
                bits(&got[j * n..(j + 1) * n]),
                "{isa:?} token {j}"
            );
        }
    }
}

#[test]
fn a_fused_call_gives_each_weight_its_own_calls_bits() {
    // q/k/v-like: three weights of one k, ragged row counts; a per-block weight among them
    // takes its own call.
    let k = 576;
    let ws = [grouped(24, k, 21), grouped(13, k, 22), grouped(8, k, 23)];
    let per_block = synthetic_weights(DType::F8_S, 9, k, 24);
    for isa in Isa::available() {
        let mut rps: Vec<Repack> = ws
            .iter()
            .map(|w| relaid(isa, w, w.len() / (k / 32 * BB), k))
            .collect();
        rps.push(relaid(isa, &per_block, 9, k));
        assert!(matches!(rps[3], Repack::F8(_)));
        for (t, m) in [(1, 3), (3, 3), (11, 4)] {
            let x = acts(t, k, 30 + t as u32);
            let pool = ThreadPool::new(2).unwrap();
            let refs: Vec<&Repack> = rps[..m].iter().collect();
            let mut outs: Vec<Vec<f32>> = refs.iter().map(|w| vec![f32::NAN; t * w.n()]).collect();
            let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            crate::kernels::matmul::matmul_repacked_fused(
                isa,
                &x,
                t,
                k,
                &refs,
                &mut slices,
                &pool,
                None,
            )
            .unwrap();
            for (w, got) in refs.iter().zip(&outs) {
                assert_eq!(bits(got), bits(&run(isa, 1, w, &x, t, k)), "{isa:?} t={t}");
            }
        }
    }
}
