//! The mixture-of-experts ops: `gather_cols`, `moe_matmul` and `moe_combine`.
//!
//! `moe_matmul` multiplies each (token, slot) pair by its expert's rows of an [E, N, K] stack.
//! Where the stack has an 8-row layout (the dtypes the dense matmuls re-lay, under ggml numerics,
//! `N` a multiple of 8), one pool dispatch covers every (selected expert, row group) unit and the
//! activation is quantized once per row (`kernels::matmul::experts`). Such a stack is re-laid
//! expert by expert: a step first re-lays the experts it selects that no earlier step did (spread
//! over the pool's threads, each once however many plans or threads ask) and releases each one's
//! stored bytes (`WeightStore::release_range`, in the experts' bytes one after another), so
//! loading reads no expert and resident memory holds each expert once; a Q4_Z stack (GPTQ/AWQ),
//! whose experts may re-lay to different kinds, was re-laid whole when the plan compiled.
//! Otherwise the stack is read in place (packed, any dtype the
//! matmul kernels read): expert `e` is the contiguous byte range
//! `e * N * row_bytes .. (e + 1) * N * row_bytes` of a GGUF's packed tensor, or the e-th of the store's `pieces` (a
//! safetensors checkpoint's experts stored one tensor each, read where they are mapped), and the
//! pairs grouped by expert go through the ordinary matmul path for its dtype and the plan's
//! numerics, one call per selected expert. Either way each selected expert's rows are streamed
//! once per step, and experts no token chose are never read. Every id is checked against `E`
//! before anything is computed (a typed error otherwise). Results do not depend on how the
//! step's tokens are grouped: both paths give each row the same bits whatever the row count
//! (batch-invariant numerics), and the re-laid path gives the bits of the dense re-laid matmul
//! on the expert's rows.

use poot_graph::{Op, ValueId};
use poot_runtime::RuntimeError;

use super::{kerr, Buf, Exec};
use crate::kernels::matmul::experts::{matmul_experts, Stack};
use crate::kernels::matmul::experts_stack::LazyStack;
use crate::kernels::matmul::{matmul_on_path, MatmulPath};
use crate::kernels::simd::Isa;

fn bad(op: &'static str, detail: String) -> RuntimeError {
    RuntimeError::Kernel { op, detail }
}

