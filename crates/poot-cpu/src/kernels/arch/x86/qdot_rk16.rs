//! The 8-row Q4_K dot (`arch/x86/qdot_rk.rs`) two groups at a time in 512-bit registers, for
//! AVX-512 BW: lanes 0-7 hold group `g`'s rows, lanes 8-15 group `g + 1`'s.
//!
//! Why: Q4_K prefill is bound by the kernel's `maddubs`/`madd` steps; here each step does 16
//! rows' work for the same instruction count, though it gains far less than the halved count
//! suggests. `matmul::rk` uses it for prefill only; one-token calls measured the same either
//! way (measurements: `docs/performance-history.md`, "Measurements behind the kernels").
//!
//! With AVX-512 VNNI the integer dots are `vpdpbusd` (`q4k_vnni`, as `arch/x86/qdot_rk_vnni.rs`
//! in 256 bits): 64 tokens against a [4096 x 1536] Q4_K matrix on one core took 3.8 ms, against
//! 4.7-4.9 ms without VNNI, here or in 256 bits (minimums of 4-5 runs on a shared machine).
//!
//! Numerics: every lane runs the 256-bit kernel's integer steps for its row (exact), and the
//! float steps are the same `fma(d * dy, sumi, acc)` chain per row and token, so results are
//! bit-identical to `arch::x86::qdot_rk::group` and `matmul::qdot_k::dot_scalar` (tested).
//!
//! Invariant (soundness): reached only through `matmul_rk` after [`available`] was true.

use std::arch::x86_64::*;

use crate::kernels::blocks::KKind;
use crate::kernels::blocks::RG;
use crate::kernels::matmul::repack_k::q4k;
use crate::kernels::qact::BlockQ8K;

/// Whether this CPU has the 512-bit byte and word ops the kernel uses.
pub(crate) fn available() -> bool {
    crate::CpuFeatures::get().avx512_bytes()
}

/// Tokens one call handles.
pub(crate) const TOKENS: usize = 2;

