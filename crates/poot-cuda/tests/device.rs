//! The CUDA runtime on a real GPU: each op's graph against the CPU runtime (exact numerics)
//! under the bound stated at each test, a Llama-shaped block end to end, the GPU against the
//! CPU shim (the same source: equal bits where no library function is involved), and the
//! plan cache. Where no CUDA device exists the same tests run on the CPU emulation of the
//! driver (`common::runtime`): the runtime's host code for real, the kernels through the
//! shim; with `POOT_REQUIRE_CUDA=1` (`make test-device-cuda`) a missing GPU fails instead.
mod common;

use std::sync::Arc;

use common::{abs_dots, dequant, dot_bound, packed, Rng, Store, MATMUL_DTYPES};
use poot_core::{DType, Deadline};
use poot_cpu::{CpuOptions, CpuRuntime};
use poot_cuda::CudaRuntime;
use poot_graph::{
    CompileLimits, Graph, RopeConfig, RopeScaling, RopeStyle, TraceLimits, Tracer, WeightCatalog,
};
use poot_runtime::{HostTensor, Runtime, RuntimeError};

fn f32s(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
    HostTensor::F32 { shape, data }
}
fn i32s(data: Vec<i32>) -> HostTensor {
    HostTensor::I32 {
        shape: vec![data.len()],
        data,
    }
}

fn data(t: &HostTensor) -> &[f32] {
    match t {
        HostTensor::F32 { data, .. } => data,
        HostTensor::I32 { .. } => panic!("expected f32"),
    }
}

/// Compiles and runs `g` on both runtimes; returns (cuda, cpu) outputs in graph order.
fn both(
    rt: &CudaRuntime,
    g: &Graph,
    s: &Arc<Store>,
    inputs: &[(&str, HostTensor)],
) -> (Vec<HostTensor>, Vec<HostTensor>) {
    let cpu = CpuRuntime::new(CpuOptions {
        threads: 4,
        ..CpuOptions::default()
    })
    .unwrap();
    let lim = CompileLimits::default();
    let p = rt.prepare(g, s.clone(), &lim).unwrap();
    let got = rt
        .run(p.as_ref(), inputs, Deadline::default_device())
        .unwrap();
    let pc = cpu.prepare(g, s.clone(), &lim).unwrap();
    let want = cpu.run(pc.as_ref(), inputs, Deadline::never()).unwrap();
    (
        got.into_iter().map(|x| x.1).collect(),
        want.into_iter().map(|x| x.1).collect(),
    )
}

fn tracer(s: &Arc<Store>, tokens: usize) -> Tracer {
    let cat: Arc<dyn WeightCatalog> = s.clone();
    Tracer::new(TraceLimits::default(), tokens, cat).unwrap()
}

