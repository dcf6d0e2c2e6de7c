//! `moe_matmul` through the runtime. A stack of a re-laid dtype (stored whole, or one piece per
//! expert) is re-laid expert by expert as steps first select each, each expert's stored bytes
//! released once re-laid, and each (token, slot) output is bit-identical to the dense matmul of
//! its expert's rows (which the runtime re-lays as well). For every dtype the matmuls read, under
//! both numerics, each output is within the stated bound of the float64 product of the exactly
//! dequantized expert rows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, Runtime, WeightStore};

use crate::kernels::Numerics;
use crate::runtime::{CpuOptions, CpuRuntime};
use crate::testutil::{synthetic_weights, Rng};

const E: usize = 4;
const N: usize = 16;
const K: usize = 256;

/// The stack `exps` [E, N, K] and each expert's rows again as `e{i}` [N, K]; records releases.
/// With `split`, the stack exists only as one piece per expert (a safetensors checkpoint's
/// experts, `WeightStore::pieces`).
struct Store {
    tensors: HashMap<String, (DType, Vec<usize>, Vec<u8>)>,
    released: Mutex<Vec<String>>,
    ranges: Mutex<Vec<std::ops::Range<usize>>>,
    split: bool,
}

impl WeightCatalog for Store {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.tensors.get(name).map(|(d, s, _)| (*d, s.clone()))
    }
}

impl WeightStore for Store {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        if self.split && name == "exps" {
            return None;
        }
        self.tensors.get(name).map(|(_, _, b)| b.as_slice())
    }
    fn pieces(&self, name: &str) -> Option<Vec<&[u8]>> {
        if self.split && name == "exps" {
            let (_, _, b) = self.tensors.get(name)?;
            return Some(b.chunks(b.len() / E).collect());
        }
        self.bytes(name).map(|b| vec![b])
    }
    fn total_bytes(&self) -> u64 {
        self.tensors.values().map(|(_, _, b)| b.len() as u64).sum()
    }
    fn release(&self, name: &str) {
        self.released.lock().unwrap().push(name.to_string());
    }
    fn release_range(&self, name: &str, range: std::ops::Range<usize>) {
        if name == "exps" {
            self.ranges.lock().unwrap().push(range);
        }
    }
}

fn store(dt: DType, split: bool) -> Arc<Store> {
    let w = synthetic_weights(dt, E * N, K, 5);
    let per = w.len() / E;
    let mut tensors = HashMap::new();
    for e in 0..E {
        let rows = w[e * per..(e + 1) * per].to_vec();
        tensors.insert(format!("e{e}"), (dt, vec![N, K], rows));
    }
    tensors.insert("exps".to_string(), (dt, vec![E, N, K], w));
    Arc::new(Store {
        tensors,
        released: Mutex::new(Vec::new()),
        ranges: Mutex::new(Vec::new()),
        split,
    })
}

#[test]
fn a_relaid_stack_matches_the_dense_relaid_matmul_of_each_expert() {
    let cases = [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K].map(|dt| (dt, false));
    for (dt, split) in cases
        .into_iter()
        .chain([(DType::Q4_0, true), (DType::Q4_K, true)])
    {
        let store = store(dt, split);
        let cat: Arc<dyn WeightCatalog> = store.clone();
        let mut t = Tracer::new(TraceLimits::default(), 2, cat).unwrap();
        let x = t.input("x", DType::F32, vec![3, K]).unwrap();
        let ids = t.input("ids", DType::I32, vec![3, 2]).unwrap();
        let stack = t.weight("exps").unwrap();
        let y = t.moe_matmul(x, stack, ids).unwrap();
        t.output("y", y).unwrap();
        for e in 0..E {
            let w = t.weight(&format!("e{e}")).unwrap();
            let d = t.matmul(x, w).unwrap();
            t.output(&format!("d{e}"), d).unwrap();
        }
        let graph = t.finish();
        let rt = CpuRuntime::new(CpuOptions {
            threads: 2,
            numerics: Numerics::Ggml,
            ..CpuOptions::default()
        })
        .unwrap();
        let plan = rt
            .prepare(&graph, store.clone(), &CompileLimits::default())
            .unwrap();
        // Nothing is re-laid before a step selects it.
        assert_eq!(rt.memory().weight_bytes, dense_bytes(&store), "{dt}");
        let xs = Rng::new(2).vec(3 * K, -2.0, 2.0);
        let idv = vec![3, 1, 1, 1, 0, 3];
        let inputs = [
            (
                "x",
                HostTensor::F32 {
                    shape: vec![3, K],
                    data: xs,
                },
            ),
            (
                "ids",
                HostTensor::I32 {
                    shape: vec![3, 2],
                    data: idv.clone(),
                },
            ),
        ];
        let out: HashMap<String, Vec<f32>> = rt
            .run(plan.as_ref(), &inputs, Deadline::never())
            .unwrap()
            .into_iter()
            .map(|(name, t)| match t {
                HostTensor::F32 { data, .. } => (name, data),
                _ => panic!("f32 outputs"),
            })
            .collect();
        // Experts 0, 1 and 3 were re-laid by the step, and their stored bytes released; expert 2
        // was not read.
        let per = store.tensors["exps"].2.len() / E;
        let mut ranges = store.ranges.lock().unwrap().clone();
        ranges.sort_by_key(|r| r.start);
        assert_eq!(
            ranges,
            [0, 1, 3].map(|e| e * per..(e + 1) * per),
            "{dt} split {split}"
        );
        assert_eq!(
            rt.memory().weight_bytes,
            dense_bytes(&store) + 3 * per_relaid(dt),
            "{dt}"
        );
        for (s, &e) in idv.iter().enumerate() {
            let got: Vec<u32> = out["y"][s * N..(s + 1) * N]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let dense = &out[&format!("d{e}")][(s / 2) * N..(s / 2 + 1) * N];
            let want: Vec<u32> = dense.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{dt} split {split} pair {s}");
        }
    }
}

