//! The raw Vulkan device (`WgpuRuntime::vulkan`), whatever `POOT_GPU_API` says: bring-up and
//! its reported capabilities and settings, one kernel against the CPU runtime and the same op
//! on wgpu, the subgroup matmul against the workgroup one, staged device-local weights against
//! mapped ones, weights split across lowered bindings, the bounded wait on a stalled
//! submission, and a lost device. The whole conformance suite runs on it with
//! `POOT_GPU_API=vulkan` (`make test-device-vulkan`), and with `POOT_VK_STAGING=1` staged.
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::compare::{assert_close, cpu, f32s};
use common::{packed, Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, Graph, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{Health, HostTensor, Runtime, RuntimeError};
use poot_wgpu::{Api, VkOptions, WgpuOptions, WgpuRuntime};

fn vulkan(options: WgpuOptions) -> Option<WgpuRuntime> {
    common::open_api(Api::Vulkan, options)
}

/// Raw Vulkan with the subgroup matmul and staging as given (not from the environment).
fn vulkan_with(subgroups: bool, staging: bool) -> Option<WgpuRuntime> {
    vulkan(WgpuOptions {
        vulkan: VkOptions {
            subgroups: Some(subgroups),
            staging: Some(staging),
        },
        ..WgpuOptions::default()
    })
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
    let (lo, hi) = caps.subgroup_size_range;
    assert!(
        lo <= caps.subgroup_size && caps.subgroup_size <= hi,
        "{caps:?}"
    );
    assert!(rt.vulkan_settings().is_some());
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
fn settings_follow_the_options_and_the_device() {
    let Some(rt) = vulkan_with(true, false) else {
        return;
    };
    let caps = rt.vulkan_caps().unwrap().clone();
    let got = rt.vulkan_settings().unwrap();
    // The subgroup matmul wherever the device can run it; staging only where it must.
    assert_eq!(got.subgroup_matvec, caps.subgroup_matvec(), "{caps:?}");
    assert_eq!(got.staging, !caps.local_heap_mappable, "{caps:?}");
    let off = vulkan_with(false, true).unwrap().vulkan_settings().unwrap();
    assert!(!off.subgroup_matvec);
    // Forced wherever the device has device-local memory to stage into.
    assert_eq!(off.staging, caps.device_local || !caps.local_heap_mappable);
}

#[test]
fn a_packed_matmul_equals_the_cpu_within_its_bound_and_wgpu_exactly() {
    // The workgroup matmul: wgpu's kernel, so wgpu's bits.
    let Some(rt) = vulkan_with(false, false) else {
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

/// The dtypes whose decode matmul the issue names, over a row count that leaves a workgroup
/// part-full, k of 16 chunks (two per lane), and token counts of 1 (decode), 5 and 9 (two
/// tiles of 8).
const MATVEC_DTYPES: [DType; 6] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::F16,
];

#[test]
fn the_subgroup_matmul_agrees_with_the_workgroup_one() {
    let (Some(sub), Some(wg)) = (vulkan_with(true, false), vulkan_with(false, false)) else {
        return;
    };
    if !sub.vulkan_settings().unwrap().subgroup_matvec {
        let caps = sub.vulkan_caps().unwrap();
        eprintln!("SKIP: this device cannot run the subgroup matmul ({caps:?})");
        return;
    }
    let (k, n) = (512, 67);
    let mut differ = 0;
    for dtype in MATVEC_DTYPES {
        for t in [1, 5, 9] {
            let (g, s) = matmul_graph(dtype, t, k, n);
            let x = f32s(vec![t, k], Rng(7).vec(t * k));
            let got = run(&sub, &g, &s, &x);
            let name = format!("subgroup matmul {dtype} t={t}");
            // Each lane's partial sum is the workgroup kernel's bit for bit; only the eight
            // partials of a row are added in another order: a few ulps of the row's sum.
            let want = run(&wg, &g, &s, &x);
            assert_close(&name, &want, &got, 1e-5, 1e-6);
            differ += (f32s_of(&want).iter().zip(f32s_of(&got)))
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_close(&name, &run(&cpu(), &g, &s, &x), &got, 2e-4, 1e-5);
        }
    }
    // The other summation order shows somewhere in these fixed inputs: the subgroup kernel ran.
    assert!(
        differ > 0,
        "the subgroup matmul gave the workgroup kernel's bits everywhere"
    );
    eprintln!(
        "subgroup matmul: {differ} outputs differ from the workgroup kernel in the last bits"
    );
}

fn f32s_of(t: &HostTensor) -> &[f32] {
    match t {
        HostTensor::F32 { data, .. } => data,
        other => panic!("expected f32 output, got {other:?}"),
    }
}

#[test]
fn staged_device_local_weights_equal_mapped_ones_exactly() {
    let (Some(staged), Some(mapped)) = (vulkan_with(true, true), vulkan_with(true, false)) else {
        return;
    };
    assert!(staged.vulkan_settings().unwrap().staging);
    for dtype in MATVEC_DTYPES {
        let (t, k, n) = (3, 256, 40);
        let (g, s) = matmul_graph(dtype, t, k, n);
        let x = f32s(vec![t, k], Rng(9).vec(t * k));
        // The same kernels over the same bytes: only where the weights live differs.
        assert_close(
            &format!("staged {dtype}"),
            &run(&mapped, &g, &s, &x),
            &run(&staged, &g, &s, &x),
            0.0,
            0.0,
        );
    }
}

#[test]
fn weights_split_across_small_bindings_still_agree() {
    // A lowered binding limit splits the weight by rows on every kind of buffer and kernel.
    for (subgroups, staging) in [(false, false), (true, true)] {
        let Some(rt) = vulkan(WgpuOptions {
            max_binding_bytes: Some(4096),
            vulkan: VkOptions {
                subgroups: Some(subgroups),
                staging: Some(staging),
            },
            ..WgpuOptions::default()
        }) else {
            return;
        };
        assert_eq!(rt.max_binding_bytes(), 4096);
        for dtype in [DType::Q8_0, DType::Q4_K] {
            let (t, k, n) = (3, 256, 40);
            let (g, s) = matmul_graph(dtype, t, k, n);
            let x = f32s(vec![t, k], Rng(5).vec(t * k));
            assert_close(
                &format!("split {dtype} subgroups={subgroups} staging={staging}"),
                &run(&cpu(), &g, &s, &x),
                &run(&rt, &g, &s, &x),
                2e-4,
                1e-5,
            );
        }
    }
}

#[test]
fn a_bad_environment_setting_is_a_typed_error() {
    // Set only for this check's own child process: the environment is shared by the
    // test threads, so the child is this test binary running the check alone.
    if std::env::var("POOT_VK_ENV_CHILD").is_ok() {
        let err = WgpuRuntime::vulkan(WgpuOptions::default()).unwrap_err();
        match err {
            RuntimeError::DeviceUnavailable { missing, .. } => {
                assert!(missing.contains("POOT_VK_STAGING"), "{missing}")
            }
            e => panic!("expected DeviceUnavailable, got {e:?}"),
        }
        return;
    }
    if vulkan(WgpuOptions::default()).is_none() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new(me)
        .args([
            "--exact",
            "a_bad_environment_setting_is_a_typed_error",
            "--nocapture",
        ])
        .env("POOT_VK_ENV_CHILD", "1")
        .env("POOT_VK_STAGING", "yes")
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("1 passed"), "{log}");
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
