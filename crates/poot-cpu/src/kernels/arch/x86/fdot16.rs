//! tinyBLAS's 8-lane order in 512-bit registers: each `zmm` holds the 8-lane chains of two
//! tokens against one row (lanes 0-7 token `2p`, lanes 8-15 token `2p + 1`), the row's slice
//! broadcast to both halves. Every lane is still its output's own chain of FMAs along `k`, in
//! the same order as the 8-lane `ymm` tiles (`arch::x86::fdot::chunk8_body`), so the results are
//! the same bits with twice the work per instruction.
//!
//! A tile is `NR` rows against up to 6 token pairs (12 tokens: 24 chains, the 4 rows' slices
//! and one token pair in 29 of the 32 registers); the last pair may be half (an odd token
//! count), its upper lanes then multiply zeros and are dropped.
//!
//! Both operands are `f32` (f16 or bf16 values widened when packed): a widening `vcvtph2ps`
//! of 16 halves is two of this loop's vector ports' uops, and with one per activation pair
//! and row slice the loop would spend nearly as long converting as multiplying.
//!
//! Why this is not `chunk8_body` over a wider [`Lanes`](crate::kernels::arch::x86::lanes::Lanes):
//! the two differ in tiling, not only in width. Here a register holds two tokens' chains
//! against one broadcast row slice (`TT / 2` token registers, the rows loaded once a step);
//! there a register holds one token's chains against one row slice, rows outer and tokens
//! inner, with f16 operands widened in the loop and a hand-allocated 3-token form; the parked
//! partials are laid out per pair here and per token there. A shared body would change the
//! loop order and register allocation both were tuned for, so each keeps its own (the lane
//! chains, and so the bits, are the same: `matmul/tests.rs` checks every output against
//! `ggml::dot_lanes8` on every ISA).
//!
//! Invariant (soundness): every function here is `unsafe` with the contract that the caller
//! has detected AVX-512F, AVX2, FMA and F16C, and that the pointers cover the lengths stated.

use std::arch::x86_64::*;

use crate::kernels::simd::NR;

/// 16 floats at `p`, or 8 with zeros above when `half`.
///
/// # Safety
/// AVX-512F detected; 16 (or with `half` 8) readable floats at `p`.
#[inline(always)]
unsafe fn load16(p: *const f32, half: bool) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        if half {
            _mm512_zextps256_ps512(_mm256_loadu_ps(p))
        } else {
            _mm512_loadu_ps(p)
        }
    }
}

/// The 8 floats at `p` in both halves.
///
/// # Safety
/// AVX-512F detected; 8 readable floats at `p`.
#[inline(always)]
unsafe fn bcast8(p: *const f32) -> __m512 {
    // SAFETY: the caller's contract; the bits move unchanged.
    unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p.cast()))) }
}

