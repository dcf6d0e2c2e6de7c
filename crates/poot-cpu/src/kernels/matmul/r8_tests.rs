//! The 8-row layout: a lossless re-lay, and its matmul bit-identical to the stored-layout
//! ggml matmul on every ISA, thread count and ragged shape.

use super::*;
use crate::kernels::act_cache::ActCache;
use crate::kernels::matmul::q8::matmul_q8;
use crate::kernels::matmul::stored::dot_scalar_blocks;
use crate::kernels::qact::quantize_row_q8;
use crate::testutil::{real_slices, synthetic_weights, Rng};
use poot_core::DType;

const KINDS: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4_Z,
];

/// The re-lay on a pool (as the runtime builds it) is the sequential one's bytes, for every
/// 8-row kind and both k-quant kinds.
#[test]
fn a_relay_on_the_pool_is_the_sequential_one() {
    use crate::kernels::format::Format;
    use crate::kernels::matmul::repack_k::RepackedK;
    use crate::kernels::qact::QK_K;
    let pool = crate::ThreadPool::new(3).unwrap();
    let (n, k) = (45, 512);
    for dt in KINDS {
        let (kind, w) = (Format::of(dt).unwrap(), synthetic_weights(dt, n, k, 8));
        let (a, b) = (
            Repacked::new(kind, &w, n, k / 32),
            Repacked::new_on(kind, &w, n, k / 32, Some(&pool)),
        );
        assert!((0..a.groups()).all(|g| a.group(g) == b.group(g)), "{dt}");
    }
    for (dt, kind) in [(DType::Q4_K, Format::Q4_K), (DType::Q6_K, Format::Q6_K)] {
        let w = synthetic_weights(dt, n, k, 9);
        let (a, b) = (
            RepackedK::new(kind, &w, n, k / QK_K),
            RepackedK::new_on(kind, &w, n, k / QK_K, Some(&pool)),
        );
        assert!((0..a.groups()).all(|g| a.group(g) == b.group(g)), "{dt}");
    }
}

#[test]
fn stored_rows_round_trip() {
    for dt in KINDS {
        let kind = Format::of(dt).unwrap();
        let (n, k) = (13, 96);
        let w = synthetic_weights(dt, n, k, 5);
        let rp = Repacked::new(kind, &w, n, k / 32);
        assert_eq!(
            rp.bytes(),
            2 * 8 * (k / 32) * kind.block_bytes(),
            "{dt}: 2 groups"
        );
        let rb = w.len() / n;
        let mut row = vec![0u8; rb];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            assert_eq!(row, w[r * rb..(r + 1) * rb], "{dt} row {r}");
        }
    }
}

/// The repacked matmul on `isa` and what it must equal bit for bit: for Q4_1 the stored-layout
/// matmul (ggml's order), for Q4_0/Q5_0/Q8_0 the block order's scalar reference, whatever `t`.
#[allow(
    clippy::too_many_arguments,
    reason = "a matmul's shapes plus the ISA and threads"
)]
fn both(
    isa: Isa,
    dt: DType,
    w: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    t: usize,
    threads: usize,
) -> (Vec<u32>, Vec<u32>) {
    let kind = Format::of(dt).unwrap();
    let ck = isa.checked().unwrap();
    let pool = ThreadPool::new(threads).unwrap();
    let mut want = vec![0.0f32; t * n];
    if kind != Format::Q4_1 {
        // The block order, from its scalar reference.
        let nb = k / 32;
        let mut a = vec![BlockQ8::default(); t * nb];
        for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
            quantize_row_q8(xr, ar, kind.act_sum());
        }
        let rb = w.len() / n;
        for j in 0..t {
            for r in 0..n {
                let row = &w[r * rb..(r + 1) * rb];
                want[j * n + r] = dot_scalar_blocks(kind, row, &a[j * nb..(j + 1) * nb]);
            }
        }
    } else {
        matmul_q8(ck, kind, x, t, k, w, w.len() / n, n, &mut want, &pool, None);
    }
    let rp = Repacked::new(kind, w, n, k / 32);
    let mut got = vec![f32::NAN; t * n];
    let mut cache = ActCache::default();
    matmul_r8(ck, &rp, x, t, k, &mut got, &pool, Some((&mut cache, 7)));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect();
    (bits(&want), bits(&got))
}

