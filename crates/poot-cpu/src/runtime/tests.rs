//! CPU runtime tests over small graphs with an in-memory weight store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use poot_core::{DType, Deadline};
use poot_graph::{
    AttentionConfig, AttentionMeta, CompileError, CompileLimits, TraceLimits, Tracer, WeightCatalog,
};
use poot_runtime::{Health, HostTensor, KvCacheConfig, Runtime, RuntimeError, WeightStore};

use super::{CpuOptions, CpuRuntime};
use crate::kernels::Numerics;

struct Store(HashMap<String, (Vec<usize>, Vec<u8>)>);

impl WeightCatalog for Store {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.0.get(name).map(|(s, _)| (DType::F32, s.clone()))
    }
}

impl WeightStore for Store {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|(_, b)| b.as_slice())
    }
    fn total_bytes(&self) -> u64 {
        self.0.values().map(|(_, b)| b.len() as u64).sum()
    }
}

fn store() -> Arc<Store> {
    let mut m = HashMap::new();
    // w [3, 2] = [[1, 2], [3, 4], [5, 6]]; bias [3] = [0.5, -1, 2]
    let w: Vec<u8> = [1f32, 2., 3., 4., 5., 6.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let b: Vec<u8> = [0.5f32, -1., 2.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    m.insert("w".to_owned(), (vec![3, 2], w));
    m.insert("b".to_owned(), (vec![3], b));
    Arc::new(Store(m))
}

fn linear_graph() -> poot_graph::Graph {
    let s: Arc<dyn WeightCatalog> = store();
    let mut t = Tracer::new(TraceLimits::default(), 2, s).unwrap();
    let x = t.input("x", DType::F32, vec![2, 2]).unwrap();
    let w = t.weight("w").unwrap();
    let b = t.weight("b").unwrap();
    let y = t.matmul(x, w).unwrap();
    let y = t.add(y, b).unwrap();
    t.output("y", y).unwrap();
    t.finish()
}

fn x() -> HostTensor {
    HostTensor::F32 {
        shape: vec![2, 2],
        data: vec![1., 0., 0., 1.],
    }
}

#[test]
fn runs_a_linear_layer() {
    let rt = CpuRuntime::new(CpuOptions {
        threads: 2,
        ..CpuOptions::default()
    })
    .unwrap();
    let plan = rt
        .prepare(&linear_graph(), store(), &CompileLimits::default())
        .unwrap();
    // Where huge pages are available the float matmul weight is copied onto them (counted as
    // the runtime's own weight bytes) and the results below are the copy's, and so is the bias
    // (a small weight other ops read, copied once per store); elsewhere nothing is copied,
    // since there are no repacks either.
    let copied = if crate::hugemem::available() {
        24 + 12
    } else {
        0
    };
    assert_eq!(rt.memory().weight_bytes, copied);
    let out = rt
        .run(plan.as_ref(), &[("x", x())], Deadline::default_device())
        .unwrap();
    assert_eq!(out[0].0, "y");
    assert_eq!(
        out[0].1,
        HostTensor::F32 {
            shape: vec![2, 3],
            data: vec![1.5, 2., 7., 2.5, 3., 8.]
        }
    );
}

/// Two runtimes with different options live in one process: each pool's workers and each
/// runtime's compile and run follow that runtime's options, and the caller's own tuning is
/// back to the process default afterwards.
#[test]
fn two_runtimes_with_different_options_coexist() {
    use crate::tuning::Tuning;
    use crate::Isa;
    let a = CpuRuntime::new(CpuOptions {
        threads: 2,
        isa: Isa::Scalar,
        prefetch: 0,
        prefetch_next: false,
        huge_pages: false,
        spin: Duration::ZERO,
        ..CpuOptions::default()
    })
    .unwrap();
    let b = CpuRuntime::new(CpuOptions {
        threads: 2,
        isa: Isa::Amx,
        prefetch: 4096,
        prefetch_next: true,
        huge_pages: true,
        ..CpuOptions::default()
    })
    .unwrap();
    assert_eq!(a.isa(), Isa::Scalar);
    assert_eq!(b.isa(), Isa::best());
    assert_eq!(a.options().prefetch, 0);
    for rt in [&a, &b] {
        rt.pool.broadcast(|i| {
            if i > 0 {
                assert_eq!(Tuning::current(), rt.tuning, "worker {i}");
            }
        });
    }
    let (pa, pb) = (
        a.prepare(&linear_graph(), store(), &CompileLimits::default())
            .unwrap(),
        b.prepare(&linear_graph(), store(), &CompileLimits::default())
            .unwrap(),
    );
    // Each plan chose its matmul weight's path when it compiled.
    let cpu = |p: &Arc<dyn poot_runtime::CompiledPlan>| {
        let plan = p.as_any().downcast_ref::<super::CpuPlan>().unwrap();
        let w = plan.matmul_paths.keys().copied().collect::<Vec<_>>();
        (w.len(), plan.matmul_path(w[0]))
    };
    let decoded = Some(crate::kernels::matmul::MatmulPath::Decoded);
    assert_eq!(cpu(&pa), (1, decoded));
    assert_eq!(cpu(&pb), (1, decoded));
    // Huge pages off for `a`: its compile copied nothing; `b` copied where the host has them
    // (the matmul weight, then the bias other ops read).
    assert_eq!(a.memory().weight_bytes, 0);
    let thp = crate::hugemem::available_with(true);
    assert_eq!(b.memory().weight_bytes, if thp { 24 + 12 } else { 0 });
    for _ in 0..2 {
        for (rt, plan) in [(&a, &pa), (&b, &pb)] {
            let out = rt
                .run(plan.as_ref(), &[("x", x())], Deadline::default_device())
                .unwrap();
            assert_eq!(
                out[0].1,
                HostTensor::F32 {
                    shape: vec![2, 3],
                    data: vec![1.5, 2., 7., 2.5, 3., 8.]
                }
            );
        }
    }
    assert_eq!(Tuning::current(), Tuning::process_default());
    let entered = b.tuning.enter();
    assert_eq!(Isa::detect(), b.isa());
    drop(entered);
    assert_eq!(Isa::detect(), Tuning::process_default().isa);
}

/// `weight_progress` counts each matmul weight's stored bytes once (here one weight read by
/// two matmuls), reaches its total when the compile returns, and is not reset by a compile
/// that has nothing left to prepare.
#[test]
fn weight_progress_counts_each_matmul_weight_once() {
    let rt = CpuRuntime::new(CpuOptions::default()).unwrap();
    assert_eq!(rt.weight_progress(), (0, 0));
    let s: Arc<dyn WeightCatalog> = store();
    let mut t = Tracer::new(TraceLimits::default(), 2, s).unwrap();
    let x = t.input("x", DType::F32, vec![2, 2]).unwrap();
    let w = t.weight("w").unwrap();
    let (y, z) = (t.matmul(x, w).unwrap(), t.matmul(x, w).unwrap());
    t.output("y", y).unwrap();
    t.output("z", z).unwrap();
    let g = t.finish();
    let weights = store();
    rt.prepare(&g, weights.clone(), &CompileLimits::default())
        .unwrap();
    // "w" is 6 f32s; "b" is no matmul's weight.
    assert_eq!(rt.weight_progress(), (24, 24));
    rt.prepare(&linear_graph(), weights, &CompileLimits::default())
        .unwrap();
    assert_eq!(rt.weight_progress(), (24, 24));
}

#[test]
fn profile_counts_every_op_kind() {
    let rt = CpuRuntime::new(CpuOptions {
        profile: true,
        ..CpuOptions::default()
    })
    .unwrap();
    let plan = rt
        .prepare(&linear_graph(), store(), &CompileLimits::default())
        .unwrap();
    for _ in 0..3 {
        rt.run(plan.as_ref(), &[("x", x())], Deadline::never())
            .unwrap();
    }
    let report = rt.profile_report().unwrap();
    assert!(report.contains("3 prefill runs"), "{report}");
    let line = report.lines().find(|l| l.contains("matmul F32")).unwrap();
    assert_eq!(line.split_whitespace().nth(4), Some("3"), "{report}");
    assert!(
        report.lines().any(|l| l.contains("prefill add")),
        "{report}"
    );
    let off = CpuRuntime::new(CpuOptions::default()).unwrap();
    assert_eq!(
        off.profile_report().is_some(),
        std::env::var_os("POOT_CPU_PROFILE").is_some()
    );
}

#[test]
fn inputs_are_checked() {
    let rt = CpuRuntime::new(CpuOptions::default()).unwrap();
    let plan = rt
        .prepare(&linear_graph(), store(), &CompileLimits::default())
        .unwrap();
    let err = rt.run(plan.as_ref(), &[], Deadline::never()).unwrap_err();
    assert!(matches!(err, RuntimeError::MissingInput { name } if name == "x"));
    let bad = HostTensor::I32 {
        shape: vec![2, 2],
        data: vec![0; 4],
    };
    let err = rt
        .run(plan.as_ref(), &[("x", bad)], Deadline::never())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::InputMismatch { .. }));
    assert_eq!(rt.health(), Health::Ok, "bad input does not poison");
}

