//! The grouped Q4_Z layout: found only where headers repeat, a lossless re-lay of fewer bytes,
//! its matmul bit-identical to the portable loop on every ISA, thread count, token count and
//! ragged shape (and in the fused and expert matmuls), and within `f32` rounding of the float64
//! product of the dequantized weights with the quantized activations.

use super::*;
use crate::kernels::arch::generic::qdot_zg_generic::group_z;
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::{matmul_repacked, repack_for};
use crate::kernels::qact::{quantize_row_q8, BlockQ8};
use crate::kernels::Numerics;
use crate::testutil::{synthetic_weights, Rng};
use crate::{Isa, ThreadPool};
use poot_core::DType;

/// `n x k` stored Q4_Z rows whose scale and zero point repeat over aligned runs of `per`
/// blocks (a GPTQ/AWQ group of `32 * per`), zero points drawn below `zmax`.
fn grouped(n: usize, k: usize, per: usize, seed: u32, zmax: u32) -> Vec<u8> {
    assert!((k / 32).is_multiple_of(per));
    let mut w = synthetic_weights(DType::Q4_Z, n, k, seed);
    let mut rng = Rng::new(seed + 50);
    for run in w.chunks_exact_mut(per * BB) {
        run[2] = (rng.next_u32() % zmax) as u8;
        let head: [u8; 3] = run[..3].try_into().unwrap();
        for b in run.chunks_exact_mut(BB) {
            b[..3].copy_from_slice(&head);
        }
    }
    w
}

fn relaid(w: &[u8], n: usize, k: usize) -> Repacked {
    match repack_for(Numerics::Ggml, Isa::Scalar, w, DType::Q4_Z, n, k) {
        Ok(Some(Repack::Q(r))) => r,
        other => panic!("not an 8-row re-lay: {other:?}"),
    }
}

/// `t` tokens of `x` quantized as `matmul_r8` quantizes them for Q4_Z.
fn quantized(x: &[f32], k: usize) -> Vec<BlockQ8> {
    let nb = k / 32;
    let mut a = vec![BlockQ8::default(); x.len() / 32];
    for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
        quantize_row_q8(xr, ar, false);
    }
    a
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn runs_of_repeated_headers_are_found() {
    assert_eq!(repeated_headers(&grouped(9, 512, 4, 1, 16), 16), Some(4));
    assert_eq!(repeated_headers(&grouped(9, 512, 2, 2, 16), 16), Some(2));
    // Group 32: no run; 3 blocks a row fit no run of 2 or 4 (group -1 then keeps its layout).
    assert_eq!(repeated_headers(&grouped(9, 512, 1, 3, 16), 16), None);
    let w = grouped(9, 96, 3, 4, 16);
    assert_eq!(repeated_headers(&w, 3), None);
    // Group -1 (one header a row): runs of 4 where 4 divides the blocks, else of 2.
    assert_eq!(repeated_headers(&grouped(9, 256, 8, 5, 16), 8), Some(4));
    assert_eq!(repeated_headers(&grouped(9, 192, 6, 6, 16), 6), Some(2));
    // Blocks 6 and 7 with another zero point break the run of 4 (blocks 4..8), not the runs
    // of 2; one scale byte more, in block 1, breaks those too.
    let mut w = grouped(9, 512, 4, 7, 16);
    w[6 * BB + 2] ^= 1;
    w[7 * BB + 2] ^= 1;
    assert_eq!(repeated_headers(&w, 16), Some(2));
    w[BB + 1] ^= 0x40;
    assert_eq!(repeated_headers(&w, 16), None);
}

#[test]
fn rows_round_trip_and_the_copy_is_smaller() {
    let pool = ThreadPool::new(3).unwrap();
    for (per, k) in [(4, 512), (2, 192)] {
        let n = 13;
        let w = grouped(n, k, per, 8, 16);
        let rp = relaid(&w, n, k);
        assert_eq!((rp.kind, rp.qgroup), (Format::Q4_Z, per));
        // Two groups of 8 rows, (24 + 128 per) bytes per group of `per` blocks.
        assert_eq!(
            rp.bytes(),
            2 * (k / 32 / per) * (24 + 128 * per),
            "per {per}"
        );
        let mut row = vec![0u8; k / 32 * BB];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            assert_eq!(
                row,
                w[r * row.len()..(r + 1) * row.len()],
                "per {per} row {r}"
            );
        }
        let on_pool = Repacked::grouped_q4z_on(&w, n, k / 32, Some(&pool)).unwrap();
        assert!((0..rp.groups()).all(|g| rp.group(g) == on_pool.group(g)));
    }
    // Group 128 at 4.19 bits a weight, against 4.75 for the per-block layout.
    let (n, k) = (64, 4096);
    let rp = relaid(&grouped(n, k, 4, 9, 16), n, k);
    assert_eq!(rp.bytes() * 8 * 1000 / (n * k), 4187);
}