#[test]
fn bit_identical_to_the_reference_orders_on_every_isa() {
    let mut rng = Rng::new(9);
    for dt in KINDS {
        // Ragged rows (not a multiple of 8), and 1, 2, 3 and 5 tokens (every tile and a tail);
        // 2056 rows: a one-token matrix large enough for two groups per step, with an odd
        // group count; 12 rows: one pair whose second group is short.
        for (n, k, t) in [
            (21, 256, 1),
            (12, 256, 1),
            (8, 64, 2),
            (19, 160, 3),
            (40, 512, 5),
            (2056, 64, 1),
        ] {
            let w = synthetic_weights(dt, n, k, 17);
            let x: Vec<f32> = (0..t * k)
                .map(|i| rng.uniform(-4.0, 4.0) * (i % 7) as f32)
                .collect();
            for isa in Isa::available() {
                for threads in [1, 3] {
                    let (want, got) = both(isa, dt, &w, n, k, &x, t, threads);
                    assert_eq!(got, want, "{dt} n={n} k={k} t={t} {isa:?} x{threads}");
                }
            }
        }
    }
}

#[test]
fn a_tokens_result_does_not_depend_on_the_tokens_beside_it() {
    // Batch invariance: each row of a t-token call equals that token alone, on every ISA.
    let mut rng = Rng::new(13);
    for dt in KINDS {
        let kind = Format::of(dt).unwrap();
        let (n, k, t) = (2056, 256, 7);
        let w = synthetic_weights(dt, n, k, 5);
        let rp = Repacked::new(kind, &w, n, k / 32);
        let x = rng.vec(t * k, -3.0, 3.0);
        let pool = ThreadPool::new(2).unwrap();
        for isa in Isa::available() {
            let ck = isa.checked().unwrap();
            let mut all = vec![0.0f32; t * n];
            matmul_r8(ck, &rp, &x, t, k, &mut all, &pool, None);
            for j in 0..t {
                let mut one = vec![0.0f32; n];
                matmul_r8(ck, &rp, &x[j * k..(j + 1) * k], 1, k, &mut one, &pool, None);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&one),
                    bits(&all[j * n..(j + 1) * n]),
                    "{dt} {isa:?} tok {j}"
                );
            }
        }
    }
}

#[test]
fn bit_identical_on_real_slices() {
    let Some(g) = real_slices() else { return };
    let mut rng = Rng::new(4);
    for t in g.tensors() {
        if !KINDS.contains(&t.dtype) {
            continue;
        }
        let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
        let w = g.tensor_bytes(t);
        let x = rng.vec(2 * k, -2.0, 2.0);
        for isa in Isa::available() {
            let (want, got) = both(isa, t.dtype, w, n, k, &x, 2, 2);
            assert_eq!(got, want, "{} on {isa:?}", t.name);
        }
    }
}

#[test]
fn extreme_weights_and_activations_stay_exact() {
    // Q8_0 weights of -128 and 127 against activations at +-127: the sign trick's and the
    // sign-flip's worst cases for `maddubs` and `dpbusd`.
    let (n, k, t) = (9, 64, 2);
    let mut w = synthetic_weights(DType::Q8_0, n, k, 3);
    for (i, b) in w.chunks_exact_mut(34).enumerate() {
        for (j, q) in b[2..].iter_mut().enumerate() {
            *q = if (i + j) % 3 == 0 { 0x80 } else { 0x7f };
        }
    }
    let x: Vec<f32> = (0..t * k)
        .map(|i| if i % 2 == 0 { 1e3 } else { -1e3 })
        .collect();
    for isa in Isa::available() {
        let (want, got) = both(isa, DType::Q8_0, &w, n, k, &x, t, 2);
        assert_eq!(got, want, "{isa:?}");
    }
}

#[test]
fn largest_nibble_sums_stay_exact() {
    // Q4_0/Q4_1 nibbles of 15 against activations all at +127 (one token) and -127 (the
    // other): the largest lane sums (4 * 15 * 127), which VNNI's biased conversion
    // (`arch/x86/qdot_r.rs`, `LO_BITS`/`HI_BITS`) must carry exactly, high nibbles in place.
    let (n, k, t) = (17, 64, 2);
    for (dt, hdr, bytes) in [(DType::Q4_0, 2, 18), (DType::Q4_1, 4, 20)] {
        let mut w = synthetic_weights(dt, n, k, 5);
        for (i, b) in w.chunks_exact_mut(bytes).enumerate() {
            let q = [0xff, 0xf0, 0x0f, 0x00][i % 4];
            b[hdr..].iter_mut().for_each(|v| *v = q);
        }
        let x: Vec<f32> = (0..t * k).map(|i| if i < k { 1e3 } else { -1e3 }).collect();
        for isa in Isa::available() {
            let (want, got) = both(isa, dt, &w, n, k, &x, t, 2);
            assert_eq!(got, want, "{dt} {isa:?}");
        }
    }
}

