//! Conformance of the `Sample` node on wgpu against the CPU runtime: greedy rows (-1 for a
//! row with a NaN or with nothing allowed), temperature, top-k, top-p and min-p rows with the
//! host's uniform draws: identical ids, on the device (`sample.wgsl`, where the adapter has
//! f64) and on the host path (`WgpuOptions::host_sampling`). The bound is equality: the
//! device's sums may differ from the CPU's by rounding (see `sample.wgsl`), which moves a draw
//! with probability at most V^2 * 2^-52 per row (typically near V^1.5 * 2^-53), so the fixed
//! inputs here, flat 49152-token rows included, are asserted equal.
mod common;

use std::sync::Arc;

use common::compare::{compare, cpu, f32s, i32s, open};
use common::{Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, SampleInputs, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, Runtime};
use poot_wgpu::WgpuOptions;

fn sample_graph(s: usize, v: usize) -> poot_graph::Graph {
    let cat: Arc<dyn WeightCatalog> = Arc::new(Store::default());
    let mut tr = Tracer::new(TraceLimits::default(), s, cat).unwrap();
    let l = tr.input("logits", DType::F32, vec![s, v]).unwrap();
    let p = SampleInputs {
        temperature: tr.input("temp", DType::F32, vec![s]).unwrap(),
        top_k: tr.input("top_k", DType::I32, vec![s]).unwrap(),
        top_p: tr.input("top_p", DType::F32, vec![s]).unwrap(),
        min_p: tr.input("min_p", DType::F32, vec![s]).unwrap(),
        uniform: tr.input("u", DType::F32, vec![s]).unwrap(),
    };
    let ids = tr.sample(l, p).unwrap();
    tr.output("ids", ids).unwrap();
    tr.finish()
}

fn run(rt: &dyn Runtime, g: &poot_graph::Graph, inputs: &[(&str, HostTensor)]) -> Vec<i32> {
    let store = Arc::new(Store::default());
    let plan = rt.prepare(g, store, &CompileLimits::default()).unwrap();
    match rt
        .run(plan.as_ref(), inputs, Deadline::default_device())
        .unwrap()
        .remove(0)
        .1
    {
        HostTensor::I32 { data, .. } => data,
        t => panic!("ids are {t:?}"),
    }
}

/// Rows of every kind: peaked, flat, quantized (many ties), one dominant value; each with
/// its own settings and draw.
fn mixed_rows(rng: &mut Rng, s: usize, v: usize) -> Vec<(&'static str, HostTensor)> {
    let mut logits = Vec::with_capacity(s * v);
    let (mut t, mut k, mut p, mut m, mut u) = (vec![], vec![], vec![], vec![], vec![]);
    for r in 0..s {
        let scale = [8.0, 0.05, 2.0, 1.0][r % 4];
        for _ in 0..v {
            let x = rng.f32() * scale;
            logits.push(if r % 4 == 3 {
                (x * 4.0).round() / 4.0
            } else {
                x
            });
        }
        t.push([0.0, 0.3, 0.8, 1.0, 1.5, 0.7][r % 6]);
        k.push([0, 1, 5, 40, 0, 3000, 0][r % 7]);
        p.push([1.0, 0.9, 0.5, 1.0, 0.95][r % 5]);
        m.push([0.0, 0.0, 0.05, 0.3][(r / 2) % 4]);
        u.push((rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32);
    }
    vec![
        ("logits", f32s(vec![s, v], logits)),
        ("temp", f32s(vec![s], t)),
        ("top_k", i32s(vec![s], k)),
        ("top_p", f32s(vec![s], p)),
        ("min_p", f32s(vec![s], m)),
        ("u", f32s(vec![s], u)),
    ]
}

#[test]
fn device_draws_equal_the_cpus_over_mixed_rows() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    assert!(
        rt.samples_on_device(),
        "lavapipe and GPUs with shader-f64 sample on the device"
    );
    let mut rng = Rng(77);
    for (s, v) in [(48, 1000), (12, 5000), (4, 17)] {
        let inputs = mixed_rows(&mut rng, s, v);
        let g = sample_graph(s, v);
        let want = run(&cpu(), &g, &inputs);
        let got = run(&rt, &g, &inputs);
        assert_eq!(want, got, "{s} rows of {v}");
        assert!(want.iter().all(|&i| i >= 0));
    }
}