#[test]
fn a_missed_deadline_poisons_the_runtime() {
    let rt = CpuRuntime::new(CpuOptions::default()).unwrap();
    let plan = rt
        .prepare(&linear_graph(), store(), &CompileLimits::default())
        .unwrap();
    let err = rt
        .run(
            plan.as_ref(),
            &[("x", x())],
            Deadline::after(Duration::ZERO),
        )
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Timeout { .. }));
    let err = rt
        .run(plan.as_ref(), &[("x", x())], Deadline::never())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }));
    assert!(matches!(rt.health(), Health::Poisoned { .. }));
    assert!(rt
        .prepare(&linear_graph(), store(), &CompileLimits::default())
        .is_err());
}

#[test]
fn artifact_over_the_limit_is_refused() {
    let rt = CpuRuntime::new(CpuOptions::default()).unwrap();
    let limits = CompileLimits {
        max_artifact_bytes: 64,
        ..CompileLimits::default()
    };
    let err = rt.prepare(&linear_graph(), store(), &limits).unwrap_err();
    assert!(matches!(
        err,
        RuntimeError::Compile(CompileError::ArtifactTooLarge { limit: 64, .. })
    ));
}

#[test]
fn kv_pool_is_bounded_and_required() {
    kv_pool_case(Numerics::Exact, 1e-6);
    // f16 cache entries and f16 softmax weights: within 2^-11 relative.
    kv_pool_case(Numerics::Ggml, 1e-3);
}

