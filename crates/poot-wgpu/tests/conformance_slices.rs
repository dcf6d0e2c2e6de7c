//! The WGSL decoders on real quantized data: `quant-slices/real-quant-slices.gguf` (byte-exact
//! row slices of SmolLM2, Qwen2.5 and stories260K tensors: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K,
//! F16) read packed on wgpu.
//!
//! Bounds and why: the embedding kernel decodes rows without arithmetic beyond the format's
//! own (one multiply, at most one add or subtract, as ggml's `dequantize_row_*`), so its output
//! equals `real-quant-slices.dequant.safetensors` (the `gguf` Python package's dequantization,
//! written by others and equal to ggml's C code) bit for bit. A matmul over the same rows sums
//! `k` products in another order than the CPU runtime's exact matmul; with |x| <= 1 and real
//! weights (|w| < 0.5) that is at most k ulps of the running sum, stated as
//! `atol = 2e-7 * k`, `rtol = 1e-5` (k = 576..8960 here). Under ggml numerics the Q4_0, Q4_1,
//! Q5_0, Q8_0, Q4_K and Q6_K slices take integer dots on both runtimes (conformance_ggml.rs),
//! where only `fma` fusion differs: the same bound holds over these longer rows.
//!
//! Skips, saying why, where `../shared/models` is absent; fails there under
//! `POOT_REQUIRE_SHARED=1`. Also skips where no wgpu adapter exists (see `common`).
mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::compare::{compare, f32s, i32s, open};
use common::{Rng, Store};
use poot_core::DType;
use poot_formats::{GgufFile, SafetensorsFile};
use poot_wgpu::WgpuOptions;

/// The slices and their reference, or `None` (the reason on stderr) without `../shared`.
fn slices() -> Option<(GgufFile, SafetensorsFile)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/quant-slices");
    let gguf = dir.join("real-quant-slices.gguf");
    if !gguf.is_file() {
        let reason = format!("../shared missing: {} not found", gguf.display());
        if std::env::var("POOT_REQUIRE_SHARED").as_deref() == Ok("1") {
            panic!("POOT_REQUIRE_SHARED=1 but {reason}");
        }
        eprintln!("SKIP: {reason}");
        return None;
    }
    let src = GgufFile::open(&gguf).unwrap();
    let refs = SafetensorsFile::open(dir.join("real-quant-slices.dequant.safetensors")).unwrap();
    Some((src, refs))
}

/// (rows, k) of a 2-d slice.
fn dims(name: &str, shape: &[u64]) -> (usize, usize) {
    let [rows, k] = shape[..] else {
        panic!("{name}: slices are 2-d, got {shape:?}")
    };
    (rows as usize, k as usize)
}

#[test]
fn real_slices_decode_on_wgpu_as_gguf_py_does() {
    let Some((src, refs)) = slices() else { return };
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut seen = BTreeSet::new();
    for t in src.tensors() {
        let (rows, k) = dims(&t.name, &t.shape);
        let r = refs.tensor(&t.name).expect("a reference per slice");
        let want: Vec<f32> = refs
            .tensor_bytes(r)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut s = Store::default();
        s.add("w", t.dtype, vec![rows, k], src.tensor_bytes(t).to_vec());
        let ids: Vec<i32> = (0..rows as i32).collect();
        let got = run_embedding(&rt, s, rows, k, ids);
        let bad = (0..want.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        assert_eq!(bad, 0, "{} ({}): {bad} values differ", t.name, t.dtype);
        seen.insert(t.dtype.name());
    }
    // The folder's README promises these types; a shrunken file must not pass silently.
    for dt in ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "F16"] {
        assert!(seen.contains(dt), "no {dt} slice");
    }
}

