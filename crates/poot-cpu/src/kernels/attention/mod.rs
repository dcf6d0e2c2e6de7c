//! Paged causal attention with grouped-query heads, one layer, one step.
//!
//! Layout: each layer's K and V caches are `[num_blocks, block_size, n_kv_heads, head_dim]` of
//! a [`KvElem`] (`f32`, or `half::f16` as llama.cpp keeps it). A sequence's logical block `b`
//! lives in physical block `block_tables[seq][b]`; position `p` is slot
//! `block * block_size + p % block_size` with `block = block_tables[seq][p / block_size]`.
//!
//! One call: (1) validate everything, (2) write this step's `k`/`v` rows to their slots
//! (`slot_mapping[i] == -1`: don't write), (3) every token attends to its own sequence's
//! positions `0..=positions[i]`, read back from the cache, so chunked prefill and decode share
//! one path. Query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
//!
//! Invariants: every index read from caller data (slots, sequence ids, positions, block table
//! entries a token will read) is checked before anything is written, and a written slot must be
//! the slot the block table gives for that token's position (a scheduler bug otherwise). So a
//! returned error leaves `k_cache`, `v_cache` and `out` untouched, and nothing panics.
//!
//! Numerics ([`Numerics::Exact`], `attention/exact.rs`): scores `dot(q, k) * scale` (8 `f32`
//! lanes), softmax in `f32` with the max subtracted (`e_p = expf(s_p - max)`, ggml's `expf`,
//! within 1.95 ulp) and an `f32` sum, `out = (sum_p e_p * v_p) * (1 / sum)`. Error bound in
//! the tests. [`Numerics::Ggml`] follows llama.cpp's prefill order instead (`attention/ggml_heads.rs`).
//! Under either, a token's result depends only on its own query and its sequence's cache: not on
//! the thread count, nor on which or how many tokens share the step (batch invariance).
//!
//! Cost: O(sum over tokens of (position + 1) * n_heads * head_dim) multiply-adds, parallel over
//! (token, head) pairs; scratch of `max position + 1` floats per thread plus `n_seqs` counters.

#[cfg(target_arch = "x86_64")]
pub(crate) mod exact;
pub(crate) mod ggml_heads;
pub(crate) mod grouped;
#[cfg(target_arch = "x86_64")]
pub(crate) mod grouped_one;
pub(crate) mod kv;
pub(crate) mod windowed;

use crate::error::{check_len, mul};
use crate::kernels::attention::kv::kv_row_of;
pub use crate::kernels::attention::kv::{AttentionInputs, AttentionShape, KvCacheMut, KvElem};
pub use crate::kernels::attention::windowed::AttentionMask;
use crate::kernels::ggml::Numerics;
use crate::kernels::scratch::AttnGuard;
use crate::kernels::simd::Isa;
use crate::pool::ThreadPool;
use crate::KernelError;

fn invalid(what: &'static str, detail: String) -> KernelError {
    KernelError::InvalidArgument { what, detail }
}

fn out_of_range(what: &'static str, at: usize, value: i64, bound: usize) -> KernelError {
    KernelError::IndexOutOfRange {
        what,
        at,
        value,
        bound,
    }
}

/// Writes this step's K/V into `cache` and computes attention into `out` (`[t, n_heads,
/// head_dim]`); see the module docs for the contract.
pub fn paged_attention<T: KvElem>(
    shape: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    cache: KvCacheMut<'_, T>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    paged_attention_numerics(Numerics::Exact, shape, inputs, cache, out, pool)
}

/// [`paged_attention`] under a chosen [`Numerics`] (the same contract and checks).
pub fn paged_attention_numerics<T: KvElem>(
    numerics: Numerics,
    shape: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    cache: KvCacheMut<'_, T>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    paged_attention_masked(
        numerics,
        AttentionMask::default(),
        shape,
        inputs,
        cache,
        out,
        pool,
    )
}

/// [`paged_attention_numerics`] of a layer with a sliding window and/or a score soft-cap
/// (`attention/windowed.rs`); an empty mask is exactly [`paged_attention_numerics`].
pub fn paged_attention_masked<T: KvElem>(
    numerics: Numerics,
    mask: AttentionMask,
    shape: &AttentionShape,
    inputs: &AttentionInputs<'_>,
    cache: KvCacheMut<'_, T>,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    if !(mask.softcap.is_finite() && mask.softcap >= 0.0) {
        return Err(invalid(
            "attention softcap",
            format!("{} is not finite and >= 0", mask.softcap),
        ));
    }
    let plan = validate(shape, inputs, cache.k.len(), cache.v.len(), out.len())?;
    let s = shape;
    let kv_row = s.n_kv_heads * s.head_dim;
    for (i, &slot) in inputs.slot_mapping.iter().enumerate() {
        if slot >= 0 {
            let dst = slot as usize * kv_row;
            for (c, src) in [(&mut *cache.k, inputs.k), (&mut *cache.v, inputs.v)] {
                let row = &src[i * kv_row..(i + 1) * kv_row];
                T::slice_from_f32(row, &mut c[dst..dst + kv_row]);
            }
        }
    }
    if plan.t == 0 || s.head_dim == 0 {
        return Ok(());
    }
    let (k_cache, v_cache) = (&*cache.k, &*cache.v);
    if !mask.is_none() {
        let caches = (k_cache, v_cache);
        crate::kernels::attention::windowed::attend(numerics, mask, s, inputs, caches, out, pool);
        return Ok(());
    }
    let group = s.n_heads / s.n_kv_heads;
    if numerics == Numerics::Ggml {
        let fma = Isa::detect() != Isa::Scalar;
        // A step over an f16 cache takes each KV head's query heads together, so every K and V
        // row is widened once per group (bit-identical to the per-head path).
        let grouped = crate::kernels::attention::grouped::paged_grouped;
        if grouped(fma, s, inputs, k_cache, v_cache, plan.t, out, pool) {
            return Ok(());
        }
        pool.for_each_chunk_mut(out, s.head_dim, AttnGuard::take, |scratch, idx, o| {
            let (tok, h) = (idx / s.n_heads, idx % s.n_heads);
            let row_of = kv_row_of(s, inputs, tok, h / group);
            ggml_heads::head(
                fma,
                &inputs.q[idx * s.head_dim..(idx + 1) * s.head_dim],
                k_cache,
                v_cache,
                row_of,
                inputs.positions[tok] as usize + 1,
                s.scale,
                scratch,
                o,
            );
        });
        return Ok(());
    }
    crate::kernels::attention::exact::attend(s, inputs, (k_cache, v_cache), out, pool);
    Ok(())
}

