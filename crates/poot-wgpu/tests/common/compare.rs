//! Running one graph on the wgpu and the CPU runtime and comparing the outputs elementwise
//! (`|wgpu - cpu| <= atol + rtol * |cpu|`; ids exactly), for the conformance suites.

use std::sync::Arc;

use poot_core::Deadline;
use poot_cpu::{CpuOptions, CpuRuntime};
use poot_graph::{CompileLimits, TraceLimits, Tracer, ValueId, WeightCatalog};
use poot_runtime::{HostTensor, Runtime};
use poot_wgpu::{WgpuOptions, WgpuRuntime};

use super::Store;

pub fn f32s(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
    HostTensor::F32 { shape, data }
}

pub fn i32s(shape: Vec<usize>, data: Vec<i32>) -> HostTensor {
    HostTensor::I32 { shape, data }
}

pub fn cpu() -> CpuRuntime {
    CpuRuntime::new(CpuOptions {
        threads: 1,
        ..CpuOptions::default()
    })
    .unwrap()
}

/// Traces `build` once and runs it on both runtimes; compares every output.
pub fn compare(
    rt: &WgpuRuntime,
    what: &str,
    store: Store,
    tokens: usize,
    build: impl Fn(&mut Tracer) -> Vec<(&'static str, ValueId)>,
    inputs: &[(&str, HostTensor)],
    (atol, rtol): (f32, f32),
) {
    let store = Arc::new(store);
    let cat: Arc<dyn WeightCatalog> = store.clone();
    let mut t = Tracer::new(TraceLimits::default(), tokens, cat).unwrap();
    for (name, v) in build(&mut t) {
        t.output(name, v).unwrap();
    }
    let g = t.finish();
    let limits = CompileLimits::default();
    let cpu = cpu();
    let want = cpu
        .run(
            cpu.prepare(&g, store.clone(), &limits).unwrap().as_ref(),
            inputs,
            Deadline::never(),
        )
        .unwrap();
    let plan = rt.prepare(&g, store, &limits).unwrap();
    let got = rt
        .run(plan.as_ref(), inputs, Deadline::default_device())
        .unwrap();
    assert_eq!(want.len(), got.len());
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert_close(&format!("{what}: {name}"), w, g, atol, rtol);
    }
}

pub fn assert_close(what: &str, want: &HostTensor, got: &HostTensor, atol: f32, rtol: f32) {
    match (want, got) {
        (HostTensor::F32 { shape: s1, data: a }, HostTensor::F32 { shape: s2, data: b }) => {
            assert_eq!(s1, s2, "{what}: shape");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let bound = atol + rtol * x.abs();
                assert!(
                    x == y || (x - y).abs() <= bound || (x.is_nan() && y.is_nan()),
                    "{what}[{i}]: cpu {x}, wgpu {y}, bound {bound}"
                );
            }
        }
        (HostTensor::I32 { .. }, HostTensor::I32 { .. }) => assert_eq!(want, got, "{what}"),
        _ => panic!("{what}: dtypes differ: {want:?} vs {got:?}"),
    }
}

pub fn open(options: WgpuOptions) -> Option<WgpuRuntime> {
    super::runtime(options)
}
