//! The register ops the 8-row k-quant dots (`arch/x86/qdot_rk.rs`) need beyond [`RowLanes`]:
//! byte shuffles within 128-bit lanes, `i16`/`i32` multiplies and shifts, and Q6_K's scale
//! bytes. At [`Zmm`] width every op is the [`Ymm`] one on each 256-bit half (the shuffles and
//! shifts never cross a 128-bit lane), so a body written over [`KLanes`] gives every row the
//! same integers at either width.
//!
//! Invariant (codegen and soundness): as `lanes.rs`: every op is `#[inline(always)]` and
//! `unsafe`, called only inside a `#[target_feature]` function enabling the width's features.

use std::arch::x86_64::*;

use crate::kernels::arch::x86::lanes::{Ymm, Zmm};
use crate::kernels::arch::x86::lanes_rows::RowLanes;

/// The k-quant dots' register ops at one width (see the module docs).
///
/// # Safety (every method)
/// As [`RowLanes`]; `bytes8` reads 8 bytes at `src` of every group.
pub(crate) trait KLanes: RowLanes {
    /// The four words `v` in every 128-bit lane.
    unsafe fn lane128(v: [i32; 4]) -> Self::I;
    /// `vpshufb`: bytes of `a` picked within each 128-bit lane by `m` (a set top bit gives 0).
    unsafe fn shuffle8(a: Self::I, m: Self::I) -> Self::I;
    /// `vpmaddwd`: adjacent `i16` products summed into `i32` lanes.
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mullo32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn srai32<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn srli32<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn slli32<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn srli16<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn fsub(a: Self::F, b: Self::F) -> Self::F;
    /// 8 signed bytes at `src` of every group, one per 32-bit lane (`vpmovsxbd`).
    unsafe fn bytes8(src: Self::Src) -> Self::I;
}

impl<const VNNI: bool> KLanes for Ymm<VNNI> {
    #[inline(always)]
    unsafe fn lane128(v: [i32; 4]) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[0], v[1], v[2], v[3]) }
    }
    #[inline(always)]
    unsafe fn shuffle8(a: __m256i, m: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_shuffle_epi8(a, m) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn mullo32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn srai32<const N: u32>(a: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_sra_epi32(a, _mm_cvtsi32_si128(N as i32)) }
    }
    #[inline(always)]
    unsafe fn srli32<const N: u32>(a: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_srl_epi32(a, _mm_cvtsi32_si128(N as i32)) }
    }
    #[inline(always)]
    unsafe fn slli32<const N: u32>(a: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_sll_epi32(a, _mm_cvtsi32_si128(N as i32)) }
    }
    #[inline(always)]
    unsafe fn srli16<const N: u32>(a: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_srl_epi16(a, _mm_cvtsi32_si128(N as i32)) }
    }
    #[inline(always)]
    unsafe fn fsub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bytes8(src: *const u8) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled, 8 bytes readable).
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(src.cast())) }
    }
}

impl<const VNNI: bool> KLanes for Zmm<VNNI> {
    #[inline(always)]
    unsafe fn lane128(v: [i32; 4]) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_set4_epi32(v[3], v[2], v[1], v[0]) }
    }
    #[inline(always)]
    unsafe fn shuffle8(a: __m512i, m: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_shuffle_epi8(a, m) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn mullo32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn srai32<const N: u32>(a: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_srai_epi32::<N>(a) }
    }
    #[inline(always)]
    unsafe fn srli32<const N: u32>(a: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_srli_epi32::<N>(a) }
    }
    #[inline(always)]
    unsafe fn slli32<const N: u32>(a: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_slli_epi32::<N>(a) }
    }
    #[inline(always)]
    unsafe fn srli16<const N: u32>(a: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_srli_epi16::<N>(a) }
    }
    #[inline(always)]
    unsafe fn fsub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bytes8((p0, p1): (*const u8, *const u8)) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled, 8 bytes readable at
        // each pointer).
        unsafe {
            let lo = _mm_loadl_epi64(p0.cast());
            let hi = _mm_loadl_epi64(p1.cast());
            _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(lo, hi))
        }
    }
}
