//! x86 loops of the grouped-scale FP8 dot (`matmul/repack_f8g.rs`'s layout), on AVX2 + FMA:
//! each row's codes 32 at a time against activation vectors held in registers, 8 rows a
//! group, one scale step per row per span of 128 codes.
//!
//! Float steps, per row, are the portable dot's (`arch/generic/f8g_generic.rs`: span lanes
//! from 0, one FMA a code, `acc = fma(d * 2^72, blk, acc)` per span, `hsum8`), so results are
//! bit-identical to it (tested).
//!
//! Widening: a row's 32 codes are one load; each code's byte, its sign copied into 4 bits above
//! it, shifted to bits 20..27 of a 32-bit lane and masked, is the `f32` of its value times
//! `2^-120`. The layout puts element `8c + i` at byte `4i + c`, so 16-bit arithmetic shifts by
//! 4 shape a lane's odd bytes in place and (after a 16-bit shift by 8) its even ones, and a
//! 32-bit shift by 16 or none brings each to the top: 5 shifts and 4 masks for 4 vectors (the
//! 8-code widening was 8 shifts, and the F16C route of `f8dot_r8.rs` more, on the two vector
//! pipes that shift and shuffle). Byte multiplies (`vpmaddubsw`, then `vpmaddwd` to move a
//! half up) do it without shifts on other pipes, and llvm-mca (znver3) liked them, but they
//! ran slower here. The FMAs read the activations from memory (`fma_mem`): four of them held
//! in registers left too few for the 8 rows' chains and the widening, and LLVM spilled the
//! widened codes (two threads streaming from DRAM: 1.11x the calls a second, median of 6
//! alternations). Activations come prescaled by `2^48`, so products stay normal.
//!
//! Invariant (soundness): callers hold a `Checked` AVX2 or AVX-512 token (AVX2 and FMA
//! detected); the entry function asserts the bounds the loops read.

use std::arch::x86_64::*;

use crate::kernels::arch::generic::f8g_generic::{group_bytes, spans, BLOCK8, SPAN};
use crate::kernels::blocks::RG;
use crate::kernels::ggml::hsum8;

/// Tokens per pass of [`group_tokens`]: each block is widened once per pass, and the pass's
/// activations (`TILE * k` floats) stay in L2 while the group's blocks stream by.
pub(crate) const TILE: usize = 8;

/// `out[j * 8 + r]` = row `r` of group `g` (`nb` blocks) dotted with token `j < t`'s
/// prescaled activations (`xs[j * k..]`, `k = 32 * nb`), for `t <= TILE`.
///
/// # Panics
/// If `g`, `xs` or `out` is shorter than that, or `t > TILE`.
pub(crate) fn group_tokens(g: &[u8], nb: usize, xs: &[f32], t: usize, out: &mut [f32]) {
    let k = 32 * nb;
    assert!(t <= TILE && g.len() >= group_bytes(nb) && xs.len() >= t * k && out.len() >= t * RG);
    if t == 1 {
        // SAFETY: AVX2/FMA by the module invariant; bounds asserted above.
        unsafe { one_avx2(g, nb, xs, out) };
    } else if t > 1 {
        // SAFETY: as above.
        unsafe { tile_avx2(g, nb, xs, k, t, out) };
    }
}

/// A row's 32 codes at `p` (element `8c + i` at byte `4i + c`) as 4 vectors of their values
/// times `2^-120`: vector `c` holds elements `8c..8c + 8`.
#[inline(always)]
unsafe fn widen32(p: *const u8) -> [__m256; 4] {
    // SAFETY: 32 readable bytes at `p` (caller); AVX2 enabled by the caller.
    unsafe {
        let q = _mm256_loadu_si256(p.cast());
        let mask = _mm256_set1_epi32(0x87F0_0000u32 as i32);
        // 16-bit lanes: the high byte (`4i + 1`, `4i + 3`) and the low one (`4i`, `4i + 2`)
        // at bits 4..11 with their sign above.
        let hi = _mm256_srai_epi16::<4>(q);
        let lo = _mm256_srai_epi16::<4>(_mm256_slli_epi16::<8>(q));
        let f = |v: __m256i| _mm256_castsi256_ps(_mm256_and_si256(v, mask));
        [
            f(_mm256_slli_epi32::<16>(lo)),
            f(_mm256_slli_epi32::<16>(hi)),
            f(lo),
            f(hi),
        ]
    }
}

/// Row `r`'s scale of the span header at `sc` (stored times `2^72`).
#[inline(always)]
unsafe fn scale(sc: *const u8, r: usize) -> __m256 {
    // SAFETY: 32 readable bytes at `sc` (caller), `r < 8`; AVX enabled by the caller.
    unsafe { _mm256_set1_ps(sc.add(4 * r).cast::<f32>().read_unaligned()) }
}