/// Matmul graphs for every packed dtype at model shapes (SmolLM2's 576/1536, its 49152-row
/// head, ragged rows and lanes, prefill rows): within `dot_bound` of the CPU's exact matmul.
#[test]
fn matmul_matches_the_cpu_runtime_for_every_packed_dtype() {
    let Some(rt) = common::runtime() else { return };
    let mut rng = Rng(21);
    for dtype in MATMUL_DTYPES {
        for (t, n, k) in [
            (1, 1536, 576),
            (1, 49152, 576),
            (7, 67, 1088),
            (1, 13, 96),
            (16, 576, 1536),
        ] {
            let mut s = Store::default();
            let w = packed(dtype, n, k, &mut rng);
            s.add("w", dtype, vec![n, k], w.clone());
            let s = Arc::new(s);
            let mut tr = tracer(&s, t);
            let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
            let wv = tr.weight("w").unwrap();
            let y = tr.matmul(x, wv).unwrap();
            tr.output("y", y).unwrap();
            let xs = rng.vec(t * k);
            let (got, want) = both(
                &rt,
                &tr.finish(),
                &s,
                &[("x", f32s(vec![t, k], xs.clone()))],
            );
            let sums = abs_dots(&xs, t, k, &dequant(dtype, &w, n * k), n);
            for (i, (a, b)) in data(&got[0]).iter().zip(data(&want[0])).enumerate() {
                assert!(
                    f64::from((a - b).abs()) <= dot_bound(k, sums[i]),
                    "{dtype} {t}x{n}x{k} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

/// A Llama block's ops in one graph: embedding (Q8_0 table), rms_norm, q projection (Q4_0),
/// rope, gate (Q4_1) and up (Q8_0), silu * up, down (F16), residual add, last-row gather, head
/// (F32). Bound: 1e-4 of the output's largest magnitude (each op's own bound, compounded over
/// six roundings-per-element stages with dots of at most 1536 terms, is below 1e-5 of it).
#[test]
fn a_llama_block_graph_matches_the_cpu_runtime() {
    let Some(rt) = common::runtime() else { return };
    let mut rng = Rng(33);
    let (vocab, d, ff, heads, hd, t) = (300, 576, 1536, 9, 64, 5);
    let mut s = Store::default();
    s.add(
        "emb",
        DType::Q8_0,
        vec![vocab, d],
        packed(DType::Q8_0, vocab, d, &mut rng),
    );
    s.add(
        "norm",
        DType::F32,
        vec![d],
        packed(DType::F32, 1, d, &mut rng),
    );
    s.add(
        "wq",
        DType::Q4_0,
        vec![d, d],
        packed(DType::Q4_0, d, d, &mut rng),
    );
    s.add(
        "gate",
        DType::Q4_1,
        vec![ff, d],
        packed(DType::Q4_1, ff, d, &mut rng),
    );
    s.add(
        "up",
        DType::Q8_0,
        vec![ff, d],
        packed(DType::Q8_0, ff, d, &mut rng),
    );
    s.add(
        "down",
        DType::F16,
        vec![d, ff],
        packed(DType::F16, d, ff, &mut rng),
    );
    s.add(
        "head",
        DType::F32,
        vec![vocab, d],
        packed(DType::F32, vocab, d, &mut rng),
    );
    let s = Arc::new(s);
    let mut tr = tracer(&s, t);
    let ids = tr.input("ids", DType::I32, vec![t]).unwrap();
    let pos = tr.input("pos", DType::I32, vec![t]).unwrap();
    let last = tr.input("last", DType::I32, vec![2]).unwrap();
    let w = |tr: &mut Tracer, n: &str| tr.weight(n).unwrap();
    let (emb, norm, wq, gate, up, down, head) = (
        w(&mut tr, "emb"),
        w(&mut tr, "norm"),
        w(&mut tr, "wq"),
        w(&mut tr, "gate"),
        w(&mut tr, "up"),
        w(&mut tr, "down"),
        w(&mut tr, "head"),
    );
    let x = tr.embedding(emb, ids).unwrap();
    let h = tr.rms_norm(x, norm, 1e-5).unwrap();
    let q = tr.matmul(h, wq).unwrap();
    let cfg = RopeConfig {
        n_heads: heads,
        head_dim: hd,
        rot_dim: hd,
        theta: 100000.0,
        style: RopeStyle::NeoX,
        scaling: RopeScaling::None,
    };
    let q = tr.rope(q, pos, cfg).unwrap();
    let g = tr.matmul(h, gate).unwrap();
    let u = tr.matmul(h, up).unwrap();
    let g = tr.silu(g).unwrap();
    let m = tr.mul(g, u).unwrap();
    let dn = tr.matmul(m, down).unwrap();
    let r = tr.add(x, dn).unwrap();
    let r = tr.add(r, q).unwrap();
    let rows = tr.gather_rows(r, last).unwrap();
    let logits = tr.matmul(rows, head).unwrap();
    tr.output("q", q).unwrap();
    tr.output("logits", logits).unwrap();
    let inputs = [
        ("ids", i32s(vec![1, 299, 17, 17, 0])),
        ("pos", i32s(vec![0, 1, 2, 3, 4])),
        ("last", i32s(vec![4, 2])),
    ];
    let (got, want) = both(&rt, &tr.finish(), &s, &inputs);
    for (o, (a, b)) in got.iter().zip(&want).enumerate() {
        let scale = data(b).iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = data(a)
            .iter()
            .zip(data(b))
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-4 * scale,
            "output {o}: worst {worst} vs scale {scale}"
        );
        eprintln!("block output {o}: worst abs diff {worst:e}, scale {scale}");
    }
}

/// The same source on the GPU and on the CPU shim: matvec (every dtype), rms_norm's f64 sum
/// aside, rope and add give equal bits (NVRTC --fmad=false, the shim -ffp-contract=off).
/// Skips with the reason where this machine has no host C++ compiler.
#[test]
fn the_gpu_and_the_cpu_shim_compute_the_same_bits() {
    // On the emulation this compares the shim with itself: only a GPU makes it a test.
    let Some(rt) = common::gpu_runtime() else {
        return;
    };
    let shim = match poot_cuda::shim::Shim::get() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIP: no CPU shim here ({e})");
            return;
        }
    };
    let mut rng = Rng(44);
    for dtype in MATMUL_DTYPES {
        let (t, n, k) = (3, 200, 1088);
        let w = packed(dtype, n, k, &mut rng);
        let mut s = Store::default();
        s.add("w", dtype, vec![n, k], w.clone());
        let s = Arc::new(s);
        let mut tr = tracer(&s, t);
        let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
        let wv = tr.weight("w").unwrap();
        let y = tr.matmul(x, wv).unwrap();
        tr.output("y", y).unwrap();
        let xs = rng.vec(t * k);
        let p = rt
            .prepare(&tr.finish(), s.clone(), &CompileLimits::default())
            .unwrap();
        let gpu = rt
            .run(
                p.as_ref(),
                &[("x", f32s(vec![t, k], xs.clone()))],
                Deadline::default_device(),
            )
            .unwrap();
        let mut cpu = vec![f32::NAN; t * n];
        let l = poot_cuda::ops::matvec(
            dtype,
            w.as_ptr() as u64,
            xs.as_ptr() as u64,
            cpu.as_mut_ptr() as u64,
            t as u32,
            n as u32,
            k as u32,
        );
        // SAFETY: the host buffers hold the launch's shapes.
        unsafe { shim.launch(&l) }.unwrap();
        let same = data(&gpu[0].1)
            .iter()
            .zip(&cpu)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        eprintln!(
            "{dtype}: {same} of {} outputs bit-equal between the GPU and the CPU shim",
            t * n
        );
        assert_eq!(same, t * n, "{dtype}");
    }
}

/// Errors are typed: an unsupported op is refused at compile time, bad ids before any launch.
#[test]
fn bad_graphs_and_inputs_are_typed_errors() {
    let Some(rt) = common::runtime() else { return };
    let mut s = Store::default();
    s.add("emb", DType::F32, vec![4, 32], vec![0; 4 * 32 * 4]);
    let s = Arc::new(s);
    let mut tr = tracer(&s, 2);
    let ids = tr.input("ids", DType::I32, vec![2]).unwrap();
    let emb = tr.weight("emb").unwrap();
    let x = tr.embedding(emb, ids).unwrap();
    let y = tr.softmax(x).unwrap();
    tr.output("y", y).unwrap();
    match rt.prepare(&tr.finish(), s.clone(), &CompileLimits::default()) {
        Err(RuntimeError::Compile(e)) => assert!(e.to_string().contains("softmax"), "{e}"),
        other => panic!("expected an unsupported-op error, got {other:?}"),
    }
    let mut tr = tracer(&s, 2);
    let ids = tr.input("ids", DType::I32, vec![2]).unwrap();
    let emb = tr.weight("emb").unwrap();
    let x = tr.embedding(emb, ids).unwrap();
    tr.output("x", x).unwrap();
    let p = rt
        .prepare(&tr.finish(), s.clone(), &CompileLimits::default())
        .unwrap();
    let err = rt
        .run(
            p.as_ref(),
            &[("ids", i32s(vec![0, 4]))],
            Deadline::default_device(),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Kernel {
                op: "embedding",
                ..
            }
        ),
        "{err:?}"
    );
    // The runtime is still healthy: a bad input is not a device fault.
    let ok = rt
        .run(
            p.as_ref(),
            &[("ids", i32s(vec![0, 3]))],
            Deadline::default_device(),
        )
        .unwrap();
    assert_eq!(data(&ok[0].1).len(), 64);
}

/// Weights are uploaded once per runtime and shared by plans over the same store.
#[test]
fn plans_share_uploaded_weights() {
    let Some(rt) = common::runtime() else { return };
    let mut rng = Rng(55);
    let mut s = Store::default();
    s.add(
        "w",
        DType::Q4_0,
        vec![64, 256],
        packed(DType::Q4_0, 64, 256, &mut rng),
    );
    let s = Arc::new(s);
    let plan = |t: usize| {
        let mut tr = tracer(&s, t);
        let x = tr.input("x", DType::F32, vec![t, 256]).unwrap();
        let w = tr.weight("w").unwrap();
        let y = tr.matmul(x, w).unwrap();
        tr.output("y", y).unwrap();
        rt.prepare(&tr.finish(), s.clone(), &CompileLimits::default())
            .unwrap()
    };
    let (a, b) = (plan(1), plan(4));
    assert_eq!(
        rt.weight_bytes(),
        64 * 256 / 32 * 18,
        "one device copy, as stored"
    );
    drop((a, b));
    assert_eq!(rt.weight_bytes(), 0);
}

/// `sample` on the host over read-back logits: greedy and tempered rows give the CPU
/// runtime's ids (same row function, same draws; the logits agree to f32 rounding, far from
/// any tie on random weights).
#[test]
fn sampling_gives_the_cpu_runtimes_ids() {
    let Some(rt) = common::runtime() else { return };
    let mut rng = Rng(66);
    let (s_rows, k, vocab) = (4, 64, 500);
    let mut s = Store::default();
    s.add(
        "head",
        DType::Q8_0,
        vec![vocab, k],
        packed(DType::Q8_0, vocab, k, &mut rng),
    );
    let s = Arc::new(s);
    let mut tr = tracer(&s, s_rows);
    let x = tr.input("x", DType::F32, vec![s_rows, k]).unwrap();
    let head = tr.weight("head").unwrap();
    let logits = tr.matmul(x, head).unwrap();
    let inp = |tr: &mut Tracer, n: &str, d: DType| tr.input(n, d, vec![s_rows]).unwrap();
    let params = poot_graph::SampleInputs {
        temperature: inp(&mut tr, "temperature", DType::F32),
        top_k: inp(&mut tr, "top_k", DType::I32),
        top_p: inp(&mut tr, "top_p", DType::F32),
        min_p: inp(&mut tr, "min_p", DType::F32),
        uniform: inp(&mut tr, "uniform", DType::F32),
    };
    let ids = tr.sample(logits, params).unwrap();
    tr.output("ids", ids).unwrap();
    let inputs = [
        (
            "x",
            f32s(
                vec![s_rows, k],
                rng.vec(s_rows * k).iter().map(|v| v * 4.0).collect(),
            ),
        ),
        ("temperature", f32s(vec![s_rows], vec![0.0, 0.7, 1.0, 1.3])),
        (
            "top_k",
            HostTensor::I32 {
                shape: vec![s_rows],
                data: vec![0, 40, 0, 5],
            },
        ),
        ("top_p", f32s(vec![s_rows], vec![1.0, 0.9, 1.0, 0.95])),
        ("min_p", f32s(vec![s_rows], vec![0.0, 0.0, 0.05, 0.0])),
        ("uniform", f32s(vec![s_rows], vec![0.5, 0.25, 0.75, 0.1])),
    ];
    let (got, want) = both(&rt, &tr.finish(), &s, &inputs);
    assert_eq!(got[0], want[0]);
    eprintln!("sampled ids {:?}", got[0]);
}

/// A kernel needing more registers than `CompileLimits::max_kernel_locals` is a typed
/// refusal at compile time (`BodyLimit`, Python `KernelBodyLimitError`), as on wgpu.
#[test]
fn a_kernel_over_the_body_limit_is_refused() {
    let Some(rt) = common::runtime() else { return };
    let (regs, local) = rt.kernel_resources("matvec_q4_0").unwrap();
    eprintln!("matvec_q4_0: {regs} registers, {local} local bytes per thread");
    assert!(regs > 8);
    let mut rng = Rng(3);
    let mut s = Store::default();
    s.add(
        "w",
        DType::Q4_0,
        vec![8, 64],
        packed(DType::Q4_0, 8, 64, &mut rng),
    );
    let s = Arc::new(s);
    let mut tr = tracer(&s, 1);
    let x = tr.input("x", DType::F32, vec![1, 64]).unwrap();
    let w = tr.weight("w").unwrap();
    let y = tr.matmul(x, w).unwrap();
    tr.output("y", y).unwrap();
    let g = tr.finish();
    let tight = CompileLimits {
        max_kernel_locals: 8,
        ..CompileLimits::default()
    };
    match rt.prepare(&g, s.clone(), &tight) {
        Err(RuntimeError::Compile(poot_graph::CompileError::BodyLimit {
            kernel,
            what,
            limit,
            total,
        })) => {
            assert_eq!(
                (kernel.as_str(), what, limit, total),
                ("matvec_q4_0", "registers", 8, u64::from(regs))
            );
        }
        other => panic!("expected a body-limit refusal, got {other:?}"),
    }
    assert!(rt.prepare(&g, s, &CompileLimits::default()).is_ok());
}
