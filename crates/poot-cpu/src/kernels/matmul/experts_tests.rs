//! The expert matmul: each pair's output bit-identical to the dense re-laid kernel on its
//! expert's rows, whatever other pairs share the call, for every re-laid kind and ISA, and the
//! same bits from a stack re-laid lazily, expert by expert; bad shapes and ids, and an expert
//! read before it is re-laid, are typed errors.

use super::*;
use crate::kernels::matmul::experts_stack::{lazily_relaid, LazyStack};
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
    matmul_experts(
        isa,
        x,
        K,
        Stack::Whole(rp),
        E,
        (ids, slots),
        &mut out,
        pool,
        None,
    )
    .unwrap();
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
        matmul_experts(
            isa,
            x,
            K,
            Stack::Whole(&rp),
            n_exp,
            (ids, slots),
            out,
            &pool,
            None,
        )
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

/// A lazy stack of `w` (the `[E * N, K]` stored bytes), none of its experts re-laid.
fn lazy(dt: DType, isa: Isa) -> LazyStack {
    LazyStack::new(Numerics::Ggml, isa, dt, (E, N, K))
        .unwrap()
        .expect("a lazily re-laid kind")
}

#[test]
fn a_lazy_stack_gives_the_whole_stacks_bits_and_relays_only_what_is_read() {
    let pool = ThreadPool::new(2).unwrap();
    let mut rng = Rng::new(4);
    for dt in KINDS {
        assert_eq!(
            lazily_relaid(Numerics::Ggml, dt, N),
            dt != DType::Q4_Z,
            "{dt}"
        );
        if dt == DType::Q4_Z {
            continue;
        }
        for isa in Isa::available() {
            let (w, rp) = stack(dt, isa);
            let per = w.len() / E;
            let ls = lazy(dt, isa);
            assert_eq!(ls.bytes(), 0, "nothing re-laid before use");
            let ids = [1, 4, 4, 1, 1, 0];
            let relaid = std::sync::Mutex::new(Vec::new());
            let stored = |e: usize| &w[e * per..(e + 1) * per];
            let then = |e: usize| relaid.lock().unwrap().push(e);
            ls.ensure(&ids, &stored, &pool, &then).unwrap();
            let mut got = relaid.into_inner().unwrap();
            got.sort_unstable();
            assert_eq!(got, [0, 1, 4], "{dt} {isa:?}: each selected expert once");
            assert!((0..E).all(|e| ls.is_ready(e) == [0, 1, 4].contains(&e)));
            let x = rng.vec(3 * K, -2.0, 2.0);
            let want = run(isa, &rp, &x, (&ids, 2), &pool);
            let mut out = vec![f32::NAN; ids.len() * N];
            let st = Stack::Lazy(&ls);
            matmul_experts(isa, &x, K, st, E, (&ids, 2), &mut out, &pool, None).unwrap();
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{dt} {isa:?}");
            // Expert 2 was never re-laid: reading it is a typed error and writes nothing.
            let mut out = vec![0.0f32; 2 * N];
            let err = matmul_experts(isa, &x[..K], K, st, E, (&[0, 2], 2), &mut out, &pool, None)
                .unwrap_err();
            assert!(
                matches!(&err, KernelError::InvalidArgument { detail, .. } if detail.contains("expert 2")),
                "{err:?}"
            );
            assert!(out.iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn concurrent_first_uses_relay_each_expert_once() {
    let pool = ThreadPool::new(2).unwrap();
    let isa = Isa::detect();
    let (w, rp) = stack(DType::Q4_K, isa);
    let per = w.len() / E;
    let ls = lazy(DType::Q4_K, isa);
    let count = std::sync::atomic::AtomicUsize::new(0);
    let stored = |e: usize| &w[e * per..(e + 1) * per];
    let then = |_: usize| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    std::thread::scope(|s| {
        for i in 0..4 {
            let (ls, stored, then) = (&ls, &stored, &then);
            s.spawn(move || {
                // Each thread its own pool: they race for the same experts' locks.
                let own = ThreadPool::new(1 + i % 2).unwrap();
                let ids: Vec<i32> = (0..E as i32).rev().collect();
                ls.ensure(&ids, stored, &own, then).unwrap();
            });
        }
    });
    assert_eq!(count.into_inner(), E);
    assert_eq!(ls.bytes(), rp.bytes());
    let x = Rng::new(8).vec(K, -2.0, 2.0);
    let ids: Vec<i32> = (0..E as i32).collect();
    let want = run(isa, &rp, &x, (&ids, E), &pool);
    let mut out = vec![f32::NAN; E * N];
    let st = Stack::Lazy(&ls);
    matmul_experts(isa, &x, K, st, E, (&ids, E), &mut out, &pool, None).unwrap();
    assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
}

#[test]
fn a_stored_expert_of_the_wrong_length_is_a_typed_error_naming_it() {
    let pool = ThreadPool::new(1).unwrap();
    let isa = Isa::detect();
    let (w, _) = stack(DType::Q8_0, isa);
    let per = w.len() / E;
    let ls = lazy(DType::Q8_0, isa);
    let stored = |e: usize| {
        if e == 3 {
            &w[..per - 34]
        } else {
            &w[e * per..(e + 1) * per]
        }
    };
    let err = ls.ensure(&[0, 3], &stored, &pool, &|_| {}).unwrap_err();
    assert!(
        matches!(&err, KernelError::InvalidArgument { detail, .. } if detail.starts_with("expert 3")),
        "{err:?}"
    );
    assert!(ls.is_ready(0) && !ls.is_ready(3));
}
