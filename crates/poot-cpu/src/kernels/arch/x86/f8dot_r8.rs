//! x86 loops of the FP8 dot over 8-row interleaved weights (`matmul/repack_f8.rs`'s layout), on
//! AVX2 + FMA + F16C: one row per `f32` lane, so every vector op works on 8 rows at once.
//!
//! Float steps, per row, are the 8-row reference's (`arch/generic/f8dot_generic.rs`'s
//! `dot_scalar_span` with the layout's span and shifted spans): for each span and lane `l`,
//! `inner = e_l * x_l`, then one FMA per element `l + 8c` (`c < 4s`) in order, then
//! `acc_l = fma(D, inner, acc_l)`; at the end `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))`
//! (`hsum8`). Here `inner` and `acc_l` are registers of 8 rows, so those steps are the same
//! operations on the same values in the same order: bit-identical to the portable dot
//! (tested). The 8 lanes' chains are independent, and the loops step several together (4
//! elements of each of 4 lanes, then the next 4) so that FMA latency overlaps across them
//! rather than along one lane's 16-step chain.
//!
//! Widening, per span as the layout marks it:
//! - shifted (no subnormal code): 3 integer instructions per 8 codes, no conversion: a byte
//!   shuffle within each 128-bit half puts one element's code of rows 0..4 and 4..8 in the
//!   top byte of the 8 32-bit lanes; an arithmetic shift right by 4 and a mask leave its sign
//!   in bit 31 and its exponent and mantissa in bits 20..26: the f32 of the value times
//!   `2^-120`, exactly, against the activations times `2^64` (the caller's copy);
//! - F16C: `arch/x86/f8dot.rs`'s `widen32` (an in-lane unpack, shift and mask to the f16 of
//!   the value over 256, then `vcvtph2ps`), against the activations as given.
//!
//! The layout holds no NaN code (its invariant), so no NaN fix-up.
//!
//! Invariant (soundness): callers hold a `Checked` AVX2 or AVX-512 token (AVX2, FMA and F16C
//! detected); the entry functions assert the bounds the loops read.

use std::arch::x86_64::*;

use crate::kernels::arch::generic::f8dot_generic::D_SCALE;
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

/// The activations of one group's call: `x` as given and `xs = x * 2^64` (for shifted spans),
/// token `j` at `j * k`.
#[derive(Clone, Copy)]
pub(crate) struct Acts<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) xs: &'a [f32],
}

