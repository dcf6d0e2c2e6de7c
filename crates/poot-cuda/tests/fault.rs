//! Bounded waits and poisoning with a real fault on the GPU: a kernel that spins on the GPU
//! timer for 3 s (`CudaRuntime::inject_stall`) against a 200 ms deadline. The deadline is a
//! bound on a wait, not a speed threshold: the stall runs 15 times longer. Without a GPU the
//! CPU emulation of the driver models the stall as a stream busy for 3 s, which exercises the
//! runtime's polling, timeout and poisoning the same way.
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{Health, HostTensor, Runtime, RuntimeError};

#[test]
fn a_stalled_run_times_out_and_poisons_the_runtime() {
    let Some(rt) = common::runtime() else { return };
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
    let plan = rt
        .prepare(&t.finish(), s.clone(), &CompileLimits::default())
        .unwrap();
    let x = || {
        vec![(
            "x",
            HostTensor::F32 {
                shape: vec![1, 2],
                data: vec![1., 1.],
            },
        )]
    };
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

    rt.inject_stall(Duration::from_secs(3));
    let start = Instant::now();
    let err = rt
        .run(
            plan.as_ref(),
            &x(),
            Deadline::after(Duration::from_millis(200)),
        )
        .unwrap_err();
    let waited = start.elapsed();
    eprintln!("stalled run returned {err:?} after {waited:?}");
    assert!(matches!(err, RuntimeError::Timeout { .. }), "{err:?}");
    assert!(
        waited < Duration::from_secs(2),
        "the wait outlived its deadline: {waited:?}"
    );
    match rt.health() {
        Health::Poisoned { reason } => assert!(reason.contains("deadline"), "{reason}"),
        Health::Ok => panic!("the runtime should be poisoned"),
    }
    let again = rt
        .run(plan.as_ref(), &x(), Deadline::default_device())
        .unwrap_err();
    assert!(matches!(again, RuntimeError::Poisoned { .. }), "{again:?}");
    let compile = rt
        .prepare(plan.graph(), s, &CompileLimits::default())
        .unwrap_err();
    assert!(
        matches!(compile, RuntimeError::Poisoned { .. }),
        "{compile:?}"
    );
}