impl Exec<'_> {
    pub(super) fn gather_cols(&mut self, x: ValueId, ids: ValueId) -> Result<Buf, RuntimeError> {
        let e = self.shape(x)[1];
        let (t, k) = (self.shape(x)[0], self.shape(ids)[1]);
        let xv = self.f32(x, "gather_cols")?;
        // A stored permutation (an act-order layer's `input_perm`) is read from its bytes.
        let stored: Vec<i32>;
        let iv: &[i32] = if matches!(self.graph().op(ids), Op::Weight { .. }) {
            let (bytes, _) = self.weight(ids, "gather_cols")?;
            stored = bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            &stored
        } else {
            self.i32(ids, "gather_cols")?
        };
        // One row of ids applies to every row of x.
        let per_row = iv.len() != k;
        let mut out = Vec::with_capacity(t * k);
        for r in 0..t {
            let row = if per_row { &iv[r * k..(r + 1) * k] } else { iv };
            for &id in row {
                if id < 0 || id as usize >= e {
                    return Err(bad("gather_cols", format!("id {id} outside 0..{e}")));
                }
                out.push(xv[r * e + id as usize]);
            }
        }
        Ok(Buf::F32(out))
    }

    pub(super) fn moe_matmul(
        &mut self,
        x: ValueId,
        w: ValueId,
        ids: ValueId,
    ) -> Result<Buf, RuntimeError> {
        const OP: &str = "moe_matmul";
        if let Some(rp) = self.plan.repack(w.index()) {
            return self.moe_matmul_relaid(x, w, ids, Stack::Whole(rp));
        }
        if let Some(lazy) = self.plan.experts(w.index()) {
            self.relay_selected(w, ids, lazy)?;
            return self.moe_matmul_relaid(x, w, ids, Stack::Lazy(lazy));
        }
        let (pieces, dtype) = self.weight_pieces(w, OP)?;
        let ws = self.shape(w);
        let (n_exp, n, k) = (ws[0], ws[1], ws[2]);
        let (t, slots) = (self.shape(ids)[0], self.shape(ids)[1]);
        let x_rows = self.shape(x)[0];
        let per_expert = dtype
            .bytes_for((n * k) as u64)
            .ok_or_else(|| bad(OP, format!("{n}x{k} is not whole blocks of {dtype}")))?
            as usize;
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let whole = pieces.len() == 1 && total == per_expert * n_exp;
        let each = pieces.len() == n_exp && pieces.iter().all(|p| p.len() == per_expert);
        if !(whole || each) {
            return Err(bad(
                OP,
                format!(
                    "{total} bytes in {} pieces for {n_exp} experts of {per_expert}",
                    pieces.len()
                ),
            ));
        }
        let iv = self.i32(ids, OP)?.to_vec();
        if let Some(&id) = iv.iter().find(|&&id| id < 0 || id as usize >= n_exp) {
            return Err(bad(OP, format!("expert id {id} outside 0..{n_exp}")));
        }
        let xv = self.f32(x, OP)?.to_vec();
        let shared = x_rows == t;
        let numerics = self.plan.numerics;
        let path = MatmulPath::choose(numerics, dtype);
        let mut out = self.arena.zeros(t * slots * n);
        let (mut xs, mut ys, mut members) = (Vec::new(), Vec::new(), Vec::new());
        for e in 0..n_exp {
            members.clear();
            members.extend((0..iv.len()).filter(|&s| iv[s] as usize == e));
            if members.is_empty() {
                continue;
            }
            xs.clear();
            for &s in &members {
                let r = if shared { s / slots } else { s };
                xs.extend_from_slice(&xv[r * k..(r + 1) * k]);
            }
            ys.clear();
            ys.resize(members.len() * n, 0.0);
            let we = if whole {
                &pieces[0][e * per_expert..(e + 1) * per_expert]
            } else {
                pieces[e]
            };
            let pool = self.pool;
            matmul_on_path(
                path,
                numerics,
                Isa::detect(),
                &xs,
                members.len(),
                k,
                we,
                dtype,
                n,
                &mut ys,
                pool,
                None,
            )
            .map_err(kerr(OP))?;
            for (j, &s) in members.iter().enumerate() {
                out[s * n..(s + 1) * n].copy_from_slice(&ys[j * n..(j + 1) * n]);
            }
        }
        Ok(Buf::F32(out))
    }

    /// Re-lays the experts of `lazy` that `ids` selects and no earlier step did, from the
    /// stored stack, then releases each one's stored pages (`kernels::matmul::experts_stack`).
    /// Checks every id first; a step whose experts are all ready reads nothing stored.
    fn relay_selected(
        &mut self,
        w: ValueId,
        ids: ValueId,
        lazy: &LazyStack,
    ) -> Result<(), RuntimeError> {
        const OP: &str = "moe_matmul";
        let (n_exp, n, k) = lazy.shape();
        let iv = self.i32(ids, OP)?;
        if let Some(&id) = iv.iter().find(|&&id| id < 0 || id as usize >= n_exp) {
            return Err(bad(OP, format!("expert id {id} outside 0..{n_exp}")));
        }
        if iv.iter().all(|&id| lazy.is_ready(id as usize)) {
            return Ok(());
        }
        let iv = iv.to_vec();
        let (pieces, dtype) = self.weight_pieces(w, OP)?;
        let Op::Weight { name } = self.graph().op(w) else {
            unreachable!("weight_pieces checked it")
        };
        let per = dtype.bytes_for((n * k) as u64).unwrap_or(0) as usize;
        // Compiling checked the pieces: one of every expert, or one each.
        let stored = |e: usize| match pieces.as_slice() {
            [one] => &one[e * per..(e + 1) * per],
            each => each[e],
        };
        let store = &self.plan.weights;
        let release = |e: usize| store.release_range(name, e * per..(e + 1) * per);
        lazy.ensure(&iv, &stored, self.pool, &release)
            .map_err(kerr(OP))
    }

    /// [`Self::moe_matmul`] through the stack's 8-row re-lay (`kernels::matmul::experts`): one
    /// pool dispatch, the activation quantized once (shared with the other stacks reading it).
    fn moe_matmul_relaid(
        &mut self,
        x: ValueId,
        w: ValueId,
        ids: ValueId,
        stack: Stack<'_>,
    ) -> Result<Buf, RuntimeError> {
        const OP: &str = "moe_matmul";
        let (n_exp, n, k) = (self.shape(w)[0], self.shape(w)[1], self.shape(w)[2]);
        let slots = self.shape(ids)[1];
        self.i32(ids, OP)?;
        self.f32(x, OP)?;
        let (Buf::I32(iv), Buf::F32(xv)) = (&self.bufs[ids.index()], &self.bufs[x.index()]) else {
            unreachable!("checked just above")
        };
        let mut out = self.arena.zeros(iv.len() * n);
        let key = (self.arena.run << 32) | x.index() as u64;
        let cache = Some((&mut self.arena.act, key));
        let pool = self.pool;
        matmul_experts(
            Isa::detect(),
            xv,
            k,
            stack,
            n_exp,
            (iv, slots),
            &mut out,
            pool,
            cache,
        )
        .map_err(kerr(OP))?;
        Ok(Buf::F32(out))
    }

    pub(super) fn moe_combine(
        &mut self,
        y: ValueId,
        weights: ValueId,
    ) -> Result<Buf, RuntimeError> {
        let d = self.shape(y)[1];
        let (t, k) = (self.shape(weights)[0], self.shape(weights)[1]);
        let yv = self.f32(y, "moe_combine")?;
        let wv = self.f32(weights, "moe_combine")?;
        let mut out = vec![0.0f32; t * d];
        for (r, o) in out.chunks_mut(d.max(1)).enumerate() {
            for j in 0..k {
                let wgt = wv[r * k + j];
                let row = &yv[(r * k + j) * d..(r * k + j + 1) * d];
                for (a, &b) in o.iter_mut().zip(row) {
                    *a += wgt * b;
                }
            }
        }
        Ok(Buf::F32(out))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use poot_core::{DType, Deadline};
    use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
    use poot_runtime::{HostTensor, Runtime, RuntimeError, WeightStore};

    use crate::runtime::{CpuOptions, CpuRuntime};

    /// One f32 weight `w` [E=3, N=2, K=3]: expert `e`, row `n`, column `k` holds
    /// `100 e + 10 n + k`.
    struct Store(Vec<u8>);

    impl WeightCatalog for Store {
        fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
            (name == "w").then(|| (DType::F32, vec![3, 2, 3]))
        }
    }

    impl WeightStore for Store {
        fn bytes(&self, name: &str) -> Option<&[u8]> {
            (name == "w").then_some(self.0.as_slice())
        }
        fn total_bytes(&self) -> u64 {
            self.0.len() as u64
        }
    }

    fn w(e: usize, n: usize, k: usize) -> f32 {
        (100 * e + 10 * n + k) as f32
    }

    fn run(ids: Vec<i32>) -> Result<HashMap<String, Vec<f32>>, RuntimeError> {
        let bytes = (0..3)
            .flat_map(|e| (0..2).flat_map(move |n| (0..3).map(move |k| w(e, n, k))))
            .flat_map(f32::to_le_bytes)
            .collect();
        let store = Arc::new(Store(bytes));
        let cat: Arc<dyn WeightCatalog> = store.clone();
        let mut t = Tracer::new(TraceLimits::default(), 2, cat).unwrap();
        let x = t.input("x", DType::F32, vec![2, 3]).unwrap();
        let logits = t.input("logits", DType::F32, vec![2, 3]).unwrap();
        let idv = t.input("ids", DType::I32, vec![2, 2]).unwrap();
        let wv = t.weight("w").unwrap();
        let y = t.moe_matmul(x, wv, idv).unwrap();
        let g = t.gather_cols(logits, idv).unwrap();
        let c = t.moe_combine(y, g).unwrap();
        for (name, v) in [("y", y), ("g", g), ("c", c)] {
            t.output(name, v).unwrap();
        }
        let graph = t.finish();
        let rt = CpuRuntime::new(CpuOptions {
            threads: 1,
            ..CpuOptions::default()
        })
        .unwrap();
        let plan = rt.prepare(&graph, store, &CompileLimits::default())?;
        let f = |shape: Vec<usize>, data: Vec<f32>| HostTensor::F32 { shape, data };
        let inputs = [
            ("x", f(vec![2, 3], vec![1., 0., 2., 0., 1., -1.])),
            ("logits", f(vec![2, 3], vec![0.5, 1.5, 2.5, -1., 0., 1.])),
            (
                "ids",
                HostTensor::I32 {
                    shape: vec![2, 2],
                    data: ids,
                },
            ),
        ];
        let out = rt.run(plan.as_ref(), &inputs, Deadline::never())?;
        Ok(out
            .into_iter()
            .map(|(name, t)| match t {
                HostTensor::F32 { data, .. } => (name, data),
                _ => panic!("f32 outputs"),
            })
            .collect())
    }

    #[test]
    fn each_slot_reads_its_expert_and_the_combination_is_weighted() {
        let ids = vec![2, 0, 1, 2];
        let out = run(ids.clone()).unwrap();
        let x = [[1f32, 0., 2.], [0., 1., -1.]];
        let mut want_y = Vec::new();
        for (s, &e) in ids.iter().enumerate() {
            for n in 0..2 {
                let row = &x[s / 2];
                want_y.push((0..3).map(|k| row[k] * w(e as usize, n, k)).sum::<f32>());
            }
        }
        assert_eq!(out["y"], want_y);
        assert_eq!(out["g"], vec![2.5, 0.5, 0.0, 1.0]);
        let want_c: Vec<f32> = (0..2)
            .flat_map(|t| {
                let (g, y) = (&out["g"], &want_y);
                (0..2).map(move |n| g[2 * t] * y[4 * t + n] + g[2 * t + 1] * y[4 * t + 2 + n])
            })
            .collect();
        assert_eq!(out["c"], want_c);
    }

    #[test]
    fn an_expert_id_out_of_range_is_a_typed_error() {
        let err = run(vec![0, 3, 1, 2]).unwrap_err();
        assert!(
            matches!(&err, RuntimeError::Kernel { op: "moe_matmul", detail } if detail.contains("expert id 3")),
            "{err:?}"
        );
    }
}

#[cfg(test)]
#[path = "moe_tests.rs"]
mod relaid_tests;
