//! Matmul fusion in a plan (`CpuPlan::fuse_matmuls`): matmuls that read one activation through
//! re-laid weights of one kind run in one dispatch, with each output the bits of a plan that
//! runs that matmul alone; other matmuls stay apart.

use std::collections::HashMap;
use std::sync::Arc;

use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, Graph, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, Runtime, WeightStore};

use super::{CpuOptions, CpuPlan, CpuRuntime};
use crate::kernels::Numerics;
use crate::testutil::{synthetic_weights, Rng};

const K: usize = 256;

struct Store(HashMap<String, (DType, Vec<usize>, Vec<u8>)>);

impl WeightCatalog for Store {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.0.get(name).map(|(d, s, _)| (*d, s.clone()))
    }
}

impl WeightStore for Store {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|(_, _, b)| b.as_slice())
    }
    fn total_bytes(&self) -> u64 {
        self.0.values().map(|(_, _, b)| b.len() as u64).sum()
    }
}

/// q/k/v-like Q8_0 weights (20 rows: not a multiple of 8; `up` as many rows as `q`), a Q4_K
/// one and an F32 one.
fn store() -> Arc<Store> {
    let mut m = HashMap::new();
    for (i, (name, dt, n)) in [
        ("q", DType::Q8_0, 40),
        ("k", DType::Q8_0, 20),
        ("v", DType::Q8_0, 16),
        ("up", DType::Q8_0, 40),
        ("gate", DType::Q4_K, 24),
        ("f", DType::F32, 8),
        // Q4_1 gate/up pairs (ggml's order): single groups with a short last one, and enough
        // groups for two per step on VNNI with claims of two pieces (`matmul/glu.rs`).
        ("g4", DType::Q4_1, 20),
        ("u4", DType::Q4_1, 20),
        ("g4p", DType::Q4_1, 4104),
        ("u4p", DType::Q4_1, 4104),
    ]
    .into_iter()
    .enumerate()
    {
        let w = synthetic_weights(dt, n, K, 3 + i as u32);
        m.insert(name.to_owned(), (dt, vec![n, K], w));
    }
    Arc::new(Store(m))
}

/// `x @ W^T` for each named weight, as outputs of one graph.
fn graph(t: usize, names: &[&str]) -> Graph {
    let s: Arc<dyn WeightCatalog> = store();
    let mut tr = Tracer::new(TraceLimits::default(), 2, s).unwrap();
    let x = tr.input("x", DType::F32, vec![t, K]).unwrap();
    for name in names {
        let w = tr.weight(name).unwrap();
        let y = tr.matmul(x, w).unwrap();
        tr.output(name, y).unwrap();
    }
    tr.finish()
}

#[test]
fn fused_matmuls_give_each_alone_plans_bits() {
    let rt = CpuRuntime::new(CpuOptions {
        threads: 2,
        numerics: Numerics::Ggml,
        ..CpuOptions::default()
    })
    .unwrap();
    let weights = store();
    let names = ["q", "k", "v", "gate", "f"];
    for t in [1, 5] {
        let x = HostTensor::F32 {
            shape: vec![t, K],
            data: Rng::new(9).vec(t * K, -1.0, 1.0),
        };
        let limits = CompileLimits::default();
        let plan = rt
            .prepare(&graph(t, &names), weights.clone(), &limits)
            .unwrap();
        let cpu = plan.as_any().downcast_ref::<CpuPlan>().unwrap();
        // q, k and v share one Q8_0 dispatch; the lone Q4_K and the F32 weight stay apart.
        let groups: Vec<usize> = cpu.fused.values().map(Vec::len).collect();
        assert_eq!(groups, [3], "t={t}");
        assert_eq!(cpu.fused_later.iter().filter(|&&l| l).count(), 2);
        let all = rt
            .run(plan.as_ref(), &[("x", x.clone())], Deadline::never())
            .unwrap();
        for name in names {
            let alone = rt
                .prepare(&graph(t, &[name]), weights.clone(), &limits)
                .unwrap();
            let want = rt
                .run(alone.as_ref(), &[("x", x.clone())], Deadline::never())
                .unwrap();
            let got = all.iter().find(|(n, _)| n == name).unwrap();
            assert_eq!(got.1, want[0].1, "{name} t={t}");
        }
    }
}

