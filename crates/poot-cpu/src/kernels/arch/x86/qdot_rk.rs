//! The 8-row interleaved k-quant dot (`matmul/repack_k.rs`, `matmul/rk.rs`): one body per
//! format, written once over the register width and the integer-dot instruction ([`KLanes`]),
//! and monomorphized in a `#[target_feature]` entry function per ISA:
//!
//! | entry          | registers            | integer dot          | used for               |
//! |----------------|----------------------|----------------------|------------------------|
//! | `*_avx2`       | `Ymm<false>`: 1 group | `maddubs` + `madd`  | AVX2                   |
//! | `*_ymm_vnni`   | `Ymm<true>`: 1 group  | `vpdpbusd ymm`      | AVX-512 VNNI + VL      |
//! | `q4k_zmm`      | `Zmm<false>`: 2 groups | `maddubs` + `madd` | Q4_K prefill, AVX-512 BW |
//! | `q4k_zmm_vnni` | `Zmm<true>`: 2 groups | `vpdpbusd zmm`      | Q4_K prefill, AVX-512 VNNI |
//!
//! One register holds 4 quant bytes of each of 8 rows (one row per 32-bit lane; at 512 bits
//! lanes 8-15 hold a second group's rows). Q4_K: without VNNI, `maddubs` of the nibbles with a
//! broadcast activation word gives pair sums, the 8 words of a 32-value sub-block are added in
//! `i16` and the sub-block scale applied with one `madd`; with VNNI, `vpdpbusd` sums the
//! products in `i32`, the high nibbles dotted in place (`q & 0xf0`, 16 times the nibble, which
//! saves a shift per vector) and shifted back once per super-block. Q6_K sums two words'
//! products in `i16` before widening them to `i32` for one token without VNNI (`vpdpbusd`
//! per word otherwise) and applies `scale * (sum - 32 * bsum)` per 16-value sub-block with
//! `mullo`. Every super-block therefore yields, per row, exactly the
//! integers `sumi` (and Q4_K's `summ`) of `matmul::qdot_k::q4k_ints`/`q6k_ints`, and the float
//! steps are `blocks::finish`'s lane by lane (`acc = fma(d * dy, sumi, acc)` in block order,
//! one chain per row and token): results are bit-identical to `matmul::qdot_k::dot_scalar` on
//! the stored rows for every entry and tile (`qdot_rk_tests.rs`, `matmul/rk_tests.rs`).
//!
//! Exactness: Q4_K `maddubs` pairs are at most `2 * 15 * 127 = 3810`, 8 of them `30480 <
//! 2^15`; with VNNI the low nibbles give per sub-block `|p| <= 15 * 127 * 32 = 60960`, the high
//! ones `|16 p| <= 975360`, times a scale below 64 and summed over 4 sub-blocks: below `2^28`
//! (`vpdpbusd` does not saturate). Scales and mins are below 64 and block sums of 32
//! activations below `2^12`. Q6_K pairs are at most `2 * 63 * 128`, two of them summed in `i16`;
//! `|scale * (sum - 32 bsum)|` is below `2^24` per sub-block.
//!
//! Invariant (soundness): the entry functions are reached only through [`group`] with a
//! `Checked` AVX2 or AVX-512 token (VNNI and VL detected for `Ymm<true>`), and through
//! [`groups2`] after [`available512`] (and `CpuFeatures::vnni512` for `Zmm<true>`).

use crate::kernels::arch::x86::lanes::{Avx2, Avx2Vnni, Zmm};
use crate::kernels::arch::x86::lanes_k::KLanes;
use crate::kernels::arch::x86::qdot_rk_parts::{
    pick32_masks, pick_masks, q4k_mins, q4k_scales, q6k_unpack,
};
use crate::kernels::blocks::RG;
use crate::kernels::format::Format;
use crate::kernels::matmul::repack_k::{q4k, q6k};
use crate::kernels::qact::BlockQ8K;
use crate::kernels::simd::{prefetch_ahead, Checked};

/// Tokens one [`group`] call takes when `left` are left: 16 vector registers hold 4 tokens'
/// Q4_K accumulators, 2 tokens' Q6_K ones (4 per token).
pub(crate) fn tile_tokens(kind: Format, left: usize) -> usize {
    match (kind, left) {
        (_, 0 | 1) => 1,
        (Format::Q4_K, 4..) => 4,
        _ => 2,
    }
}

/// Tokens one [`groups2`] call handles.
pub(crate) const TOKENS2: usize = 2;

/// Whether this CPU has the 512-bit byte and word ops [`groups2`] uses.
pub(crate) fn available512() -> bool {
    crate::CpuFeatures::get().avx512_bytes()
}

