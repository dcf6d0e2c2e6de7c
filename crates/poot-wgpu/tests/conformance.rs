//! The backend conformance suite: every op and stored dtype on wgpu against the CPU runtime
//! (exact numerics), on the same graphs and inputs, each with its stated error bound:
//! `|wgpu - cpu| <= atol + rtol * |cpu|` elementwise.
//!
//! Bounds and why: decoding packed blocks and data movement (embedding, slice, concat, gather,
//! reshape, literal) are exact (0); matmul sums K products in another order (f32), bounded by
//! 1e-5 * K * max|x| * max|w| per element, stated here as atol 2e-4 on outputs of size ~1;
//! elementwise and norm ops 1e-6 to 1e-5 (exp/tanh/sqrt differ by ulps across libms); rope
//! uses the host's cos/sin, so only the unfused rotation rounds (1e-6); attention's online
//! softmax reorders sums (2e-5), also with a sliding window and soft-capped scores (tanh differs
//! by ulps). Sampling is in conformance_sample.rs.
mod common;

use std::sync::Arc;

use common::compare::{assert_close, compare, cpu, f32s, i32s, open};
use common::{packed, Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{
    AttentionConfig, AttentionMeta, CompileLimits, RopeConfig, RopeScaling, RopeStyle, TraceLimits,
    Tracer, WeightCatalog,
};
use poot_runtime::{KvCacheConfig, Runtime};
use poot_wgpu::WgpuOptions;

/// Every stored dtype the CPU runtime decodes (`poot_cpu`'s packed kinds).
const WEIGHT_DTYPES: [DType; 14] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::Q8_K,
];

#[test]
fn matmul_every_dtype_and_token_tile() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(7);
    let (k, n) = (256, 67);
    for dt in WEIGHT_DTYPES {
        for t in [1usize, 5, 9] {
            let mut s = Store::default();
            s.add("w", dt, vec![n, k], packed(dt, n, k, &mut rng));
            let x = f32s(vec![t, k], rng.vec(t * k));
            compare(
                &rt,
                &format!("matmul {dt} t={t}"),
                s,
                t,
                |tr| {
                    let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
                    let w = tr.weight("w").unwrap();
                    vec![("y", tr.matmul(x, w).unwrap())]
                },
                &[("x", x)],
                (2e-4, 1e-5),
            );
        }
    }
}

#[test]
fn float_matmul_with_a_k_that_is_not_a_multiple_of_32() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(8);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let (k, n, t) = (45, 13, 3);
        let mut s = Store::default();
        s.add("w", dt, vec![n, k], packed(dt, n, k, &mut rng));
        let x = f32s(vec![t, k], rng.vec(t * k));
        compare(
            &rt,
            &format!("matmul {dt} k=45"),
            s,
            t,
            |tr| {
                let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
                let w = tr.weight("w").unwrap();
                vec![("y", tr.matmul(x, w).unwrap())]
            },
            &[("x", x)],
            (2e-4, 1e-5),
        );
    }
}

#[test]
fn weights_larger_than_a_binding_are_split_by_rows() {
    // 4 KiB bindings: a [67, 256] weight spans several parts in every dtype.
    let options = WgpuOptions {
        max_binding_bytes: Some(4096),
        ..WgpuOptions::default()
    };
    let Some(rt) = open(options) else { return };
    assert_eq!(rt.max_binding_bytes(), 4096);
    let mut rng = Rng(9);
    let (k, n, t) = (256, 67, 3);
    // Blocks of 22 and 110 bytes: parts start on row boundaries that are not 4-aligned.
    for dt in [
        DType::F32,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q3_K,
        DType::Q6_K,
    ] {
        let mut s = Store::default();
        s.add("w", dt, vec![n, k], packed(dt, n, k, &mut rng));
        let x = f32s(vec![t, k], rng.vec(t * k));
        compare(
            &rt,
            &format!("split matmul + embedding {dt}"),
            s,
            t,
            |tr| {
                let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
                let ids = tr.input("ids", DType::I32, vec![t]).unwrap();
                let w = tr.weight("w").unwrap();
                vec![
                    ("y", tr.matmul(x, w).unwrap()),
                    ("e", tr.embedding(w, ids).unwrap()),
                ]
            },
            &[("x", x), ("ids", i32s(vec![t], vec![0, 66, 33]))],
            (2e-4, 1e-5),
        );
    }
}

