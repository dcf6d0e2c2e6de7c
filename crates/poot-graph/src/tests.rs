//! Tracer and pass tests: shapes, every budget, and the compile limits.

use std::collections::HashMap;
use std::sync::Arc;

use poot_core::DType;

use crate::*;

struct Catalog(HashMap<String, (DType, Vec<usize>)>);

impl WeightCatalog for Catalog {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.0.get(name).cloned()
    }
}

fn catalog() -> Arc<dyn WeightCatalog> {
    let mut m = HashMap::new();
    m.insert("emb".to_owned(), (DType::Q8_0, vec![512, 64]));
    m.insert("norm".to_owned(), (DType::F32, vec![64]));
    m.insert("wq".to_owned(), (DType::Q4_0, vec![64, 64]));
    m.insert("exps".to_owned(), (DType::Q8_0, vec![8, 32, 64]));
    m.insert("gate1d".to_owned(), (DType::F32, vec![64]));
    m.insert("gate3d".to_owned(), (DType::F32, vec![1, 1, 64]));
    Arc::new(Catalog(m))
}

fn tiny(limits: TraceLimits, tokens: usize) -> Result<Graph, TraceError> {
    let mut t = Tracer::new(limits, tokens, catalog())?;
    let ids = t.input("ids", DType::I32, vec![tokens])?;
    let emb = t.weight("emb")?;
    let x = t.embedding(emb, ids)?;
    let w = t.weight("norm")?;
    let h = t.rms_norm(x, w, 1e-5)?;
    let wq = t.weight("wq")?;
    let q = t.matmul(h, wq)?;
    let y = t.silu(q)?;
    t.output("y", y)?;
    Ok(t.finish())
}

#[test]
fn traces_a_typed_graph() {
    let g = tiny(TraceLimits::default(), 3).unwrap();
    let (_, y) = &g.outputs[0];
    assert_eq!(g.info(*y).shape, vec![3, 64]);
    assert_eq!(g.weights().count(), 3);
    assert_eq!(
        g.inputs().map(|(n, _, _)| n).collect::<Vec<_>>(),
        vec!["ids"]
    );
    validate(&g).unwrap();
}

#[test]
fn same_weight_name_is_one_value() {
    let mut t = Tracer::new(TraceLimits::default(), 1, catalog()).unwrap();
    assert_eq!(t.weight("wq").unwrap(), t.weight("wq").unwrap());
    assert_eq!(t.usage().equations, 1);
}

#[test]
fn step_above_max_tokens_is_refused_before_tracing() {
    let limits = TraceLimits {
        max_tokens: 4,
        ..TraceLimits::default()
    };
    let err = Tracer::new(limits, 5, catalog()).unwrap_err();
    assert_eq!(
        err,
        TraceError::Budget {
            resource: Resource::Tokens,
            limit: 4,
            total: 5
        }
    );
}

#[test]
fn each_budget_trips_with_resource_limit_and_total() {
    let cases = [
        (
            TraceLimits {
                max_equations: 4,
                ..TraceLimits::default()
            },
            Resource::Equations,
            4,
            5,
        ),
        (
            TraceLimits {
                max_values: 3,
                ..TraceLimits::default()
            },
            Resource::Values,
            3,
            4,
        ),
        (
            TraceLimits {
                max_records: 2,
                ..TraceLimits::default()
            },
            Resource::Records,
            2,
            3,
        ),
    ];
    for (limits, resource, limit, total) in cases {
        let err = tiny(limits, 2).unwrap_err();
        assert_eq!(
            err,
            TraceError::Budget {
                resource,
                limit,
                total
            },
            "{resource}"
        );
    }
    let mut t = Tracer::new(
        TraceLimits {
            max_literal_bytes: 16,
            ..TraceLimits::default()
        },
        1,
        catalog(),
    )
    .unwrap();
    t.literal(&[1.0; 4], vec![4]).unwrap();
    let err = t.literal(&[1.0], vec![1]).unwrap_err();
    assert_eq!(
        err,
        TraceError::Budget {
            resource: Resource::LiteralBytes,
            limit: 16,
            total: 20
        }
    );
    assert_eq!(
        t.usage().equations,
        1,
        "the refused literal was not recorded"
    );
}

