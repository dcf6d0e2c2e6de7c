//! How one step of the 8-row interleaved layout (`matmul/repack.rs`) is read at each register
//! width ([`RowLanes`], over `lanes.rs`'s [`Lanes`]): [`Ymm`] reads one group (8 rows, one per
//! 32-bit lane), [`Zmm`] two groups side by side (lanes 0-7 the first group's rows, 8-15 the
//! second's), so a body generic over `L: RowLanes` (`qdot_r.rs`, `qdot_zg.rs`, `qdot_rk.rs`)
//! runs the same instructions on the same values in every lane at either width. Split from
//! `lanes.rs`, which keeps the element-wise register ops.
//!
//! Invariant (codegen and soundness): as `lanes.rs`'s; every op is `#[inline(always)]` and
//! `unsafe`, run inside a `#[target_feature]` function enabling the width's features.

use std::arch::x86_64::*;

use crate::kernels::arch::x86::lanes::{Lanes, Ymm, Zmm};
use crate::kernels::simd::{prefetch_next, prefetch_next_distance, prefetch_stream};

/// How one step of the 8-row interleaved layout is read at a width (see the module docs).
///
/// # Safety (every method)
/// As [`Lanes`]; the pointers cover what each method reads in every group of `Src`.
pub(crate) trait RowLanes: Lanes {
    /// The groups a step reads: one pointer into one group, or one into each of two.
    type Src: Copy;
    /// Rows a step handles (`f32` lanes of `F`): 8 a group.
    const ROWS: usize;
    /// `src` moved `off` bytes on in every group.
    unsafe fn at(src: Self::Src, off: usize) -> Self::Src;
    /// 32 quant bytes at `src` of every group.
    unsafe fn quants(src: Self::Src) -> Self::I;
    /// 8 f16 values at `src` of every group, widened (exact).
    unsafe fn halves(src: Self::Src) -> Self::F;
    /// Q5_0's fifth bits of chunk `c` as `0x10` bytes (low nibbles', high nibbles'), from the
    /// 32 bytes at `hb` of every group ([`fifth_bits`]).
    unsafe fn fifth(hb: Self::Src, c: usize) -> (Self::I, Self::I);
    /// Each row's zero point (the 8 bytes at `z` of every group, Q4_Z) times `c`, exact in
    /// `i32` (`z <= 255`, `|c| <= 32 * 128`).
    unsafe fn zero_terms(z: Self::Src, c: i32) -> Self::I;
    /// The distance [`RowLanes::prefetch`] takes for a task whose groups are `group` bytes
    /// each.
    fn next_distance(group: usize) -> usize;
    /// The streaming prefetches for the superblock of `sb` bytes at `s` in every group.
    fn prefetch(s: Self::Src, sb: usize, ahead: usize, next: usize);
}

impl<const VNNI: bool> RowLanes for Ymm<VNNI> {
    type Src = *const u8;
    const ROWS: usize = 8;
    #[inline(always)]
    unsafe fn at(src: *const u8, off: usize) -> *const u8 {
        // SAFETY: the trait's contract (inside the group).
        unsafe { src.add(off) }
    }
    #[inline(always)]
    unsafe fn quants(src: *const u8) -> __m256i {
        // SAFETY: the trait's contract.
        unsafe { _mm256_loadu_si256(src.cast()) }
    }
    #[inline(always)]
    unsafe fn halves(src: *const u8) -> __m256 {
        // SAFETY: the trait's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast())) }
    }
    #[inline(always)]
    unsafe fn zero_terms(z: *const u8, c: i32) -> __m256i {
        // SAFETY: the trait's contract.
        unsafe {
            let z = _mm256_cvtepu8_epi32(_mm_loadl_epi64(z.cast()));
            _mm256_mullo_epi32(z, _mm256_set1_epi32(c))
        }
    }
    #[inline(always)]
    unsafe fn fifth(hb: *const u8, c: usize) -> (__m256i, __m256i) {
        // SAFETY: the trait's contract.
        unsafe { fifth_bits(hb, c) }
    }
    fn next_distance(_: usize) -> usize {
        0
    }
    #[inline(always)]
    fn prefetch(s: *const u8, sb: usize, ahead: usize, _: usize) {
        // One group: the next group's stream starts far away; within a group the hardware
        // prefetcher follows the sequential superblocks, so a few lines ahead is enough.
        prefetch_stream(s, sb, ahead);
    }
}