/// Bytes of the dense experts `e{i}` re-laid (the test graph's dense matmuls), for `rt`'s ISA.
fn dense_bytes(store: &Store) -> u64 {
    let (dt, _, w) = &store.tensors["e0"];
    E as u64 * per_relaid_of(*dt, w) as u64
}

fn per_relaid_of(dt: DType, w: &[u8]) -> usize {
    crate::kernels::matmul::repack_for(Numerics::Ggml, crate::Isa::detect(), w, dt, N, K)
        .unwrap()
        .unwrap()
        .bytes()
}

/// Bytes one expert's re-lay holds.
fn per_relaid(dt: DType) -> u64 {
    per_relaid_of(dt, &synthetic_weights(dt, N, K, 1)) as u64
}

#[test]
fn every_dtype_matches_the_float64_product_of_its_dequantized_experts() {
    use crate::kernels::matmul::MATMUL_DTYPES;
    let xs = Rng::new(6).vec(3 * K, -2.0, 2.0);
    let idv = vec![3, 1, 1, 2, 0, 3];
    for numerics in [Numerics::Exact, Numerics::Ggml] {
        for dt in MATMUL_DTYPES {
            let store = store(dt, false);
            let cat: Arc<dyn WeightCatalog> = store.clone();
            let mut t = Tracer::new(TraceLimits::default(), 2, cat).unwrap();
            let x = t.input("x", DType::F32, vec![3, K]).unwrap();
            let ids = t.input("ids", DType::I32, vec![3, 2]).unwrap();
            let stack = t.weight("exps").unwrap();
            let y = t.moe_matmul(x, stack, ids).unwrap();
            t.output("y", y).unwrap();
            let rt = CpuRuntime::new(CpuOptions {
                threads: 2,
                numerics,
                ..CpuOptions::default()
            })
            .unwrap();
            let plan = rt
                .prepare(&t.finish(), store.clone(), &CompileLimits::default())
                .unwrap();
            let inputs = [
                (
                    "x",
                    HostTensor::F32 {
                        shape: vec![3, K],
                        data: xs.clone(),
                    },
                ),
                (
                    "ids",
                    HostTensor::I32 {
                        shape: vec![3, 2],
                        data: idv.clone(),
                    },
                ),
            ];
            let out = rt.run(plan.as_ref(), &inputs, Deadline::never()).unwrap();
            let Some((_, HostTensor::F32 { data: y, .. })) = out.into_iter().next() else {
                panic!("one f32 output")
            };
            let w = crate::testutil::reference(dt, &store.tensors["exps"].2, E * N * K);
            for (s, &e) in idv.iter().enumerate() {
                let row = &xs[(s / 2) * K..(s / 2 + 1) * K];
                for n in 0..N {
                    let wr = &w[(e as usize * N + n) * K..][..K];
                    let want: f64 = row.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = row
                        .iter()
                        .zip(wr)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    // Exact: f32 sums of exact products. Ggml adds the activation's rounding: to
                    // Q8 blocks (at most 1/254 of the 256-value block's largest |x|, plus the
                    // f16 scale's 2^-11 relative) for the integer dots, to bf16 (2^-9) or f16
                    // for the float ones.
                    let mut tol = (K as f64 / 8.0 + 16.0) * 2f64.powi(-24) * mag;
                    if numerics == Numerics::Ggml {
                        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                        let wsum: f64 = wr.iter().map(|&b| (b as f64).abs()).sum();
                        tol += wsum * amax / 254.0 + 2f64.powi(-8) * mag;
                    }
                    let got = y[s * N + n] as f64;
                    assert!(
                        (got - want).abs() <= tol,
                        "{dt} {numerics:?} pair {s} row {n}: {got} vs {want} (bound {tol})"
                    );
                }
            }
        }
    }
}