/// `out[j * 8 + r]` = row `r` of group `grp` (`nb` super-blocks of `kind`) dotted with token
/// `j` (blocks `a[j * nb..(j + 1) * nb]`), for `j < t`, `t` from [`tile_tokens`].
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_rk` sizes them).
pub(crate) fn group(
    ck: Checked,
    kind: Format,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
) {
    let vnni = ck.isa().avx512() && crate::CpuFeatures::get().vnni256();
    group_on(vnni, kind, grp, nb, a, t, out);
}

/// [`group`] on `vpdpbusd ymm` or not (`vnni` needs `CpuFeatures::vnni256` and AVX-512F; the
/// same bits either way).
pub(super) fn group_on(
    vnni: bool,
    kind: Format,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
) {
    let f = crate::CpuFeatures::get();
    assert!(f.avx2_fma_f16c() && (!vnni || f.vnni256() && f.avx512f));
    assert!(grp.len() >= nb * RG * kind.block_bytes(), "qdot_rk group");
    assert!(t >= 1 && t <= tile_tokens(kind, t) && a.len() >= t * nb && out.len() >= t * RG);
    let (g, o) = (grp.as_ptr(), out.as_mut_ptr());
    // SAFETY: the features each entry enables were detected (asserted above); the bodies read
    // `nb` super-blocks of `grp` and blocks `j * nb + b` of `a` for `j < T`, and write `8 T`
    // floats of `out`, all inside the slices by the asserts.
    unsafe {
        match (vnni, kind, t) {
            (false, Format::Q4_K, 4) => q4k_avx2::<4>(g, nb, a, o),
            (false, Format::Q4_K, 2) => q4k_avx2::<2>(g, nb, a, o),
            (false, Format::Q4_K, _) => q4k_avx2::<1>(g, nb, a, o),
            (false, Format::Q6_K, 2) => q6k_avx2::<2>(g, nb, a, o),
            (false, Format::Q6_K, _) => q6k_avx2::<1>(g, nb, a, o),
            (true, Format::Q4_K, 4) => q4k_ymm_vnni::<4>(g, nb, a, o),
            (true, Format::Q4_K, 2) => q4k_ymm_vnni::<2>(g, nb, a, o),
            (true, Format::Q4_K, _) => q4k_ymm_vnni::<1>(g, nb, a, o),
            (true, Format::Q6_K, 2) => q6k_ymm_vnni::<2>(g, nb, a, o),
            (true, Format::Q6_K, _) => q6k_ymm_vnni::<1>(g, nb, a, o),
            (_, other, _) => unreachable!("{other:?} has no 8-row k-quant layout"),
        }
    }
}

/// `out[j * 16 + r]` = row `r` of Q4_K groups `g0` (`r < 8`) and `g1` (`r >= 8`) dotted with
/// token `j < t` (`t <= TOKENS2`; blocks `a[j * nb..]`).
///
/// # Panics
/// If the slices are shorter than that, or without [`available512`] (internal invariants;
/// `matmul_rk` checks and sizes them).
pub(crate) fn groups2(g0: &[u8], g1: &[u8], nb: usize, a: &[BlockQ8K], t: usize, out: &mut [f32]) {
    groups2_on(crate::CpuFeatures::get().vnni512(), g0, g1, nb, a, t, out);
}

/// [`groups2`] on `vpdpbusd zmm` or not (`vnni` needs `CpuFeatures::vnni512`; the same bits
/// either way).
pub(super) fn groups2_on(
    vnni: bool,
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
) {
    assert!(available512() && (!vnni || crate::CpuFeatures::get().vnni512()));
    let need = nb * RG * Format::Q4_K.block_bytes();
    assert!(g0.len() >= need && g1.len() >= need);
    assert!((1..=TOKENS2).contains(&t) && a.len() >= t * nb && out.len() >= t * 2 * RG);
    let (s, o) = ((g0.as_ptr(), g1.as_ptr()), out.as_mut_ptr());
    // SAFETY: AVX-512 F/BW, FMA and F16C detected (`available512`), VNNI and VL too where
    // `vnni`; bounds asserted above.
    unsafe {
        match (vnni, t) {
            (true, 2) => q4k_zmm_vnni::<2>(s, nb, a, o),
            (true, _) => q4k_zmm_vnni::<1>(s, nb, a, o),
            (false, 2) => q4k_zmm::<2>(s, nb, a, o),
            (false, _) => q4k_zmm::<1>(s, nb, a, o),
        }
    }
}

type Pair = (*const u8, *const u8);

// The entry functions: each enables its width's features and monomorphizes a body (their
// contract is the body's, with those features detected).

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_avx2<const T: usize>(g: *const u8, nb: usize, a: &[BlockQ8K], out: *mut f32) {
    // SAFETY: the caller's contract; this function's features are `Avx2`'s.
    unsafe { q4k_body::<Avx2, T>(g, nb, a, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_avx2<const T: usize>(g: *const u8, nb: usize, a: &[BlockQ8K], out: *mut f32) {
    // SAFETY: the caller's contract; this function's features are `Avx2`'s.
    unsafe { q6k_body::<Avx2, T>(g, nb, a, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4k_ymm_vnni<const T: usize>(g: *const u8, nb: usize, a: &[BlockQ8K], out: *mut f32) {
    // SAFETY: the caller's contract; this function's features cover `Avx2Vnni`'s.
    unsafe { q4k_body::<Avx2Vnni, T>(g, nb, a, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q6k_ymm_vnni<const T: usize>(g: *const u8, nb: usize, a: &[BlockQ8K], out: *mut f32) {
    // SAFETY: the caller's contract; this function's features cover `Avx2Vnni`'s.
    unsafe { q6k_body::<Avx2Vnni, T>(g, nb, a, out) }
}

#[target_feature(enable = "avx512f,avx512bw,fma,f16c")]
unsafe fn q4k_zmm<const T: usize>(s: Pair, nb: usize, a: &[BlockQ8K], out: *mut f32) {
    // SAFETY: the caller's contract; this function's features cover `Zmm<false>`'s.
    unsafe { q4k_body::<Zmm<false>, T>(s, nb, a, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q4k_zmm_vnni<const T: usize>(s: Pair, nb: usize, a: &[BlockQ8K], out: *mut f32) {
    // SAFETY: the caller's contract; this function's features cover `Zmm`'s.
    unsafe { q4k_body::<Zmm, T>(s, nb, a, out) }
}

/// Q4_K: `L::ROWS` rows (every group of `src`, `nb` super-blocks each) dotted with `T` tokens
/// into `out[j * L::ROWS + r]` (module docs).
///
/// # Safety
/// The width's features enabled; `nb` super-blocks readable at every group of `src`, `T * nb`
/// blocks in `a`, `T * L::ROWS` floats writable at `out`.
#[inline(always)]
unsafe fn q4k_body<L: KLanes, const T: usize>(
    src: L::Src,
    nb: usize,
    a: &[BlockQ8K],
    out: *mut f32,
) {
    let sb = RG * Format::Q4_K.block_bytes();
    // SAFETY: the contract above.
    unsafe {
        let m4 = L::isplat8(0x0f);
        let mh = L::isplat8(0xf0u8 as i8);
        let pick = pick_masks::<L>();
        let pick32 = pick32_masks::<L>();
        let ahead = prefetch_ahead();
        let mut acc = [L::zero(); T];
        let mut accm = [L::zero(); T];
        for b in 0..nb {
            let s = L::at(src, b * sb);
            // The hardware prefetcher follows a group's sequential super-blocks; this only
            // starts the next lines early.
            L::prefetch(s, sb, ahead, 0);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let (sc, mn) = q4k_scales::<L>(s);
            // Low-nibble sub-blocks' scaled sums, and (VNNI) the high ones' times 16.
            let mut isum = [L::izero(); T];
            let mut isum16 = [L::izero(); T];
            let q = L::at(s, q4k::QS);
            for c in 0..4 {
                let mut lo = [L::izero(); T];
                let mut hi = [L::izero(); T];
                for w in 0..8 {
                    let v = L::quants(L::at(q, 32 * (8 * c + w)));
                    let wl = L::and(v, m4);
                    let wh = if L::VNNI {
                        L::and(v, mh)
                    } else {
                        L::and(L::srli16_4(v), m4)
                    };
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr().add(64 * c + 4 * w);
                        if L::VNNI {
                            lo[j] = L::dot(lo[j], wl, L::word(y));
                            hi[j] = L::dot(hi[j], wh, L::word(y.add(32)));
                        } else {
                            lo[j] = L::add16(lo[j], L::maddubs(wl, L::word(y)));
                            hi[j] = L::add16(hi[j], L::maddubs(wh, L::word(y.add(32))));
                        }
                    }
                }
                // Sub-blocks 2c (low nibbles) and 2c + 1 (high): scale bytes 2c % 4 and
                // (2c + 1) % 4 of vector c / 2.
                let (lo_pick, hi_pick) = ((2 * c) % 4, (2 * c + 1) % 4);
                if L::VNNI {
                    let sl = L::shuffle8(sc[c / 2], pick32[lo_pick]);
                    let sh = L::shuffle8(sc[c / 2], pick32[hi_pick]);
                    for j in 0..T {
                        isum[j] = L::add32(isum[j], L::mullo32(lo[j], sl));
                        isum16[j] = L::add32(isum16[j], L::mullo32(hi[j], sh));
                    }
                } else {
                    let sl = L::shuffle8(sc[c / 2], pick[lo_pick]);
                    let sh = L::shuffle8(sc[c / 2], pick[hi_pick]);
                    for j in 0..T {
                        let p = L::add32(L::madd16(lo[j], sl), L::madd16(hi[j], sh));
                        isum[j] = L::add32(isum[j], p);
                    }
                }
            }
            let msum = q4k_mins::<L, T>(mn, &pick, &ab);
            let d = L::halves(L::at(s, q4k::D));
            let dm = L::halves(L::at(s, q4k::DMIN));
            for j in 0..T {
                let sumi = if L::VNNI {
                    L::add32(isum[j], L::srai32::<4>(isum16[j]))
                } else {
                    isum[j]
                };
                let dy = L::splat(ab[j].d);
                acc[j] = L::fma(L::mul(d, dy), L::to_f(sumi), acc[j]);
                accm[j] = L::fma(L::mul(dm, dy), L::to_f(msum[j]), accm[j]);
            }
        }
        for j in 0..T {
            L::store(out.add(L::ROWS * j), L::fsub(acc[j], accm[j]));
        }
    }
}

/// Q6_K, as [`q4k_body`] (the same contract).
#[inline(always)]
unsafe fn q6k_body<L: KLanes, const T: usize>(
    src: L::Src,
    nb: usize,
    a: &[BlockQ8K],
    out: *mut f32,
) {
    let sb = RG * Format::Q6_K.block_bytes();
    // SAFETY: the contract of `q4k_body`.
    unsafe {
        let ahead = prefetch_ahead();
        let mut acc = [L::zero(); T];
        for b in 0..nb {
            let s = L::at(src, b * sb);
            L::prefetch(s, sb, ahead, 0);
            let ab: [&BlockQ8K; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let mut isum = [L::izero(); T];
            for n in 0..2 {
                for half in 0..2 {
                    // Words w = 4 half..4 half + 4 of this 128-value half: quant vector g holds
                    // elements 128n + 32g + 4w..+4, all in sub-block 8n + 2g + half.
                    // Each sub-block's sum starts at its offset term `-32 * bsum` (exact in
                    // `i32`), so `scale * (sum - 32 bsum)` below is one `mullo`.
                    let mut p = [[L::izero(); T]; 4];
                    for (g, pg) in p.iter_mut().enumerate() {
                        let si = 8 * n + 2 * g + half;
                        for (j, v) in pg.iter_mut().enumerate() {
                            *v = L::word(ab[j].q6_offsets.as_ptr().add(si).cast());
                        }
                    }
                    if !L::VNNI && T == 1 {
                        // Two words' pair sums added in `i16` before one widening: each is
                        // at most `2 * 63 * 128`, two of them below `2^15`.
                        for w in (4 * half..4 * half + 4).step_by(2) {
                            let qa = q6k_unpack::<L>(L::at(s, q6k::QS + 96 * (8 * n + w)));
                            let qb = q6k_unpack::<L>(L::at(s, q6k::QS + 96 * (8 * n + w + 1)));
                            let y = ab[0].qs.as_ptr().add(128 * n + 4 * w);
                            for g in 0..4 {
                                let pa = L::maddubs(qa[g], L::word(y.add(32 * g)));
                                let pb = L::maddubs(qb[g], L::word(y.add(32 * g + 4)));
                                p[g][0] = L::add32(p[g][0], L::widen16(L::add16(pa, pb)));
                            }
                        }
                    } else {
                        for w in 4 * half..4 * half + 4 {
                            let qv = q6k_unpack::<L>(L::at(s, q6k::QS + 96 * (8 * n + w)));
                            for j in 0..T {
                                let y = ab[j].qs.as_ptr().add(128 * n + 4 * w);
                                for (g, &qg) in qv.iter().enumerate() {
                                    p[g][j] = L::dot(p[g][j], qg, L::word(y.add(32 * g)));
                                }
                            }
                        }
                    }
                    for (g, pg) in p.iter().enumerate() {
                        let si = 8 * n + 2 * g + half;
                        let sc = L::bytes8(L::at(s, q6k::SCALES + 8 * si));
                        for j in 0..T {
                            isum[j] = L::add32(isum[j], L::mullo32(pg[j], sc));
                        }
                    }
                }
            }
            let d = L::halves(L::at(s, q6k::D));
            for j in 0..T {
                acc[j] = L::fma(L::mul(d, L::splat(ab[j].d)), L::to_f(isum[j]), acc[j]);
            }
        }
        for (j, v) in acc.iter().enumerate() {
            // `blocks::finish`'s min accumulator stays +0 for Q6_K, and `x - 0.0 == x`.
            L::store(out.add(L::ROWS * j), *v);
        }
    }
}

#[cfg(test)]
#[path = "qdot_rk_tests.rs"]
mod tests;