/// What validation learned.
struct Plan {
    t: usize,
}

fn validate(
    s: &AttentionShape,
    inp: &AttentionInputs<'_>,
    k_len: usize,
    v_len: usize,
    out_len: usize,
) -> Result<Plan, KernelError> {
    for (what, v) in [
        ("attention n_heads", s.n_heads),
        ("attention n_kv_heads", s.n_kv_heads),
        ("attention block_size", s.block_size),
    ] {
        if v == 0 {
            return Err(invalid(what, "must be positive".into()));
        }
    }
    if !s.n_heads.is_multiple_of(s.n_kv_heads) {
        return Err(invalid(
            "attention heads",
            format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                s.n_heads, s.n_kv_heads
            ),
        ));
    }
    if !s.scale.is_finite() {
        return Err(invalid(
            "attention scale",
            format!("{} is not finite", s.scale),
        ));
    }
    let t = inp.positions.len();
    let q_row = mul(s.n_heads, s.head_dim, "attention q")?;
    let kv_row = mul(s.n_kv_heads, s.head_dim, "attention k")?;
    check_len("attention q", mul(t, q_row, "attention q")?, inp.q.len())?;
    check_len("attention k", mul(t, kv_row, "attention k")?, inp.k.len())?;
    check_len("attention v", mul(t, kv_row, "attention v")?, inp.v.len())?;
    check_len("attention out", mul(t, q_row, "attention out")?, out_len)?;
    check_len("attention slot_mapping", t, inp.slot_mapping.len())?;
    check_len("attention token_seq", t, inp.token_seq.len())?;
    let n_slots = mul(s.num_blocks, s.block_size, "attention cache")?;
    let cache_len = mul(n_slots, kv_row, "attention cache")?;
    check_len("attention k_cache", cache_len, k_len)?;
    check_len("attention v_cache", cache_len, v_len)?;
    let mb = s.max_blocks_per_seq;
    let n_seqs = inp.block_tables.len().checked_div(mb).unwrap_or(0);
    if n_seqs * mb != inp.block_tables.len() {
        return Err(invalid(
            "attention block_tables",
            format!("{} entries are not rows of {mb}", inp.block_tables.len()),
        ));
    }
    let max_pos = mul(mb, s.block_size, "attention positions")?;
    // Blocks each sequence needs: max over its tokens of position / block_size + 1.
    // Up to 256 sequences on the stack (no allocation per step), more on the heap.
    let mut stack = [0usize; 256];
    let mut heap = Vec::new();
    let need: &mut [usize] = if n_seqs <= stack.len() {
        &mut stack[..n_seqs]
    } else {
        heap.resize(n_seqs, 0);
        &mut heap
    };
    for i in 0..t {
        let seq = inp.token_seq[i];
        if seq < 0 || seq as usize >= n_seqs {
            return Err(out_of_range("attention token_seq", i, seq.into(), n_seqs));
        }
        let pos = inp.positions[i];
        if pos < 0 || pos as usize >= max_pos {
            return Err(out_of_range("attention positions", i, pos.into(), max_pos));
        }
        let slot = inp.slot_mapping[i];
        if slot != -1 && (slot < 0 || slot as usize >= n_slots) {
            return Err(out_of_range(
                "attention slot_mapping",
                i,
                slot.into(),
                n_slots,
            ));
        }
        let n = &mut need[seq as usize];
        *n = (*n).max(pos as usize / s.block_size + 1);
    }
    for (seq, &n) in need.iter().enumerate() {
        for b in 0..n {
            let at = seq * mb + b;
            let blk = inp.block_tables[at];
            if blk < 0 || blk as usize >= s.num_blocks {
                return Err(out_of_range(
                    "attention block_tables",
                    at,
                    blk.into(),
                    s.num_blocks,
                ));
            }
        }
    }
    for i in 0..t {
        let slot = inp.slot_mapping[i];
        if slot >= 0 {
            let (seq, pos) = (inp.token_seq[i] as usize, inp.positions[i] as usize);
            let blk = inp.block_tables[seq * mb + pos / s.block_size] as usize;
            let want = blk * s.block_size + pos % s.block_size;
            if slot as usize != want {
                return Err(invalid(
                    "attention slot_mapping",
                    format!(
                        "token {i} (sequence {seq}, position {pos}) writes slot {slot}, but its \
                         block table puts that position at slot {want}"
                    ),
                ));
            }
        }
    }
    Ok(Plan { t })
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