/// All rows of `w` through the wgpu embedding kernel.
fn run_embedding(
    rt: &poot_wgpu::WgpuRuntime,
    s: Store,
    rows: usize,
    k: usize,
    ids: Vec<i32>,
) -> Vec<f32> {
    use std::sync::Arc;

    use poot_core::Deadline;
    use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
    use poot_runtime::{HostTensor, Runtime};

    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut tr = Tracer::new(TraceLimits::default(), rows, cat).unwrap();
    let i = tr.input("ids", DType::I32, vec![rows]).unwrap();
    let w = tr.weight("w").unwrap();
    let e = tr.embedding(w, i).unwrap();
    tr.output("e", e).unwrap();
    let plan = rt
        .compile(&tr.finish(), s, &CompileLimits::default())
        .unwrap();
    let out = rt
        .run(
            plan.as_ref(),
            &[("ids", i32s(vec![rows], ids))],
            Deadline::default_device(),
        )
        .unwrap();
    let HostTensor::F32 { shape, data } = &out[0].1 else {
        panic!("embedding output is not f32")
    };
    assert_eq!(shape, &vec![rows, k]);
    data.clone()
}

#[test]
fn real_slices_matmul_matches_the_cpu() {
    let Some((src, _)) = slices() else { return };
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(31);
    for info in src.tensors() {
        let (rows, k) = dims(&info.name, &info.shape);
        let t = 3;
        let mut s = Store::default();
        s.add(
            "w",
            info.dtype,
            vec![rows, k],
            src.tensor_bytes(info).to_vec(),
        );
        let x = f32s(vec![t, k], rng.vec(t * k));
        compare(
            &rt,
            &format!("matmul {} ({})", info.name, info.dtype),
            s,
            t,
            |tr| {
                let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
                let w = tr.weight("w").unwrap();
                vec![("y", tr.matmul(x, w).unwrap())]
            },
            &[("x", x)],
            (2e-7 * k as f32, 1e-5),
        );
    }
}

#[test]
fn real_slices_ggml_matmul_matches_the_cpu() {
    use std::sync::Arc;

    use poot_core::Deadline;
    use poot_cpu::{CpuOptions, CpuRuntime, Numerics};
    use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
    use poot_runtime::Runtime;

    let Some((src, _)) = slices() else { return };
    let Some(rt) = open(WgpuOptions {
        ggml: true,
        ..WgpuOptions::default()
    }) else {
        return;
    };
    let cpu = CpuRuntime::new(CpuOptions {
        threads: 1,
        numerics: Numerics::Ggml,
        ..CpuOptions::default()
    })
    .unwrap();
    let limits = CompileLimits::default();
    let mut rng = Rng(32);
    // F16 takes ggml's float dot path on the CPU (`float_ggml.rs`, measured 2.7e-5 away on
    // this slice), which wgpu's ggml numerics does not follow: its bound is the exact one above.
    for info in src.tensors().iter().filter(|i| i.dtype != DType::F16) {
        let (rows, k) = dims(&info.name, &info.shape);
        let t = 3;
        let mut s = Store::default();
        s.add(
            "w",
            info.dtype,
            vec![rows, k],
            src.tensor_bytes(info).to_vec(),
        );
        let s = Arc::new(s);
        let cat: Arc<dyn WeightCatalog> = s.clone();
        let mut tr = Tracer::new(TraceLimits::default(), t, cat).unwrap();
        let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
        let w = tr.weight("w").unwrap();
        let y = tr.matmul(x, w).unwrap();
        tr.output("y", y).unwrap();
        let g = tr.finish();
        let inputs = [("x", f32s(vec![t, k], rng.vec(t * k)))];
        let want = cpu
            .run(
                cpu.compile(&g, s.clone(), &limits).unwrap().as_ref(),
                &inputs,
                Deadline::never(),
            )
            .unwrap();
        let got = rt
            .run(
                rt.compile(&g, s, &limits).unwrap().as_ref(),
                &inputs,
                Deadline::default_device(),
            )
            .unwrap();
        let what = format!("ggml matmul {} ({})", info.name, info.dtype);
        common::compare::assert_close(&what, &want[0].1, &got[0].1, 2e-7 * k as f32, 1e-5);
    }
}
