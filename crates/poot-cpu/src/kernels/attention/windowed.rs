//! Attention of a layer with a sliding window or a score soft-cap (Mistral, Gemma 2 and 3),
//! after the KV write and validation in `attention/mod.rs`.
//!
//! Token `t` at position `p` attends to positions `lo ..= p`, `lo = p + 1 - window` when
//! `window > 0` and `p + 1 > window`, else `0`; positions below `lo` are never read (their
//! blocks stay in the pool: the window is a mask over the block table, not a ring buffer).
//!
//! Arithmetic: each (token, head) runs the per-head path of the numerics it is under over the
//! positions `lo..=p` only: [`Numerics::Exact`]'s `exact::head` (a window that starts at 0 gives
//! the unwindowed bits), [`Numerics::Ggml`]'s `ggml_heads::head` (llama.cpp masks cells outside the
//! window to `-inf`, which contribute exact zeros, so skipping them keeps its values). A
//! soft-capped layer (`softcap > 0`) takes `exact::head` under both numerics: each score `s`
//! becomes `softcap * tanh(s / softcap)` before the softmax, as llama.cpp's Gemma 2 graph does
//! with `ggml_tanh` (within a few ulp of it; the model tests state the bound).
//!
//! A token's result depends only on its own query, its position and its sequence's cache
//! (batch invariance holds as on the unwindowed paths). Cost: O(min(p + 1, window)) per
//! (token, head), parallel over (token, head) pairs.

use crate::kernels::attention::kv::{kv_row_of, AttentionInputs, AttentionShape, KvElem};
use crate::kernels::ggml::Numerics;
use crate::kernels::scratch::{AttnGuard, Scratch};
use crate::kernels::simd::Isa;
use crate::pool::ThreadPool;

/// Which positions a layer reads and how its scores are shaped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionMask {
    /// `0`: every position `0..=p`; `w > 0`: the last `w` positions `p + 1 - w ..= p`.
    pub window: usize,
    /// `0`: none; `c > 0`: scores become `c * tanh(s / c)`.
    pub softcap: f32,
}

impl AttentionMask {
    /// True when the mask changes nothing (the unwindowed, uncapped kernels apply).
    pub fn is_none(&self) -> bool {
        self.window == 0 && self.softcap == 0.0
    }

    /// The first position a token at `pos` reads.
    pub fn first(&self, pos: usize) -> usize {
        if self.window > 0 {
            (pos + 1).saturating_sub(self.window)
        } else {
            0
        }
    }
}

/// Every token's windowed / capped attention into `out` (`[t, n_heads, head_dim]`).
pub(crate) fn attend<T: KvElem>(
    numerics: Numerics,
    mask: AttentionMask,
    s: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    (k_cache, v_cache): (&[T], &[T]),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let fma = Isa::detect() != Isa::Scalar;
    let group = s.n_heads / s.n_kv_heads;
    let span = |idx: usize| {
        let (tok, h) = (idx / s.n_heads, idx % s.n_heads);
        let pos = inputs.positions[tok] as usize;
        let lo = mask.first(pos);
        let base = kv_row_of(s, inputs, tok, h / group);
        let q = &inputs.q[idx * s.head_dim..(idx + 1) * s.head_dim];
        (q, move |p: usize| base(p + lo), pos + 1 - lo)
    };
    if numerics == Numerics::Ggml && mask.softcap == 0.0 {
        pool.for_each_chunk_mut(out, s.head_dim, AttnGuard::take, |scratch, idx, o| {
            let (q, row_of, len) = span(idx);
            crate::kernels::attention::ggml_heads::head(
                fma, q, k_cache, v_cache, row_of, len, s.scale, scratch, o,
            );
        });
        return;
    }
    pool.for_each_chunk_mut(
        out,
        s.head_dim,
        || Scratch::<f32>::zeroed(0),
        |scores, idx, o| {
            let (q, row_of, len) = span(idx);
            crate::kernels::attention::exact::head(
                fma,
                s,
                q,
                (k_cache, v_cache),
                row_of,
                len,
                mask.softcap,
                scores,
                o,
            );
        },
    );
}

#[cfg(test)]
#[path = "windowed_tests.rs"]
mod tests;