/// One k-chunk of `NR` rows against `P` token pairs (`2P` tokens, or `2P - 1` when `odd`),
/// both packed in 8-element slices: slice `s` of row `r` at `w + (s * NR + r) * 8`, of token
/// `j` at `x + (s * tt + j) * 8` with `tt` the token count. Lane `l` of output `(j, r)`
/// continues its chain with `fma(w, x, lane)` slice after slice. The chains start at zero
/// when `first`, else from `part` (`P * NR * 16` floats from a 64-byte boundary: pair `p`,
/// row `r` at `(p * NR + r) * 16`, token `2p`'s lanes first); when `last` the lane sums
/// (`ggml::hsum8`) go to `res[j * NR + r]`, else the lanes go back to `part`. Splitting `k`
/// into chunks changes no bit.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C detected; `NR * len` floats at `w`, `tt * len` at `x`,
/// `len % 8 == 0`; `part.len() >= P * NR * 16`, `res.len() >= tt * NR`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn chunk16<const P: usize>(
    w: *const f32,
    x: *const f32,
    (len, odd): (usize, bool),
    part: &mut [f32],
    (first, last): (bool, bool),
    res: &mut [f32],
) {
    let tt = 2 * P - usize::from(odd);
    assert!(part.len() >= P * NR * 16 && res.len() >= tt * NR && len.is_multiple_of(8));
    let pp = part.as_mut_ptr();
    assert!(
        pp.cast::<__m512>().is_aligned(),
        "`part` starts on a 64-byte boundary"
    );
    // SAFETY: slice s < len / 8 stays inside both operands (the contract; the half pair reads
    // only its 8 elements); `part` holds P * NR * 16 floats (asserted).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NR]; P];
        if !first {
            for (p, a) in acc.iter_mut().enumerate() {
                for (r, v) in a.iter_mut().enumerate() {
                    // Volatile: the compiler otherwise turns these loads into a `memcpy` to
                    // the stack and reloads the registers from there (15% of a 256-element
                    // chunk's time).
                    *v = pp.add((p * NR + r) * 16).cast::<__m512>().read_volatile();
                }
            }
        }
        let (mut wp, mut xp) = (w, x);
        for _ in 0..len / 8 {
            let mut wv = [_mm512_setzero_ps(); NR];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = bcast8(wp.add(r * 8));
            }
            for (p, a) in acc.iter_mut().enumerate() {
                let xv = load16(xp.add(p * 16), odd && p == P - 1);
                for (r, v) in a.iter_mut().enumerate() {
                    *v = _mm512_fmadd_ps(wv[r], xv, *v);
                }
            }
            wp = wp.add(NR * 8);
            xp = xp.add(tt * 8);
        }
        for (p, a) in acc.iter().enumerate() {
            for (r, v) in a.iter().enumerate() {
                if last {
                    let l = hsum8x2(*v);
                    res[2 * p * NR + r] = l[0];
                    if 2 * p + 1 < tt {
                        res[(2 * p + 1) * NR + r] = l[8];
                    }
                } else {
                    // Volatile, as the loads above.
                    pp.add((p * NR + r) * 16)
                        .cast::<__m512>()
                        .write_volatile(*v);
                }
            }
        }
    }
}

/// `ggml::hsum8` of each 8-lane half of `v`, in lanes 0 and 8: `(a4 + a0)`-style pairs,
/// then `(r0 + r2) + (r1 + r3)`, the same additions (each commutes, none reassociates).
#[inline(always)]
fn hsum8x2(v: __m512) -> [f32; 16] {
    let mut l = [0.0f32; 16];
    // SAFETY: AVX-512F is enabled in every caller (`chunk16`); `l` holds 16 floats.
    unsafe {
        // Lanes i and i + 4 of each half: swap the 128-bit quarters within each half.
        let r = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        // r0 + r2 and r1 + r3.
        let s = _mm512_add_ps(r, _mm512_permute_ps::<0b01_00_11_10>(r));
        // (r0 + r2) + (r1 + r3).
        let u = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
        _mm512_storeu_ps(l.as_mut_ptr(), u);
    }
    l
}

/// 8 floats rounded to f16 (to nearest even, as `half::f16::from_f32`), as f16 bits.
///
/// # Safety
/// F16C detected.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f16_bits8(v: &[f32; 8]) -> [u16; 8] {
    let mut out = [0u16; 8];
    // SAFETY: 8 floats in, 8 halves out; the features this function enables.
    unsafe {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(v.as_ptr()));
        _mm_storeu_si128(out.as_mut_ptr().cast(), h);
    }
    out
}

/// 8 floats rounded to f16 and widened back (exact), as ggml's F16 `vec_dot_type` sees them.
///
/// # Safety
/// F16C detected.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f16_round8(v: &[f32; 8]) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 8 floats in and out; the features this function enables.
    unsafe {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(v.as_ptr()));
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    out
}

/// `dst[i] = f16(src[i])` widened back (exact), 8 values at a time ([`f16_round8`]), the
/// tail through `half` (the same bits either way, tested): `half`'s conversion checks for F16C
/// at run time on every value.
///
/// # Safety
/// AVX2 and F16C detected.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn f16_round_into(src: &[f32], dst: &mut [f32]) {
    assert!(dst.len() == src.len());
    let done = src.len() & !7;
    for (s, d) in src[..done]
        .chunks_exact(8)
        .zip(dst[..done].chunks_exact_mut(8))
    {
        let s: &[f32; 8] = s.try_into().expect("8 values");
        // SAFETY: the features this function enables.
        d.copy_from_slice(&unsafe { f16_round8(s) });
    }
    for (s, d) in src[done..].iter().zip(&mut dst[done..]) {
        *d = half::f16::from_f32(*s).to_f32();
    }
}

