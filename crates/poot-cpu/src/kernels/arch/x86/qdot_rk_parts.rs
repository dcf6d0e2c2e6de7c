//! Register steps shared by the 8-row k-quant kernels (`arch/x86/qdot_rk.rs` on `maddubs`,
//! `arch/x86/qdot_rk_vnni.rs` on `vpdpbusd`): the activation broadcast, the byte picks, Q4_K's
//! scale and min unpacking and min sums, Q6_K's quant unpacking. Each is exact integer work on
//! the layout of `matmul/repack_k.rs`, so both kernels see the same integers.
//!
//! Invariant (soundness): every function here is `#[inline(always)]` and register-only or
//! reads what its caller vouches for; callers are `#[target_feature]` functions with AVX2
//! enabled.

use std::arch::x86_64::*;

use crate::kernels::matmul::repack_k::q4k;
use crate::kernels::qact::BlockQ8K;

/// 4 activation bytes at `p`, broadcast to every 32-bit lane.
#[inline(always)]
pub(super) unsafe fn bcast(p: *const i8) -> __m256i {
    // SAFETY: 4 readable bytes at `p` (caller); AVX enabled by the caller.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Shuffle masks that copy byte `j` of every 32-bit lane into both of its 16-bit halves
/// (zero-extended): per lane the bytes `[4l + j, 0x80, 4l + j, 0x80]`.
#[inline(always)]
pub(super) unsafe fn pick_masks() -> [__m256i; 4] {
    // SAFETY: register-only AVX2 ops; AVX2 enabled by the caller.
    unsafe {
        let lane = _mm256_setr_epi32(
            0, 0x4_0004, 0x8_0008, 0xc_000c, 0, 0x4_0004, 0x8_0008, 0xc_000c,
        );
        std::array::from_fn(|j| {
            let base = (0x8000_8000u32 + 0x1_0001 * j as u32) as i32;
            _mm256_add_epi32(lane, _mm256_set1_epi32(base))
        })
    }
}

/// Bits 6-7 of every byte of `w`, moved to bits 4-5 (the high bits of scales and mins 4-7).
#[inline(always)]
unsafe fn top2(w: __m256i, k3: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 ops; AVX2 enabled by the caller.
    unsafe { _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(w), k3)) }
}

/// ggml's 12-byte scale unpacking (its kmask1..3) of the Q4_K super-block at `s`, one row per
/// lane: the bytes of `sc[0]`, `sc[1]` are sub-blocks 0-3, 4-7's scales; `mn[0]`, `mn[1]`
/// their mins.
#[inline(always)]
pub(super) unsafe fn q4k_scales(s: *const u8) -> ([__m256i; 2], [__m256i; 2]) {
    // SAFETY: the super-block's 96 scale bytes are readable (caller); AVX2 enabled by it.
    unsafe {
        let k1 = _mm256_set1_epi32(0x3f3f_3f3f);
        let k2 = _mm256_set1_epi32(0x0f0f_0f0f);
        let k3 = _mm256_set1_epi32(0x0303_0303);
        let w0 = _mm256_loadu_si256(s.add(q4k::SCALES).cast());
        let w1 = _mm256_loadu_si256(s.add(q4k::SCALES + 32).cast());
        let w2 = _mm256_loadu_si256(s.add(q4k::SCALES + 64).cast());
        let sc = [
            _mm256_and_si256(w0, k1),
            _mm256_or_si256(_mm256_and_si256(w2, k2), top2(w0, k3)),
        ];
        let mn = [
            _mm256_and_si256(w1, k1),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(w2), k2),
                top2(w1, k3),
            ),
        ];
        (sc, mn)
    }
}

/// Q4_K's `summ` per row and token: the sum over sub-blocks `m` of `min_m * (bsums[2m] +
/// bsums[2m + 1])`, with `mn` from [`q4k_scales`].
#[inline(always)]
pub(super) unsafe fn q4k_mins<const T: usize>(
    mn: [__m256i; 2],
    pick: &[__m256i; 4],
    ab: &[&BlockQ8K; T],
) -> [__m256i; T] {
    // SAFETY: reads the `bsums` of `T` blocks (references); AVX2 enabled by the caller.
    unsafe {
        let mut msum = [_mm256_setzero_si256(); T];
        for m in 0..8 {
            let mp = _mm256_shuffle_epi8(mn[m / 4], pick[m % 4]);
            for j in 0..T {
                let pair = ab[j].bsums.as_ptr().add(2 * m).cast::<i32>();
                let bs = _mm256_set1_epi32(pair.read_unaligned());
                msum[j] = _mm256_add_epi32(msum[j], _mm256_madd_epi16(mp, bs));
            }
        }
        msum
    }
}

/// The 6-bit quants (0..63) of the Q6_K word triple at `qs` (layout: `repack_k::q6k::QS`), 8
/// rows' 4 bytes each per vector: vector `g` holds elements `32 g + 4 w..+4` of the half.
#[inline(always)]
pub(super) unsafe fn q6k_unpack(qs: *const u8) -> [__m256i; 4] {
    // SAFETY: 96 readable bytes at `qs` (caller); AVX2 enabled by the caller.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let ql0 = _mm256_loadu_si256(qs.cast());
        let ql1 = _mm256_loadu_si256(qs.add(32).cast());
        let qh = _mm256_loadu_si256(qs.add(64).cast());
        // As `arch::x86::qdot_k::unpack_q6k`: masks before shifts keep bits in bytes.
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(0x30)),
            ),
        ]
    }
}
