//! Conformance of the sampling step's logit ops on wgpu (adapters with f64) against the CPU
//! runtime, and of the whole head as `poot.models.step.trace_head` builds it.
//!
//! Bounds and why: `mask_logits` and `top_k` move values and compare keys only (exact);
//! `adjust_logits` follows the CPU's f32 steps, its penalty division done in f64 and rounded
//! once (exact where f64 division is correctly rounded, as on lavapipe); `logprobs` sums in
//! f64 in another order and uses its own exp/ln (a few f64 ulp of lse), so the f32 result is
//! the CPU's or one f32 ulp away (rtol 3e-7), or, for a logprob near 0 where x - lse cancels,
//! within a few f64 ulp of lse (atol 1e-12 for |lse| < 1000); the head's token ids are equal (see
//! conformance_sample.rs for the draw's bound). The head reads back only its outputs.
mod common;

use std::sync::Arc;

use common::compare::{assert_close, compare, cpu, f32s, i32s, open};
use common::{Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{AdjustInputs, CompileLimits, SampleInputs, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, LateInput, Runtime, RuntimeError};
use poot_wgpu::{WgpuOptions, WgpuRuntime};

const S: usize = 6;
const V: usize = 777;
const W: usize = 16;

fn device() -> Option<WgpuRuntime> {
    let rt = open(WgpuOptions::default())?;
    assert!(rt.samples_on_device(), "lavapipe has shader-f64");
    Some(rt)
}

/// Logits with ties and extremes: row 2 holds a NaN, row 3 a -inf, row 4 quantized values.
fn logits(rng: &mut Rng) -> Vec<f32> {
    let mut l: Vec<f32> = rng.vec(S * V).iter().map(|x| x * 6.0).collect();
    l[2 * V + 100] = f32::NAN;
    l[3 * V + 5] = f32::NEG_INFINITY;
    for x in &mut l[4 * V..5 * V] {
        *x = (*x).round();
    }
    l[5 * V + 9] = 40.0;
    l
}

/// Per-row sparse lists: repeated ids, prompt-only and generated ids, bias-only entries, a
/// -inf bias (row 1), -1 padding.
fn adjust_inputs(rng: &mut Rng) -> Vec<(&'static str, HostTensor)> {
    let (mut ids, mut counts, mut bias) = (vec![], vec![], vec![]);
    for r in 0..S {
        for j in 0..W {
            let id = if j == 3 {
                ids[r * W + 1]
            } else {
                (rng.next_u32() % V as u32) as i32
            };
            ids.push(if j >= 12 { -1 } else { id });
            counts.push([-1, 0, 1, 3][j % 4]);
            bias.push(if j % 3 == 0 { rng.f32() * 4.0 } else { 0.0 });
        }
    }
    bias[W + 2] = f32::NEG_INFINITY;
    vec![
        ("adj_ids", i32s(vec![S, W], ids)),
        ("adj_counts", i32s(vec![S, W], counts)),
        ("adj_bias", f32s(vec![S, W], bias)),
        (
            "repetition",
            f32s(vec![S], vec![1.3, 1.0, 0.7, 2.0, 1.1, 1.3]),
        ),
        (
            "presence",
            f32s(vec![S], vec![0.5, 0.0, 0.25, 1.0, 0.0, 0.1]),
        ),
        (
            "frequency",
            f32s(vec![S], vec![0.1, 0.3, 0.0, 0.7, 0.2, 0.0]),
        ),
    ]
}

fn adjust(tr: &mut Tracer, l: poot_graph::ValueId) -> poot_graph::ValueId {
    let mut input = |n: &str, dt, shape| tr.input(n, dt, shape).unwrap();
    let a = AdjustInputs {
        ids: input("adj_ids", DType::I32, vec![S, W]),
        counts: input("adj_counts", DType::I32, vec![S, W]),
        bias: input("adj_bias", DType::F32, vec![S, W]),
        repetition: input("repetition", DType::F32, vec![S]),
        presence: input("presence", DType::F32, vec![S]),
        frequency: input("frequency", DType::F32, vec![S]),
    };
    tr.adjust_logits(l, a).unwrap()
}

/// Row r allows every token whose id is not a multiple of r + 2 (row 5: none but token 9).
fn mask() -> HostTensor {
    let words = V.div_ceil(32);
    let mut m = vec![0i32; S * words];
    for r in 0..S {
        for t in 0..V {
            if (r < 5 && t % (r + 2) != 0) || (r == 5 && t == 9) {
                m[r * words + t / 32] |= 1 << (t % 32);
            }
        }
    }
    i32s(vec![S, words], m)
}

#[test]
fn adjust_and_mask_equal_the_cpus_bit_for_bit() {
    let Some(rt) = device() else { return };
    let mut rng = Rng(3);
    let mut inputs = adjust_inputs(&mut rng);
    inputs.push(("logits", f32s(vec![S, V], logits(&mut rng))));
    inputs.push(("mask", mask()));
    compare(
        &rt,
        "adjust, mask",
        Store::default(),
        S,
        |tr| {
            let l = tr.input("logits", DType::F32, vec![S, V]).unwrap();
            let a = adjust(tr, l);
            let m = tr
                .input("mask", DType::I32, vec![S, V.div_ceil(32)])
                .unwrap();
            let masked = tr.mask_logits(a, m).unwrap();
            vec![("adjusted", a), ("masked", masked)]
        },
        &inputs,
        (0.0, 0.0),
    );
}

#[test]
fn top_k_ids_and_logprobs_equal_the_cpus() {
    let Some(rt) = device() else { return };
    let mut rng = Rng(4);
    let mut l = logits(&mut rng);
    l[V + 3] = f32::INFINITY; // ranks first; its row's logprobs are NaN
    l[5 * V + 10] = 40.0; // a tie with id 9: the lower id first
    let ids: Vec<i32> = (0..S * 3)
        .map(|i| [7, -1, (i * 31 % V) as i32][i % 3])
        .collect();
    let inputs = [
        ("logits", f32s(vec![S, V], l)),
        ("ids", i32s(vec![S, 3], ids)),
    ];
    compare(
        &rt,
        "top_k, logprobs",
        Store::default(),
        S,
        |tr| {
            let l = tr.input("logits", DType::F32, vec![S, V]).unwrap();
            let ids = tr.input("ids", DType::I32, vec![S, 3]).unwrap();
            let top = tr.top_k_ids(l, 64).unwrap();
            vec![("top", top), ("logprobs", tr.logprobs(l, ids).unwrap())]
        },
        &inputs,
        (1e-12, 3e-7),
    );
    // A short row: fewer ranked values than k pad with -1.
    let row = vec![1.0, f32::NAN, -2.0, 1.0];
    compare(
        &rt,
        "top_k padding",
        Store::default(),
        1,
        |tr| {
            let l = tr.input("logits", DType::F32, vec![1, 4]).unwrap();
            vec![("top", tr.top_k_ids(l, 4).unwrap())]
        },
        &[("logits", f32s(vec![1, 4], row))],
        (0.0, 0.0),
    );
}

/// The head of a sampled, biased, penalised, guided step that asks for logprobs.
fn head(s: usize, v: usize) -> poot_graph::Graph {
    let cat: Arc<dyn WeightCatalog> = Arc::new(Store::default());
    let mut tr = Tracer::new(TraceLimits::default(), s, cat).unwrap();
    let raw = tr.input("logits", DType::F32, vec![s, v]).unwrap();
    let a = adjust(&mut tr, raw);
    let m = tr
        .input("mask", DType::I32, vec![s, v.div_ceil(32)])
        .unwrap();
    let l = tr.mask_logits(a, m).unwrap();
    let p = SampleInputs {
        temperature: tr.input("temperature", DType::F32, vec![s]).unwrap(),
        top_k: tr.input("top_k", DType::I32, vec![s]).unwrap(),
        top_p: tr.input("top_p", DType::F32, vec![s]).unwrap(),
        min_p: tr.input("min_p", DType::F32, vec![s]).unwrap(),
        uniform: tr.input("uniform", DType::F32, vec![s]).unwrap(),
    };
    let ids = tr.sample(l, p).unwrap();
    tr.output("token_ids", ids).unwrap();
    let col = tr.reshape(ids, vec![s, 1]).unwrap();
    let top = tr.top_k_ids(raw, 20).unwrap();
    let both = tr.concat(&[col, top], 1).unwrap();
    tr.output("logprob_ids", both).unwrap();
    let lp = tr.logprobs(raw, both).unwrap();
    tr.output("logprobs", lp).unwrap();
    tr.finish()
}

fn head_inputs(rng: &mut Rng) -> Vec<(&'static str, HostTensor)> {
    let mut inputs = adjust_inputs(rng);
    inputs.push(("logits", f32s(vec![S, V], logits(rng))));
    inputs.push(("mask", mask()));
    inputs.push((
        "temperature",
        f32s(vec![S], vec![0.8, 0.0, 1.0, 0.7, 1.2, 0.5]),
    ));
    inputs.push(("top_k", i32s(vec![S], vec![0, 0, 40, 0, 5, 0])));
    inputs.push(("top_p", f32s(vec![S], vec![0.9, 1.0, 1.0, 0.95, 0.5, 1.0])));
    inputs.push(("min_p", f32s(vec![S], vec![0.0, 0.0, 0.05, 0.0, 0.0, 0.1])));
    let u = (0..S).map(|_| (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32);
    inputs.push(("uniform", f32s(vec![S], u.collect())));
    inputs
}

fn run(rt: &dyn Runtime, inputs: &[(&str, HostTensor)]) -> Vec<(String, HostTensor)> {
    let plan = rt
        .prepare(
            &head(S, V),
            Arc::new(Store::default()),
            &CompileLimits::default(),
        )
        .unwrap();
    rt.run(plan.as_ref(), inputs, Deadline::default_device())
        .unwrap()
}

#[test]
fn the_whole_head_equals_the_cpus_and_reads_back_no_logits() {
    let Some(rt) = device() else { return };
    let mut rng = Rng(9);
    for _ in 0..3 {
        let inputs = head_inputs(&mut rng);
        let want = run(&cpu(), &inputs);
        let before = rt.stats().readback_bytes;
        let got = run(&rt, &inputs);
        // token ids [S], logprob ids [S, 21], logprobs [S, 21]: 4 bytes each.
        assert_eq!(
            rt.stats().readback_bytes - before,
            (S * 4 + 2 * S * 21 * 4) as u64
        );
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_close(name, w, g, 1e-12, 3e-7);
        }
        // As on the CPU, the logit ops treat any non-finite value as a broken row: row 2's NaN
        // and row 3's -inf logit (adjust_logits), and row 1's -inf bias (then mask_logits)
        // give -1; the other rows draw a token.
        let HostTensor::I32 { data, .. } = &got[0].1 else {
            panic!()
        };
        let drawn: Vec<bool> = data.iter().map(|&i| i >= 0).collect();
        assert_eq!(drawn, [true, false, false, false, true, true]);
    }
}

#[test]
fn bad_settings_are_typed_errors_before_the_device_runs() {
    let Some(rt) = device() else { return };
    let mut rng = Rng(10);
    let base = head_inputs(&mut rng);
    let with = |name: &str, t: HostTensor| {
        let mut v = base.clone();
        v.iter_mut().find(|(n, _)| *n == name).unwrap().1 = t;
        v
    };
    let plan = rt
        .prepare(
            &head(S, V),
            Arc::new(Store::default()),
            &CompileLimits::default(),
        )
        .unwrap();
    let mut bad_id = vec![0; S * W];
    bad_id[5] = V as i32;
    for inputs in [
        with("repetition", f32s(vec![S], vec![0.0; S])),
        with("adj_ids", i32s(vec![S, W], bad_id)),
        with("top_p", f32s(vec![S], vec![0.0; S])),
    ] {
        let e = rt.run(plan.as_ref(), &inputs, Deadline::default_device());
        assert!(matches!(e, Err(RuntimeError::Kernel { .. })), "{e:?}");
        assert!(cpu()
            .run(
                cpu()
                    .prepare(
                        &head(S, V),
                        Arc::new(Store::default()),
                        &CompileLimits::default()
                    )
                    .unwrap()
                    .as_ref(),
                &inputs,
                Deadline::never()
            )
            .is_err());
    }
    // Nothing was poisoned: the good inputs still run.
    run(&rt, &base);
}

#[test]
fn the_mask_as_a_late_input_is_read_after_the_forward_submission() {
    let Some(rt) = device() else { return };
    let mut rng = Rng(11);
    let inputs = head_inputs(&mut rng);
    let want = run(&cpu(), &inputs);
    let early: Vec<(&str, HostTensor)> = inputs
        .iter()
        .filter(|(n, _)| *n != "mask")
        .cloned()
        .collect();
    let plan = rt
        .prepare(
            &head(S, V),
            Arc::new(Store::default()),
            &CompileLimits::default(),
        )
        .unwrap();
    let deadline = Deadline::default_device();
    // Filled from another thread while the step runs.
    let slot = LateInput::new();
    let filler = slot.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(30));
        filler.fill(mask());
    });
    let got = rt
        .run_late(plan.as_ref(), &early, &[("mask", slot)], deadline)
        .unwrap();
    t.join().unwrap();
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert_close(name, w, g, 1e-12, 3e-7);
    }
    // A failed slot and a mask of the wrong shape are typed errors that poison nothing.
    let failed = LateInput::new();
    failed.fail("the grammar rejected the prefix");
    let e = rt.run_late(plan.as_ref(), &early, &[("mask", failed)], deadline);
    assert!(
        matches!(
            e,
            Err(RuntimeError::Kernel {
                op: "late_input",
                ..
            })
        ),
        "{e:?}"
    );
    let wrong = LateInput::new();
    wrong.fill(i32s(vec![S, 1], vec![0; S]));
    let e = rt.run_late(plan.as_ref(), &early, &[("mask", wrong)], deadline);
    assert!(
        matches!(e, Err(RuntimeError::InputMismatch { .. })),
        "{e:?}"
    );
    assert!(matches!(rt.health(), poot_runtime::Health::Ok));
    run(&rt, &inputs);
}