#[test]
fn only_asymmetric_runs_take_the_grouped_layout() {
    let (n, k) = (16, 256);
    // Group 32: the per-block layout; every zero 8: Q4_0.
    let rp = relaid(&grouped(n, k, 1, 10, 16), n, k);
    assert_eq!((rp.kind, rp.qgroup), (Format::Q4_Z, 1));
    let mut sym = grouped(n, k, 4, 11, 16);
    for b in sym.chunks_exact_mut(BB) {
        b[2] = 8;
    }
    let rp = relaid(&sym, n, k);
    assert_eq!((rp.kind, rp.qgroup), (Format::Q4_0, 1));
}

/// `want[j * n + r]` from the portable loop on each group of `rp`.
fn portable(rp: &Repacked, a: &[BlockQ8], t: usize) -> Vec<f32> {
    let (n, nb) = (rp.n, rp.nb);
    let mut want = vec![0.0f32; t * n];
    for g in 0..rp.groups() {
        let mut res = vec![f32::NAN; t * RG];
        group_z(rp.qgroup, rp.group(g), nb, a, t, &mut res);
        for j in 0..t {
            for r in 0..RG.min(n - g * RG) {
                want[j * n + g * RG + r] = res[j * RG + r];
            }
        }
    }
    want
}

#[test]
fn every_isa_and_thread_count_is_the_portable_loop_bit_for_bit() {
    let mut rng = Rng::new(12);
    // Ragged rows, every token tile and a tail, zero points of GPTQ's range and beyond it;
    // 2056 rows: a one-token matrix the per-block layout would take two groups a step for.
    for (n, k, t, per, zmax) in [
        (21, 512, 1, 4, 17),
        (8, 128, 2, 4, 16),
        (19, 192, 3, 2, 256),
        (40, 1024, 5, 4, 256),
        (2056, 256, 1, 2, 16),
        (13, 256, 7, 4, 16),
    ] {
        let w = grouped(n, k, per, 13 + n as u32, zmax);
        let rp = Repack::Q(relaid(&w, n, k));
        let Repack::Q(r) = &rp else { unreachable!() };
        assert_eq!(r.qgroup, per);
        let x: Vec<f32> = (0..t * k)
            .map(|i| rng.uniform(-4.0, 4.0) * if i % 37 == 0 { 8.0 } else { 1.0 })
            .collect();
        let want = bits(&portable(r, &quantized(&x, k), t));
        for isa in Isa::available() {
            for threads in [1, 3] {
                let pool = ThreadPool::new(threads).unwrap();
                let mut got = vec![f32::NAN; t * n];
                matmul_repacked(isa, &x, t, k, &rp, &mut got, &pool).unwrap();
                assert_eq!(bits(&got), want, "n={n} k={k} t={t} {isa:?} x{threads}");
                // Batch invariance: each token alone gives its row of the batch.
                for j in 0..t {
                    let mut one = vec![f32::NAN; n];
                    let xj = &x[j * k..(j + 1) * k];
                    matmul_repacked(isa, xj, 1, k, &rp, &mut one, &pool).unwrap();
                    assert_eq!(bits(&one), want[j * n..(j + 1) * n], "{isa:?} tok {j}");
                }
            }
        }
    }
}

