//! x86 inner loops for float weights read as stored (F16 / BF16 halves, widened in registers).
//!
//! - [`lanes8_rows_avx2`]: `R` rows against one token in tinyBLAS's 8 lanes (lane `i % 8`),
//!   the chains `matmul/lanes8.rs` runs for several tokens; the caller sums each by `hsum8`.
//! - [`lanes32_avx2`], [`lanes32_avx512`]: `R` rows against one token in ggml's
//!   `ggml_vec_dot_f16` lane order (lane `i % 32` over whole 32-groups), one body over the
//!   register width (`arch/x86/lanes.rs`); the caller folds the lanes and adds the tail.
//! - [`chunk8_avx2`]: 4 decoded f32 rows against `TT` tokens in 8 lanes (llamafile tinyBLAS's
//!   order) over one chunk of `k`, the lane chains carried between chunks, each result summed by
//!   `ggml::hsum8`. Its 512-bit counterpart (`chunk16`, in the 16-lane module that builds on
//!   this one) is a different tiling rather than a wider register, so the two keep their own
//!   bodies.
//!
//! Invariant (soundness): every function here is `unsafe` with the contract that the caller
//! holds a `Checked` token for the ISA the function's `target_feature` names, and that the
//! pointers cover the lengths stated on each function.

use std::arch::x86_64::*;

use crate::kernels::arch::x86::lanes::{Avx2, Lanes, Zmm};
use crate::kernels::format::id::{F16, F32};
use crate::kernels::ggml::hsum8;
use crate::kernels::simd::NR;

/// 8 stored halves at `p` widened to `f32` (exact).
#[inline(always)]
pub(crate) unsafe fn load8<const KIND: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract: AVX2 and F16C, 16 readable bytes at `p`.
    unsafe {
        let h = _mm_loadu_si128(p.cast());
        if KIND == F16 {
            _mm256_cvtph_ps(h)
        } else {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// tinyBLAS's 8 lanes of `R` stored rows (`rb` bytes apart) against one token: `out[r][l] =
/// fma(w[8(k/8 - 1) + l], x[..], ... fma(w[l], x[l], 0))`, the chain `ggml::dot_lanes8` runs
/// before its `hsum8`, for `k` (a multiple of 8) elements of format id `KIND` (`id::F16`, `id::BF16`,
/// `id::F32`). Each row's lanes are one FMA chain along `k`, so that a token's result is the same
/// whichever token count the matmul ran with (`matmul/lanes8.rs` runs the same chains);
/// `R` rows side by side hide the FMA latency one chain would wait on.
///
/// # Safety
/// AVX2, FMA and F16C detected; `R` rows of `k` elements at `w`, `rb` bytes apart; `k` floats
/// at `x`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn lanes8_rows_avx2<const KIND: u8, const R: usize>(
    w: *const u8,
    rb: usize,
    k: usize,
    x: *const f32,
) -> [[f32; 8]; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let es = if KIND == F32 { 4 } else { 2 };
    let ahead = crate::kernels::simd::prefetch_float_ahead();
    let mut i = 0;
    // SAFETY: i + 8 <= k for every load; a prefetch never faults.
    unsafe {
        while i < k {
            let xv = _mm256_loadu_ps(x.add(i));
            for (r, a) in acc.iter_mut().enumerate() {
                let p = w.add(r * rb + es * i);
                if i % 32 == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead).cast());
                }
                let wv = if KIND == F32 {
                    _mm256_loadu_ps(p.cast())
                } else {
                    load8::<KIND>(p)
                };
                *a = _mm256_fmadd_ps(wv, xv, *a);
            }
            i += 8;
        }
    }
    let mut out = [[0.0f32; 8]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        // SAFETY: `o` holds 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
    }
    out
}

/// ggml's 32 lanes of `R` F16 rows (`rb` bytes apart) against one token: `out[r][l] = sum
/// over whole 32-groups g of fma(w[32g + l], x[32g + l])`, in `g` order, for `k32` (a multiple
/// of 32) elements; written once over [`Lanes`] (`32 / L::LANES` registers a row), so the
/// 256- and 512-bit forms run the same FMA chain in every lane: the same bits.
///
/// # Safety
/// `L`'s features enabled by the caller; `R` rows of `2 * k32` bytes at `w`, `rb` apart;
/// `k32` floats at `x`.
#[inline(always)]
unsafe fn lanes32_body<L: Lanes, const R: usize>(
    w: *const u8,
    rb: usize,
    k32: usize,
    x: *const f32,
) -> [[f32; 32]; R] {
    // Registers a row: 2 (512 bits) or 4 (256); arrays of 4, the unused ones never touched.
    let regs = 32 / L::LANES;
    // SAFETY: the contract above.
    let mut acc = [[unsafe { L::zero() }; 4]; R];
    let ahead = L::float_ahead();
    let mut i = 0;
    // SAFETY: i + 32 <= k32 for every load; a prefetch never faults.
    unsafe {
        while i < k32 {
            for r in 0..R {
                L::prefetch_float(w.wrapping_add(r * rb + 2 * i + ahead));
            }
            let mut xv = [L::zero(); 4];
            for (q, v) in xv.iter_mut().enumerate().take(regs) {
                *v = L::load(x.add(i + L::LANES * q));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let p = w.add(r * rb + 2 * i);
                for q in 0..regs {
                    a[q] = L::fma(L::load_f16(p.add(2 * L::LANES * q)), xv[q], a[q]);
                }
            }
            i += 32;
        }
    }
    let mut out = [[0.0f32; 32]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (q, v) in a.iter().enumerate().take(regs) {
            // SAFETY: o[LANES q..LANES (q + 1)] is inside `o`; the caller's features.
            unsafe { L::store(o.as_mut_ptr().add(L::LANES * q), *v) };
        }
    }
    out
}