fn kv_pool_case(numerics: Numerics, tol: f32) {
    let rt = CpuRuntime::new(CpuOptions {
        threads: 1,
        max_kv_bytes: 1024,
        numerics,
        ..CpuOptions::default()
    })
    .unwrap();
    let big = KvCacheConfig {
        n_layers: 2,
        n_kv_heads: 2,
        head_dim: 8,
        block_size: 16,
        num_blocks: 64,
        windowed_layers: 0,
        windowed_blocks: 0,
    };
    assert!(matches!(
        rt.configure_kv(big),
        Err(RuntimeError::OutOfMemory { .. })
    ));

    let s: Arc<dyn WeightCatalog> = store();
    let mut t = Tracer::new(TraceLimits::default(), 2, s).unwrap();
    let q = t.input("q", DType::F32, vec![2, 4]).unwrap();
    let mut meta = [0usize; 4].map(|_| q);
    for (i, name) in ["slots", "seq", "pos"].iter().enumerate() {
        meta[i] = t.input(name, DType::I32, vec![2]).unwrap();
    }
    meta[3] = t.input("tables", DType::I32, vec![1, 1]).unwrap();
    let m = AttentionMeta {
        slot_mapping: meta[0],
        token_seq: meta[1],
        positions: meta[2],
        block_tables: meta[3],
    };
    let cfg = AttentionConfig {
        layer: 0,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        scale: 0.5,
        window: 0,
        softcap: 0.0,
    };
    let o = t.paged_attention(q, q, q, m, cfg).unwrap();
    t.output("o", o).unwrap();
    let plan = rt
        .prepare(&t.finish(), store(), &CompileLimits::default())
        .unwrap();
    let i32s = |d: Vec<i32>| HostTensor::I32 {
        shape: vec![d.len()],
        data: d,
    };
    let q_data = HostTensor::F32 {
        shape: vec![2, 4],
        data: vec![1., 0., 0., 0., 0., 1., 0., 0.],
    };
    let inputs = [
        ("q", q_data),
        ("slots", i32s(vec![0, 1])),
        ("seq", i32s(vec![0, 0])),
        ("pos", i32s(vec![0, 1])),
        (
            "tables",
            HostTensor::I32 {
                shape: vec![1, 1],
                data: vec![0],
            },
        ),
    ];
    let err = rt
        .run(plan.as_ref(), &inputs, Deadline::never())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::KvNotConfigured));
    let small = KvCacheConfig {
        n_layers: 1,
        n_kv_heads: 1,
        head_dim: 4,
        block_size: 4,
        num_blocks: 2,
        windowed_layers: 0,
        windowed_blocks: 0,
    };
    rt.configure_kv(small).unwrap();
    let entry = if numerics == Numerics::Ggml { 2 } else { 4 };
    assert_eq!(rt.memory().kv_bytes, 2 * 8 * 4 * entry);
    let out = rt.run(plan.as_ref(), &inputs, Deadline::never()).unwrap();
    let HostTensor::F32 { data, .. } = &out[0].1 else {
        panic!("f32 output")
    };
    // Token 0 sees only itself; token 1 mixes both values with softmax weights.
    assert_eq!(&data[..4], &[1., 0., 0., 0.]);
    // Token 1's scores are 0 (key 0) and 0.5 (key 1) after the scale.
    let w1 = 0.5f32.exp() / (1.0 + 0.5f32.exp());
    let w0 = 1.0 - w1;
    assert!(
        (data[4] - w0).abs() < tol && (data[5] - w1).abs() < tol,
        "{data:?}"
    );
}