#[test]
fn the_block_order_stays_within_f32_rounding_of_ggmls() {
    let mut rng = Rng::new(21);
    for dt in [DType::Q4_0, DType::Q5_0, DType::Q8_0] {
        let kind = Format::of(dt).unwrap();
        let (n, k, t) = (24, 1024, 4);
        let w = synthetic_weights(dt, n, k, 2);
        let x = rng.vec(t * k, -3.0, 3.0);
        let ck = Isa::detect().checked().unwrap();
        let pool = ThreadPool::new(2).unwrap();
        let mut ggml = vec![0.0f32; t * n];
        matmul_q8(
            ck,
            kind,
            &x,
            t,
            k,
            &w,
            w.len() / n,
            n,
            &mut ggml,
            &pool,
            None,
        );
        let rp = Repacked::new(kind, &w, n, k / 32);
        let mut got = vec![0.0f32; t * n];
        matmul_r8(ck, &rp, &x, t, k, &mut got, &pool, None);
        // The bound of the module docs: sum_b |dw dx sum_b| from the blocks' own terms.
        let nb = k / 32;
        let rb = w.len() / n;
        for j in 0..t {
            let mut a = vec![BlockQ8::default(); nb];
            quantize_row_q8(&x[j * k..(j + 1) * k], &mut a, kind.act_sum());
            for r in 0..n {
                let row = &w[r * rb..(r + 1) * rb];
                let mag: f64 = (0..nb)
                    .map(|b| {
                        let blk = &row[b * rb / nb..(b + 1) * rb / nb];
                        f64::from(dot_scalar_blocks(kind, blk, &a[b..=b]).abs())
                    })
                    .sum();
                let tol = (nb + 8) as f64 * 2f64.powi(-24) * mag;
                let (g, e) = (f64::from(got[j * n + r]), f64::from(ggml[j * n + r]));
                assert!(
                    (g - e).abs() <= tol,
                    "{dt} tok {j} row {r}: {g} vs {e}, bound {tol:e}"
                );
            }
        }
    }
}

/// Q4_Z's repacked block order against its stored-row path (`matmul/q8.rs`, ggml's lane order):
/// the same exact integers, so within `f32` rounding (the bound above).
#[test]
fn q4_z_block_order_stays_within_f32_rounding_of_the_stored_path() {
    let mut rng = Rng::new(22);
    let (n, k, t) = (21, 1024, 3);
    let w = synthetic_weights(DType::Q4_Z, n, k, 4);
    let x = rng.vec(t * k, -3.0, 3.0);
    let ck = Isa::detect().checked().unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let rb = w.len() / n;
    let mut stored = vec![0.0f32; t * n];
    matmul_q8(
        ck,
        Format::Q4_Z,
        &x,
        t,
        k,
        &w,
        rb,
        n,
        &mut stored,
        &pool,
        None,
    );
    let rp = Repacked::new(Format::Q4_Z, &w, n, k / 32);
    let mut got = vec![0.0f32; t * n];
    matmul_r8(ck, &rp, &x, t, k, &mut got, &pool, None);
    let nb = k / 32;
    for j in 0..t {
        let mut a = vec![BlockQ8::default(); nb];
        quantize_row_q8(&x[j * k..(j + 1) * k], &mut a, false);
        for r in 0..n {
            let row = &w[r * rb..(r + 1) * rb];
            let mag: f64 = (0..nb)
                .map(|b| {
                    let blk = &row[b * 19..(b + 1) * 19];
                    f64::from(dot_scalar_blocks(Format::Q4_Z, blk, &a[b..=b]).abs())
                })
                .sum();
            let tol = (nb + 8) as f64 * 2f64.powi(-24) * mag;
            let (g, e) = (f64::from(got[j * n + r]), f64::from(stored[j * n + r]));
            assert!(
                (g - e).abs() <= tol,
                "tok {j} row {r}: {g} vs {e}, bound {tol:e}"
            );
        }
    }
}