/// [`lanes32_body`] in 512-bit registers.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C detected; [`lanes32_body`]'s pointer contract.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn lanes32_avx512<const R: usize>(
    w: *const u8,
    rb: usize,
    k32: usize,
    x: *const f32,
) -> [[f32; 32]; R] {
    // SAFETY: the contract above; this function's features cover `Zmm`'s float ops.
    unsafe { lanes32_body::<Zmm, R>(w, rb, k32, x) }
}

/// [`lanes32_body`] in 256-bit registers.
///
/// # Safety
/// AVX2, FMA and F16C detected; [`lanes32_body`]'s pointer contract.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn lanes32_avx2<const R: usize>(
    w: *const u8,
    rb: usize,
    k32: usize,
    x: *const f32,
) -> [[f32; 32]; R] {
    // SAFETY: the contract above; this function's features cover `Avx2`'s float ops.
    unsafe { lanes32_body::<Avx2, R>(w, rb, k32, x) }
}

/// An element of [`chunk8_avx2`]'s packed operands: f16 bits (widened by F16C, exact) or `f32`.
pub(crate) trait Lane8: Copy + crate::kernels::scratch::Parked + Send + Sync {
    /// 8 elements at `p` as `f32`.
    ///
    /// # Safety
    /// AVX2 and F16C detected; 8 readable elements at `p`.
    unsafe fn load8(p: *const Self) -> __m256;
    /// Whether `Self` is `u16` (f16 bits), which [`chunk8_avx2`]'s hand-allocated loop takes.
    const HALF: bool;
}

impl Lane8 for u16 {
    const HALF: bool = true;
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        // SAFETY: the caller's contract (F16C, 16 readable bytes).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

impl Lane8 for f32 {
    const HALF: bool = false;
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract (32 readable bytes).
        unsafe { _mm256_loadu_ps(p) }
    }
}

/// One k-chunk of tinyBLAS's 8-lane order for `NR` rows against `TT` tokens, both packed in
/// 8-element slices: slice `s` of row `r` at `w + (s * NR + r) * 8`, of token `j` at `x + (s *
/// TT + j) * 8`, `s < len / 8`. Lane `l` of output `(j, r)` continues its chain with `fma(w,
/// x, lane)` slice after slice. The chains start at zero when `first`, else from `part` (`TT
/// * NR * 8` floats: `part[(j * NR + r) * 8 + l]`); when `last` the lane sums (`ggml::hsum8`)
/// go to `res[j * NR + r]`, else the lanes go back to `part`. Splitting `k` into chunks
/// changes no bit: each chain is the same sequence of FMAs as one pass over `k`.
///
/// # Safety
/// The callers' target features (AVX2, FMA, F16C); `NR * len` elements at `w`, `TT * len` at
/// `x`, `len % 8 == 0`; `part.len() >= TT * NR * 8` and `res.len() >= TT * NR`.
#[inline(always)]
unsafe fn chunk8_body<E: Lane8, const TT: usize>(
    w: *const E,
    x: *const E,
    len: usize,
    part: &mut [f32],
    (first, last): (bool, bool),
    res: &mut [f32],
) {
    assert!(part.len() >= TT * NR * 8 && res.len() >= TT * NR);
    let pp = part.as_mut_ptr();
    // SAFETY: slice s < len / 8 stays inside both operands (the contract); `part` holds
    // TT * NR * 8 floats (asserted).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NR]; TT];
        if !first {
            for (j, a) in acc.iter_mut().enumerate() {
                for (r, v) in a.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(pp.add((j * NR + r) * 8));
                }
            }
        }
        let (mut wp, mut xp) = (w, x);
        for _ in 0..len / 8 {
            let mut xv = [_mm256_setzero_ps(); TT];
            for (j, v) in xv.iter_mut().enumerate() {
                *v = E::load8(xp.add(j * 8));
            }
            for r in 0..NR {
                let wv = E::load8(wp.add(r * 8));
                for (j, a) in acc.iter_mut().enumerate() {
                    a[r] = _mm256_fmadd_ps(wv, xv[j], a[r]);
                }
            }
            wp = wp.add(NR * 8);
            xp = xp.add(TT * 8);
        }
        finish_chains(acc.as_flattened(), part, last, res);
    }
}