#[test]
fn within_f32_rounding_of_the_float64_dequantization() {
    // The float64 product of the dequantized weights `(q - z) * dw` with the dequantized Q8
    // activations `qx * dx`; the bound is that of the order in `arch/generic/qdot_zg_generic.rs`:
    // `(per + nq + 2) * 2^-24 * sum_groups |dw| * sum_b |dx_b| (|sum_b(q y)| + z |sum_b(y)|)`.
    let mut rng = Rng::new(14);
    let pool = ThreadPool::new(2).unwrap();
    for (per, zmax) in [(4, 17), (2, 17), (4, 256)] {
        let (n, k, t) = (24, 2048, 3);
        let w = grouped(n, k, per, 15 + per as u32, zmax);
        let rp = Repack::Q(relaid(&w, n, k));
        let x = rng.vec(t * k, -3.0, 3.0);
        let a = quantized(&x, k);
        let mut got = vec![f32::NAN; t * n];
        matmul_repacked(Isa::detect(), &x, t, k, &rp, &mut got, &pool).unwrap();
        let (nb, nq) = (k / 32, k / 32 / per);
        for j in 0..t {
            for r in 0..n {
                let row = &w[r * nb * BB..(r + 1) * nb * BB];
                let (mut exact, mut mass) = (0.0f64, 0.0f64);
                for q in 0..nq {
                    let head = &row[q * per * BB..];
                    let dw = f64::from(half::f16::from_le_bytes([head[0], head[1]]).to_f32());
                    let z = f64::from(head[2]);
                    let mut m = 0.0f64;
                    for b in q * per..(q + 1) * per {
                        let (blk, y) = (&row[b * BB..(b + 1) * BB], &a[j * nb + b]);
                        let dx = f64::from(y.d);
                        let (mut isum, mut ysum) = (0i64, 0i64);
                        for e in 0..32 {
                            let byte = blk[3 + e % 16];
                            let qv = i64::from(if e < 16 { byte & 15 } else { byte >> 4 });
                            let yv = i64::from(y.qs[e]);
                            isum += qv * yv;
                            ysum += yv;
                            exact += (qv as f64 - z) * dw * yv as f64 * dx;
                        }
                        m += dx.abs() * ((isum as f64).abs() + z * (ysum as f64).abs());
                    }
                    mass += dw.abs() * m;
                }
                let tol = (per + nq + 2) as f64 * 1.01 * 2f64.powi(-24) * mass;
                let g = f64::from(got[j * n + r]);
                assert!(
                    (g - exact).abs() <= tol,
                    "per {per} tok {j} row {r}: {g} vs {exact}, bound {tol:e}"
                );
            }
        }
    }
}

#[test]
fn a_fused_call_mixing_layouts_is_each_weights_own_call() {
    use crate::kernels::matmul::matmul_repacked_fused;
    let (n, k, t) = (24, 512, 3);
    let ws = [
        Repack::Q(relaid(&grouped(n, k, 4, 20, 16), n, k)),
        Repack::Q(relaid(&grouped(n, k, 1, 21, 16), n, k)),
        Repack::Q(relaid(&grouped(n, k, 2, 22, 16), n, k)),
    ];
    let x = Rng::new(23).vec(t * k, -2.0, 2.0);
    let pool = ThreadPool::new(2).unwrap();
    for isa in Isa::available() {
        let mut outs = vec![vec![f32::NAN; t * n]; 3];
        let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        let refs: Vec<&Repack> = ws.iter().collect();
        matmul_repacked_fused(isa, &x, t, k, &refs, &mut views, &pool, None).unwrap();
        for (w, got) in ws.iter().zip(&outs) {
            let mut want = vec![f32::NAN; t * n];
            matmul_repacked(isa, &x, t, k, w, &mut want, &pool).unwrap();
            assert_eq!(bits(got), bits(&want), "{isa:?}");
        }
    }
}

#[test]
fn an_expert_stack_takes_the_grouped_kernel() {
    use crate::kernels::matmul::experts::{matmul_experts, Stack};
    let (e, n, k) = (3, 16, 256);
    let w = grouped(e * n, k, 4, 30, 16);
    let stack = Repack::Q(relaid(&w, e * n, k));
    let ids = [2, 0, 2, 1, 2];
    let x = Rng::new(31).vec(ids.len() * k, -2.0, 2.0);
    let pool = ThreadPool::new(2).unwrap();
    for isa in Isa::available() {
        let mut got = vec![f32::NAN; ids.len() * n];
        matmul_experts(
            isa,
            &x,
            k,
            Stack::Whole(&stack),
            e,
            (&ids, 1),
            &mut got,
            &pool,
            None,
        )
        .unwrap();
        for (s, &id) in ids.iter().enumerate() {
            let id = id as usize;
            let one = Repack::Q(relaid(&w[id * n * k / 32 * BB..][..n * k / 32 * BB], n, k));
            let mut want = vec![f32::NAN; n];
            matmul_repacked(isa, &x[s * k..(s + 1) * k], 1, k, &one, &mut want, &pool).unwrap();
            assert_eq!(
                bits(&got[s * n..(s + 1) * n]),
                bits(&want),
                "{isa:?} pair {s}"
            );
        }
    }
}
