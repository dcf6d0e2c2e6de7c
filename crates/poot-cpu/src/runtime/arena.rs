//! The executor's reusable state: activation buffers parked between runs ([`Arena`]) and the
//! quantized-activation cache, so a warm decode step allocates only what it returns.
//!
//! Invariants: a parked buffer is empty when handed out (`f32s`/`i32s`), zero-filled
//! (`zeros`), or holds stale values only for a kernel that overwrites every one
//! (`overwritten`); at most `KEEP` buffers per element type are parked and none over
//! `MAX_BYTES`, so idle memory is bounded and a long prefill's buffers go back to the
//! allocator; handing out picks the smallest buffer that fits (`overwritten`: the one already
//! holding the fewest values, at least as many as asked, when there is one), so a repeated
//! plan meets the buffers it had.

use poot_graph::{Op, ValueId};

use crate::kernels::act_cache::ActCache;

/// One value's storage in a run.
#[derive(Debug)]
pub(super) enum Buf {
    Empty,
    Weight,
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// Activation buffers kept between runs (see the module docs). At most `KEEP` per element type
/// are parked, none over `MAX_BYTES`, so what a long prefill needed goes back to the allocator.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    f32s: Vec<Vec<f32>>,
    i32s: Vec<Vec<i32>>,
    pub(super) bufs: Vec<Buf>,
    /// Quantized matmul inputs, keyed by run and value (`run << 32 | value`).
    pub(super) act: ActCache,
    /// Rope angles of one run's positions under one table: `(run, positions value, table)`
    /// and the `(cos, sin)` pairs (`kernels::rope_angles`), shared by the run's rope ops.
    pub(super) rope_key: Option<(u64, usize, usize)>,
    pub(super) rope_angles: Vec<(f32, f32)>,
    pub(super) run: u64,
}

impl Arena {
    const KEEP: usize = 64;
    const MAX_BYTES: usize = 8 << 20;

    pub(super) fn give(&mut self, b: Buf) {
        match b {
            Buf::F32(v) if v.capacity() * 4 <= Self::MAX_BYTES && self.f32s.len() < Self::KEEP => {
                self.f32s.push(v);
            }
            Buf::I32(v) if v.capacity() * 4 <= Self::MAX_BYTES && self.i32s.len() < Self::KEEP => {
                self.i32s.push(v);
            }
            _ => {}
        }
    }

    /// An empty f32 buffer (reserved for `cap` values).
    pub(super) fn f32s(&mut self, cap: usize) -> Vec<f32> {
        best_fit(&mut self.f32s, cap)
    }

    /// An empty i32 buffer (reserved for `cap` values).
    pub(super) fn i32s(&mut self, cap: usize) -> Vec<i32> {
        best_fit(&mut self.i32s, cap)
    }

    /// `n` zeros.
    pub(super) fn zeros(&mut self, n: usize) -> Vec<f32> {
        let mut v = self.f32s(n);
        v.resize(n, 0.0);
        v
    }

    /// `n` values for a kernel that writes every one of them: a parked buffer keeps what its
    /// last run left (only a part it never held is zeroed), so a warm step does not clear
    /// its matmul outputs (about 1.4 MB a SmolLM2 decode step) before overwriting them.
    ///
    /// A buffer already holding `n` values is preferred, the one holding fewest: a decode
    /// step's buffers all have the prefill's capacity, so the fit by capacity alone let a
    /// 192-value output take a buffer a 1536-value one had left, which the next such output
    /// then zeroed again.
    pub(super) fn overwritten(&mut self, n: usize) -> Vec<f32> {
        let filled = self
            .f32s
            .iter()
            .enumerate()
            .filter(|(_, v)| v.len() >= n)
            .min_by_key(|(_, v)| (v.len(), v.capacity()))
            .map(|(i, _)| i);
        let mut v = match filled {
            Some(i) => self.f32s.swap_remove(i),
            None => take_fit(&mut self.f32s, n),
        };
        v.truncate(n);
        v.resize(n, 0.0);
        v
    }

    /// Bytes parked here (reported as the runtime's scratch memory).
    pub(crate) fn parked_bytes(&self) -> u64 {
        let f: usize = self.f32s.iter().map(|v| v.capacity() * 4).sum();
        let i: usize = self.i32s.iter().map(|v| v.capacity() * 4).sum();
        (f + i) as u64
    }
}

/// The smallest parked buffer that holds `cap` values (so a run's requests find the buffers
/// they had last run and nothing grows), else the largest one grown; emptied.
fn best_fit<T>(parked: &mut Vec<Vec<T>>, cap: usize) -> Vec<T> {
    let mut v = take_fit(parked, cap);
    v.clear();
    v
}

