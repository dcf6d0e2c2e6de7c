//! The expert matmul: each pair's output bit-identical to the dense re-laid kernel on its
//! expert's rows, whatever other pairs share the call, for every re-laid kind and ISA; bad
//! shapes and ids are typed errors.

use super::*;
use crate::kernels::matmul::{matmul_repacked, repack_for};
use crate::kernels::Numerics;
use crate::testutil::{synthetic_weights, Rng};
use poot_core::DType;

const KINDS: [DType; 7] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4_Z,
    DType::Q4_K,
    DType::Q6_K,
];
const E: usize = 5;
const N: usize = 24;
const K: usize = 512;

/// The stack re-laid whole, as the runtime does.
fn stack(dt: DType, isa: Isa) -> (Vec<u8>, Repack) {
    let w = synthetic_weights(dt, E * N, K, 11);
    let rp = repack_for(Numerics::Ggml, isa, &w, dt, E * N, K)
        .unwrap()
        .expect("a re-laid kind");
    (w, rp)
}

/// Expert `e` of `w` alone, through the dense re-laid kernel, against one row.
fn dense(dt: DType, isa: Isa, w: &[u8], e: usize, x: &[f32], pool: &ThreadPool) -> Vec<u32> {
    let per = w.len() / E;
    let rows = &w[e * per..(e + 1) * per];
    let rp = repack_for(Numerics::Ggml, isa, rows, dt, N, K)
        .unwrap()
        .unwrap();
    let mut out = vec![f32::NAN; N];
    matmul_repacked(isa, x, 1, K, &rp, &mut out, pool).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

fn run(
    isa: Isa,
    rp: &Repack,
    x: &[f32],
    (ids, slots): (&[i32], usize),
    pool: &ThreadPool,
) -> Vec<u32> {
    let mut out = vec![f32::NAN; ids.len() * N];
    matmul_experts(isa, x, K, rp, E, (ids, slots), &mut out, pool, None).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn each_pair_is_the_dense_kernel_on_its_expert() {
    let mut rng = Rng::new(3);
    let mut checked = 0;
    for threads in [1, 3] {
        let pool = ThreadPool::new(threads).unwrap();
        for dt in KINDS {
            for isa in Isa::available() {
                let (w, rp) = stack(dt, isa);
                // 6 tokens of 2 slots: expert 1 read by 5 pairs (more than one token tile),
                // expert 3 by none.
                let ids = [1, 0, 1, 4, 2, 1, 1, 0, 4, 1, 2, 0];
                let x = rng.vec(6 * K, -2.0, 2.0);
                let shared = run(isa, &rp, &x, (&ids, 2), &pool);
                let own = rng.vec(12 * K, -2.0, 2.0);
                let per_pair = run(isa, &rp, &own, (&ids, 2), &pool);
                for (s, &e) in ids.iter().enumerate() {
                    let tok = &x[(s / 2) * K..(s / 2 + 1) * K];
                    let want = dense(dt, isa, &w, e as usize, tok, &pool);
                    assert_eq!(shared[s * N..(s + 1) * N], want, "{dt} {isa:?} pair {s}");
                    let row = &own[s * K..(s + 1) * K];
                    let want = dense(dt, isa, &w, e as usize, row, &pool);
                    assert_eq!(per_pair[s * N..(s + 1) * N], want, "{dt} {isa:?} own {s}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn a_pairs_result_does_not_depend_on_the_other_pairs() {
    let pool = ThreadPool::new(2).unwrap();
    let mut rng = Rng::new(9);
    for dt in [DType::Q4_0, DType::Q4_K] {
        for isa in Isa::available() {
            let (_, rp) = stack(dt, isa);
            let x = rng.vec(4 * K, -2.0, 2.0);
            // Token 0 routes to experts 2 and 4 in every step; the others change.
            let a = run(isa, &rp, &x, (&[2, 4, 2, 2, 2, 4, 0, 1], 2), &pool);
            let b = run(isa, &rp, &x, (&[2, 4, 3, 0, 1, 1, 3, 3], 2), &pool);
            let alone = run(isa, &rp, &x[..K], (&[2, 4], 2), &pool);
            assert_eq!(a[..2 * N], b[..2 * N], "{dt} {isa:?}");
            assert_eq!(a[..2 * N], alone[..], "{dt} {isa:?}");
        }
    }
}

#[test]
fn bad_ids_and_shapes_are_typed_errors() {
    let pool = ThreadPool::new(1).unwrap();
    let isa = Isa::detect();
    let (_, rp) = stack(DType::Q8_0, isa);
    let x = vec![0.5f32; 2 * K];
    let mut out = vec![0.0f32; 4 * N];
    let call = |ids: &[i32], slots, n_exp, x: &[f32], out: &mut [f32]| {
        matmul_experts(isa, x, K, &rp, n_exp, (ids, slots), out, &pool, None)
    };
    let err = call(&[0, 5, 1, 2], 2, E, &x, &mut out).unwrap_err();
    assert!(
        matches!(&err, KernelError::InvalidArgument { detail, .. } if detail.contains("expert id 5")),
        "{err:?}"
    );
    let err = call(&[0, -1, 1, 2], 2, E, &x, &mut out).unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidArgument { .. }),
        "{err:?}"
    );
    // 120 rows are not 4 experts of whole 8-row groups (30 rows each).
    let err = call(&[0, 1, 1, 2], 2, 4, &x, &mut out).unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidArgument { .. }),
        "{err:?}"
    );
    let err = call(&[0, 1, 1, 2], 2, E, &x[..K + 32], &mut out).unwrap_err();
    assert!(matches!(err, KernelError::Length { .. }), "{err:?}");
    let err = call(&[0, 1, 1, 2], 2, E, &x, &mut out[..3 * N]).unwrap_err();
    assert!(matches!(err, KernelError::Length { .. }), "{err:?}");
    let err = call(&[0, 1, 1], 2, E, &x, &mut out).unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidArgument { .. }),
        "{err:?}"
    );
    // Nothing was written by the refused calls.
    assert!(out.iter().all(|&v| v == 0.0));
}