/// Each matmul dispatch names the next one's weights (the last the first's) as the pool's
/// prefetch hint; the workers prefetch them, and the outputs are the bits of a runtime that
/// prefetches nothing.
#[test]
fn prefetch_hints_name_the_next_dispatch_and_change_no_output() {
    use poot_graph::Op;
    let off = CpuRuntime::new(CpuOptions {
        threads: 2,
        numerics: Numerics::Ggml,
        prefetch_gap: 0,
        ..CpuOptions::default()
    })
    .unwrap();
    // Workers that keep spinning take every hint, however loaded the machine is.
    let on = CpuRuntime::new(CpuOptions {
        threads: 2,
        numerics: Numerics::Ggml,
        prefetch_gap: 1 << 20,
        spin: std::time::Duration::from_secs(60),
        ..CpuOptions::default()
    })
    .unwrap();
    let weights = store();
    let names = ["q", "k", "v", "gate", "f"];
    let limits = CompileLimits::default();
    let plan = on
        .prepare(&graph(1, &names), weights.clone(), &limits)
        .unwrap();
    let cpu = plan.as_any().downcast_ref::<CpuPlan>().unwrap();
    // The dispatches in order: q (with k and v), gate, f; each names the next one's bytes.
    let eq = |name: &str| {
        cpu.graph
            .equations
            .iter()
            .position(|op| match op {
                Op::MatMul { w, .. } => {
                    matches!(cpu.graph.op(*w), Op::Weight { name: n } if n == name)
                }
                _ => false,
            })
            .unwrap()
    };
    let w = |name: &str| match &cpu.graph.equations[eq(name)] {
        Op::MatMul { w, .. } => w.index(),
        _ => unreachable!(),
    };
    let lens = |i: usize| -> Vec<usize> { cpu.prefetch_next[i].iter().map(|r| r.1).collect() };
    let repacked = |name: &str| cpu.repack(w(name)).unwrap().bytes();
    assert_eq!(lens(eq("q")), [repacked("gate")]);
    assert_eq!(lens(eq("gate")), [8 * K * 4]);
    assert_eq!(lens(eq("f")), [repacked("q"), repacked("k"), repacked("v")]);
    for j in [eq("k"), eq("v")] {
        assert!(
            cpu.prefetch_next[j].is_empty(),
            "a later fused member posts nothing"
        );
    }
    let plan_off = off.prepare(&graph(1, &names), weights, &limits).unwrap();
    for round in 0..20 {
        let x = HostTensor::F32 {
            shape: vec![1, K],
            data: Rng::new(round).vec(K, -1.0, 1.0),
        };
        let want = off
            .run(plan_off.as_ref(), &[("x", x.clone())], Deadline::never())
            .unwrap();
        let got = on
            .run(plan.as_ref(), &[("x", x)], Deadline::never())
            .unwrap();
        assert_eq!(got, want, "round {round}");
    }
    // The idle worker took the hints (a liveness bound, not a timing).
    let start = std::time::Instant::now();
    while on.pool.hinted_bytes() == 0 {
        assert!(start.elapsed().as_secs() < 60, "no hint was prefetched");
        std::thread::yield_now();
    }
    assert_eq!(off.pool.hinted_bytes(), 0);
}

/// `act(x @ gate^T) * (x @ up^T)` over the named weights of `s` (the factors in either order),
/// and the activation itself as a second output when `keep` (a second reader: neither the
/// multiply nor the pair can be fused).
fn glu(
    t: usize,
    gelu: bool,
    act_first: bool,
    keep: bool,
    (gate, up): (&str, &str),
    s: Arc<dyn WeightCatalog>,
) -> Graph {
    let mut tr = Tracer::new(TraceLimits::default(), 2, s).unwrap();
    let x = tr.input("x", DType::F32, vec![t, K]).unwrap();
    let (wg, wu) = (tr.weight(gate).unwrap(), tr.weight(up).unwrap());
    let g = tr.matmul(x, wg).unwrap();
    let u = tr.matmul(x, wu).unwrap();
    let a = if gelu { tr.gelu(g) } else { tr.silu(g) }.unwrap();
    let y = if act_first {
        tr.mul(a, u)
    } else {
        tr.mul(u, a)
    }
    .unwrap();
    tr.output("y", y).unwrap();
    if keep {
        tr.output("a", a).unwrap();
    }
    tr.finish()
}

