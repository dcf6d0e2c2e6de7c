//! AVX2 paths of `matmul/qdot_k.rs`: `maddubs` (unsigned 4/6-bit weights times signed Q8_K
//! activations, pairs summed to `i16` without saturation) then `madd` with the sub-block scale
//! (to `i32`), one integer sum per super-block, then the same float steps as the scalar path
//! (`blocks::finish`). Every integer step is exact, so results equal the scalar path's bits.
//!
//! Saturation: Q4_K pairs are at most `2 * 15 * 127 = 3810`, Q6_K pairs `2 * 63 * 127 =
//! 16002`, both below `i16::MAX`; `madd` with scales below 64 (Q4_K) or 128 (Q6_K, signed)
//! keeps `i32` lanes far from overflow (at most `2^23` per super-block).
//!
//! Invariant (soundness): reached only through the k-quant matmul's token dot with a `Checked`
//! AVX2 or AVX-512 token, which proves AVX2, FMA and F16C were detected.

use std::arch::x86_64::*;

use crate::kernels::blocks::{finish, scale_min_k4};
use crate::kernels::format::{id, Format};
use crate::kernels::qact::BlockQ8K;
use crate::kernels::simd::Checked;

/// `out[j] = dot(w, a[j * nb..(j + 1) * nb])` for every `j < out.len()`, the k-quant matmul's
/// token dot (the same contract as its portable loop). `w` holds `nb` whole blocks and `a`
/// `out.len() * nb` (asserted).
pub(crate) fn dot_tokens(
    _ck: Checked,
    kind: Format,
    w: &[u8],
    a: &[BlockQ8K],
    nb: usize,
    out: &mut [f32],
) {
    let bb = kind.block_bytes();
    assert!(
        w.len() >= nb * bb && a.len() >= out.len() * nb,
        "qdot_k shapes"
    );
    let mut j = 0;
    while j < out.len() {
        let take = if out.len() - j >= 4 { 4 } else { 1 };
        let (a, o) = (&a[j * nb..(j + take) * nb], &mut out[j..j + take]);
        // SAFETY: the `Checked` token proves AVX2/FMA/F16C (module invariant); block `i < nb`
        // spans `w[i * bb..(i + 1) * bb]` and token `t < take` has blocks `a[t * nb..][..nb]`,
        // inside the slices by the assert.
        unsafe {
            match (kind, take) {
                (Format::Q4_K, 4) => dot_avx2::<{ id::Q4_K }, 4>(w, a, nb, o),
                (Format::Q6_K, 4) => dot_avx2::<{ id::Q6_K }, 4>(w, a, nb, o),
                (Format::Q4_K, _) => dot_avx2::<{ id::Q4_K }, 1>(w, a, nb, o),
                (Format::Q6_K, _) => dot_avx2::<{ id::Q6_K }, 1>(w, a, nb, o),
                (other, _) => unreachable!("{other:?} is no k-quant with a dot"),
            }
        }
        j += take;
    }
}

