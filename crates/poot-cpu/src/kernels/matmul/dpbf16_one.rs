//! One token against BF16 weights under ggml numerics with `vdpbf16ps` (`matmul/dpbf16.rs`'s
//! arithmetic), reading the stored rows in place.
//!
//! Why: several tokens pack their row blocks into tiles, which pays when each row is used by
//! every token of the call; one token uses each row once, and a decode step is bound by
//! reading the weights, so the copy only added traffic (Llama-3.2-1B shape BF16 decode read
//! 0.93x the speed it had before the tiles took every token count for batch invariance).
//!
//! Numerics: the tiles' exactly. Per output, lane `l` of one 16-lane register adds the pair
//! `(32 s + 2 l, 32 s + 2 l + 1)` of every 32-element slice `s` of `k` in order (the last
//! slice zero-padded, as the packed rows and activations are), then `_mm512_reduce_add_ps`;
//! the activations are `dpbf16::pack_x`'s, so every output is bit-identical to the tiles'
//! (tested; `invariance_tests.rs` checks it through `matmul`).
//!
//! Cost: `2 * n * k` flops, one pass over the weights with rows prefetched
//! [`prefetch_float_ahead`](crate::kernels::simd::prefetch_float_ahead) bytes ahead; memory:
//! the packed activations (`2 * k` bytes).

use crate::kernels::matmul::dpbf16::{available, pack_x};
use crate::pool::{SharedMut, ThreadPool};

/// Rows one task step takes (independent chains for the FMA ports).
const ROWS: usize = 4;

/// `out[n] = sum_k W[n][k] x'[k]` for one token (`x` is `k` floats); the caller checked
/// [`available`] and an AVX-512 path, and `matmul_cached` validated the shapes.
pub(crate) fn gemv(
    x: &[f32],
    k: usize,
    (w, row_bytes, n): (&[u8], usize, usize),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    assert!(available() && x.len() >= k && out.len() >= n);
    assert!(row_bytes >= 2 * k && w.len() >= n * row_bytes);
    let xp = pack_x(x, (1, k), pool);
    let quads = n.div_ceil(ROWS);
    let (per_task, tasks) = pool.split(quads);
    let shared = SharedMut::new(out);
    let ahead = crate::kernels::simd::prefetch_float_ahead();
    pool.for_each(tasks, |task| {
        let (q0, q1) = (task * per_task, ((task + 1) * per_task).min(quads));
        let (r0, r1) = (q0 * ROWS, (q1 * ROWS).min(n));
        // SAFETY: rows r0..r1 belong to this task only.
        let dst = unsafe { shared.slice_mut(r0..r1) };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available()` (asserted) proves AVX-512F, BW and BF16; rows r0..r1 of
        // `row_bytes` each lie inside `w` and hold `k` halves; `xp` holds `k` rounded to 32.
        unsafe {
            x86::rows(
                w[r0 * row_bytes..].as_ptr(),
                row_bytes,
                k,
                xp.as_ptr(),
                ahead,
                dst,
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (dst, ahead, &xp, row_bytes);
    });
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Invariant (soundness): every function here is `unsafe` with the contract that the caller
    //! detected AVX-512F, BW and BF16 and that the pointers cover the lengths stated.

    use std::arch::x86_64::*;

    use super::ROWS;

    /// `out[i] = dot(row i, x')` for `out.len()` rows of `row_bytes` from `w`, `k` halves
    /// each; `x` holds `k` rounded up to 32 halves (zero-padded).
    ///
    /// # Safety
    /// See the module invariant.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn rows(
        w: *const u8,
        row_bytes: usize,
        k: usize,
        x: *const u16,
        ahead: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the contract; every load below stays inside row i's k halves (the tail
        // masked) and x's padded length.
        unsafe {
            let mut i = 0;
            while i + ROWS <= out.len() {
                let res = dots::<ROWS>(w.add(i * row_bytes), row_bytes, k, x, ahead);
                out[i..i + ROWS].copy_from_slice(&res);
                i += ROWS;
            }
            while i < out.len() {
                out[i] = dots::<1>(w.add(i * row_bytes), row_bytes, k, x, ahead)[0];
                i += 1;
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn dots<const R: usize>(
        w: *const u8,
        row_bytes: usize,
        k: usize,
        x: *const u16,
        ahead: usize,
    ) -> [f32; R] {
        // SAFETY: as `rows`.
        unsafe {
            let (full, tail) = (k / 32, k % 32);
            let mut acc = [_mm512_setzero_ps(); R];
            let row = |r: usize| w.add(r * row_bytes);
            for s in 0..full {
                let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(x.add(32 * s).cast()));
                for (r, a) in acc.iter_mut().enumerate() {
                    let p = row(r).add(64 * s);
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead).cast());
                    let wv: __m512bh = std::mem::transmute(_mm512_loadu_si512(p.cast()));
                    *a = _mm512_dpbf16_ps(*a, wv, xv);
                }
            }
            if tail > 0 {
                // Zeros past k, as the packed operands have: exact zero products.
                let m: __mmask32 = (1u32 << tail) - 1;
                let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(x.add(32 * full).cast()));
                for (r, a) in acc.iter_mut().enumerate() {
                    let p = row(r).add(64 * full);
                    let wv: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(m, p.cast()));
                    *a = _mm512_dpbf16_ps(*a, wv, xv);
                }
            }
            acc.map(|a| _mm512_reduce_add_ps(a))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{synthetic_weights, Rng};
    use poot_core::DType;

    /// Bit-identical to the packed tiles for one token, on ragged `k` and `n`, any threads.
    #[test]
    fn one_token_equals_the_tiles() {
        if !crate::testutil::isa_runs("bf16", available()) {
            return;
        }
        let mut rng = Rng::new(17);
        for (n, k) in [(13, 96), (8, 64), (21, 2048), (5, 40), (9, 33)] {
            let w = synthetic_weights(DType::BF16, n, k, 3);
            let x = rng.vec(k, -2.0, 2.0);
            for threads in [1, 3] {
                let pool = ThreadPool::new(threads).unwrap();
                let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                crate::kernels::matmul::dpbf16::matmul(&x, (1, k), (&w, 2 * k, n), &mut a, &pool);
                gemv(&x, k, (&w, 2 * k, n), &mut b, &pool);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "n={n} k={k} threads={threads}");
            }
        }
    }
}