#[test]
fn shape_errors_name_the_op() {
    let mut t = Tracer::new(TraceLimits::default(), 2, catalog()).unwrap();
    let ids = t.input("ids", DType::I32, vec![2]).unwrap();
    let x = t.input("x", DType::F32, vec![2, 32]).unwrap();
    let wq = t.weight("wq").unwrap();
    assert!(matches!(
        t.matmul(x, wq),
        Err(TraceError::Shape { op: "matmul", .. })
    ));
    assert!(matches!(
        t.matmul(ids, wq),
        Err(TraceError::Shape { op: "matmul", .. })
    ));
    assert!(matches!(
        t.matmul(x, x),
        Err(TraceError::Shape { op: "matmul", .. })
    ));
    assert!(matches!(
        t.weight("nope"),
        Err(TraceError::UnknownWeight { .. })
    ));
    assert!(matches!(
        t.input("x", DType::F32, vec![1]),
        Err(TraceError::DuplicateInput { .. })
    ));
    assert!(matches!(
        t.reshape(x, vec![3, 3]),
        Err(TraceError::Shape { op: "reshape", .. })
    ));
    assert!(matches!(
        t.slice(x, 1, 4, 40),
        Err(TraceError::Shape { op: "slice", .. })
    ));
    let cfg = RopeConfig {
        n_heads: 4,
        head_dim: 4,
        rot_dim: 4,
        theta: 1e4,
        style: RopeStyle::NeoX,
        scaling: RopeScaling::None,
    };
    assert!(matches!(
        t.rope(x, ids, cfg),
        Err(TraceError::Shape { op: "rope", .. })
    ));
    let cfg = RopeConfig {
        n_heads: 8,
        head_dim: 4,
        rot_dim: 4,
        ..cfg
    };
    t.rope(x, ids, cfg).unwrap();
}

#[test]
fn attention_checks_gqa_and_metadata() {
    let mut t = Tracer::new(TraceLimits::default(), 3, catalog()).unwrap();
    let q = t.input("q", DType::F32, vec![3, 64]).unwrap();
    let kv = t.input("kv", DType::F32, vec![3, 32]).unwrap();
    let slots = t.input("slots", DType::I32, vec![3]).unwrap();
    let seq = t.input("seq", DType::I32, vec![3]).unwrap();
    let pos = t.input("pos", DType::I32, vec![3]).unwrap();
    let tables = t.input("tables", DType::I32, vec![1, 4]).unwrap();
    let meta = AttentionMeta {
        slot_mapping: slots,
        token_seq: seq,
        positions: pos,
        block_tables: tables,
    };
    let cfg = AttentionConfig {
        layer: 0,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 8,
        scale: 0.35,
        window: 0,
        softcap: 0.0,
    };
    let out = t.paged_attention(q, kv, kv, meta, cfg).unwrap();
    assert_eq!(t.info(out).unwrap().shape, vec![3, 64]);
    let bad = AttentionConfig {
        n_kv_heads: 3,
        ..cfg
    };
    assert!(t.paged_attention(q, kv, kv, meta, bad).is_err());
    let bad_meta = AttentionMeta {
        slot_mapping: tables,
        ..meta
    };
    assert!(t.paged_attention(q, kv, kv, bad_meta, cfg).is_err());
}

#[test]
fn dce_drops_unused_and_keeps_outputs() {
    let mut t = Tracer::new(TraceLimits::default(), 1, catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![1, 64]).unwrap();
    let _unused = t.gelu(x).unwrap();
    let y = t.silu(x).unwrap();
    t.output("y", y).unwrap();
    let g = t.finish();
    let out = run_passes(&g, &[&DeadCodeElimination], &CompileLimits::default()).unwrap();
    assert_eq!(out.equations.len(), 2);
    assert_eq!(out.op(out.outputs[0].1).name(), "silu");
}

