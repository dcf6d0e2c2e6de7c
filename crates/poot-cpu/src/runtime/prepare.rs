//! Preparing a plan's weights when it compiles: re-lays for the faster kernels, copies of the
//! small weights other ops read, and the release of the stored pages those replace (the
//! invariants are the runtime's, in its module docs).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use poot_graph::Op;
use poot_runtime::{RuntimeError, WeightStore};

use super::{CpuPlan, CpuRuntime, Prepared, RepackCache};
use crate::hugemem::HugeBytes;
use crate::kernels::matmul::experts_stack::LazyStack;
use crate::Isa;

impl CpuRuntime {
    /// For every matmul of `plan` whose stored weight has a faster layout on this CPU, the
    /// re-laid copy (made once per store and tensor, then shared). When there are any, the
    /// small weights other ops read each step are copied too, and the store is told to drop
    /// the stored pages of all of them, so resident memory holds each weight once.
    ///
    /// Why the small copies: the kernel maps a whole page-cache folio (up to megabytes) on a
    /// fault, so reading a 2 KiB norm weight from the map would bring back the released
    /// matmul weights stored beside it. Tied embeddings read their rows from the copy too.
    pub(super) fn prepare_weights(
        &self,
        plan: &mut CpuPlan,
        weights: &Arc<dyn WeightStore>,
    ) -> Result<(), RuntimeError> {
        const SMALL: usize = 1 << 20;
        let g = &plan.graph;
        let key = Arc::as_ptr(weights).cast::<()>() as usize;
        let mut cache = self.repacks.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, (store, _)| store.strong_count() > 0);
        let stored = |name: &String| {
            weights
                .bytes(name)
                .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })
        };
        let pieces = |name: &String| {
            weights
                .pieces(name)
                .ok_or_else(|| RuntimeError::MissingWeight { name: name.clone() })
        };
        let float_copies = crate::hugemem::available();
        let cached = |cache: &RepackCache, name: &String| {
            cache
                .get(&(key, name.clone()))
                .filter(|(store, _)| store.upgrade().is_some_and(|s| Arc::ptr_eq(&s, weights)))
                .map(|(_, rp)| rp.clone())
        };
        let (repacked, copied) = (&mut plan.repacked, &mut plan.copied);
        let mut attach = |w: poot_graph::ValueId, rp: Arc<Prepared>| {
            match &*rp {
                Prepared::Repack(_) | Prepared::Experts(_) => repacked.insert(w.index(), rp),
                Prepared::Copy(_) => copied.insert(w.index(), rp),
            };
        };
        // The matmul weights (and expert stacks) this store has no copy of yet, each value
        // once, in graph order.
        let mut todo: Vec<(poot_graph::ValueId, &String, bool)> = Vec::new();
        for op in &g.equations {
            let (w, experts) = match op {
                Op::MatMul { w, .. } => (w, false),
                Op::MoeMatMul { w, .. } => (w, true),
                _ => continue,
            };
            let Op::Weight { name } = &g.equations[w.index()] else {
                continue;
            };
            if let Some(rp) = cached(&cache, name) {
                attach(*w, rp);
            } else if !todo.iter().any(|(v, _, _)| v == w) {
                todo.push((*w, name, experts));
            }
        }
        let mut total = 0u64;
        for (i, &(_, name, experts)) in todo.iter().enumerate() {
            if !todo[..i].iter().any(|(_, n, _)| *n == name) {
                total += match experts {
                    true => pieces(name)?.iter().map(|p| p.len() as u64).sum(),
                    false => stored(name)?.len() as u64,
                };
            }
        }
        let (done, all) = &self.preparing;
        if total > 0 {
            // `done` first: a reader that sees the new total sees the reset too.
            done.store(0, Ordering::Release);
            all.store(total, Ordering::Release);
        }
        for (w, name, experts) in todo {
            // Another value of the same name, prepared just before.
            if let Some(rp) = cached(&cache, name) {
                attach(w, rp);
                continue;
            }
            let info = g.info(w);
            if experts {
                let stack = pieces(name)?;
                let size: u64 = stack.iter().map(|p| p.len() as u64).sum();
                if let Some(p) = self.relay_experts(&stack, info.dtype, &info.shape)? {
                    // A lazy stack has read nothing yet: each expert's stored pages go as it is
                    // re-laid (`exec/moe.rs`).
                    if matches!(p, Prepared::Repack(_)) {
                        weights.release(name);
                    }
                    let p = Arc::new(p);
                    cache.insert((key, name.clone()), (Arc::downgrade(weights), p.clone()));
                    attach(w, p);
                }
                done.fetch_add(size, Ordering::AcqRel);
                continue;
            }
            let bytes = stored(name)?;
            let rp = crate::kernels::matmul::repack_for_on(
                self.options.numerics,
                Isa::detect(),
                (bytes, info.dtype),
                info.matrix(), // a 1-D weight is one row
                Some(&self.pool),
            )
            .map_err(|e| RuntimeError::Kernel {
                op: "matmul",
                detail: e.to_string(),
            })?;
            let ck = (key, name.clone());
            let prepared = if let Some(rp) = rp {
                // At once as well as below: a store's heap copy (a re-laid GPTQ layer) then
                // never sits beside its re-lay, so loading peaks at one copy, not two.
                weights.release(name);
                Some(Prepared::Repack(rp))
            } else if float_copies && !info.dtype.is_quantized() {
                // A plain float matrix keeps its layout but moves to huge pages (see
                // `hugemem`); its mapped pages go span by span as each is copied, so loading
                // never holds two copies of it, even for the moment of the copy (a tied F16
                // embedding is half of a small int4 model). Counted span by span too: one tied
                // output matrix is a fifth of a 1B model.
                let cp = HugeBytes::copy_of_on_then(bytes, &self.pool, |span| {
                    done.fetch_add(span.len() as u64, Ordering::Relaxed);
                    weights.release_range(name, span);
                });
                weights.release(name);
                Some(Prepared::Copy(cp))
            } else {
                None
            };
            let counted = matches!(prepared, Some(Prepared::Copy(_)));
            if let Some(p) = prepared {
                let p = Arc::new(p);
                cache.insert(ck, (Arc::downgrade(weights), p.clone()));
                attach(w, p);
            }
            if !counted {
                done.fetch_add(bytes.len() as u64, Ordering::AcqRel);
            }
        }
        if plan.repacked.is_empty() && plan.copied.is_empty() {
            return Ok(());
        }
        // What the copies so far replace, and the store's unserved tensors: copying a tensor
        // maps its neighbours' pages too (a page-cache folio per read, measured: 10 MB of file
        // pages after SmolLM2's 61 norm copies), so this runs every `FLUSH` copies as well as
        // at the end, and the pages never pile up. Repeating it for tensors released by an
        // earlier plan is cheap.
        const FLUSH: usize = 8;
        let flush = |plan: &CpuPlan| {
            for i in plan.repacked.keys().chain(plan.copied.keys()) {
                if let Op::Weight { name } = &g.equations[*i] {
                    weights.release(name);
                }
            }
            weights.release_unserved();
        };
        let mut made = 0usize;
        for op in &g.equations {
            for v in op.operands() {
                let Op::Weight { name } = &g.equations[v.index()] else {
                    continue;
                };
                // A re-laid weight is not read again: its store may have released it, and
                // asking a released heap copy for its bytes rebuilds it (`WeightStore::release`).
                if plan.repacked.contains_key(&v.index()) || plan.copied.contains_key(&v.index()) {
                    continue;
                }
                // An expert stack has no contiguous bytes (WeightStore::pieces): it stays
                // where it is mapped. Compiling checked that every weight exists.
                let Some(bytes) = weights.bytes(name) else {
                    continue;
                };
                // A tensor the store holds in its own memory (a GPTQ/AWQ/FP8 re-lay) has no
                // pages to lose: copying it would hold it twice, once more per plan. A copy is
                // made once per store and tensor and shared by later plans, as re-lays are.
                if bytes.len() <= SMALL && weights.mapped(name) {
                    if let Some(p) = cached(&cache, name) {
                        plan.copied.insert(v.index(), p);
                        continue;
                    }
                    let p = Arc::new(Prepared::Copy(HugeBytes::copy_of(bytes)));
                    let entry = (Arc::downgrade(weights), p.clone());
                    cache.insert((key, name.clone()), entry);
                    plan.copied.insert(v.index(), p);
                    made += 1;
                    if made.is_multiple_of(FLUSH) {
                        flush(plan);
                    }
                }
            }
        }
        flush(plan);
        Ok(())
    }

    /// An expert stack `[E, N, K]` (one stored piece, or one per expert) in the 8-row layout
    /// `kernels::matmul::experts` reads, when its dtype has one under this runtime's numerics
    /// and `N` is whole 8-row groups (so no group mixes two experts); `None` keeps the stored
    /// path. Where each expert re-lays to the same kind (every such dtype but Q4_Z), nothing
    /// is read here: the stack is re-laid expert by expert when a step first selects each
    /// (`kernels::matmul::experts_stack`), so loading does not read every expert. A Q4_Z stack
    /// (GPTQ/AWQ) is re-laid whole now, its pieces joined first (a transient copy of one stack;
    /// a GGUF stack is one piece and is read where it is).
    fn relay_experts(
        &self,
        stack: &[&[u8]],
        dtype: crate::DType,
        shape: &[usize],
    ) -> Result<Option<Prepared>, RuntimeError> {
        let &[e, n, k] = shape else {
            return Ok(None);
        };
        let numerics = self.options.numerics;
        if !n.is_multiple_of(8) || !crate::kernels::matmul::relaid(numerics, dtype) {
            return Ok(None);
        }
        let kerr = |err: crate::KernelError| RuntimeError::Kernel {
            op: "moe_matmul",
            detail: err.to_string(),
        };
        let lazy = LazyStack::new(numerics, Isa::detect(), dtype, (e, n, k)).map_err(kerr)?;
        if let Some(lazy) = lazy {
            let per = dtype.bytes_for((n * k) as u64).unwrap_or(0) as usize;
            let whole = matches!(stack, [one] if one.len() == e * per);
            let each = stack.len() == e && stack.iter().all(|p| p.len() == per);
            if !(whole || each) {
                let total: usize = stack.iter().map(|p| p.len()).sum();
                return Err(RuntimeError::Kernel {
                    op: "moe_matmul",
                    detail: format!(
                        "{total} bytes in {} pieces for {e} experts of {per}",
                        stack.len()
                    ),
                });
            }
            return Ok(Some(Prepared::Experts(lazy)));
        }
        let joined: Vec<u8>;
        let bytes = match stack {
            [one] => *one,
            _ => {
                joined = stack.concat();
                &joined
            }
        };
        let rp = crate::kernels::matmul::repack_for_on(
            numerics,
            Isa::detect(),
            (bytes, dtype),
            (e * n, k),
            Some(&self.pool),
        )
        .map_err(kerr)?;
        Ok(rp.map(Prepared::Repack))
    }
}
