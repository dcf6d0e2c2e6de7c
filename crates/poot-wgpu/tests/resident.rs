//! Resident runs: outputs kept in device buffers (`run_resident`) read back on request
//! (`read`) equal a plain run's outputs bit for bit, a resident run reads nothing back, and a
//! tensor is read only by the runtime that made it. A kept tensor given back as an input
//! (`run_resident_with`) is bound with no readback and no upload, is left intact, and is
//! checked against the input's dtype and shape.
mod common;

use std::sync::Arc;

use common::compare::f32s;
use common::{runtime, Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, UnaryKind, WeightCatalog};
use poot_runtime::{HostTensor, Runtime, RuntimeError};
use poot_wgpu::WgpuOptions;

#[test]
fn kept_outputs_read_back_equal_a_plain_run() {
    let Some(rt) = runtime(WgpuOptions::default()) else {
        return;
    };
    let store = Arc::new(Store::default());
    let cat: Arc<dyn WeightCatalog> = store.clone();
    let mut t = Tracer::new(TraceLimits::default(), 3, cat).unwrap();
    let x = t.input("x", DType::F32, vec![3, 40]).unwrap();
    let y = t.unary(x, UnaryKind::Tanh).unwrap();
    let z = t.softmax(y).unwrap();
    t.output("y", y).unwrap();
    t.output("z", z).unwrap();
    let plan = rt
        .prepare(&t.finish(), store, &CompileLimits::default())
        .unwrap();
    let mut rng = Rng(5);
    let inputs = [("x", f32s(vec![3, 40], rng.vec(120)))];
    let want = rt
        .run(plan.as_ref(), &inputs, Deadline::default_device())
        .unwrap();
    let before = rt.stats().readback_bytes;
    let kept = rt
        .run_resident(plan.as_ref(), &inputs, Deadline::default_device())
        .unwrap();
    assert_eq!(
        rt.stats().readback_bytes,
        before,
        "a resident run reads nothing back"
    );
    // A later run must not overwrite a kept buffer.
    let other = [("x", f32s(vec![3, 40], vec![0.5; 120]))];
    rt.run(plan.as_ref(), &other, Deadline::default_device())
        .unwrap();
    let after = rt.stats().readback_bytes;
    for ((name, w), (kname, k)) in want.iter().zip(&kept) {
        assert_eq!(name, kname);
        assert_eq!(k.shape(), &[3, 40]);
        assert_eq!(k.nbytes(), 3 * 40 * 4);
        let got = rt.read(k, Deadline::default_device()).unwrap();
        let (HostTensor::F32 { data: a, .. }, HostTensor::F32 { data: b, .. }) = (w, &got) else {
            panic!("{name}: not f32");
        };
        assert!(
            a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{name}"
        );
    }
    assert_eq!(rt.stats().readback_bytes, after + 2 * 3 * 40 * 4);
    let Some(other_rt) = runtime(WgpuOptions::default()) else {
        return;
    };
    match other_rt.read(&kept[0].1, Deadline::default_device()) {
        Err(RuntimeError::Kernel { op: "read", detail }) => {
            assert!(detail.contains("another wgpu runtime"), "{detail}")
        }
        other => panic!("expected a typed refusal, got {other:?}"),
    }
}

/// `softmax(exp(tanh(x)))` over `[rows, 40]`: same-sized steps after the input's last read,
/// so a pooled input buffer would be reused, and overwritten, by a later step.
fn chain(rows: usize) -> (poot_graph::Graph, Arc<Store>) {
    let store = Arc::new(Store::default());
    let cat: Arc<dyn WeightCatalog> = store.clone();
    let mut t = Tracer::new(TraceLimits::default(), 3, cat).unwrap();
    let x = t.input("x", DType::F32, vec![rows, 40]).unwrap();
    let a = t.unary(x, UnaryKind::Tanh).unwrap();
    let b = t.unary(a, UnaryKind::Exp).unwrap();
    let c = t.softmax(b).unwrap();
    t.output("y", c).unwrap();
    (t.finish(), store)
}

fn bits(t: &HostTensor) -> Vec<u32> {
    match t {
        HostTensor::F32 { data, .. } => data.iter().map(|v| v.to_bits()).collect(),
        HostTensor::I32 { .. } => panic!("not f32"),
    }
}

