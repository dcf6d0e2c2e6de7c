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
//! Numerics ([`Numerics::Exact`], `attention_exact.rs`): scores `dot(q, k) * scale` (8 `f32`
//! lanes), softmax in `f32` with the max subtracted (`e_p = expf(s_p - max)`, ggml's `expf`,
//! within 1.95 ulp) and an `f32` sum, `out = (sum_p e_p * v_p) * (1 / sum)`. Error bound in
//! the tests. [`Numerics::Ggml`] follows llama.cpp instead (`attention_ggml.rs`). Results do
//! not depend on the thread count.
//!
//! Cost: O(sum over tokens of (position + 1) * n_heads * head_dim) multiply-adds, parallel over
//! (token, head) pairs; scratch of `max position + 1` floats per thread plus `n_seqs` counters.

use super::attention_ggml;
use super::ggml::Numerics;
use super::scratch::AttnGuard;
use super::simd::Isa;
use crate::error::{check_len, mul};
use crate::pool::ThreadPool;
use crate::KernelError;

/// An element type the KV cache can store.
pub trait KvElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;

    /// `dst[i] = src[i].to_f32()` (implementations may convert in bulk).
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    fn from_f32(v: f32) -> Self;

    /// `s` as f16 elements, where this element is f16 (the grouped ggml path reads those).
    fn as_f16(_s: &[Self]) -> Option<&[half::f16]> {
        None
    }

    /// `s` as `f32` elements, where this element is `f32` (the exact grouped path reads those).
    fn as_f32(_s: &[Self]) -> Option<&[f32]> {
        None
    }

    /// [`KvElem::slice_to_f32`] inlined with F16C instructions where the element is f16.
    ///
    /// # Safety
    /// The caller runs with AVX and F16C enabled (inside a `#[target_feature]` function whose
    /// features were detected).
    #[inline(always)]
    unsafe fn slice_to_f32_f16c(src: &[Self], dst: &mut [f32]) {
        Self::slice_to_f32(src, dst);
    }

    /// ggml's `dot(row, q)` in `lanes` (8 or 32) FMA lanes folded as `attention_ggml` does,
    /// reading `row` in place, or `None` where this element has no such path (the caller then
    /// widens the row first; the result is the same).
    ///
    /// # Safety
    /// As [`KvElem::slice_to_f32_f16c`], plus FMA enabled.
    #[inline(always)]
    unsafe fn dot_f16c(_row: &[Self], _q: &[f32], _lanes: usize) -> Option<f32> {
        None
    }

    /// `acc[d] = fma(row[d], w, acc[d])` reading `row` in place; false where this element has
    /// no such path (nothing is written then).
    ///
    /// # Safety
    /// As [`KvElem::dot_f16c`].
    #[inline(always)]
    unsafe fn axpy_f16c(_row: &[Self], _w: f32, _acc: &mut [f32]) -> bool {
        false
    }

    /// `x[i] = round_to_elem(x[i] * w)` (multiply, then round to this element and back), 8
    /// at a time; false where this element has no such path (nothing is written then).
    ///
    /// # Safety
    /// As [`KvElem::slice_to_f32_f16c`].
    #[inline(always)]
    unsafe fn scale_round_f16c(_x: &mut [f32], _w: f32) -> bool {
        false
    }
}