#[test]
fn expansion_past_the_limit_is_refused() {
    let g = tiny(TraceLimits::default(), 1).unwrap();
    let limits = CompileLimits {
        max_equations: 3,
        ..CompileLimits::default()
    };
    let err = run_passes(&g, &[&DeadCodeElimination], &limits).unwrap_err();
    assert_eq!(
        err,
        CompileError::Expansion {
            pass: "dead_code_elimination",
            limit: 3,
            total: 4
        }
    );
}

#[test]
fn validate_rejects_forward_references() {
    let mut g = tiny(TraceLimits::default(), 1).unwrap();
    g.equations[1] = Op::Silu { x: ValueId(5) };
    assert!(matches!(validate(&g), Err(CompileError::Invalid(_))));
}

#[test]
fn softcap_and_attention_softcap_are_checked() {
    let mut t = Tracer::new(TraceLimits::default(), 3, catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![3, 8]).unwrap();
    t.softcap(x, 30.0).unwrap();
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(t.softcap(x, bad).is_err(), "cap {bad}");
    }
    let q = t.input("q", DType::F32, vec![3, 64]).unwrap();
    let kv = t.input("kv", DType::F32, vec![3, 32]).unwrap();
    let ids: Vec<ValueId> = ["slots", "seq", "pos"]
        .iter()
        .map(|n| t.input(n, DType::I32, vec![3]).unwrap())
        .collect();
    let tables = t.input("tables", DType::I32, vec![1, 4]).unwrap();
    let meta = AttentionMeta {
        slot_mapping: ids[0],
        token_seq: ids[1],
        positions: ids[2],
        block_tables: tables,
    };
    let cfg = AttentionConfig {
        layer: 0,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 8,
        scale: 0.35,
        window: 5,
        softcap: 50.0,
    };
    t.paged_attention(q, kv, kv, meta, cfg).unwrap();
    for softcap in [-1.0, f32::NAN, f32::INFINITY] {
        let bad = AttentionConfig { softcap, ..cfg };
        assert!(
            t.paged_attention(q, kv, kv, meta, bad).is_err(),
            "{softcap}"
        );
    }
}

#[test]
fn moe_ops_check_their_shapes() {
    let mut t = Tracer::new(TraceLimits::default(), 3, catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![3, 64]).unwrap();
    let logits = t.input("logits", DType::F32, vec![3, 8]).unwrap();
    let ids = t.top_k_ids(logits, 2).unwrap();
    let exps = t.weight("exps").unwrap();
    let wq = t.weight("wq").unwrap();
    let g = t.gather_cols(logits, ids).unwrap();
    assert_eq!(t.info(g).unwrap().shape, vec![3, 2]);
    let y = t.moe_matmul(x, exps, ids).unwrap();
    assert_eq!(t.info(y).unwrap().shape, vec![6, 32]);
    let c = t.moe_combine(y, g).unwrap();
    assert_eq!(t.info(c).unwrap().shape, vec![3, 32]);
    // A 2-D weight, a K mismatch, ids of another token count, weights of another k.
    assert!(t.moe_matmul(x, wq, ids).is_err());
    let y32 = t.input("y32", DType::F32, vec![3, 32]).unwrap();
    assert!(t.moe_matmul(y32, exps, ids).is_err());
    let ids4 = t.input("ids4", DType::I32, vec![4, 2]).unwrap();
    assert!(t.gather_cols(logits, ids4).is_err());
    // One row of ids picks the same columns of every row (an act-order input permutation).
    let ids1 = t.input("ids1", DType::I32, vec![1, 5]).unwrap();
    let g1 = t.gather_cols(logits, ids1).unwrap();
    assert_eq!(t.info(g1).unwrap().shape, vec![3, 5]);
    let g3 = t.input("g3", DType::F32, vec![3, 3]).unwrap();
    assert!(t.moe_combine(y, g3).is_err());
}