/// rms_norm -> silu -> rope twice (two layers sharing positions and a table) over `t` rows.
fn rowwise_graph(t: usize, store: Arc<Store>) -> poot_graph::Graph {
    let s: Arc<dyn WeightCatalog> = store;
    let mut tr = Tracer::new(TraceLimits::default(), 2, s).unwrap();
    let x = tr.input("x", DType::F32, vec![t, 128]).unwrap();
    let pos = tr.input("pos", DType::I32, vec![t]).unwrap();
    let w = tr.weight("norm").unwrap();
    let cfg = poot_graph::RopeConfig {
        n_heads: 2,
        head_dim: 64,
        rot_dim: 64,
        theta: 10000.0,
        style: poot_graph::RopeStyle::NeoX,
        scaling: poot_graph::RopeScaling::None,
    };
    let mut y = x;
    for _ in 0..2 {
        y = tr.rms_norm(y, w, 1e-5).unwrap();
        y = tr.silu(y).unwrap();
        y = tr.rope(y, pos, cfg).unwrap();
        // Elementwise, row-split too: a row broadcast and a same-shape operand.
        y = tr.mul(y, w).unwrap();
        y = tr.add(y, x).unwrap();
    }
    tr.output("y", y).unwrap();
    tr.finish()
}

#[test]
fn rowwise_ops_give_the_same_bits_on_any_thread_count() {
    let norm: Vec<u8> = (0..128)
        .flat_map(|i| (0.5 + i as f32 / 128.0).to_le_bytes())
        .collect();
    let store = Arc::new(Store(HashMap::from([(
        "norm".to_owned(),
        (vec![128], norm),
    )])));
    // 300 rows of 128: over the row-parallel threshold; 1 row: inline.
    for t in [300usize, 1] {
        let x = HostTensor::F32 {
            shape: vec![t, 128],
            data: (0..t * 128)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect(),
        };
        let pos = |r: i32| HostTensor::I32 {
            shape: vec![t],
            data: (0..t as i32).map(|p| p * 3 + 1 + 7 * r).collect(),
        };
        let mut outs = Vec::new();
        for (threads, numerics) in [
            (1, Numerics::Ggml),
            (2, Numerics::Ggml),
            (1, Numerics::Exact),
            (2, Numerics::Exact),
        ] {
            let rt = CpuRuntime::new(CpuOptions {
                threads,
                numerics,
                ..CpuOptions::default()
            })
            .unwrap();
            let plan = rt
                .prepare(
                    &rowwise_graph(t, store.clone()),
                    store.clone(),
                    &CompileLimits::default(),
                )
                .unwrap();
            // Two runs at other positions: the second must not reuse the first's rope angles.
            for r in 0..2 {
                let out = rt
                    .run(
                        plan.as_ref(),
                        &[("x", x.clone()), ("pos", pos(r))],
                        Deadline::never(),
                    )
                    .unwrap();
                let HostTensor::F32 { data, .. } = &out[0].1 else {
                    panic!("f32 output")
                };
                outs.push((
                    threads,
                    numerics,
                    data.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                ));
            }
        }
        // [1 thread r0, r1, 2 threads r0, r1] per numerics: the same bits for each r.
        for group in outs.chunks(4) {
            for r in 0..2 {
                let (a, b) = (&group[r], &group[2 + r]);
                assert_eq!(a.2, b.2, "t={t} r={r}: {:?} differs across threads", a.1);
            }
        }
        // And the kernels called directly, one thread, exact numerics.
        let HostTensor::F32 { data: xs, .. } = &x else {
            unreachable!()
        };
        let HostTensor::I32 { data: ps, .. } = &pos(1) else {
            unreachable!()
        };
        let table = crate::kernels::RopeTable::new(&crate::kernels::RopeConfig {
            style: poot_graph::RopeStyle::NeoX,
            head_dim: 64,
            rot_dim: 64,
            theta: 10000.0,
            scaling: poot_graph::RopeScaling::None,
        })
        .unwrap();
        let (_, bytes) = &store.0["norm"];
        let mut y = xs.clone();
        for _ in 0..2 {
            let mut n = vec![0.0; y.len()];
            crate::kernels::rms_norm(&y, t, 128, bytes, DType::F32, 1e-5, &mut n).unwrap();
            crate::kernels::silu(&mut n);
            crate::kernels::rope(&mut n, t, 2, ps, &table).unwrap();
            let g: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let mut m = vec![0.0; y.len()];
            crate::kernels::mul(&n, &g, &mut m).unwrap();
            crate::kernels::add(&m, xs, &mut y).unwrap();
        }
        let want: Vec<u32> = y.iter().map(|f| f.to_bits()).collect();
        assert_eq!(outs[5].2, want, "t={t}: exact numerics vs the kernels");
    }
}