/// The chains `acc[i]` (`i = j * NR + r`) of a tile: their lane sums (`ggml::hsum8`) into
/// `res[i]` when `last`, else the lanes back into `part[i * 8..]`.
#[inline(always)]
fn finish_chains(acc: &[__m256], part: &mut [f32], last: bool, res: &mut [f32]) {
    assert!(part.len() >= acc.len() * 8 && res.len() >= acc.len());
    for (i, v) in acc.iter().enumerate() {
        if last {
            let mut l = [0.0f32; 8];
            // SAFETY: `l` holds 8 floats.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *v) };
            res[i] = hsum8(&l);
        } else {
            // SAFETY: i * 8 + 8 <= part.len() (asserted).
            unsafe { _mm256_storeu_ps(part.as_mut_ptr().add(i * 8), *v) };
        }
    }
}

/// [`chunk8_body`] on AVX2's 16 registers (up to 3 tokens: 12 chains, 3 tokens, 1 row).
///
/// # Safety
/// AVX2, FMA and F16C detected; [`chunk8_body`]'s pointer contract.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn chunk8_avx2<E: Lane8, const TT: usize>(
    w: *const E,
    x: *const E,
    len: usize,
    part: &mut [f32],
    ends: (bool, bool),
    res: &mut [f32],
) {
    if E::HALF && TT == 3 {
        // SAFETY: E is u16 (`HALF`), so the pointers are f16 bits; the contract carries over.
        return unsafe { chunk8_h3(w.cast(), x.cast(), len, part, ends, res) };
    }
    // SAFETY: the features this function enables; the pointer contract is the caller's.
    unsafe { chunk8_body::<E, TT>(w, x, len, part, ends, res) }
}

/// [`chunk8_body`] for f16 operands and 3 tokens with the 16 registers allocated by hand:
/// chains in ymm0-11 (`acc[j][r]` in `ymm(4j + r)`), the 3 tokens' slices in ymm12-14, a row's
/// in ymm15. The compiler's allocation of the same loop spilled one chain to the stack, which
/// put a store and a reload on that chain's FMA latency every step (half the speed). Same
/// FMAs in the same order, so the same bits.
///
/// # Safety
/// AVX2, FMA and F16C detected; [`chunk8_body`]'s contract with `TT = 3`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk8_h3(
    w: *const u16,
    x: *const u16,
    len: usize,
    part: &mut [f32],
    (first, last): (bool, bool),
    res: &mut [f32],
) {
    assert!(part.len() >= 3 * NR * 8 && res.len() >= 3 * NR && len.is_multiple_of(8));
    let pp = part.as_mut_ptr();
    let mut a = [_mm256_setzero_ps(); 12];
    if !first {
        for (i, v) in a.iter_mut().enumerate() {
            // SAFETY: i * 8 + 8 <= 12 * 8 floats of `part` (asserted).
            *v = unsafe { _mm256_loadu_ps(pp.add(i * 8)) };
        }
    }
    if len > 0 {
        // SAFETY: len / 8 steps read 64 bytes of `w` and 48 of `x` each, inside the operands
        // (the contract); only the named registers are written.
        unsafe {
            std::arch::asm!(
                "2:",
                "vcvtph2ps ymm12, xmmword ptr [{x}]",
                "vcvtph2ps ymm13, xmmword ptr [{x} + 16]",
                "vcvtph2ps ymm14, xmmword ptr [{x} + 32]",
                "vcvtph2ps ymm15, xmmword ptr [{w}]",
                "vfmadd231ps ymm0, ymm15, ymm12",
                "vfmadd231ps ymm4, ymm15, ymm13",
                "vfmadd231ps ymm8, ymm15, ymm14",
                "vcvtph2ps ymm15, xmmword ptr [{w} + 16]",
                "vfmadd231ps ymm1, ymm15, ymm12",
                "vfmadd231ps ymm5, ymm15, ymm13",
                "vfmadd231ps ymm9, ymm15, ymm14",
                "vcvtph2ps ymm15, xmmword ptr [{w} + 32]",
                "vfmadd231ps ymm2, ymm15, ymm12",
                "vfmadd231ps ymm6, ymm15, ymm13",
                "vfmadd231ps ymm10, ymm15, ymm14",
                "vcvtph2ps ymm15, xmmword ptr [{w} + 48]",
                "vfmadd231ps ymm3, ymm15, ymm12",
                "vfmadd231ps ymm7, ymm15, ymm13",
                "vfmadd231ps ymm11, ymm15, ymm14",
                "add {w}, 64",
                "add {x}, 48",
                "dec {n}",
                "jnz 2b",
                w = inout(reg) w => _,
                x = inout(reg) x => _,
                n = inout(reg) len / 8 => _,
                inout("ymm0") a[0], inout("ymm1") a[1], inout("ymm2") a[2], inout("ymm3") a[3],
                inout("ymm4") a[4], inout("ymm5") a[5], inout("ymm6") a[6], inout("ymm7") a[7],
                inout("ymm8") a[8], inout("ymm9") a[9], inout("ymm10") a[10],
                inout("ymm11") a[11],
                out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                options(nostack, readonly),
            );
        }
    }
    finish_chains(&a, part, last, res);
}
