//! Paged attention on the CUDA runtime against the CPU runtime's exact attention: chunked
//! prefill of two sequences in one step, then a decode step reading what the first wrote,
//! grouped query heads, a head size off the 8-lane dot's multiple (the tail), padding tokens
//! that write no KV, a sliding window and soft-capped scores, and typed refusals of bad
//! metadata. On a GPU where one exists, else on
//! the CPU emulation of the driver (the same kernels through the shim).
//!
//! Bound: scores and sums take the CPU's operations in its order (NVRTC --fmad=false), so
//! only `expf` (and `tanhf` for capped scores) differs (each within 2 ulp of the CPU's); the
//! outputs, convex combinations of V rows, then differ by at most 1e-6 of V's magnitude (1).
mod common;

use std::sync::Arc;

use common::{Rng, Store};
use poot_core::{DType, Deadline};
use poot_cpu::{CpuOptions, CpuRuntime};
use poot_graph::{
    AttentionConfig, AttentionMeta, CompileLimits, Graph, TraceLimits, Tracer, WeightCatalog,
};
use poot_runtime::{HostTensor, KvCacheConfig, Runtime, RuntimeError};

const H: u32 = 4;
const HKV: u32 = 2;
const D: u32 = 36;
const BS: u32 = 4;
const MAX_BLOCKS: usize = 3;

fn graph(t: usize, seqs: usize) -> Graph {
    graph_masked(t, seqs, 0, 0.0)
}

/// `window` > 0: a sliding-window layer; `softcap` > 0: capped scores (Mistral, Gemma).
fn graph_masked(t: usize, seqs: usize, window: u32, softcap: f32) -> Graph {
    let s: Arc<dyn WeightCatalog> = Arc::new(Store::default());
    let mut tr = Tracer::new(TraceLimits::default(), t, s).unwrap();
    let q = tr
        .input("q", DType::F32, vec![t, (H * D) as usize])
        .unwrap();
    let k = tr
        .input("k", DType::F32, vec![t, (HKV * D) as usize])
        .unwrap();
    let v = tr
        .input("v", DType::F32, vec![t, (HKV * D) as usize])
        .unwrap();
    let meta = AttentionMeta {
        slot_mapping: tr.input("slots", DType::I32, vec![t]).unwrap(),
        token_seq: tr.input("seqs", DType::I32, vec![t]).unwrap(),
        positions: tr.input("pos", DType::I32, vec![t]).unwrap(),
        block_tables: tr
            .input("tables", DType::I32, vec![seqs, MAX_BLOCKS])
            .unwrap(),
    };
    let cfg = AttentionConfig {
        layer: 1,
        n_heads: H,
        n_kv_heads: HKV,
        head_dim: D,
        scale: 1.0 / (D as f32).sqrt(),
        window,
        softcap,
    };
    let o = tr.paged_attention(q, k, v, meta, cfg).unwrap();
    tr.output("o", o).unwrap();
    tr.finish()
}

fn i32s(v: Vec<i32>) -> HostTensor {
    HostTensor::I32 {
        shape: vec![v.len()],
        data: v,
    }
}

/// Inputs of one step: (sequence, position) per token, slots from the tables (-1 for padding).
fn step(
    rng: &mut Rng,
    toks: &[(i32, i32, bool)],
    tables: &[[i32; MAX_BLOCKS]],
) -> Vec<(&'static str, HostTensor)> {
    let t = toks.len();
    let f = |rng: &mut Rng, w: u32| HostTensor::F32 {
        shape: vec![t, w as usize],
        data: rng.vec(t * w as usize),
    };
    let slot = |&(s, p, write): &(i32, i32, bool)| {
        if write {
            tables[s as usize][(p / BS as i32) as usize] * BS as i32 + p % BS as i32
        } else {
            -1
        }
    };
    vec![
        ("q", f(rng, H * D)),
        ("k", f(rng, HKV * D)),
        ("v", f(rng, HKV * D)),
        ("slots", i32s(toks.iter().map(slot).collect())),
        ("seqs", i32s(toks.iter().map(|x| x.0).collect())),
        ("pos", i32s(toks.iter().map(|x| x.1).collect())),
        (
            "tables",
            HostTensor::I32 {
                shape: vec![tables.len(), MAX_BLOCKS],
                data: tables.iter().flatten().copied().collect(),
            },
        ),
    ]
}