impl KvElem for f32 {
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl KvElem for half::f16 {
    fn as_f16(s: &[Self]) -> Option<&[half::f16]> {
        Some(s)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }

    /// Exact; F16C when the CPU has it.
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::CpuFeatures::get().f16c && crate::CpuFeatures::get().avx {
            // SAFETY: F16C and AVX were just detected.
            return unsafe { f16_to_f32_f16c(src, dst) };
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn slice_to_f32_f16c(src: &[Self], dst: &mut [f32]) {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: elements i..i + 8 are inside both slices (i + 8 <= n); the caller runs
            // with AVX and F16C enabled (this function's contract).
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = s.to_f32();
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dot_f16c(row: &[Self], q: &[f32], lanes: usize) -> Option<f32> {
        use std::arch::x86_64::*;
        let hd = row.len().min(q.len());
        if !hd.is_multiple_of(lanes) || !(lanes == 8 || lanes == 32) {
            return None;
        }
        // SAFETY: every load reads 8 elements at `i < hd` with `hd` a multiple of 8, inside
        // both slices; AVX, F16C and FMA are enabled by the caller (this function's contract).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < hd {
                for (g, a) in acc.iter_mut().enumerate().take(lanes / 8) {
                    let at = i + 8 * g;
                    let k = _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(at).cast()));
                    *a = _mm256_fmadd_ps(k, _mm256_loadu_ps(q.as_ptr().add(at)), *a);
                }
                i += lanes;
            }
            // Lane l of accumulator g is ggml's lane 8g + l: the same sums, folded the same way
            // (`fold32`: `(0 + 2) + (1 + 3)` by accumulator, then two `hadd`s; `hsum8`: halves,
            // `movehl`, `movehdup`), in registers.
            let s = if lanes == 8 {
                super::ggml::hsum8v(acc[0])
            } else {
                let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
                let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let h = _mm_hadd_ps(h, h);
                _mm_cvtss_f32(_mm_hadd_ps(h, h))
            };
            Some(s)
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn axpy_f16c(row: &[Self], w: f32, acc: &mut [f32]) -> bool {
        use std::arch::x86_64::*;
        let hd = row.len().min(acc.len());
        if !hd.is_multiple_of(8) {
            return false;
        }
        // SAFETY: 8 elements at `i < hd` (a multiple of 8) are inside both slices; AVX, F16C
        // and FMA are enabled by the caller.
        unsafe {
            let wv = _mm256_set1_ps(w);
            for i in (0..hd).step_by(8) {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(i).cast()));
                let a = acc.as_mut_ptr().add(i);
                _mm256_storeu_ps(a, _mm256_fmadd_ps(v, wv, _mm256_loadu_ps(a)));
            }
        }
        true
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scale_round_f16c(x: &mut [f32], w: f32) -> bool {
        use std::arch::x86_64::*;
        let whole = x.len() & !7;
        // SAFETY: 8 values at `i < whole` are inside `x`; AVX and F16C are enabled by the
        // caller. `vcvtps2ph` with round-to-nearest-even is `half::f16::from_f32`'s rounding.
        unsafe {
            let wv = _mm256_set1_ps(w);
            for i in (0..whole).step_by(8) {
                let p = x.as_mut_ptr().add(i);
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(
                    _mm256_loadu_ps(p),
                    wv,
                ));
                _mm256_storeu_ps(p, _mm256_cvtph_ps(h));
            }
        }
        for v in &mut x[whole..] {
            *v = half::f16::from_f32(*v * w).to_f32();
        }
        true
    }

    /// Round to nearest even, as ggml's `fp32_to_fp16` (F16C) does.
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// `dst[i] = src[i]` widened with `vcvtph2ps`, 8 at a time, then one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
pub(crate) fn f16_to_f32_f16c(src: &[half::f16], dst: &mut [f32]) {
    use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: elements i..i + 8 are inside both slices (i + 8 <= n); F16C/AVX enabled.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = s.to_f32();
    }
}

/// Shapes and the softmax scale of one paged-attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// Physical blocks in the cache.
    pub num_blocks: usize,
    /// Columns of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// One step's per-token inputs (`t = positions.len()` tokens).
#[derive(Clone, Copy, Debug)]
pub struct AttentionInputs<'a> {
    /// `[t, n_heads, head_dim]`.
    pub q: &'a [f32],
    /// `[t, n_kv_heads, head_dim]`: this step's keys, written at `slot_mapping`.
    pub k: &'a [f32],
    /// `[t, n_kv_heads, head_dim]`: this step's values.
    pub v: &'a [f32],
    /// `[t]`: flat slot `block * block_size + offset` for each token, or -1 to skip writing.
    pub slot_mapping: &'a [i32],
    /// `[t]`: the sequence (row of `block_tables`) each token belongs to.
    pub token_seq: &'a [i32],
    /// `[t]`: each token's position in its sequence.
    pub positions: &'a [i32],
    /// `[n_seqs, max_blocks_per_seq]`: physical block ids; entries a token does not reach may
    /// hold anything (-1 padding is fine).
    pub block_tables: &'a [i32],
}

