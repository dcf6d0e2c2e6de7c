//! The mixture-of-experts ops on wgpu against the CPU runtime (exact numerics): a router's
//! `top_k` ids, `gather_cols`, `moe_matmul` over experts packed in place in each stored dtype,
//! and `moe_combine`; plus the one-row matmul of a 1-D weight (Qwen2-MoE's shared-expert gate).
//!
//! Bounds and why: ids and gathered values are exact (the same selection rule, a copy);
//! `moe_matmul` sums K products in another order than the CPU's matmul kernels, bounded as the
//! matmul of conformance.rs (atol 2e-4 on outputs of size ~1, rtol 1e-5); `moe_combine` sums k
//! products in the CPU's order (1e-6, for a fused multiply-add). Skips where no wgpu adapter
//! exists (see `common`).
mod common;

use common::compare::{compare, f32s, i32s, open};
use common::{packed, Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, Runtime, RuntimeError};
use poot_wgpu::WgpuOptions;

const E: usize = 6;
const D: usize = 256;
const F: usize = 256;

/// Experts gate/up [E, F, D] and down [E, D, F] in `dt`.
fn experts(dt: DType, rng: &mut Rng) -> Store {
    let mut s = Store::default();
    s.add("gate", dt, vec![E, F, D], packed(dt, E * F, D, rng));
    s.add("up", dt, vec![E, F, D], packed(dt, E * F, D, rng));
    s.add("down", dt, vec![E, D, F], packed(dt, E * D, F, rng));
    s
}

/// A routed feed-forward's ops from router logits, in both `x` layouts of `moe_matmul` ([T, K]
/// for gate/up, [T * k, K] for down), every op's output compared. Down reads its own input in
/// [-1, 1) rather than `gate * up` (whose size would scale the bound).
fn moe_case(rt: &poot_wgpu::WgpuRuntime, dt: DType, t: usize, k: usize, store: Store, seed: u64) {
    let mut rng = Rng(seed);
    let x = f32s(vec![t, D], rng.vec(t * D));
    let logits = f32s(vec![t, E], rng.vec(t * E));
    let h = f32s(vec![t * k, F], rng.vec(t * k * F));
    compare(
        rt,
        &format!("moe {dt} t={t} k={k}"),
        store,
        t,
        |tr| {
            let x = tr.input("x", DType::F32, vec![t, D]).unwrap();
            let l = tr.input("logits", DType::F32, vec![t, E]).unwrap();
            let ids = tr.top_k_ids(l, k).unwrap();
            let g = tr.gather_cols(l, ids).unwrap();
            let wts = tr.softmax(g).unwrap();
            let (gw, uw, dw) = (
                tr.weight("gate").unwrap(),
                tr.weight("up").unwrap(),
                tr.weight("down").unwrap(),
            );
            let gate = tr.moe_matmul(x, gw, ids).unwrap();
            let up = tr.moe_matmul(x, uw, ids).unwrap();
            let h = tr.input("h", DType::F32, vec![t * k, F]).unwrap();
            let y = tr.moe_matmul(h, dw, ids).unwrap();
            let c = tr.moe_combine(y, wts).unwrap();
            let ins = vec![("ids", ids), ("g", g), ("gate", gate), ("up", up)];
            [ins, vec![("y", y), ("c", c)]].concat()
        },
        &[("x", x), ("logits", logits), ("h", h)],
        (2e-4, 1e-5),
    );
}

#[test]
fn moe_ops_every_expert_dtype_and_token_count() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(41);
    for dt in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        // 1 token (decode); 13 tokens with 2 experts each, more than a tile of 8 slots for
        // some experts.
        for (t, k) in [(1usize, 2usize), (13, 2), (5, 4)] {
            moe_case(&rt, dt, t, k, experts(dt, &mut rng), 100 + t as u64);
        }
    }
}

#[test]
fn experts_split_across_bindings_mid_expert() {
    // 40 KiB bindings: a Q8_0 [6, 256, 256] tensor (272 bytes a row) splits every 150 rows, so
    // parts end inside experts.
    let options = WgpuOptions {
        max_binding_bytes: Some(40 << 10),
        ..WgpuOptions::default()
    };
    let Some(rt) = open(options) else { return };
    let mut rng = Rng(42);
    for dt in [DType::Q8_0, DType::F32] {
        moe_case(&rt, dt, 7, 3, experts(dt, &mut rng), 7);
    }
}

#[test]
fn top_k_ids_rank_ties_signed_zeros_and_nan_as_the_cpu() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let nan = f32::NAN;
    // Ties go to the lower id, -0 ranks below +0, NaN is never chosen, -1 fills a row with
    // fewer than k values left.
    let rows = [
        [1.0, 3.0, 3.0, -2.0, 0.5, 3.0],
        [0.0, -0.0, nan, -0.0, 0.0, -1.0],
        [nan, nan, nan, nan, 2.0, nan],
        [f32::NEG_INFINITY, -1e30, f32::INFINITY, 7.0, 7.0, -7.0],
    ];
    let data: Vec<f32> = rows.concat();
    for k in [1usize, 3, 6] {
        compare(
            &rt,
            &format!("top_k k={k}"),
            Store::default(),
            4,
            |tr| {
                let l = tr.input("l", DType::F32, vec![4, E]).unwrap();
                vec![("ids", tr.top_k_ids(l, k).unwrap())]
            },
            &[("l", f32s(vec![4, E], data.clone()))],
            (0.0, 0.0),
        );
    }
}

#[test]
fn host_expert_ids_out_of_range_are_refused_on_the_host() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(43);
    let store = std::sync::Arc::new(experts(DType::Q8_0, &mut rng));
    let cat: std::sync::Arc<dyn WeightCatalog> = store.clone();
    let mut tr = Tracer::new(TraceLimits::default(), 2, cat).unwrap();
    let x = tr.input("x", DType::F32, vec![2, D]).unwrap();
    let ids = tr.input("ids", DType::I32, vec![2, 2]).unwrap();
    let w = tr.weight("gate").unwrap();
    let y = tr.moe_matmul(x, w, ids).unwrap();
    tr.output("y", y).unwrap();
    let g = tr.finish();
    let plan = rt.prepare(&g, store, &CompileLimits::default()).unwrap();
    let run = |idv: Vec<i32>| {
        rt.run(
            plan.as_ref(),
            &[
                ("x", f32s(vec![2, D], vec![0.5; 2 * D])),
                ("ids", i32s(vec![2, 2], idv)),
            ],
            Deadline::default_device(),
        )
    };
    let err = run(vec![0, 6, 1, 2]).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Kernel { op: "moe_matmul", detail } if detail.contains("6")),
        "{err:?}"
    );
    // The runtime is not poisoned: the next step runs.
    let out = run(vec![0, 5, 1, 2]).unwrap();
    let HostTensor::F32 { shape, .. } = &out[0].1 else {
        panic!("f32 output")
    };
    assert_eq!(shape, &vec![4, F]);
}

#[test]
fn matmul_of_a_1d_weight_is_one_row() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(44);
    let mut s = Store::default();
    s.add("g", DType::F32, vec![D], packed(DType::F32, 1, D, &mut rng));
    let x = f32s(vec![3, D], rng.vec(3 * D));
    compare(
        &rt,
        "matmul [K]",
        s,
        3,
        |tr| {
            let x = tr.input("x", DType::F32, vec![3, D]).unwrap();
            let g = tr.weight("g").unwrap();
            vec![("z", tr.matmul(x, g).unwrap())]
        },
        &[("x", x)],
        (2e-4, 1e-5),
    );
}