#[test]
fn matmul_takes_a_1d_weight_as_one_row() {
    let mut t = Tracer::new(TraceLimits::default(), 3, catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![3, 64]).unwrap();
    let g = t.weight("gate1d").unwrap();
    let y = t.matmul(x, g).unwrap();
    assert_eq!(t.info(y).unwrap().shape, vec![3, 1]);
    assert_eq!(t.info(g).unwrap().matrix(), (1, 64));
    // The weight keeps its stored shape (runtimes check it against the store).
    assert_eq!(t.info(g).unwrap().shape, vec![64]);
    // K must still match, and a 3-D weight is not a matrix.
    let x32 = t.input("x32", DType::F32, vec![3, 32]).unwrap();
    assert!(matches!(
        t.matmul(x32, g),
        Err(TraceError::Shape { op: "matmul", .. })
    ));
    let g3 = t.weight("gate3d").unwrap();
    assert!(matches!(
        t.matmul(x, g3),
        Err(TraceError::Shape { op: "matmul", .. })
    ));
}

fn half_catalog() -> Arc<dyn WeightCatalog> {
    let mut m = HashMap::new();
    m.insert("emb".to_owned(), (DType::BF16, vec![16, 8]));
    m.insert("norm".to_owned(), (DType::F16, vec![8]));
    m.insert("w".to_owned(), (DType::BF16, vec![4, 8]));
    m.insert("w32".to_owned(), (DType::F32, vec![4, 8]));
    m.insert("wq".to_owned(), (DType::Q4_0, vec![32, 32]));
    Arc::new(Catalog(m))
}

/// embedding -> rms_norm -> matmul by "w", then by the tied table; `casts` records them as
/// the tracer does, otherwise the graph is built by hand without any cast.
fn half_graph(casts: bool) -> Graph {
    let mut t = Tracer::new(TraceLimits::default(), 2, half_catalog()).unwrap();
    if casts {
        let ids = t.input("ids", DType::I32, vec![2]).unwrap();
        let emb = t.weight("emb").unwrap();
        let x = t.embedding(emb, ids).unwrap();
        let norm = t.weight("norm").unwrap();
        let h = t.rms_norm(x, norm, 1e-5).unwrap();
        let w = t.weight("w").unwrap();
        let y = t.matmul(h, w).unwrap();
        let logits = t.matmul(h, emb).unwrap();
        t.output("y", y).unwrap();
        t.output("logits", logits).unwrap();
        return t.finish();
    }
    let info = |d: DType, s: &[usize]| ValueInfo::new(d, s.to_vec());
    let weight = |n: &str| Op::Weight { name: n.into() };
    Graph {
        equations: vec![
            Op::Input { name: "ids".into() },
            weight("emb"),
            Op::Embedding {
                table: ValueId(1),
                ids: ValueId(0),
            },
            weight("norm"),
            Op::RmsNorm {
                x: ValueId(2),
                weight: ValueId(3),
                eps: 1e-5,
            },
            weight("w"),
            Op::MatMul {
                x: ValueId(4),
                w: ValueId(5),
            },
            Op::MatMul {
                x: ValueId(4),
                w: ValueId(1),
            },
        ],
        values: vec![
            info(DType::I32, &[2]),
            info(DType::BF16, &[16, 8]),
            info(DType::F32, &[2, 8]),
            info(DType::F16, &[8]),
            info(DType::F32, &[2, 8]),
            info(DType::BF16, &[4, 8]),
            info(DType::F32, &[2, 4]),
            info(DType::F32, &[2, 16]),
        ],
        outputs: vec![("y".into(), ValueId(6)), ("logits".into(), ValueId(7))],
        step_tokens: 2,
    }
}

