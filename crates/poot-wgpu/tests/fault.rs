//! Bounded waits and poisoning, with real faults on the device: a kernel that spins past the
//! deadline (`WgpuRuntime::inject_stall`) and a destroyed device (`inject_device_loss`).
//! Deadlines here are short bounds on waits, not speed thresholds: the stall kernel runs for
//! seconds on any adapter, far past them.
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, Graph, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{Health, HostTensor, Runtime, RuntimeError};
use poot_wgpu::{WgpuOptions, WgpuRuntime};

/// Rows of the stall kernel: about 5 s on lavapipe, and 2^30 contended atomics on any GPU,
/// far past the 200 ms deadlines below.
const STALL: u32 = 2;

fn graph() -> (Graph, Arc<common::Store>) {
    let mut s = common::Store::default();
    let w: Vec<u8> = [1f32, 2., 3., 4.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    s.add("w", DType::F32, vec![2, 2], w);
    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut t = Tracer::new(TraceLimits::default(), 1, cat).unwrap();
    let x = t.input("x", DType::F32, vec![1, 2]).unwrap();
    let w = t.weight("w").unwrap();
    let y = t.matmul(x, w).unwrap();
    t.output("y", y).unwrap();
    (t.finish(), s)
}

fn x() -> Vec<(&'static str, HostTensor)> {
    vec![(
        "x",
        HostTensor::F32 {
            shape: vec![1, 2],
            data: vec![1., 1.],
        },
    )]
}

fn poisoned_reason(rt: &WgpuRuntime) -> String {
    match rt.health() {
        Health::Poisoned { reason } => reason,
        Health::Ok => panic!("runtime should be poisoned"),
    }
}

#[test]
fn a_stalled_submission_times_out_and_poisons() {
    let Some(rt) = common::runtime(WgpuOptions::default()) else {
        return;
    };
    let (g, s) = graph();
    let plan = rt
        .prepare(&g, s.clone(), &CompileLimits::default())
        .unwrap();
    let out = rt
        .run(plan.as_ref(), &x(), Deadline::default_device())
        .unwrap();
    assert_eq!(
        out[0].1,
        HostTensor::F32 {
            shape: vec![1, 2],
            data: vec![3., 7.]
        }
    );

    rt.inject_stall(STALL);
    let err = rt
        .run(
            plan.as_ref(),
            &x(),
            Deadline::after(Duration::from_millis(200)),
        )
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Timeout { .. }), "{err:?}");
    assert!(poisoned_reason(&rt).contains("deadline"));

    // Later calls fail fast without touching the device, even with the fault removed.
    rt.inject_stall(0);
    let err = rt
        .run(plan.as_ref(), &x(), Deadline::default_device())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }), "{err:?}");
    let err = rt.prepare(&g, s, &CompileLimits::default()).unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }), "{err:?}");
}

#[test]
fn the_runtime_timeout_bounds_waits_without_a_caller_deadline() {
    let options = WgpuOptions {
        timeout: Duration::from_millis(200),
        ..WgpuOptions::default()
    };
    let Some(rt) = common::runtime(options) else {
        return;
    };
    let (g, s) = graph();
    let plan = rt.prepare(&g, s, &CompileLimits::default()).unwrap();
    rt.inject_stall(STALL);
    let start = Instant::now();
    let err = rt.run(plan.as_ref(), &x(), Deadline::never()).unwrap_err();
    assert!(matches!(err, RuntimeError::Timeout { .. }), "{err:?}");
    // The wait returned at its bound, not when the kernel finished (sanity, not a speed test:
    // the kernel runs for seconds).
    assert!(start.elapsed() < Duration::from_secs(60));
    assert!(matches!(rt.health(), Health::Poisoned { .. }));
}

#[test]
fn a_lost_device_is_a_typed_error_and_poisons() {
    let Some(rt) = common::runtime(WgpuOptions::default()) else {
        return;
    };
    let (g, s) = graph();
    let plan = rt.prepare(&g, s, &CompileLimits::default()).unwrap();
    rt.inject_device_loss();
    let err = rt
        .run(plan.as_ref(), &x(), Deadline::default_device())
        .unwrap_err();
    match err {
        RuntimeError::Poisoned { reason } => assert!(reason.contains("lost"), "{reason}"),
        e => panic!("expected Poisoned, got {e:?}"),
    }
    assert!(poisoned_reason(&rt).contains("lost"));
}