/// Two 256-bit halves as one register: `lo` in lanes 0-7, `hi` in 8-15.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    // SAFETY: AVX-512F enabled by the caller.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

impl<const VNNI: bool> RowLanes for Zmm<VNNI> {
    type Src = (*const u8, *const u8);
    const ROWS: usize = 16;
    #[inline(always)]
    unsafe fn at((p0, p1): Self::Src, off: usize) -> Self::Src {
        // SAFETY: the trait's contract (inside both groups).
        unsafe { (p0.add(off), p1.add(off)) }
    }
    #[inline(always)]
    unsafe fn quants((p0, p1): Self::Src) -> __m512i {
        // SAFETY: the trait's contract.
        unsafe { join(_mm256_loadu_si256(p0.cast()), _mm256_loadu_si256(p1.cast())) }
    }
    #[inline(always)]
    unsafe fn halves((p0, p1): Self::Src) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe {
            let h = _mm256_set_m128i(_mm_loadu_si128(p1.cast()), _mm_loadu_si128(p0.cast()));
            _mm512_cvtph_ps(h)
        }
    }
    #[inline(always)]
    unsafe fn zero_terms((z0, z1): Self::Src, c: i32) -> __m512i {
        // SAFETY: the trait's contract.
        unsafe {
            let z = _mm_unpacklo_epi64(_mm_loadl_epi64(z0.cast()), _mm_loadl_epi64(z1.cast()));
            _mm512_mullo_epi32(_mm512_cvtepu8_epi32(z), _mm512_set1_epi32(c))
        }
    }
    #[inline(always)]
    unsafe fn fifth((h0, h1): Self::Src, c: usize) -> (__m512i, __m512i) {
        // SAFETY: the trait's contract.
        unsafe {
            let (l0, g0) = fifth_bits(h0, c);
            let (l1, g1) = fifth_bits(h1, c);
            (join(l0, l1), join(g0, g1))
        }
    }
    fn next_distance(group: usize) -> usize {
        // Groups lie back to back, so the next pair starts two groups on.
        prefetch_next_distance(2 * group)
    }
    #[inline(always)]
    fn prefetch((s0, s1): Self::Src, sb: usize, ahead: usize, next: usize) {
        prefetch_stream(s0, sb, ahead);
        prefetch_stream(s1, sb, ahead);
        prefetch_next(s0, sb, next);
        prefetch_next(s1, sb, next);
    }
}

/// Q5_0's fifth bits of chunk `c` as `0x10` bytes, the low and the high nibbles', from the
/// 32 header bytes at `hb` (see `matmul/repack.rs`: byte `4r + i` holds bit `c` for chunk `c`'s
/// low nibble of row `r`'s byte `i`, bit `4 + c` for its high one). A 16-bit shift moves bit
/// `c` (or `4 + c`) of every byte to bit 4; what crosses from the neighbouring byte lands below
/// bit 4 (left shifts by 1-4) or above it (right shifts by 0-3), so the mask drops it.
///
/// # Safety
/// AVX2 enabled by the caller; 32 readable bytes at `hb`.
#[inline(always)]
pub(crate) unsafe fn fifth_bits(hb: *const u8, c: usize) -> (__m256i, __m256i) {
    // SAFETY: the contract above.
    unsafe {
        let h = _mm256_loadu_si256(hb.cast());
        let (lo, hi) = match c {
            0 => (_mm256_slli_epi16::<4>(h), h),
            1 => (_mm256_slli_epi16::<3>(h), _mm256_srli_epi16::<1>(h)),
            2 => (_mm256_slli_epi16::<2>(h), _mm256_srli_epi16::<2>(h)),
            _ => (_mm256_slli_epi16::<1>(h), _mm256_srli_epi16::<3>(h)),
        };
        let m = _mm256_set1_epi8(0x10);
        (_mm256_and_si256(lo, m), _mm256_and_si256(hi, m))
    }
}