#[test]
fn embedding_every_dtype_is_exact() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(10);
    let (v, d, t) = (37, 256, 4);
    for dt in WEIGHT_DTYPES {
        let mut s = Store::default();
        s.add("emb", dt, vec![v, d], packed(dt, v, d, &mut rng));
        compare(
            &rt,
            &format!("embedding {dt}"),
            s,
            t,
            |tr| {
                let ids = tr.input("ids", DType::I32, vec![t]).unwrap();
                let e = tr.weight("emb").unwrap();
                vec![("e", tr.embedding(e, ids).unwrap())]
            },
            &[("ids", i32s(vec![t], vec![0, 36, 5, 5]))],
            (0.0, 0.0),
        );
    }
}

#[test]
fn norm_and_elementwise_ops() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(11);
    let (t, d) = (3, 96);
    for wdt in [DType::F32, DType::F16, DType::BF16] {
        let mut s = Store::default();
        s.add("g", wdt, vec![d], packed(wdt, 1, d, &mut rng));
        s.add("b", DType::F32, vec![d], packed(DType::F32, 1, d, &mut rng));
        let x = f32s(vec![t, d], rng.vec(t * d).iter().map(|v| 3.0 * v).collect());
        let y = f32s(vec![t, d], rng.vec(t * d));
        compare(
            &rt,
            &format!("norm/eltwise, norm weight {wdt}"),
            s,
            t,
            |tr| {
                let x = tr.input("x", DType::F32, vec![t, d]).unwrap();
                let y = tr.input("y", DType::F32, vec![t, d]).unwrap();
                let g = tr.weight("g").unwrap();
                let b = tr.weight("b").unwrap();
                vec![
                    ("rms", tr.rms_norm(x, g, 1e-5).unwrap()),
                    ("add", tr.add(x, y).unwrap()),
                    ("add_bias", tr.add(x, b).unwrap()),
                    ("mul", tr.mul(x, y).unwrap()),
                    ("silu", tr.silu(x).unwrap()),
                    ("gelu", tr.gelu(x).unwrap()),
                    ("softmax", tr.softmax(x).unwrap()),
                    ("softcap", tr.softcap(x, 1.5).unwrap()),
                ]
            },
            &[("x", x), ("y", y)],
            (1e-6, 1e-5),
        );
    }
}

#[test]
fn rope_styles_and_partial_rotation() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(12);
    let (t, heads, hd) = (4, 3, 16);
    let scalings = [
        RopeScaling::None,
        RopeScaling::Linear { factor: 2.0 },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 64,
        },
    ];
    for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
        for (rot, scaling) in [(16, scalings[0]), (8, scalings[1]), (16, scalings[2])] {
            let cfg = RopeConfig {
                n_heads: heads,
                head_dim: hd,
                rot_dim: rot,
                theta: 10000.0,
                style,
                scaling,
            };
            let x = f32s(
                vec![t, (heads * hd) as usize],
                rng.vec(t * (heads * hd) as usize),
            );
            compare(
                &rt,
                &format!("rope {style:?} rot={rot} {scaling:?}"),
                Store::default(),
                t,
                |tr| {
                    let x = tr
                        .input("x", DType::F32, vec![t, (heads * hd) as usize])
                        .unwrap();
                    let p = tr.input("pos", DType::I32, vec![t]).unwrap();
                    vec![("y", tr.rope(x, p, cfg).unwrap())]
                },
                &[("x", x), ("pos", i32s(vec![t], vec![0, 1, 17, 300]))],
                (1e-6, 1e-6),
            );
        }
    }
}