/// The first 8 stored halves of `s` (16 bytes; format id `KIND`, `id::F16` or `id::BF16`)
/// widened to `f32` (exact), through `arch::x86::fdot::load8`.
///
/// # Safety
/// AVX2 and F16C detected.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) unsafe fn widen8<const KIND: u8>(s: &[u8]) -> [f32; 8] {
    assert!(s.len() >= 16);
    let mut out = [0f32; 8];
    // SAFETY: 16 readable bytes (asserted); the features this function enables.
    unsafe {
        let v = crate::kernels::arch::x86::fdot::load8::<KIND>(s.as_ptr());
        _mm256_storeu_ps(out.as_mut_ptr(), v);
    }
    out
}

/// 8 floats rounded to bf16 as `ggml::round_bf16` does (nearest even; NaNs quieted),
/// widened back to `f32` (exact).
///
/// # Safety
/// AVX2 detected.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn bf16_round8(v: &[f32; 8]) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 8 floats in and out; the features this function enables.
    unsafe {
        let u = _mm256_loadu_si256(v.as_ptr().cast());
        let one = _mm256_set1_epi32(1);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(u), one);
        let r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
        let r = _mm256_srli_epi32::<16>(r);
        // NaN: magnitude above infinity's bits (signed compare: both sides are below 2^31).
        let mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f80_0000));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(64));
        let h = _mm256_blendv_epi8(r, quiet, nan);
        // The rounded halves back in the high 16 bits (a carry past 16 bits is impossible
        // here: the sum of a finite `u` and at most 0x8000 stays below 2^32).
        let w = _mm256_slli_epi32::<16>(h);
        _mm256_storeu_si256(out.as_mut_ptr().cast(), w);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Special values, both signs, and a spread of random bit patterns (NaNs included).
    fn samples() -> Vec<f32> {
        let mut v: Vec<f32> = [0.0, 1.0, 1.5, 65504.0, 65520.0, 1e-8, 3.4e38, f32::MAX]
            .iter()
            .flat_map(|&x: &f32| [x, -x])
            .chain([
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                f32::MIN_POSITIVE,
            ])
            .chain([f32::from_bits(0x7f80_0001), f32::from_bits(0xffc0_1234)])
            .chain([f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000)])
            .collect();
        let mut s = 0x9e37_79b9u32;
        for _ in 0..4096 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s));
        }
        while !v.len().is_multiple_of(8) {
            v.push(0.25);
        }
        v
    }

    #[test]
    fn vector_roundings_match_the_scalar_ones() {
        let f = crate::CpuFeatures::get();
        if !crate::testutil::isa_runs("avx2", f.avx2 && f.f16c) {
            return;
        }
        for c in samples().chunks_exact(8) {
            let c: &[f32; 8] = c.try_into().unwrap();
            // SAFETY: AVX2 and F16C detected above.
            let (b, h, hb) = unsafe { (bf16_round8(c), f16_round8(c), f16_bits8(c)) };
            for i in 0..8 {
                let want = u32::from(crate::kernels::ggml::round_bf16(c[i])) << 16;
                assert_eq!(b[i].to_bits(), want, "bf16 of {:#x}", c[i].to_bits());
                let want = half::f16::from_f32(c[i]);
                assert_eq!(hb[i], want.to_bits(), "f16 bits of {:#x}", c[i].to_bits());
                assert_eq!(h[i].to_bits(), want.to_f32().to_bits(), "f16 of {}", c[i]);
            }
            let bytes: Vec<u8> = hb.iter().flat_map(|v| v.to_le_bytes()).collect();
            // SAFETY: as above.
            let w = unsafe { widen8::<{ crate::kernels::format::id::F16 }>(&bytes) };
            assert_eq!(w.map(f32::to_bits), h.map(f32::to_bits));
            let bytes: Vec<u8> = b
                .iter()
                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            // SAFETY: as above.
            let w = unsafe { widen8::<{ crate::kernels::format::id::BF16 }>(&bytes) };
            assert_eq!(w.map(f32::to_bits), b.map(f32::to_bits));
        }
        // The slice form, with a tail of 5 past the last whole 8 (through `half`).
        let v = samples();
        let src = &v[..v.len() - 3];
        let mut got = vec![f32::NAN; src.len()];
        // SAFETY: AVX2 and F16C detected above.
        unsafe { f16_round_into(src, &mut got) };
        for (x, g) in src.iter().zip(&got) {
            let want = half::f16::from_f32(*x).to_f32();
            assert_eq!(g.to_bits(), want.to_bits(), "f16 of {:#x}", x.to_bits());
        }
    }
}
