//! x86 loops of the FP8 dot over 8-row interleaved weights (`matmul/repack_f8.rs`'s layout), on
//! AVX2 + FMA + F16C: one row per `f32` lane, so every vector op works on 8 rows at once.
//!
//! Float steps, per row, are the reference's (`arch/generic/f8dot_generic.rs`) for the layout's
//! scale span `s` (1 or 4 blocks): for each span and lane `l`, `inner = e_l * x_l`, then one
//! FMA per element `l + 8c` (`c < 4s`) in order, then `acc_l = fma(256 * d, inner, acc_l)`; at
//! the end `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))` (`hsum8`). Here `inner` and `acc_l` are
//! registers of 8 rows, so those steps are the same operations on the same values in the same
//! order: bit-identical to the portable dot (tested). The 8 lanes' chains are independent, and
//! the loops step them together (element `c` of every lane, then `c + 1`) so that FMA latency
//! overlaps across them rather than along one lane's 16-step chain.
//!
//! Widening: `arch/x86/f8dot.rs`'s `widen32`, without its NaN fix-up (the layout holds no NaN
//! code, its invariant).
//!
//! Invariant (soundness): callers hold a `Checked` AVX2 or AVX-512 token (AVX2, FMA and F16C
//! detected); the entry functions assert the bounds the loops read.

use std::arch::x86_64::*;

use crate::kernels::arch::x86::f8dot::widen32;
use crate::kernels::blocks::RG;

/// Bytes of one span of `s` blocks (`matmul/repack_f8.rs`'s `span_bytes`; restated here
/// because the per-ISA loops import nothing from the matmul family).
const fn span_bytes(s: usize) -> usize {
    32 + 8 * 32 * s
}

/// Tokens per pass of [`group_tokens`]: each span is widened once per pass, and the pass's
/// activations (`TILE * k` floats) stay in L2 while the group's spans stream by.
pub(crate) const TILE: usize = 8;

/// `out[j * 8 + r]` = row `r` of the group `g` (`nb` blocks in spans of `span`) dotted with
/// token `j < t` (`x[j * k..]`, `k = 32 * nb`), for `t <= TILE`.
///
/// # Panics
/// If `span` is not 1 or 4, `nb` not a multiple of it, `g`, `x` or `out` shorter than that,
/// or `t > TILE`.
pub(crate) fn group_tokens(g: &[u8], nb: usize, span: usize, x: &[f32], t: usize, out: &mut [f32]) {
    let k = 32 * nb;
    assert!(
        matches!(span, 1 | 4)
            && nb.is_multiple_of(span)
            && g.len() >= nb / span * span_bytes(span)
            && x.len() >= t * k
            && out.len() >= t * RG
            && t <= TILE,
        "f8 r8 shapes"
    );
    let ns = nb / span;
    // SAFETY: AVX2/FMA/F16C by the module invariant; bounds asserted above.
    unsafe {
        match (span, t) {
            (_, 0) => {}
            (1, 1) => one_avx2::<1>(g, ns, x, out),
            (_, 1) => one_avx2::<4>(g, ns, x, out),
            (1, _) => tile_avx2::<1>(g, ns, x, k, t, out),
            _ => tile_avx2::<4>(g, ns, x, k, t, out),
        }
    }
}

/// `hsum8`'s additions across the 8 lane accumulators, every row at once.
#[inline(always)]
unsafe fn finish(a: &[__m256; 8]) -> __m256 {
    // SAFETY: register-only AVX ops, enabled by the caller.
    unsafe {
        let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        _mm256_add_ps(lo, hi)
    }
}

/// The 8 rows' scales of the span at `s`, times 256 (exact, as the portable dot's).
#[inline(always)]
unsafe fn scales(s: *const u8) -> __m256 {
    // SAFETY: 32 readable bytes at `s` (caller); AVX enabled by the caller.
    unsafe { _mm256_mul_ps(_mm256_loadu_ps(s.cast()), _mm256_set1_ps(256.0)) }
}