#[test]
fn data_movement_is_exact() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(13);
    let x = f32s(vec![4, 6], rng.vec(24));
    let y = f32s(vec![4, 2], rng.vec(8));
    compare(
        &rt,
        "reshape/slice/concat/gather/literal",
        Store::default(),
        4,
        |tr| {
            let x = tr.input("x", DType::F32, vec![4, 6]).unwrap();
            let y = tr.input("y", DType::F32, vec![4, 2]).unwrap();
            let rows = tr.input("rows", DType::I32, vec![3]).unwrap();
            let lit = tr
                .literal(&[1.0, -2.0, 3.5, 0.25, 8.0, -1.0], vec![6])
                .unwrap();
            let r = tr.reshape(x, vec![6, 4]).unwrap();
            let s = tr.slice(x, 1, 2, 5).unwrap();
            let c = tr.concat(&[x, y], 1).unwrap();
            let g = tr.gather_rows(x, rows).unwrap();
            let a = tr.add(x, lit).unwrap();
            vec![("r", r), ("s", s), ("c", c), ("g", g), ("lit", a)]
        },
        &[("x", x), ("y", y), ("rows", i32s(vec![3], vec![3, 0, 3]))],
        (0.0, 0.0),
    );
}

/// Two steps through the paged KV pool (a 5-token prefill over two blocks, then one decode
/// token), GQA 4 query heads over 2 kv heads, on both runtimes.
#[test]
fn paged_attention_prefill_then_decode() {
    // Plain; a sliding window of 3 (positions 0..5 cross it); soft-capped scores; both.
    for (window, softcap) in [(0, 0.0), (3, 0.0), (0, 0.5), (3, 0.5)] {
        attention_case(window, softcap);
    }
}

fn attention_case(window: u32, softcap: f32) {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let cpu = cpu();
    let kv = KvCacheConfig {
        n_layers: 1,
        n_kv_heads: 2,
        head_dim: 16,
        block_size: 4,
        num_blocks: 6,
        windowed_layers: 0,
        windowed_blocks: 0,
    };
    rt.configure_kv(kv).unwrap();
    cpu.configure_kv(kv).unwrap();
    let cfg = AttentionConfig {
        layer: 0,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        scale: 0.25,
        window,
        softcap,
    };
    let mut rng = Rng(15);
    // Sequence 0 uses blocks [3, 1]; sequence 1 (decode only at step 2) uses block [5].
    // (slot_mapping, token_seq, positions, block_tables)
    type Step = (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>);
    let steps: [Step; 2] = [
        (
            vec![12, 13, 14, 15, 4],
            vec![0, 0, 0, 0, 0],
            vec![0, 1, 2, 3, 4],
            vec![3, 1, 0, 0],
        ),
        (vec![5, 20], vec![0, 1], vec![5, 0], vec![3, 1, 5, 0]),
    ];
    for (step, (slots, seqs, pos, tables)) in steps.into_iter().enumerate() {
        let t = slots.len();
        let s = tables.len() / 2;
        let store = Arc::new(Store::default());
        let cat: Arc<dyn WeightCatalog> = store.clone();
        let mut tr = Tracer::new(TraceLimits::default(), t, cat).unwrap();
        let q = tr.input("q", DType::F32, vec![t, 64]).unwrap();
        let k = tr.input("k", DType::F32, vec![t, 32]).unwrap();
        let v = tr.input("v", DType::F32, vec![t, 32]).unwrap();
        let meta = AttentionMeta {
            slot_mapping: tr.input("slots", DType::I32, vec![t]).unwrap(),
            token_seq: tr.input("seqs", DType::I32, vec![t]).unwrap(),
            positions: tr.input("pos", DType::I32, vec![t]).unwrap(),
            block_tables: tr.input("tables", DType::I32, vec![s, 2]).unwrap(),
        };
        let o = tr.paged_attention(q, k, v, meta, cfg).unwrap();
        tr.output("o", o).unwrap();
        let g = tr.finish();
        let inputs = [
            ("q", f32s(vec![t, 64], rng.vec(t * 64))),
            ("k", f32s(vec![t, 32], rng.vec(t * 32))),
            ("v", f32s(vec![t, 32], rng.vec(t * 32))),
            ("slots", i32s(vec![t], slots)),
            ("seqs", i32s(vec![t], seqs)),
            ("pos", i32s(vec![t], pos)),
            ("tables", i32s(vec![s, 2], tables)),
        ];
        let limits = CompileLimits::default();
        let want = cpu
            .run(
                cpu.prepare(&g, store.clone(), &limits).unwrap().as_ref(),
                &inputs,
                Deadline::never(),
            )
            .unwrap();
        let got = rt
            .run(
                rt.prepare(&g, store, &limits).unwrap().as_ref(),
                &inputs,
                Deadline::default_device(),
            )
            .unwrap();
        assert_close(
            &format!("attention step {step}, window {window}, softcap {softcap}"),
            &want[0].1,
            &got[0].1,
            2e-5,
            2e-5,
        );
    }
}

