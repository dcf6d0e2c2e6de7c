//! A decode step allocates nothing once warm: a one-layer transformer step (every weight dtype
//! the integer and float kernels take, RoPE, paged attention, SwiGLU, LM head, row gather) run
//! repeatedly on a 2-thread runtime, counting heap allocations on every thread with a counting
//! global allocator. What remains per run is what the API hands to the caller: the output
//! tensor's buffer, its shape and name, and the output list. (The scheduler's `Sample` op, not
//! in this graph, builds its token vector too.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use poot_core::{DType, Deadline};
use poot_cpu::{CpuOptions, CpuRuntime, Numerics};
use poot_graph::ir::{AttentionConfig, AttentionMeta, RopeConfig, RopeScaling, RopeStyle};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, KvCacheConfig, Runtime, WeightStore};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's arguments unchanged;
// the counter is a relaxed atomic and never affects what is returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged (see the impl's comment).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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

/// `rows x cols` of `dtype` with small finite scales (every f16 field 0.01) and random quants.
fn weight(dtype: DType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.max(1);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    let n = rows * cols;
    match dtype {
        DType::F32 => (0..n)
            .flat_map(|_| ((next() % 200) as f32 / 1000.0 - 0.1).to_le_bytes())
            .collect(),
        DType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32((next() % 200) as f32 / 1000.0 - 0.1).to_le_bytes())
            .collect(),
        _ => {
            let l = poot_core::quant::layout::layout(dtype).expect("packed layout");
            let mut b: Vec<u8> = (0..dtype.bytes_for(n as u64).unwrap())
                .map(|_| next() as u8)
                .collect();
            for block in b.chunks_exact_mut(l.bytes()) {
                for f in l
                    .fields
                    .iter()
                    .filter(|f| matches!(f.name, "d" | "m" | "dmin"))
                {
                    let v = half::f16::from_f32(0.01).to_le_bytes();
                    block[f.offset..f.offset + 2].copy_from_slice(&v);
                }
            }
            b
        }
    }
}

const D: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 64;
const FFN: usize = 512;
const VOCAB: usize = 96;

fn store() -> Arc<Store> {
    let mut m = HashMap::new();
    let mut add = |name: &str, dt: DType, rows: usize, cols: usize| {
        let seed = m.len() as u32 + 7;
        let shape = if rows == 1 {
            vec![cols]
        } else {
            vec![rows, cols]
        };
        m.insert(name.to_owned(), (dt, shape, weight(dt, rows, cols, seed)));
    };
    add("emb", DType::F32, VOCAB, D);
    add("norm", DType::F32, 1, D);
    add("wq", DType::Q8_0, HEADS * HD, D);
    add("wk", DType::Q4_K, KV_HEADS * HD, D);
    add("wv", DType::Q6_K, KV_HEADS * HD, D);
    add("wo", DType::Q4_1, D, HEADS * HD);
    add("gate", DType::Q4_0, FFN, D);
    add("up", DType::Q5_0, FFN, D);
    add("down", DType::F16, D, FFN);
    add("head", DType::F16, VOCAB, D);
    Arc::new(Store(m))
}