#[test]
fn a_device_sample_reads_back_only_ids_and_the_host_path_reads_logits() {
    let (s, v) = (4, 3000);
    let mut rng = Rng(5);
    let inputs = mixed_rows(&mut rng, s, v);
    let g = sample_graph(s, v);
    for host_sampling in [false, true] {
        let Some(rt) = open(WgpuOptions {
            host_sampling,
            ..WgpuOptions::default()
        }) else {
            return;
        };
        let before = rt.stats();
        let got = run(&rt, &g, &inputs);
        assert_eq!(
            got,
            run(&cpu(), &g, &inputs),
            "host_sampling {host_sampling}"
        );
        let after = rt.stats();
        assert_eq!(after.runs, before.runs + 1);
        // Rows 1..3 have a temperature: the host path reads the whole logits tensor for them.
        let logits = if host_sampling { s * v * 4 } else { 0 };
        assert_eq!(
            after.readback_bytes - before.readback_bytes,
            (s * 4 + logits) as u64
        );
    }
}

fn sample_inputs(
    s: usize,
    (temp, top_k, top_p, min_p): (f32, i32, f32, f32),
    u: &[f32],
) -> Vec<(&'static str, HostTensor)> {
    vec![
        ("temp", f32s(vec![s], vec![temp; s])),
        ("top_k", i32s(vec![s], vec![top_k; s])),
        ("top_p", f32s(vec![s], vec![top_p; s])),
        ("min_p", f32s(vec![s], vec![min_p; s])),
        ("u", f32s(vec![s], u.to_vec())),
    ]
}

#[test]
fn sampling_greedy_and_stochastic_rows_match() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(14);
    let (s, v) = (5, 1000);
    let mut logits = rng.vec(s * v);
    logits[v + 500] = 5.0; // row 1: a clear maximum
    logits[2 * v + 7] = 5.0; // row 2: a tie, the first wins
    logits[2 * v + 900] = 5.0;
    logits[3 * v + 321] = f32::NAN; // row 3: broken logits sample -1
    logits[4 * v..].fill(f32::NEG_INFINITY); // row 4: nothing allowed, -1
    let cases = [
        (0.0, 0, 1.0, 0.0),
        (0.8, 0, 1.0, 0.0),
        (1.0, 20, 0.9, 0.0),
        (1.5, 0, 0.5, 0.0),
        (1.0, 0, 1.0, 0.05),
    ];
    for (temp, top_k, top_p, min_p) in cases {
        let u = [0.1, 0.5, 0.93, 0.2, 0.7];
        let mut inputs = sample_inputs(s, (temp, top_k, top_p, min_p), &u);
        inputs.push(("logits", f32s(vec![s, v], logits.clone())));
        compare(
            &rt,
            &format!("sample t={temp} k={top_k} p={top_p} min_p={min_p}"),
            Store::default(),
            s,
            |tr| {
                let l = tr.input("logits", DType::F32, vec![s, v]).unwrap();
                let p = SampleInputs {
                    temperature: tr.input("temp", DType::F32, vec![s]).unwrap(),
                    top_k: tr.input("top_k", DType::I32, vec![s]).unwrap(),
                    top_p: tr.input("top_p", DType::F32, vec![s]).unwrap(),
                    min_p: tr.input("min_p", DType::F32, vec![s]).unwrap(),
                    uniform: tr.input("u", DType::F32, vec![s]).unwrap(),
                };
                vec![("ids", tr.sample(l, p).unwrap())]
            },
            &inputs,
            (0.0, 0.0),
        );
    }
}

#[test]
fn device_draws_equal_the_cpus_over_a_real_vocabulary() {
    // SmolLM2's 49152 tokens (4 id digits): all-equal rows, where every cut and the draw fall
    // deep in id order; quantized rows (ties in every bin); and a flat random row at
    // temperature 2, each with top-k and top-p cuts past the first thousands of tokens.
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let (s, v) = (8, 49152);
    let mut rng = Rng(21);
    let mut logits = vec![0.0f32; s * v];
    for (r, row) in logits.chunks_mut(v).enumerate() {
        for x in row.iter_mut() {
            *x = match r % 4 {
                0 => 0.0,
                1 => (rng.f32() * 3.0).round(),
                _ => rng.f32(),
            };
        }
    }
    let inputs = vec![
        ("logits", f32s(vec![s, v], logits)),
        (
            "temp",
            f32s(vec![s], vec![1.0, 1.0, 2.0, 0.9, 1.0, 0.7, 2.0, 1.3]),
        ),
        (
            "top_k",
            i32s(vec![s], vec![0, 30000, 0, 1000, 20000, 0, 0, 5]),
        ),
        (
            "top_p",
            f32s(vec![s], vec![0.5, 1.0, 0.9, 1.0, 0.95, 1.0, 0.3, 1.0]),
        ),
        (
            "min_p",
            f32s(vec![s], vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0]),
        ),
        (
            "u",
            f32s(
                vec![s],
                vec![0.9001, 0.37, 0.61, 0.999, 0.05, 0.5, 0.77, 0.2],
            ),
        ),
    ];
    let g = sample_graph(s, v);
    assert_eq!(run(&rt, &g, &inputs), run(&cpu(), &g, &inputs));
}