#[test]
fn a_kept_tensor_is_bound_as_a_later_input_and_left_intact() {
    let Some(rt) = runtime(WgpuOptions::default()) else {
        return;
    };
    let limits = CompileLimits::default();
    let (g, store) = chain(3);
    let plan = rt.prepare(&g, store, &limits).unwrap();
    let host = f32s(vec![3, 40], Rng(9).vec(120));
    let never = Deadline::default_device();
    let first = rt
        .run_resident(plan.as_ref(), &[("x", host.clone())], never)
        .unwrap();
    let y0 = first[0].1.clone();
    let want_y0 = rt.read(&y0, never).unwrap();
    let want = rt
        .run(plan.as_ref(), &[("x", want_y0.clone())], never)
        .unwrap();
    let (read0, up0) = (rt.stats().readback_bytes, rt.stats().upload_bytes);
    let second = rt
        .run_resident_with(plan.as_ref(), &[], &[("x", y0.clone())], never)
        .unwrap();
    assert_eq!(rt.stats().readback_bytes, read0, "nothing read back");
    assert_eq!(rt.stats().upload_bytes, up0, "nothing uploaded");
    let got = rt.read(&second[0].1, never).unwrap();
    assert_eq!(
        bits(&got),
        bits(&want[0].1),
        "bound input equals a host input"
    );
    let kept = rt.read(&y0, never).unwrap();
    assert_eq!(
        bits(&kept),
        bits(&want_y0),
        "the bound tensor was only read"
    );
    // A host input is uploaded, and counted.
    let up1 = rt.stats().upload_bytes;
    rt.run(plan.as_ref(), &[("x", host)], never).unwrap();
    assert_eq!(rt.stats().upload_bytes, up1 + 3 * 40 * 4);
    // Another shape is the typed input error.
    let (g2, store2) = chain(2);
    let small = rt.prepare(&g2, store2, &limits).unwrap();
    match rt.run_resident_with(small.as_ref(), &[], &[("x", y0.clone())], never) {
        Err(RuntimeError::InputMismatch { name, got, .. }) => {
            assert_eq!(name, "x");
            assert!(got.contains("[3, 40]"), "{got}");
        }
        other => panic!("expected InputMismatch, got {other:?}"),
    }
    // Another runtime's tensor is refused, never copied.
    let Some(other_rt) = runtime(WgpuOptions::default()) else {
        return;
    };
    let (g3, store3) = chain(3);
    let other_plan = other_rt.prepare(&g3, store3, &limits).unwrap();
    match other_rt.run_resident_with(other_plan.as_ref(), &[], &[("x", y0)], never) {
        Err(RuntimeError::Kernel { detail, .. }) => {
            assert!(detail.contains("another wgpu runtime"), "{detail}")
        }
        other => panic!("expected a typed refusal, got {other:?}"),
    }
}

#[test]
fn the_timer_spans_each_dispatching_equation_from_device_timestamps() {
    let Some(rt) = runtime(WgpuOptions::default()) else {
        return;
    };
    let (g, store) = chain(3);
    let plan = rt.prepare(&g, store, &CompileLimits::default()).unwrap();
    let x = [("x", f32s(vec![3, 40], Rng(2).vec(120)))];
    let never = Deadline::default_device();
    rt.run(plan.as_ref(), &x, never).unwrap();
    assert!(rt.last_run_spans().is_empty(), "off by default");
    rt.record_spans(true);
    let read0 = rt.stats().readback_bytes;
    rt.run(plan.as_ref(), &x, never).unwrap();
    assert_eq!(
        rt.stats().readback_bytes,
        read0 + 3 * 40 * 4,
        "timestamps not counted"
    );
    let spans = rt.last_run_spans();
    if !rt.timestamps_supported() {
        assert!(spans.is_empty(), "no timestamps, no spans");
        return;
    }
    let kinds: Vec<&str> = spans.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(kinds, ["tanh", "exp", "softmax"]);
    assert_eq!(spans[0].2, 0.0);
    for (i, kind, start, end) in &spans {
        assert!(0.0 <= *start && start <= end, "{kind}: {start}..{end}");
        assert_eq!(plan.graph().equations[*i].name(), kind.as_str());
    }
}