/// [`best_fit`]'s buffer as it was parked (its values kept), room for `cap` reserved.
fn take_fit<T>(parked: &mut Vec<Vec<T>>, cap: usize) -> Vec<T> {
    let fit = parked
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= cap)
        .min_by_key(|(_, v)| v.capacity())
        .or_else(|| parked.iter().enumerate().max_by_key(|(_, v)| v.capacity()))
        .map(|(i, _)| i);
    let mut v = fit.map(|i| parked.swap_remove(i)).unwrap_or_default();
    v.reserve(cap.saturating_sub(v.len()));
    v
}

/// Calls `f` on every operand of `op` (`Op::operands` without its allocation).
pub(super) fn for_each_operand(op: &Op, mut f: impl FnMut(ValueId)) {
    match op {
        Op::Input { .. } | Op::Weight { .. } | Op::Literal { .. } => {}
        Op::Embedding { table, ids } => [*table, *ids].into_iter().for_each(f),
        Op::RmsNorm { x, weight, .. } => [*x, *weight].into_iter().for_each(f),
        Op::MatMul { x, w } => [*x, *w].into_iter().for_each(f),
        Op::Add { a, b } | Op::Mul { a, b } => [*a, *b].into_iter().for_each(f),
        Op::Silu { x } | Op::Gelu { x } | Op::Softmax { x } | Op::Softcap { x, .. } => f(*x),
        Op::Rope { x, positions, .. } => [*x, *positions].into_iter().for_each(f),
        Op::PagedAttention { q, k, v, meta, .. } => [
            *q,
            *k,
            *v,
            meta.slot_mapping,
            meta.token_seq,
            meta.positions,
            meta.block_tables,
        ]
        .into_iter()
        .for_each(f),
        Op::Reshape { x, .. } | Op::Slice { x, .. } => f(*x),
        Op::Concat { xs, .. } => xs.iter().copied().for_each(f),
        Op::GatherRows { x, rows } => [*x, *rows].into_iter().for_each(f),
        Op::GatherCols { x, ids } => [*x, *ids].into_iter().for_each(f),
        Op::MoeMatMul { x, w, ids } => [*x, *w, *ids].into_iter().for_each(f),
        Op::MoeCombine { y, weights } => [*y, *weights].into_iter().for_each(f),
        Op::Unary { x, .. }
        | Op::Scalar { x, .. }
        | Op::Permute { x, .. }
        | Op::Reduce { x, .. }
        | Op::CausalMask { x } => f(*x),
        Op::Binary { a, b, .. } | Op::BatchMatMul { a, b } => [*a, *b].into_iter().for_each(f),
        Op::LayerNorm {
            x, weight, bias, ..
        } => std::iter::once(*x).chain(*weight).chain(*bias).for_each(f),
        // Anything else (new ops): the graph's own list.
        _ => op.operands().into_iter().for_each(f),
    }
}

#[cfg(test)]
mod tests {
    use super::{Arena, Buf};

    /// `overwritten` hands a parked buffer back at the asked length without clearing it, and
    /// zeroes only what the buffer never held; `zeros` and `f32s` still clear.
    #[test]
    fn overwritten_keeps_parked_values_and_zeroes_only_new_ones() {
        let mut arena = Arena::default();
        arena.give(Buf::F32(vec![7.0; 8]));
        let v = arena.overwritten(5);
        assert_eq!(v, [7.0; 5]);
        arena.give(Buf::F32(v));
        let v = arena.overwritten(12);
        assert_eq!(&v[..5], &[7.0; 5]);
        assert_eq!(&v[5..], &[0.0; 7]);
        arena.give(Buf::F32(v));
        assert_eq!(arena.zeros(3), [0.0; 3]);
        // A buffer holding enough values goes before one left short, and the one holding
        // fewest goes first: buffers keep the lengths their outputs use.
        let mut arena = Arena::default();
        let mut short = Vec::with_capacity(64);
        short.push(1.0);
        arena.give(Buf::F32(short));
        arena.give(Buf::F32(vec![3.0; 32]));
        arena.give(Buf::F32(vec![2.0; 16]));
        assert_eq!(arena.overwritten(10), [2.0; 10]);
        assert_eq!(arena.overwritten(20), [3.0; 20]);
        arena.give(Buf::F32(vec![1.0; 4]));
        assert!(arena.f32s(4).is_empty());
    }
}