/// The 32 prescaled activations at `xb` as 4 vectors.
#[inline(always)]
unsafe fn acts(xb: *const f32) -> [__m256; 4] {
    // SAFETY: 32 readable floats at `xb` (caller); AVX enabled by the caller.
    unsafe { [0, 8, 16, 24].map(|o| _mm256_loadu_ps(xb.add(o))) }
}

/// `a + w * x[..8]`, the activations read by the FMA itself: held in registers (4 of them, as
/// LLVM hoists them), they left too few for 8 rows' chains and the widening, which spilled.
#[inline]
#[target_feature(enable = "avx,fma")]
unsafe fn fma_mem(a: __m256, w: __m256, x: *const f32) -> __m256 {
    let mut a = a;
    // SAFETY: 8 readable floats at `x` (caller); FMA enabled by the caller; reads only.
    unsafe {
        std::arch::asm!(
            "vfmadd231ps {a}, {w}, ymmword ptr [{x}]",
            a = inout(ymm_reg) a,
            w = in(ymm_reg) w,
            x = in(reg) x,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    a
}

/// `hsum8` of each row's lanes into `out[..8]`.
#[inline(always)]
unsafe fn store_rows(acc: &[__m256; 8], out: *mut f32) {
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: an `__m256` is 8 `f32`s; `out` holds 8 values (caller).
        unsafe { *out.add(r) = hsum8(&std::mem::transmute::<__m256, [f32; 8]>(*a)) };
    }
}

/// One token: each row's span lanes in registers, the activations of a block loaded once for
/// the 8 rows.
#[target_feature(enable = "avx2,fma")]
unsafe fn one_avx2(g: &[u8], nb: usize, xs: &[f32], out: &mut [f32]) {
    let (gp, xp) = (g.as_ptr(), xs.as_ptr());
    let ahead = crate::kernels::simd::prefetch_ahead();
    // SAFETY: every span header and block read is inside the group's `group_bytes(nb)` and
    // every activation inside `xs[..32 * nb]` (asserted by the caller); features enabled here.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); RG];
        let mut at = 0;
        for s in 0..spans(nb) {
            let sc = gp.add(at);
            at += 32;
            let mut blk = [_mm256_setzero_ps(); RG];
            for b in SPAN * s..(SPAN * s + SPAN).min(nb) {
                let p = gp.add(at);
                crate::kernels::simd::prefetch_stream(p, BLOCK8, ahead);
                let xb = xp.add(32 * b);
                for (r, blk) in blk.iter_mut().enumerate() {
                    let w = widen32(p.add(32 * r));
                    let mut a = *blk;
                    for (c, w) in w.iter().enumerate() {
                        a = fma_mem(a, *w, xb.add(8 * c));
                    }
                    *blk = a;
                }
                at += BLOCK8;
            }
            for (r, (acc, blk)) in acc.iter_mut().zip(blk).enumerate() {
                *acc = _mm256_fmadd_ps(scale(sc, r), blk, *acc);
            }
        }
        store_rows(&acc, out.as_mut_ptr());
    }
}

/// `2..=TILE` tokens: each block widened once into 32 vectors on the stack, then every
/// token's span lanes (kept in `blk`, L1) take its steps.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(g: &[u8], nb: usize, xs: &[f32], k: usize, t: usize, out: &mut [f32]) {
    let (gp, xp) = (g.as_ptr(), xs.as_ptr());
    // SAFETY: as `one_avx2`, for tokens `j < t` at `xs[j * k..]` and `out[j * 8..]`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); RG]; TILE];
        let mut blk = [[_mm256_setzero_ps(); RG]; TILE];
        let mut w = [_mm256_setzero_ps(); 4 * RG];
        let mut at = 0;
        for s in 0..spans(nb) {
            let sc = gp.add(at);
            at += 32;
            blk[..t].fill([_mm256_setzero_ps(); RG]);
            for b in SPAN * s..(SPAN * s + SPAN).min(nb) {
                let p = gp.add(at);
                for (r, w) in w.chunks_exact_mut(4).enumerate() {
                    w.copy_from_slice(&widen32(p.add(32 * r)));
                }
                for (j, blk) in blk.iter_mut().enumerate().take(t) {
                    let xv = acts(xp.add(j * k + 32 * b));
                    for (r, blk) in blk.iter_mut().enumerate() {
                        let mut a = *blk;
                        for (c, xv) in xv.iter().enumerate() {
                            a = _mm256_fmadd_ps(w[4 * r + c], *xv, a);
                        }
                        *blk = a;
                    }
                }
                at += BLOCK8;
            }
            for r in 0..RG {
                let d = scale(sc, r);
                for (acc, blk) in acc.iter_mut().zip(&blk).take(t) {
                    acc[r] = _mm256_fmadd_ps(d, blk[r], acc[r]);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate().take(t) {
            store_rows(acc, out.as_mut_ptr().add(j * RG));
        }
    }
}