#[test]
fn half_weights_are_read_through_a_cast_at_each_reader() {
    let g = half_graph(true);
    let casts: Vec<_> = g
        .equations
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::Cast { x, to } => Some((i, g.op(*x).clone(), *to)),
            _ => None,
        })
        .collect();
    // The table (twice: embedding and tied head), the norm weight and "w".
    assert_eq!(casts.len(), 4);
    assert!(casts.iter().all(|(_, _, to)| *to == DType::F32));
    for (i, op) in g.equations.iter().enumerate() {
        let reads = match op {
            Op::Embedding { table, .. } => Some(*table),
            Op::RmsNorm { weight, .. } => Some(*weight),
            Op::MatMul { w, .. } => Some(*w),
            _ => None,
        };
        if let Some(v) = reads {
            assert!(
                matches!(g.op(v), Op::Cast { .. }),
                "equation {i} reads {v:?}"
            );
            assert_eq!(v.index() + 1, i, "the cast sits just before its reader");
            assert_eq!(g.info(v).dtype, DType::F32);
        }
    }
    // F32 and packed weights are read as they are.
    let mut t = Tracer::new(TraceLimits::default(), 1, half_catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![1, 8]).unwrap();
    let w32 = t.weight("w32").unwrap();
    t.matmul(x, w32).unwrap();
    let xq = t.input("xq", DType::F32, vec![1, 32]).unwrap();
    let wq = t.weight("wq").unwrap();
    t.matmul(xq, wq).unwrap();
    let g = t.finish();
    assert!(!g.equations.iter().any(|op| matches!(op, Op::Cast { .. })));
}

#[test]
fn fused_casts_leave_the_graph_without_them() {
    let limits = CompileLimits::default();
    let passes: [&dyn Pass; 2] = [&FuseWeightCasts::EVERY_READER, &DeadCodeElimination];
    let fused = run_passes(&half_graph(true), &passes, &limits).unwrap();
    assert_eq!(fused, half_graph(false));
    // Matrix readers only: the norm's weight keeps its cast (to run on its own).
    let passes_m: [&dyn Pass; 2] = [&FuseWeightCasts::MATRIX_READERS, &DeadCodeElimination];
    let g = run_passes(&half_graph(true), &passes_m, &limits).unwrap();
    let casts: Vec<_> = g
        .equations
        .iter()
        .filter(|op| op.name() == "cast")
        .collect();
    assert_eq!(casts.len(), 1);
    assert!(
        matches!(g.equations.last(), Some(Op::MatMul { w, .. }) if g.op(*w).name() == "weight")
    );
    // A cast read by an op that takes only activations stays, to run as its own kernel.
    let mut t = Tracer::new(TraceLimits::default(), 1, half_catalog()).unwrap();
    let w = t.weight("w").unwrap();
    let c = t.cast(w, DType::F32).unwrap();
    let s = t.softmax(c).unwrap();
    t.output("s", s).unwrap();
    let g = run_passes(&t.finish(), &passes, &limits).unwrap();
    assert_eq!(
        g.equations.iter().filter(|op| op.name() == "cast").count(),
        1
    );
}

#[test]
fn cast_refuses_what_it_cannot_read() {
    let mut t = Tracer::new(TraceLimits::default(), 1, half_catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![1, 8]).unwrap();
    let wq = t.weight("wq").unwrap();
    let w = t.weight("w").unwrap();
    for (v, to) in [(x, DType::F32), (wq, DType::F32), (w, DType::F16)] {
        let err = t.cast(v, to).unwrap_err();
        assert!(matches!(err, TraceError::Shape { op: "cast", .. }), "{err}");
    }
    // An explicit cast is read as the weight it casts: no second cast.
    let c = t.cast(w, DType::F32).unwrap();
    let before = t.usage().equations;
    t.matmul(x, c).unwrap();
    assert_eq!(t.usage().equations, before + 1);
}

#[test]
fn a_refused_read_records_no_cast() {
    let limits = TraceLimits {
        max_equations: 4,
        ..TraceLimits::default()
    };
    let mut t = Tracer::new(limits, 1, half_catalog()).unwrap();
    let x = t.input("x", DType::F32, vec![1, 8]).unwrap();
    let norm = t.weight("norm").unwrap();
    let h = t.rms_norm(x, norm, 1e-5).unwrap(); // cast + norm: 4 equations
    let w = t.weight("w");
    assert!(matches!(w, Err(TraceError::Budget { .. })));
    assert_eq!(t.usage().equations, 4);
    let err = t.rms_norm(h, norm, 1e-5).unwrap_err();
    assert!(matches!(err, TraceError::Budget { .. }));
    assert_eq!(t.usage().equations, 4);
}