/// A SiLU/GELU whose only reader is a multiply by the (fused) up projection makes the product
/// itself (`CpuPlan::act_mul`), and the fused gate/up pair read only by that product makes it
/// in its dispatch for one token (`CpuPlan::glu`, `kernels::matmul::matmul_glu`; several tokens
/// take the activation's run): bit for bit the product of a plan that keeps the activation
/// apart, under both numerics, one token and several, either operand order, for Q8_0 (block
/// order, pairs of groups on VNNI) and Q4_1 (ggml's order; single groups with a short last one,
/// and pairs in claims of two pieces).
#[test]
fn an_activation_makes_its_multiply_with_the_same_bits() {
    let weights = store();
    let limits = CompileLimits::default();
    for numerics in [Numerics::Ggml, Numerics::Exact] {
        let rt = CpuRuntime::new(CpuOptions {
            threads: 2,
            numerics,
            ..CpuOptions::default()
        })
        .unwrap();
        for (pair, t, gelu, act_first) in [
            (("q", "up"), 1, false, true),
            (("up", "q"), 1, true, false),
            (("q", "up"), 5, false, false),
            (("q", "up"), 5, true, true),
            (("g4", "u4"), 1, false, false),
            (("g4p", "u4p"), 1, false, true),
            (("g4p", "u4p"), 3, true, true),
        ] {
            let x = HostTensor::F32 {
                shape: vec![t, K],
                data: Rng::new(7 + t as u32).vec(t * K, -2.0, 2.0),
            };
            let run = |keep: bool| {
                let g = glu(t, gelu, act_first, keep, pair, weights.clone());
                let plan = rt.prepare(&g, weights.clone(), &limits).unwrap();
                let cpu = plan.as_any().downcast_ref::<CpuPlan>().unwrap();
                let fused = cpu.act_mul.iter().flatten().count();
                let glus = cpu.glu.iter().flatten().count();
                let out = rt
                    .run(plan.as_ref(), &[("x", x.clone())], Deadline::never())
                    .unwrap();
                let y = out.into_iter().find(|(n, _)| n == "y").unwrap().1;
                let HostTensor::F32 { data, .. } = y else {
                    unreachable!("an f32 output")
                };
                let bits = data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                ((fused, glus), bits)
            };
            let ((fused, got), (apart, want)) = (run(false), run(true));
            let case = format!("{numerics:?} {pair:?} t={t} gelu={gelu} act_first={act_first}");
            // Exact numerics keep the stored layouts (nothing re-laid, no fused pair).
            let glus = usize::from(numerics == Numerics::Ggml);
            assert_eq!((fused, apart), ((1, glus), (0, 0)), "{case}");
            assert_eq!(got, want, "{case}");
            // Run again: the first run's buffers, parked in the arena, are reused.
            assert_eq!(run(false).1, want, "{case}, second run");
        }
    }
}

/// A re-laid weight from 64 KiB to 2 MiB (a small model's matrices) is a piece of a shared
/// huge-page slab where the runtime asks for huge pages (`hugemem`), and an allocator buffer
/// where it does not; both give the same bits.
#[test]
fn small_re_laid_weights_sit_in_huge_page_slabs_with_the_same_bits() {
    use crate::kernels::matmul::repack::Repack;
    let runtime = |huge_pages| {
        CpuRuntime::new(CpuOptions {
            threads: 2,
            numerics: Numerics::Ggml,
            huge_pages,
            ..CpuOptions::default()
        })
        .unwrap()
    };
    let (on, off) = (runtime(true), runtime(false));
    let weights = store();
    let limits = CompileLimits::default();
    let names = ["g4p"];
    let in_slab = |rt: &CpuRuntime, t: usize| {
        let plan = rt
            .prepare(&graph(t, &names), weights.clone(), &limits)
            .unwrap();
        let cpu = plan.as_any().downcast_ref::<CpuPlan>().unwrap();
        let slab = cpu
            .graph
            .equations
            .iter()
            .find_map(|op| match op {
                poot_graph::Op::MatMul { w, .. } => match cpu.repack(w.index()) {
                    Some(Repack::Q(r)) => {
                        assert!((64 << 10..2 << 20).contains(&r.bytes()), "{}", r.bytes());
                        Some(r.data.in_slab())
                    }
                    other => panic!("g4p re-laid 8 rows at a time, not {other:?}"),
                },
                _ => None,
            })
            .expect("a matmul");
        (plan, slab)
    };
    for t in [1, 3] {
        let ((plan_on, slab_on), (plan_off, slab_off)) = (in_slab(&on, t), in_slab(&off, t));
        let want_slab = crate::hugemem::available_with(true);
        assert_eq!((slab_on, slab_off), (want_slab, false), "t={t}");
        let x = HostTensor::F32 {
            shape: vec![t, K],
            data: Rng::new(t as u32).vec(t * K, -1.0, 1.0),
        };
        let want = off
            .run(plan_off.as_ref(), &[("x", x.clone())], Deadline::never())
            .unwrap();
        let got = on
            .run(plan_on.as_ref(), &[("x", x)], Deadline::never())
            .unwrap();
        assert_eq!(got, want, "t={t}");
    }
}