/// One layer's K and V caches, `[num_blocks, block_size, n_kv_heads, head_dim]` each.
#[derive(Debug)]
pub struct KvCacheMut<'a, T> {
    pub k: &'a mut [T],
    pub v: &'a mut [T],
}

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

/// The cache slot of position `p` under a block table: `table[p / bs] * bs + p % bs`. Block
/// sizes are powers of two in practice, and a shift and mask there instead of a 64-bit
/// division per position (twice per head and position) was a tenth of decode attention.
#[inline(always)]
pub(crate) fn block_slot(table: &[i32], bs: usize, p: usize) -> usize {
    let (blk, off) = if bs.is_power_of_two() {
        (p >> bs.trailing_zeros(), p & (bs - 1))
    } else {
        (p / bs, p % bs)
    };
    table[blk] as usize * bs + off
}

/// Where token `tok`'s sequence keeps KV head `kvh`'s row for position `p` in a layer's cache
/// (`[slots, n_kv_heads, head_dim]`): `row_of(p)` is that row's first element. The block table
/// entries a token reads were validated, so every such `p` maps inside the cache.
pub(crate) fn kv_row_of<'a>(
    s: &'a AttentionShape,
    inputs: &'a AttentionInputs<'_>,
    tok: usize,
    kvh: usize,
) -> impl Fn(usize) -> usize + 'a {
    let seq = inputs.token_seq[tok] as usize;
    let table = &inputs.block_tables[seq * s.max_blocks_per_seq..];
    let kv_row = s.n_kv_heads * s.head_dim;
    move |p| block_slot(table, s.block_size, p) * kv_row + kvh * s.head_dim
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
    let plan = validate(shape, inputs, cache.k.len(), cache.v.len(), out.len())?;
    let s = shape;
    let kv_row = s.n_kv_heads * s.head_dim;
    for (i, &slot) in inputs.slot_mapping.iter().enumerate() {
        if slot >= 0 {
            let dst = slot as usize * kv_row;
            for (c, src) in [(&mut *cache.k, inputs.k), (&mut *cache.v, inputs.v)] {
                let row = &src[i * kv_row..(i + 1) * kv_row];
                for (d, &x) in c[dst..dst + kv_row].iter_mut().zip(row) {
                    *d = T::from_f32(x);
                }
            }
        }
    }
    if plan.t == 0 || s.head_dim == 0 {
        return Ok(());
    }
    let (k_cache, v_cache) = (&*cache.k, &*cache.v);
    let group = s.n_heads / s.n_kv_heads;
    if numerics == Numerics::Ggml {
        let batched = plan.t >= 2;
        let fma = Isa::detect() != Isa::Scalar;
        // A batched step over an f16 cache takes each KV head's query heads together, so every
        // K and V row is widened once per group (bit-identical to the per-head path).
        let grouped = super::attention_grouped::paged_grouped;
        // (One token too, in ggml's one-token order, where `attention_decode` applies.)
        if grouped(fma, s, inputs, k_cache, v_cache, plan.t, out, pool) {
            return Ok(());
        }
        pool.for_each_chunk_mut(out, s.head_dim, AttnGuard::take, |scratch, idx, o| {
            let (tok, h) = (idx / s.n_heads, idx % s.n_heads);
            let row_of = kv_row_of(s, inputs, tok, h / group);
            attention_ggml::head(
                fma,
                &inputs.q[idx * s.head_dim..(idx + 1) * s.head_dim],
                k_cache,
                v_cache,
                row_of,
                inputs.positions[tok] as usize + 1,
                s.scale,
                batched,
                scratch,
                o,
            );
        });
        return Ok(());
    }
    super::attention_exact::attend(s, inputs, (k_cache, v_cache), out, pool);
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
#[path = "attention_tests.rs"]
mod tests;