#[test]
fn bad_ids_are_refused_on_the_host_without_poisoning() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(16);
    let mut s = Store::default();
    s.add(
        "emb",
        DType::Q8_0,
        vec![4, 32],
        packed(DType::Q8_0, 4, 32, &mut rng),
    );
    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut tr = Tracer::new(TraceLimits::default(), 1, cat).unwrap();
    let ids = tr.input("ids", DType::I32, vec![1]).unwrap();
    let e = tr.weight("emb").unwrap();
    let y = tr.embedding(e, ids).unwrap();
    tr.output("y", y).unwrap();
    let plan = rt
        .prepare(&tr.finish(), s, &CompileLimits::default())
        .unwrap();
    let err = rt
        .run(
            plan.as_ref(),
            &[("ids", i32s(vec![1], vec![4]))],
            Deadline::default_device(),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            poot_runtime::RuntimeError::Kernel {
                op: "embedding",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(rt.health(), poot_runtime::Health::Ok);
}

#[test]
fn a_kernel_over_the_body_limit_is_refused_at_compile() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(17);
    let mut s = Store::default();
    s.add(
        "w",
        DType::Q6_K,
        vec![4, 256],
        packed(DType::Q6_K, 4, 256, &mut rng),
    );
    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut tr = Tracer::new(TraceLimits::default(), 1, cat).unwrap();
    let x = tr.input("x", DType::F32, vec![1, 256]).unwrap();
    let w = tr.weight("w").unwrap();
    let y = tr.matmul(x, w).unwrap();
    tr.output("y", y).unwrap();
    let limits = CompileLimits {
        max_kernel_instructions: 20,
        ..CompileLimits::default()
    };
    let err = rt.prepare(&tr.finish(), s, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            poot_runtime::RuntimeError::Compile(poot_graph::CompileError::BodyLimit { ref kernel, .. })
                if kernel.starts_with("matmul")
        ),
        "{err:?}"
    );
}

/// Opted-in f16 arithmetic for F16 weights: x and each product round to f16 (2^-11 relative
/// each) and products sum in f32, so |wgpu - cpu| <= 2^-10 * sum_k |x_k w_k| (at most 0.0625
/// here with |x|, |w| <= 1 and K = 256; random signs keep it near 1e-3); stated as atol 1e-2.
#[test]
fn f16_arithmetic_matmul_within_its_bound() {
    let options = WgpuOptions {
        f16_arithmetic: true,
        ..WgpuOptions::default()
    };
    let Some(rt) = open(options) else { return };
    if !rt.uses_f16_arithmetic() {
        eprintln!("SKIP: this adapter does not offer shader-f16");
        return;
    }
    let mut rng = Rng(18);
    for (k, t) in [(256, 1), (256, 9), (45, 3)] {
        let n = 33;
        let mut s = Store::default();
        s.add(
            "w",
            DType::F16,
            vec![n, k],
            packed(DType::F16, n, k, &mut rng),
        );
        let x = f32s(vec![t, k], rng.vec(t * k));
        compare(
            &rt,
            &format!("f16 matmul k={k} t={t}"),
            s,
            t,
            |tr| {
                let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
                let w = tr.weight("w").unwrap();
                vec![("y", tr.matmul(x, w).unwrap())]
            },
            &[("x", x)],
            (1e-2, 0.0),
        );
    }
}