fn graph(s: Arc<Store>) -> poot_graph::Graph {
    let cat: Arc<dyn WeightCatalog> = s;
    let mut t = Tracer::new(TraceLimits::default(), 1, cat).unwrap();
    let ids = t.input("ids", DType::I32, vec![1]).unwrap();
    let pos = t.input("pos", DType::I32, vec![1]).unwrap();
    let slots = t.input("slots", DType::I32, vec![1]).unwrap();
    let seq = t.input("seq", DType::I32, vec![1]).unwrap();
    let tables = t.input("tables", DType::I32, vec![1, 1]).unwrap();
    let rows = t.input("rows", DType::I32, vec![1]).unwrap();
    let w = |t: &mut Tracer, n: &str| t.weight(n).unwrap();
    let (emb, norm) = (w(&mut t, "emb"), w(&mut t, "norm"));
    let x = t.embedding(emb, ids).unwrap();
    let h = t.rms_norm(x, norm, 1e-5).unwrap();
    let mm = |t: &mut Tracer, x, n: &str| {
        let wv = t.weight(n).unwrap();
        t.matmul(x, wv).unwrap()
    };
    let q = mm(&mut t, h, "wq");
    let k = mm(&mut t, h, "wk");
    let v = mm(&mut t, h, "wv");
    let rope = |heads: usize| RopeConfig {
        n_heads: heads as u32,
        head_dim: HD as u32,
        rot_dim: HD as u32,
        theta: 10000.0,
        style: RopeStyle::NeoX,
        scaling: RopeScaling::None,
    };
    let q = t.rope(q, pos, rope(HEADS)).unwrap();
    let k = t.rope(k, pos, rope(KV_HEADS)).unwrap();
    let meta = AttentionMeta {
        slot_mapping: slots,
        token_seq: seq,
        positions: pos,
        block_tables: tables,
    };
    let cfg = AttentionConfig {
        layer: 0,
        n_heads: HEADS as u32,
        n_kv_heads: KV_HEADS as u32,
        head_dim: HD as u32,
        scale: 0.125,
        window: 0,
        softcap: 0.0,
    };
    let a = t.paged_attention(q, k, v, meta, cfg).unwrap();
    let o = mm(&mut t, a, "wo");
    let x = t.add(x, o).unwrap();
    let h = t.rms_norm(x, norm, 1e-5).unwrap();
    let g = mm(&mut t, h, "gate");
    let u = mm(&mut t, h, "up");
    let g = t.silu(g).unwrap();
    let f = t.mul(g, u).unwrap();
    let f = mm(&mut t, f, "down");
    let x = t.add(x, f).unwrap();
    let h = t.rms_norm(x, norm, 1e-5).unwrap();
    let h = t.gather_rows(h, rows).unwrap();
    let logits = mm(&mut t, h, "head");
    t.output("logits", logits).unwrap();
    t.finish()
}

fn allocations_per_warm_step(numerics: Numerics) -> usize {
    let rt = CpuRuntime::new(CpuOptions {
        threads: 2,
        numerics,
        ..CpuOptions::default()
    })
    .unwrap();
    rt.configure_kv(KvCacheConfig {
        n_layers: 1,
        n_kv_heads: KV_HEADS as u32,
        head_dim: HD as u32,
        block_size: 64,
        num_blocks: 1,
        windowed_layers: 0,
        windowed_blocks: 0,
    })
    .unwrap();
    let s = store();
    let plan = rt
        .prepare(&graph(s.clone()), s, &CompileLimits::default())
        .unwrap();
    let one = |v: i32| HostTensor::I32 {
        shape: vec![1],
        data: vec![v],
    };
    let step = |p: i32| {
        let inputs = [
            ("ids", one(p % VOCAB as i32)),
            ("pos", one(p)),
            ("slots", one(p)),
            ("seq", one(0)),
            (
                "tables",
                HostTensor::I32 {
                    shape: vec![1, 1],
                    data: vec![0],
                },
            ),
            ("rows", one(0)),
        ];
        let before = ALLOCS.load(Ordering::SeqCst);
        let out = rt.run(plan.as_ref(), &inputs, Deadline::never()).unwrap();
        let used = ALLOCS.load(Ordering::SeqCst) - before;
        assert_eq!(out[0].1.len(), VOCAB);
        used
    };
    // Warm-up: plans' buffers and every thread's kernel scratch reach their sizes. Tasks are
    // claimed dynamically, so a worker may meet a kernel shape late; the median of the
    // measured steps is what a steady decode does.
    for p in 0..20 {
        step(p);
    }
    let mut used: Vec<usize> = (20..31).map(step).collect();
    used.sort_unstable();
    used[used.len() / 2]
}

#[test]
fn warm_decode_steps_allocate_only_their_outputs() {
    for numerics in [Numerics::Ggml, Numerics::Exact] {
        let n = allocations_per_warm_step(numerics);
        // The logits buffer, its shape, its name and the output list.
        assert!(
            n <= 4,
            "{numerics:?}: {n} allocations in a warm decode step"
        );
    }
}
