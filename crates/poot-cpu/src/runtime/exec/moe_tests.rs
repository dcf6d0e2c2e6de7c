//! `moe_matmul` over a re-laid expert stack through the runtime: compiling re-lays the stack
//! (stored whole, or one piece per expert) and releases its stored bytes, and each (token, slot) output is bit-identical to the dense
//! matmul of its expert's rows (which the runtime re-lays as well).

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
        assert!(
            store.released.lock().unwrap().iter().any(|n| n == "exps"),
            "{dt} split {split}: the stored stack is released once re-laid"
        );
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
