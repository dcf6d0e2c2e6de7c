//! What every attention kernel shares, at the bottom of the attention family: the KV element
//! types ([`KvElem`]: `f32`, or `half::f16` as llama.cpp keeps it), one call's shapes and
//! inputs, the cache view, and where a position's KV row lives (`kv_row_of`). The dispatch
//! (`attention/mod.rs`) and the kernels (`attention/exact.rs`, `attention/ggml_heads.rs`,
//! `attention/grouped.rs`, `attention/decode.rs`) all import from here and never from each
//! other upward. See `attention/mod.rs` for the layout and the contract.

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

    /// `dst[i] = from_f32(src[i])` (implementations may convert in bulk, with the same
    /// rounding).
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }

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

    /// `half`'s bulk conversion (F16C 8 at a time where the CPU has it; round to nearest
    /// even, as `from_f32`): a decode step's new K and V rows had been a call per value.
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        let n = src.len().min(dst.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
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
                crate::kernels::ggml::hsum8v(acc[0])
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
