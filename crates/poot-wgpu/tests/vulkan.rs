//! The raw Vulkan device (`WgpuRuntime::vulkan`), whatever `POOT_GPU_API` says: bring-up and
//! its reported capabilities, one kernel against the CPU runtime and the same op on wgpu, the
//! bounded wait on a stalled submission, and a lost device. The whole conformance suite runs on
//! it with `POOT_GPU_API=vulkan` (`make test-device-vulkan`).
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::compare::{assert_close, cpu, f32s};
use common::{packed, Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, Graph, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{Health, HostTensor, Runtime, RuntimeError};
use poot_wgpu::{Api, WgpuOptions, WgpuRuntime};

fn vulkan(options: WgpuOptions) -> Option<WgpuRuntime> {
    common::open_api(Api::Vulkan, options)
}

/// `y = x @ w.T` over a stored `[n, k]` weight of `dtype`.
fn matmul_graph(dtype: DType, t: usize, k: usize, n: usize) -> (Graph, Arc<Store>) {
    let mut s = Store::default();
    s.add("w", dtype, vec![n, k], packed(dtype, n, k, &mut Rng(11)));
    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut tr = Tracer::new(TraceLimits::default(), t, cat).unwrap();
    let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
    let w = tr.weight("w").unwrap();
    let y = tr.matmul(x, w).unwrap();
    tr.output("y", y).unwrap();
    (tr.finish(), s)
}

fn run(rt: &dyn Runtime, g: &Graph, s: &Arc<Store>, x: &HostTensor) -> HostTensor {
    let plan = rt.prepare(g, s.clone(), &CompileLimits::default()).unwrap();
    let mut out = rt
        .run(
            plan.as_ref(),
            &[("x", x.clone())],
            Deadline::default_device(),
        )
        .unwrap();
    out.remove(0).1
}

#[test]
fn opens_and_reports_what_it_offers() {
    let Some(rt) = vulkan(WgpuOptions::default()) else {
        return;
    };
    assert_eq!(rt.name(), "vulkan");
    assert_eq!(rt.api(), Api::Vulkan);
    let caps = rt
        .vulkan_caps()
        .expect("a raw Vulkan runtime reports its capabilities");
    assert!(caps.api_version.starts_with("1."), "{caps:?}");
    assert!(caps.max_storage_buffer_range > 0);
    // The binding limit is the device's own range, below the 4 GiB kernels can address.
    assert_eq!(
        rt.max_binding_bytes(),
        caps.max_storage_buffer_range.min((1 << 32) - 4) & !3
    );
    assert_eq!(rt.has_f64(), caps.f64);
    assert!(!rt.adapter().name.is_empty());
    // Discovery lists the device it opened.
    let names: Vec<String> = poot_wgpu::vulkan_devices()
        .into_iter()
        .map(|(a, _)| a.name)
        .collect();
    assert!(names.contains(&rt.adapter().name), "{names:?}");
    eprintln!("vulkan device: {:?} {caps:?}", rt.adapter());
}

#[test]
fn a_packed_matmul_equals_the_cpu_within_its_bound_and_wgpu_exactly() {
    let Some(rt) = vulkan(WgpuOptions::default()) else {
        return;
    };
    for dtype in [DType::Q4_0, DType::Q6_K, DType::F16] {
        let (t, k, n) = (5, 256, 67);
        let (g, s) = matmul_graph(dtype, t, k, n);
        let x = f32s(vec![t, k], Rng(3).vec(t * k));
        let got = run(&rt, &g, &s, &x);
        let want = run(&cpu(), &g, &s, &x);
        // The conformance suite's matmul bound (tests/conformance.rs).
        assert_close(&format!("vulkan matmul {dtype}"), &want, &got, 2e-4, 1e-5);
        // The same SPIR-V semantics as wgpu's: one kernel source, same summation order.
        if let Some(w) = common::open_api(Api::Wgpu, WgpuOptions::default()) {
            assert_close(
                &format!("vulkan vs wgpu {dtype}"),
                &run(&w, &g, &s, &x),
                &got,
                0.0,
                0.0,
            );
        }
    }
}

#[test]
fn weights_split_across_small_bindings_still_agree() {
    let Some(rt) = vulkan(WgpuOptions {
        max_binding_bytes: Some(4096),
        ..WgpuOptions::default()
    }) else {
        return;
    };
    let (t, k, n) = (3, 256, 40);
    let (g, s) = matmul_graph(DType::Q8_0, t, k, n);
    let x = f32s(vec![t, k], Rng(5).vec(t * k));
    assert_close(
        "split",
        &run(&cpu(), &g, &s, &x),
        &run(&rt, &g, &s, &x),
        2e-4,
        1e-5,
    );
}

fn poisoned(rt: &WgpuRuntime) -> String {
    match rt.health() {
        Health::Poisoned { reason } => reason,
        Health::Ok => panic!("runtime should be poisoned"),
    }
}

#[test]
fn a_stalled_submission_times_out_on_its_fence_and_poisons() {
    let Some(rt) = vulkan(WgpuOptions::default()) else {
        return;
    };
    let (g, s) = matmul_graph(DType::F32, 1, 32, 2);
    let plan = rt
        .prepare(&g, s.clone(), &CompileLimits::default())
        .unwrap();
    let x = f32s(vec![1, 32], vec![1.0; 32]);
    rt.run(
        plan.as_ref(),
        &[("x", x.clone())],
        Deadline::default_device(),
    )
    .unwrap();
    // Seconds of device work (see tests/fault.rs), far past the 200 ms deadline.
    rt.inject_stall(2);
    let err = rt
        .run(
            plan.as_ref(),
            &[("x", x.clone())],
            Deadline::after(Duration::from_millis(200)),
        )
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Timeout { .. }), "{err:?}");
    assert!(poisoned(&rt).contains("deadline"));
    rt.inject_stall(0);
    let err = rt
        .run(plan.as_ref(), &[("x", x)], Deadline::default_device())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }), "{err:?}");
    let err = rt.prepare(&g, s, &CompileLimits::default()).unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }), "{err:?}");
}

#[test]
fn a_lost_device_is_a_typed_error_and_poisons() {
    let Some(rt) = vulkan(WgpuOptions::default()) else {
        return;
    };
    let (g, s) = matmul_graph(DType::F32, 1, 32, 2);
    let plan = rt.prepare(&g, s, &CompileLimits::default()).unwrap();
    rt.inject_device_loss();
    let err = rt
        .run(
            plan.as_ref(),
            &[("x", f32s(vec![1, 32], vec![1.0; 32]))],
            Deadline::default_device(),
        )
        .unwrap_err();
    match err {
        RuntimeError::Poisoned { reason } => assert!(reason.contains("lost"), "{reason}"),
        e => panic!("expected Poisoned, got {e:?}"),
    }
    assert!(poisoned(&rt).contains("lost"));
}