/// `out[j * 8 + r]` = row `r` of the group `g` (`nb` blocks in spans of `span`, span `p`
/// shifted where `shifted[p]`) dotted with token `j < t` (`k = 32 * nb`), for `t <= TILE`.
///
/// # Panics
/// If `span` is not 1 or 4, `nb` not a multiple of it, `g`, `shifted`, the activations or
/// `out` shorter than that, or `t > TILE`.
pub(crate) fn group_tokens(
    g: &[u8],
    shifted: &[bool],
    nb: usize,
    span: usize,
    a: Acts<'_>,
    t: usize,
    out: &mut [f32],
) {
    let k = 32 * nb;
    assert!(
        matches!(span, 1 | 4)
            && nb.is_multiple_of(span)
            && g.len() >= nb / span * span_bytes(span)
            && shifted.len() >= nb / span
            && a.x.len() >= t * k
            && a.xs.len() >= t * k
            && out.len() >= t * RG
            && t <= TILE,
        "f8 r8 shapes"
    );
    let ns = nb / span;
    // SAFETY: AVX2/FMA/F16C by the module invariant; bounds asserted above.
    unsafe {
        match (span, t) {
            (_, 0) => {}
            (1, 1) => one_avx2::<1>(g, shifted, ns, a, out),
            (_, 1) => one_avx2::<4>(g, shifted, ns, a, out),
            (1, _) => tile_avx2::<1>(g, shifted, ns, a, k, t, out),
            _ => tile_avx2::<4>(g, shifted, ns, a, k, t, out),
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

/// The 8 rows' scales of the span at `s` times the scaling's factor (`2^56` shifted, 256 for
/// F16C; exact, as the portable dot's).
#[inline(always)]
unsafe fn scales(s: *const u8, shifted: bool) -> __m256 {
    // SAFETY: 32 readable bytes at `s` (caller); AVX enabled by the caller.
    unsafe {
        let f = if shifted { D_SCALE } else { 256.0 };
        _mm256_mul_ps(_mm256_loadu_ps(s.cast()), _mm256_set1_ps(f))
    }
}

/// The 32 codes at `p` (one piece of a shifted span: elements `l + 8c` of 8 rows) as four
/// vectors, element `l + 8c` of the 8 rows in vector `c`, each code's value times `2^-120`.
#[inline(always)]
unsafe fn widen_shifted(p: *const u8) -> [__m256; 4] {
    // SAFETY: 32 readable bytes at `p` (caller); AVX2 enabled by the caller.
    unsafe {
        let v = _mm256_loadu_si256(p.cast());
        [element(v, 0), element(v, 1), element(v, 2), element(v, 3)]
    }
}

/// Element `c` of the shifted piece `v` (see [`widen_shifted`]).
#[inline(always)]
unsafe fn element(v: __m256i, c: i8) -> __m256 {
    // SAFETY: register-only AVX2 ops, enabled by the caller.
    unsafe {
        // Dword `i` of each half takes byte `4c + i` of that half in its top byte; a set top
        // bit in the index makes the shuffle write zero.
        let z = -128i8;
        let (a, b, e, f) = (4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3);
        let pick = _mm256_setr_epi8(
            z, z, z, a, z, z, z, b, z, z, z, e, z, z, z, f, //
            z, z, z, a, z, z, z, b, z, z, z, e, z, z, z, f,
        );
        let top = _mm256_shuffle_epi8(v, pick);
        // Sign to bit 31 (its copies in bits 27..30 masked off), exponent and mantissa to
        // bits 20..26.
        let bits = _mm256_and_si256(
            _mm256_srai_epi32::<4>(top),
            _mm256_set1_epi32(0x87F0_0000u32 as i32),
        );
        _mm256_castsi256_ps(bits)
    }
}

/// A piece of a span in its widening.
#[inline(always)]
unsafe fn widen(p: *const u8, shifted: bool) -> [__m256; 4] {
    // SAFETY: the caller's contract (32 readable bytes, AVX2 and F16C enabled).
    unsafe {
        if shifted {
            widen_shifted(p)
        } else {
            widen32::<false>(p)
        }
    }
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

/// The 8 lanes' `inner` of one token over the span at `s` (`S` blocks; activations at `x`,
/// scaled to match `SHIFTED`).
#[inline(always)]
unsafe fn span_one<const S: usize, const SHIFTED: bool>(
    s: *const u8,
    x: *const f32,
) -> [__m256; 8] {
    // SAFETY: the span and its `32 S` activations are readable (caller); features enabled by
    // the caller.
    unsafe {
        let mut inner = [_mm256_setzero_ps(); 8];
        // Lanes 0..4, then 4..8: four chains in flight fit the registers beside the
        // widening's constants (all 8 made the compiler spill them every step).
        for h in 0..2 {
            let mut part = [_mm256_setzero_ps(); 4];
            for b in 0..S {
                for (i, part) in part.iter_mut().enumerate() {
                    let l = 4 * h + i;
                    let e = widen(s.add(32 + 256 * b + 32 * l), SHIFTED);
                    let xl = x.add(32 * b + l);
                    for (c, &e) in e.iter().enumerate() {
                        *part = step(b == 0 && c == 0, e, xl.add(8 * c), *part);
                    }
                }
            }
            inner[4 * h..4 * h + 4].copy_from_slice(&part);
        }
        inner
    }
}

/// One token over `ns` spans of `S` blocks: the 8 lanes' `inner` and `acc` in registers, each
/// code widened once.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_avx2<const S: usize>(
    g: &[u8],
    shifted: &[bool],
    ns: usize,
    a: Acts<'_>,
    out: &mut [f32],
) {
    let (gp, sb) = (g.as_ptr(), span_bytes(S));
    let ahead = crate::kernels::simd::prefetch_ahead();
    // SAFETY: span `p < ns` is inside `g` and activations `32 S p ..+ 32 S` inside `a`
    // (asserted by the caller); `out` holds 8 values; the features are enabled here.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (p, &sh) in shifted.iter().enumerate().take(ns) {
            let s = gp.add(p * sb);
            // As the integer 8-row loops: the group's stream, a few lines ahead.
            crate::kernels::simd::prefetch_stream(s, sb, ahead);
            let inner = if sh {
                span_one::<S, true>(s, a.xs.as_ptr().add(32 * S * p))
            } else {
                span_one::<S, false>(s, a.x.as_ptr().add(32 * S * p))
            };
            let d = scales(s, sh);
            for (acc, &inner) in acc.iter_mut().zip(&inner) {
                *acc = _mm256_fmadd_ps(d, inner, *acc);
            }
        }
        _mm256_storeu_ps(out.as_mut_ptr(), finish(&acc));
    }
}

/// `2..=TILE` tokens over `ns` spans of `S` blocks: each span widened once into `32 S`
/// vectors on the stack in the order the steps read them, then every token's 8 lanes take
/// their steps together (the accumulators in `acc`, L1).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const S: usize>(
    g: &[u8],
    shifted: &[bool],
    ns: usize,
    a: Acts<'_>,
    k: usize,
    t: usize,
    out: &mut [f32],
) {
    let (gp, sb) = (g.as_ptr(), span_bytes(S));
    // SAFETY: as `one_avx2`, for tokens `j < t` at `j * k` and `out[j * 8..]`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 8]; TILE];
        // `w[8 (4b + c) + l]`: block `b`, lane `l`, element `l + 8c` of the block, in the order
        // the tokens' steps read them.
        let mut w = [_mm256_setzero_ps(); 32 * 4];
        for (p, &sh) in shifted.iter().enumerate().take(ns) {
            let s = gp.add(p * sb);
            for b in 0..S {
                for l in 0..8 {
                    let e = widen(s.add(32 + 256 * b + 32 * l), sh);
                    for (c, e) in e.into_iter().enumerate() {
                        w[8 * (4 * b + c) + l] = e;
                    }
                }
            }
            let d = scales(s, sh);
            let x = if sh { a.xs } else { a.x };
            for (j, acc) in acc.iter_mut().enumerate().take(t) {
                let xs = x.as_ptr().add(j * k + 32 * S * p);
                // The 8 lanes' chains stepped together: each is `4 S` dependent FMAs, so one
                // chain at a time waits on FMA latency (16 deep at `S = 4`: prefill ran at half
                // speed); 8 chains in registers keep both FMA pipes busy. Each lane's steps and
                // their order are unchanged.
                let mut inner = [_mm256_setzero_ps(); 8];
                for b in 0..S {
                    for c in 0..4 {
                        for (l, inner) in inner.iter_mut().enumerate() {
                            let e = w[8 * (4 * b + c) + l];
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