/// `inner = e * x` for the span's first element, an FMA into `inner` for the others.
#[inline(always)]
unsafe fn step(first: bool, e: __m256, x: *const f32, inner: __m256) -> __m256 {
    // SAFETY: one readable float at `x` (caller); AVX and FMA enabled by the caller.
    unsafe {
        let xv = _mm256_broadcast_ss(&*x);
        if first {
            _mm256_mul_ps(e, xv)
        } else {
            _mm256_fmadd_ps(e, xv, inner)
        }
    }
}

/// One token over `ns` spans of `S` blocks: the 8 lanes' `inner` and `acc` in registers, each
/// code widened once.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_avx2<const S: usize>(g: &[u8], ns: usize, x: &[f32], out: &mut [f32]) {
    let (gp, xp, sb) = (g.as_ptr(), x.as_ptr(), span_bytes(S));
    let ahead = crate::kernels::simd::prefetch_ahead();
    // SAFETY: span `p < ns` is inside `g` and activations `32 S p ..+ 32 S` inside `x`
    // (asserted by the caller); `out` holds 8 values; the features are enabled here.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for p in 0..ns {
            let s = gp.add(p * sb);
            // As the integer 8-row loops: the group's stream, a few lines ahead.
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let xs = xp.add(32 * S * p);
            let mut inner = [_mm256_setzero_ps(); 8];
            for b in 0..S {
                for (l, inner) in inner.iter_mut().enumerate() {
                    let e = widen32::<false>(s.add(32 + 256 * b + 32 * l));
                    let xl = xs.add(32 * b + l);
                    for (c, &e) in e.iter().enumerate() {
                        *inner = step(b == 0 && c == 0, e, xl.add(8 * c), *inner);
                    }
                }
            }
            let d = scales(s);
            for (acc, &inner) in acc.iter_mut().zip(&inner) {
                *acc = _mm256_fmadd_ps(d, inner, *acc);
            }
        }
        _mm256_storeu_ps(out.as_mut_ptr(), finish(&acc));
    }
}

/// `2..=TILE` tokens over `ns` spans of `S` blocks: each span widened once into `32 S`
/// vectors on the stack, then every token's 8 lanes take their steps (`inner` in registers,
/// the accumulators in `acc`, L1).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const S: usize>(
    g: &[u8],
    ns: usize,
    x: &[f32],
    k: usize,
    t: usize,
    out: &mut [f32],
) {
    let (gp, sb) = (g.as_ptr(), span_bytes(S));
    // SAFETY: as `one_avx2`, for tokens `j < t` at `x[j * k..]` and `out[j * 8..]`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 8]; TILE];
        // `w[32 b + 4 l + c]`: block `b`, lane `l`, element `l + 8c` of the block.
        let mut w = [_mm256_setzero_ps(); 32 * 4];
        for p in 0..ns {
            let s = gp.add(p * sb);
            for b in 0..S {
                for l in 0..8 {
                    let e = widen32::<false>(s.add(32 + 256 * b + 32 * l));
                    w[32 * b + 4 * l..32 * b + 4 * l + 4].copy_from_slice(&e);
                }
            }
            let d = scales(s);
            for (j, acc) in acc.iter_mut().enumerate().take(t) {
                let xs = x.as_ptr().add(j * k + 32 * S * p);
                let mut inner = [_mm256_setzero_ps(); 8];
                for b in 0..S {
                    for c in 0..4 {
                        for (l, inner) in inner.iter_mut().enumerate() {
                            let e = w[32 * b + 4 * l + c];
                            *inner = step(b == 0 && c == 0, e, xs.add(32 * b + 8 * c + l), *inner);
                        }
                    }
                }
                for (acc, &inner) in acc.iter_mut().zip(&inner) {
                    *acc = _mm256_fmadd_ps(d, inner, *acc);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate().take(t) {
            _mm256_storeu_ps(out.as_mut_ptr().add(j * RG), finish(acc));
        }
    }
}
