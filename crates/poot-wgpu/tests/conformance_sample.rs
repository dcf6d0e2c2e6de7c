//! Conformance of the `Sample` node on wgpu against the CPU runtime: greedy rows (a device
//! argmax; -1 for a row with a NaN or with nothing allowed), temperature, top-k, top-p and
//! min-p rows (sampled on the host by the shared row function): identical ids.
mod common;

use common::compare::{compare, f32s, i32s, open};
use common::{Rng, Store};
use poot_core::DType;
use poot_graph::SampleInputs;
use poot_runtime::HostTensor;
use poot_wgpu::WgpuOptions;

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