fn out(o: &[(String, HostTensor)]) -> Vec<f32> {
    match &o[0].1 {
        HostTensor::F32 { data, .. } => data.clone(),
        _ => panic!("f32 output"),
    }
}

#[test]
fn chunked_prefill_then_decode_matches_the_cpu_runtime() {
    // Plain; a window of 3 (the prefill's later tokens and both decodes read only their last
    // three positions); soft-capped scores; both.
    for (window, softcap) in [(0, 0.0), (3, 0.0), (0, 0.5), (3, 0.5)] {
        attention_case(window, softcap);
    }
}

fn attention_case(window: u32, softcap: f32) {
    let Some(rt) = common::runtime() else { return };
    let cpu = CpuRuntime::new(CpuOptions {
        threads: 1,
        ..CpuOptions::default()
    })
    .unwrap();
    let kv = KvCacheConfig {
        n_layers: 2,
        n_kv_heads: HKV,
        head_dim: D,
        block_size: BS,
        num_blocks: 9,
        windowed_layers: 0,
        windowed_blocks: 0,
    };
    rt.configure_kv(kv).unwrap();
    cpu.configure_kv(kv).unwrap();
    let store: Arc<Store> = Arc::new(Store::default());
    let tables = [[3, 7, 1], [5, 2, 0]];
    let mut rng = Rng(77);
    // Step 1: sequence 0 prefills positions 0..6, sequence 1 positions 0..3, one padding row.
    let mut toks: Vec<(i32, i32, bool)> = (0..6).map(|p| (0, p, true)).collect();
    toks.extend((0..3).map(|p| (1, p, true)));
    toks.push((1, 2, false));
    // Step 2: each decodes one token, reading what step 1 wrote.
    let steps = [toks, vec![(0, 6, true), (1, 3, true)]];
    for toks in &steps {
        let g = graph_masked(toks.len(), tables.len(), window, softcap);
        let inputs = step(&mut rng, toks, &tables);
        let lim = CompileLimits::default();
        let got = out(&rt
            .run(
                rt.prepare(&g, store.clone(), &lim).unwrap().as_ref(),
                &inputs,
                Deadline::default_device(),
            )
            .unwrap());
        let want = out(&cpu
            .run(
                cpu.prepare(&g, store.clone(), &lim).unwrap().as_ref(),
                &inputs,
                Deadline::never(),
            )
            .unwrap());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{} tokens, window {window}, softcap {softcap}: worst abs diff {worst:e}",
            toks.len()
        );
        assert!(worst <= 1e-6, "worst {worst}");
    }
}

#[test]
fn bad_metadata_is_refused_before_anything_runs() {
    let Some(rt) = common::runtime() else { return };
    let store: Arc<Store> = Arc::new(Store::default());
    let g = graph(2, 1);
    let plan = rt.prepare(&g, store, &CompileLimits::default()).unwrap();
    let mut rng = Rng(5);
    let inputs = step(&mut rng, &[(0, 0, true), (0, 1, true)], &[[0, 1, 2]]);
    let err = rt
        .run(plan.as_ref(), &inputs, Deadline::default_device())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::KvNotConfigured), "{err:?}");
    rt.configure_kv(KvCacheConfig {
        n_layers: 2,
        n_kv_heads: HKV,
        head_dim: D,
        block_size: BS,
        num_blocks: 2,
        windowed_layers: 0,
        windowed_blocks: 0,
    })
    .unwrap();
    // Block 2 is past the pool's 2 blocks: position 8 would read it.
    let inputs = step(&mut rng, &[(0, 0, true), (0, 8, false)], &[[0, 1, 2]]);
    let err = rt
        .run(plan.as_ref(), &inputs, Deadline::default_device())
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Kernel { op: "paged_attention", detail } if detail.contains("block_tables")),
        "{err:?}"
    );
    // A slot that is not its position's slot.
    let mut inputs = step(&mut rng, &[(0, 0, true), (0, 1, true)], &[[0, 1, 0]]);
    inputs[3].1 = i32s(vec![0, 5]);
    let err = rt
        .run(plan.as_ref(), &inputs, Deadline::default_device())
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Kernel { op: "paged_attention", detail } if detail.contains("slot_mapping")),
        "{err:?}"
    );
    assert_eq!(
        rt.health(),
        poot_runtime::Health::Ok,
        "bad inputs are not device faults"
    );
}
