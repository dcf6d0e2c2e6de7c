//! Resident runs: outputs kept in device buffers (`run_resident`) read back on request
//! (`read`) equal a plain run's outputs bit for bit, a resident run reads nothing back, and a
//! tensor is read only by the runtime that made it.
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