/// `out[j * 16 + r]` = row `r` of Q4_K groups `g0` (`r < 8`) and `g1` (`r >= 8`) dotted with
/// token `j < t` (`t <= TOKENS`; blocks `a[j * nb..]`).
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_rk` sizes them).
pub(crate) fn groups2(g0: &[u8], g1: &[u8], nb: usize, a: &[BlockQ8K], t: usize, out: &mut [f32]) {
    let vnni = crate::CpuFeatures::get().vnni512();
    groups2_on(vnni, g0, g1, nb, a, t, out);
}

/// [`groups2`] with `vpdpbusd` for the integer dots or not (`vnni` needs
/// `CpuFeatures::vnni512`; the same bits either way).
fn groups2_on(
    vnni: bool,
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
) {
    assert!(!vnni || crate::CpuFeatures::get().vnni512());
    let need = nb * RG * KKind::Q4_K.block_bytes();
    assert!(g0.len() >= need && g1.len() >= need && available());
    assert!((1..=TOKENS).contains(&t) && a.len() >= t * nb && out.len() >= t * 2 * RG);
    // SAFETY: AVX-512 F/BW, FMA and F16C detected (`available`), VNNI and VL too where `vnni`;
    // bounds asserted above.
    unsafe {
        match (vnni, t) {
            (true, 2) => q4k_vnni::<2>(g0, g1, nb, a, out),
            (true, _) => q4k_vnni::<1>(g0, g1, nb, a, out),
            (false, 2) => q4k::<2>(g0, g1, nb, a, out),
            (false, _) => q4k::<1>(g0, g1, nb, a, out),
        }
    }
}

/// 32 bytes at `off` of each group as one register.
#[inline(always)]
unsafe fn load2(p0: *const u8, p1: *const u8, off: usize) -> __m512i {
    // SAFETY: 32 readable bytes at each pointer plus `off` (caller); AVX-512F enabled.
    unsafe {
        let lo = _mm256_loadu_si256(p0.add(off).cast());
        let hi = _mm256_loadu_si256(p1.add(off).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// `arch::x86::qdot_rk::pick_masks` in every 128-bit lane of a 512-bit register.
#[inline(always)]
unsafe fn pick_masks() -> [__m512i; 4] {
    // SAFETY: register-only AVX-512F ops; enabled by the caller.
    unsafe {
        let lane = _mm512_set4_epi32(0xc_000c, 0x8_0008, 0x4_0004, 0);
        std::array::from_fn(|j| {
            let base = (0x8000_8000u32 + 0x1_0001 * j as u32) as i32;
            _mm512_add_epi32(lane, _mm512_set1_epi32(base))
        })
    }
}

/// Bits 6-7 of every byte of `w`, moved to bits 4-5.
#[inline(always)]
unsafe fn top2(w: __m512i, k3: __m512i) -> __m512i {
    // SAFETY: register-only AVX-512F ops; enabled by the caller.
    unsafe { _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(w), k3)) }
}

#[target_feature(enable = "avx512f,avx512bw,fma,f16c")]
unsafe fn q4k<const T: usize>(g0: &[u8], g1: &[u8], nb: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let sb = RG * KKind::Q4_K.block_bytes();
    // SAFETY: bounds asserted by `groups2`; the features are this function's.
    unsafe {
        let (p0, p1) = (g0.as_ptr(), g1.as_ptr());
        let m4 = _mm512_set1_epi8(0x0f);
        let k1 = _mm512_set1_epi32(0x3f3f_3f3f);
        let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
        let k3 = _mm512_set1_epi32(0x0303_0303);
        let pick = pick_masks();
        let ahead = crate::kernels::simd::prefetch_ahead();
        let mut acc = [_mm512_setzero_ps(); T];
        let mut accm = [_mm512_setzero_ps(); T];
        let word = |p: *const i8| _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
        for b in 0..nb {
            let (s0, s1) = (p0.add(b * sb), p1.add(b * sb));
            crate::kernels::simd::prefetch_stream(s0, sb, ahead);
            crate::kernels::simd::prefetch_stream(s1, sb, ahead);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let w0 = load2(s0, s1, q4k::SCALES);
            let w1 = load2(s0, s1, q4k::SCALES + 32);
            let w2 = load2(s0, s1, q4k::SCALES + 64);
            let sc = [
                _mm512_and_si512(w0, k1),
                _mm512_or_si512(_mm512_and_si512(w2, k2), top2(w0, k3)),
            ];
            let mn = [
                _mm512_and_si512(w1, k1),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<4>(w2), k2),
                    top2(w1, k3),
                ),
            ];
            let mut isum = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let mut lo = [_mm512_setzero_si512(); T];
                let mut hi = [_mm512_setzero_si512(); T];
                for w in 0..8 {
                    let v = load2(s0, s1, q4k::QS + 32 * (8 * c + w));
                    let wl = _mm512_and_si512(v, m4);
                    let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr().add(64 * c + 4 * w);
                        lo[j] = _mm512_add_epi16(lo[j], _mm512_maddubs_epi16(wl, word(y)));
                        hi[j] = _mm512_add_epi16(hi[j], _mm512_maddubs_epi16(wh, word(y.add(32))));
                    }
                }
                let sl = _mm512_shuffle_epi8(sc[c / 2], pick[(2 * c) % 4]);
                let sh = _mm512_shuffle_epi8(sc[c / 2], pick[(2 * c + 1) % 4]);
                for j in 0..T {
                    let p = _mm512_add_epi32(
                        _mm512_madd_epi16(lo[j], sl),
                        _mm512_madd_epi16(hi[j], sh),
                    );
                    isum[j] = _mm512_add_epi32(isum[j], p);
                }
            }
            let mut msum = [_mm512_setzero_si512(); T];
            for m in 0..8 {
                let mp = _mm512_shuffle_epi8(mn[m / 4], pick[m % 4]);
                for j in 0..T {
                    let bs = word(ab[j].bsums.as_ptr().add(2 * m).cast());
                    msum[j] = _mm512_add_epi32(msum[j], _mm512_madd_epi16(mp, bs));
                }
            }
            let halves = |off: usize| {
                let h = _mm256_set_m128i(
                    _mm_loadu_si128(s1.add(off).cast()),
                    _mm_loadu_si128(s0.add(off).cast()),
                );
                _mm512_cvtph_ps(h)
            };
            let (d16, dm16) = (halves(q4k::D), halves(q4k::DMIN));
            for j in 0..T {
                let dy = _mm512_set1_ps(ab[j].d);
                acc[j] =
                    _mm512_fmadd_ps(_mm512_mul_ps(d16, dy), _mm512_cvtepi32_ps(isum[j]), acc[j]);
                accm[j] = _mm512_fmadd_ps(
                    _mm512_mul_ps(dm16, dy),
                    _mm512_cvtepi32_ps(msum[j]),
                    accm[j],
                );
            }
        }
        for j in 0..T {
            _mm512_storeu_ps(
                out.as_mut_ptr().add(2 * RG * j),
                _mm512_sub_ps(acc[j], accm[j]),
            );
        }
    }
}

/// [`q4k`] with `vpdpbusd` for the integer dots, as `arch::x86::qdot_rk_vnni` does in 256 bits
/// (its module docs give the exactness argument: the high nibbles are dotted in place, times
/// 16, and shifted back once per super-block): the same integers, so the same bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q4k_vnni<const T: usize>(
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    out: &mut [f32],
) {
    let sb = RG * KKind::Q4_K.block_bytes();
    // SAFETY: bounds asserted by `groups2`; the features are this function's.
    unsafe {
        let (p0, p1) = (g0.as_ptr(), g1.as_ptr());
        let m4 = _mm512_set1_epi8(0x0f);
        let mh = _mm512_set1_epi8(0xf0u8 as i8);
        let k1 = _mm512_set1_epi32(0x3f3f_3f3f);
        let k2 = _mm512_set1_epi32(0x0f0f_0f0f);
        let k3 = _mm512_set1_epi32(0x0303_0303);
        let pick = pick_masks();
        // Byte j of every 32-bit lane, zero-extended to the lane.
        let pick32: [__m512i; 4] = std::array::from_fn(|j| {
            let lane = _mm512_set4_epi32(12, 8, 4, 0);
            _mm512_add_epi32(lane, _mm512_set1_epi32((0x8080_8000u32 + j as u32) as i32))
        });
        let ahead = crate::kernels::simd::prefetch_ahead();
        let mut acc = [_mm512_setzero_ps(); T];
        let mut accm = [_mm512_setzero_ps(); T];
        let word = |p: *const i8| _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
        for b in 0..nb {
            let (s0, s1) = (p0.add(b * sb), p1.add(b * sb));
            crate::kernels::simd::prefetch_stream(s0, sb, ahead);
            crate::kernels::simd::prefetch_stream(s1, sb, ahead);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let w0 = load2(s0, s1, q4k::SCALES);
            let w1 = load2(s0, s1, q4k::SCALES + 32);
            let w2 = load2(s0, s1, q4k::SCALES + 64);
            let sc = [
                _mm512_and_si512(w0, k1),
                _mm512_or_si512(_mm512_and_si512(w2, k2), top2(w0, k3)),
            ];
            let mn = [
                _mm512_and_si512(w1, k1),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<4>(w2), k2),
                    top2(w1, k3),
                ),
            ];
            let mut isum = [_mm512_setzero_si512(); T];
            let mut isum16 = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let mut lo = [_mm512_setzero_si512(); T];
                let mut hi = [_mm512_setzero_si512(); T];
                for w in 0..8 {
                    let v = load2(s0, s1, q4k::QS + 32 * (8 * c + w));
                    let wl = _mm512_and_si512(v, m4);
                    let wh = _mm512_and_si512(v, mh);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr().add(64 * c + 4 * w);
                        lo[j] = _mm512_dpbusd_epi32(lo[j], wl, word(y));
                        hi[j] = _mm512_dpbusd_epi32(hi[j], wh, word(y.add(32)));
                    }
                }
                let sl = _mm512_shuffle_epi8(sc[c / 2], pick32[(2 * c) % 4]);
                let sh = _mm512_shuffle_epi8(sc[c / 2], pick32[(2 * c + 1) % 4]);
                for j in 0..T {
                    isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(lo[j], sl));
                    isum16[j] = _mm512_add_epi32(isum16[j], _mm512_mullo_epi32(hi[j], sh));
                }
            }
            let mut msum = [_mm512_setzero_si512(); T];
            for m in 0..8 {
                let mp = _mm512_shuffle_epi8(mn[m / 4], pick[m % 4]);
                for j in 0..T {
                    let bs = word(ab[j].bsums.as_ptr().add(2 * m).cast());
                    msum[j] = _mm512_add_epi32(msum[j], _mm512_madd_epi16(mp, bs));
                }
            }
            let halves = |off: usize| {
                let h = _mm256_set_m128i(
                    _mm_loadu_si128(s1.add(off).cast()),
                    _mm_loadu_si128(s0.add(off).cast()),
                );
                _mm512_cvtph_ps(h)
            };
            let (d16, dm16) = (halves(q4k::D), halves(q4k::DMIN));
            for j in 0..T {
                let sumi = _mm512_add_epi32(isum[j], _mm512_srai_epi32::<4>(isum16[j]));
                let dy = _mm512_set1_ps(ab[j].d);
                acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(d16, dy), _mm512_cvtepi32_ps(sumi), acc[j]);
                accm[j] = _mm512_fmadd_ps(
                    _mm512_mul_ps(dm16, dy),
                    _mm512_cvtepi32_ps(msum[j]),
                    accm[j],
                );
            }
        }
        for j in 0..T {
            _mm512_storeu_ps(
                out.as_mut_ptr().add(2 * RG * j),
                _mm512_sub_ps(acc[j], accm[j]),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::repack_k::RepackedK;
    use crate::kernels::qact::quantize_row_q8k;
    use crate::testutil::{synthetic_weights, Rng};
    use poot_core::DType;

    #[test]
    fn two_groups_give_each_groups_bits() {
        if !crate::testutil::isa_runs("avx512", available()) {
            return;
        }
        let mut rng = Rng::new(43);
        let (n, k) = (16, 512);
        let nb = k / 256;
        let rp = RepackedK::new(KKind::Q4_K, &synthetic_weights(DType::Q4_K, n, k, 9), n, nb);
        let ck = crate::Isa::Avx2.checked().unwrap();
        for t in 1..=TOKENS {
            let x: Vec<f32> = (0..t * k).map(|_| rng.uniform(-3.0, 3.0)).collect();
            let mut a = vec![BlockQ8K::default(); t * nb];
            for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
                quantize_row_q8k(xr, ar);
            }
            let mut want = vec![0.0f32; t * 16];
            for g in 0..2 {
                let mut one = [0.0f32; 4 * RG];
                crate::kernels::arch::x86::qdot_rk::group(
                    ck,
                    KKind::Q4_K,
                    rp.group(g),
                    nb,
                    &a,
                    t,
                    &mut one,
                );
                for j in 0..t {
                    want[j * 16 + g * 8..j * 16 + g * 8 + 8]
                        .copy_from_slice(&one[j * 8..j * 8 + 8]);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            for vnni in [false, true] {
                if vnni && !crate::testutil::isa_runs("vnni", crate::CpuFeatures::get().vnni512()) {
                    continue;
                }
                let mut got = vec![f32::NAN; t * 16];
                groups2_on(vnni, rp.group(0), rp.group(1), nb, &a, t, &mut got);
                assert_eq!(bits(&got), bits(&want), "t={t} vnni={vnni}");
            }
        }
    }
}