/// One row against `T` tokens: each weight block is unpacked once (`Unpacked`) and dotted
/// against the `T` tokens' blocks; per token the float steps are `blocks::finish`'s, in
/// block order, so the bits do not depend on `T`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<const KIND: u8, const T: usize>(
    w: &[u8],
    a: &[BlockQ8K],
    nb: usize,
    out: &mut [f32],
) {
    let kind = Format::from_id(KIND);
    let bb = kind.block_bytes();
    let mut acc = [[0.0f32; 2]; T];
    for i in 0..nb {
        let b = &w[i * bb..(i + 1) * bb];
        // A prefetch never faults; the next blocks of this row are what we read next.
        _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(4 * bb).cast());
        // SAFETY: `b` is one whole block (sliced above); AVX2 is enabled on this function.
        let u = unsafe {
            if KIND == id::Q4_K {
                unpack_q4k(b)
            } else {
                unpack_q6k(b)
            }
        };
        for (j, acc) in acc.iter_mut().enumerate() {
            let y = &a[j * nb + i];
            // SAFETY: AVX2 enabled on this function; `u` holds this block's quants.
            let ints = unsafe { ints(&u, y) };
            finish(kind, b, y, ints, acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(&acc) {
        *o = acc[0] - acc[1];
    }
}

/// One weight block as 8 vectors of 32 unsigned quants (vector `v` holds elements
/// `32v..32v + 32`), each vector's 16-bit scales (low and high 16 elements), and the
/// per-16-element factors of the block-sum term as 16-bit lanes: Q6_K's `-32 * scale` (its
/// offset), or Q4_K's min of each 32-element sub-block, repeated for its two 16-sums.
struct Unpacked {
    q: [__m256i; 8],
    scales: [__m256i; 8],
    bsum_factors: __m256i,
    q6: bool,
}

/// Exact `(sumi, summ)` of an unpacked block against `y` (the portable `q4k_ints`/`q6k_ints`
/// of the k-quant matmul). Factor products fit `i16` (`|-32 * 128| = 4096`, mins
/// below 64) and their `madd` sums `i32`.
#[inline(always)]
unsafe fn ints(u: &Unpacked, y: &BlockQ8K) -> (i32, i32) {
    // SAFETY: `y.qs` holds 256 bytes (8 loads of 32) and `y.bsums` 32 bytes; AVX2 enabled by
    // the caller.
    unsafe {
        let mut sumv = _mm256_setzero_si256();
        for v in 0..8 {
            let yv = _mm256_loadu_si256(y.qs.as_ptr().add(32 * v).cast());
            let p16 = _mm256_maddubs_epi16(u.q[v], yv);
            sumv = _mm256_add_epi32(sumv, _mm256_madd_epi16(p16, u.scales[v]));
        }
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let corr = _mm256_madd_epi16(bs, u.bsum_factors);
        if u.q6 {
            (hsum_i32(_mm256_add_epi32(sumv, corr)), 0)
        } else {
            (hsum_i32(sumv), hsum_i32(corr))
        }
    }
}

/// Unpacks one Q4_K block (144 bytes at `b`).
#[inline(always)]
unsafe fn unpack_q4k(b: &[u8]) -> Unpacked {
    let sc = &b[4..16];
    // SAFETY: `b` holds 144 bytes (loads at 16 + 32c, c < 4); AVX2 enabled by the caller.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let mut u = Unpacked {
            q: [_mm256_setzero_si256(); 8],
            scales: [_mm256_setzero_si256(); 8],
            bsum_factors: _mm256_setzero_si256(),
            q6: false,
        };
        let mut mins = [0i16; 16];
        for c in 0..4 {
            let q = _mm256_loadu_si256(b.as_ptr().add(16 + c * 32).cast());
            u.q[2 * c] = _mm256_and_si256(q, mask);
            u.q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask);
            for h in 0..2 {
                let (s, m) = scale_min_k4(2 * c + h, sc);
                u.scales[2 * c + h] = _mm256_set1_epi16(s as i16);
                mins[2 * (2 * c + h)] = m as i16;
                mins[2 * (2 * c + h) + 1] = m as i16;
            }
        }
        u.bsum_factors = _mm256_loadu_si256(mins.as_ptr().cast());
        u
    }
}

/// Unpacks one Q6_K block (210 bytes at `b`) to unsigned 6-bit quants (the `-32` offset is
/// applied through the block sums).
#[inline(always)]
unsafe fn unpack_q6k(b: &[u8]) -> Unpacked {
    // SAFETY: `b` holds 210 bytes (loads end at 64 + 64 and 128 + 64); AVX2 enabled by the
    // caller.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut u = Unpacked {
            q: [_mm256_setzero_si256(); 8],
            scales: [_mm256_setzero_si256(); 8],
            bsum_factors: _mm256_setzero_si256(),
            q6: true,
        };
        let mut factors = [0i16; 16];
        for n in 0..2 {
            let p = b.as_ptr();
            let ql0 = _mm256_loadu_si256(p.add(n * 64).cast());
            let ql1 = _mm256_loadu_si256(p.add(n * 64 + 32).cast());
            let qh = _mm256_loadu_si256(p.add(128 + n * 32).cast());
            // Masks before shifts keep every bit inside its byte.
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(0x30)),
                ),
            ];
            for (g, qg) in q.into_iter().enumerate() {
                let (lo, hi) = (
                    b[192 + n * 8 + 2 * g] as i8,
                    b[192 + n * 8 + 2 * g + 1] as i8,
                );
                u.q[4 * n + g] = qg;
                u.scales[4 * n + g] =
                    _mm256_set_m128i(_mm_set1_epi16(i16::from(hi)), _mm_set1_epi16(i16::from(lo)));
                factors[n * 8 + 2 * g] = -32 * i16::from(lo);
                factors[n * 8 + 2 * g + 1] = -32 * i16::from(hi);
            }
        }
        u.bsum_factors = _mm256_loadu_si256(factors.as_ptr().cast());
        u
    }
}

/// Exact sum of the eight `i32` lanes.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only AVX2 ops; AVX2 enabled by the caller.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        _mm_cvtsi128_si32(s)
    }
}
