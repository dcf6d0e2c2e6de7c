//! The 8-row interleaved integer dot (`matmul/repack.rs`, `matmul/r8.rs`), written once over
//! [`RowLanes`]: `arch/x86/qdot_r8.rs` runs it on 256-bit registers (one group a step, AVX2 or
//! VNNI), `arch/x86/qdot_r16.rs` on 512-bit ones (two groups a step, VNNI).
//!
//! One register holds 4 quant bytes of each row (one row per 32-bit lane), so each integer step
//! yields ggml's lane sum `l` for every row of the step at once; the float steps are ggml's,
//! per row: `acc[l] = fma(dw * dy, lane_l, acc[l])` block after block, then
//! `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))` (`hsum_float_8`), plus Q4_1's
//! `summs = fma(m, s, summs)` ([`body`]); or in the block order, each block's 32 products
//! summed in one `i32` per row, then one FMA ([`body_blocks`]). Results are bit-identical to
//! `arch::generic::qdot_generic::dot_scalar{,_blocks}` and to `arch::generic::qdot_r8_generic` at either width
//! (tested).
//!
//! Integer steps: Q4 nibbles are unsigned (`0..16`) against the signed activations, so
//! `maddubs` + `madd` (AVX2) or `vpdpbusd` (VNNI) apply directly; Q4_0's `-8` offset (Q5_0's
//! `-16`) is folded in as `-8 * sum(y)` over the lane's 4 activations, precomputed per block
//! (`corr`); Q4_Z's per-row zero point `z` (block order only) as `z * -sum(y)`, one `i32`
//! multiply per block and token for all the rows of a step. Q8_0 on VNNI flips the sign bit (`w + 128`, unsigned) and folds `-128 * sum(y)` the
//! same way; without VNNI it takes the sign trick (`|w|` times `y * sign(w)`), as
//! `arch/x86/qdot.rs` does. Every lane sum is exact in `i32`, so only the float steps decide
//! the result.
//!
//! Invariant (soundness): both bodies are `#[inline(always)]`, reached only from the entry
//! functions of `qdot_r8` / `qdot_r16`, whose `#[target_feature]` covers `L`'s ops and whose
//! asserts cover the bounds stated on each body.

use crate::kernels::arch::x86::lanes_rows::RowLanes;
use crate::kernels::blocks::{header_bytes, superblock_bytes};
use crate::kernels::format::{id, Format};
use crate::kernels::qact::BlockQ8;

/// `1.5 * 2^23` as `f32` bits: adding an integer `x` with `|x| < 2^22` to them gives the bits
/// of `1.5 * 2^23 + x` (one unit per mantissa step), so `x` as `f32` is that float less
/// `1.5 * 2^23`, both steps exact: `cvtdq2ps`'s result for such `x`, bit for bit, from an
/// integer add folded into the dot's start and a float subtract.
const LO_BITS: i32 = 0x4B40_0000;

/// `1.5 * 2^19` as `f32` bits: a mantissa step is `1/16` there, so adding `16 x` gives
/// `1.5 * 2^19 + x`; the high nibbles dotted in place (16 times their value) come out as
/// their lane sum exactly (`|16 x| < 2^22`).
const HI_BITS: i32 = 0x4940_0000;

/// The format a `KIND` id names (`Format::X as u8`).
const fn kind_of(k: u8) -> Format {
    Format::from_id(k)
}

/// `out[j * L::ROWS + r]` = row `r` of the groups at `g` (`nb` superblocks each) dotted with
/// token `j < T` (`a[j * nb..]`, corrections `corr[j * nb..]`) in ggml's order.
///
/// # Safety
/// `L`'s features enabled by the caller; `nb` superblocks of `KIND` in every group of `g`,
/// `T * nb` blocks in `a` and `corr`, `T * L::ROWS` values in `out`.
#[inline(always)]
pub(crate) unsafe fn body<L: RowLanes, const KIND: u8, const T: usize>(
    g: L::Src,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let (sb, hdr) = (superblock_bytes(kind_of(KIND)), header_bytes(kind_of(KIND)));
    // SAFETY: superblock `b < nb` is inside every group, activation/correction `j * nb + b`
    // inside `a`/`corr` for `j < T`, and `out` holds `T * L::ROWS` values (the contract); the
    // features are the caller's.
    unsafe {
        let mut acc = [[L::zero(); 8]; T];
        let mut summs = [L::zero(); T];
        let m4 = L::isplat8(0x0f);
        let mf0 = L::isplat8(0xf0u8 as i8);
        let (lo_bits, hi_bits) = (L::isplat(LO_BITS), L::isplat(HI_BITS));
        let (lo_at, hi_at) = (L::bits_f(lo_bits), L::bits_f(hi_bits));
        let ahead = crate::kernels::simd::prefetch_ahead();
        let next = L::next_distance(nb * sb);
        for b in 0..nb {
            let s = L::at(g, b * sb);
            L::prefetch(s, sb, ahead, next);
            let d = L::halves(s);
            let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let cj: [&[i32; 8]; T] = std::array::from_fn(|j| corr.get_unchecked(j * nb + b));
            // ggml's `dw * dy`, every row at once.
            let sc: [L::F; T] = std::array::from_fn(|j| L::mul(d, L::splat(ab[j].d)));
            if KIND == id::Q4_1 {
                let m = L::halves(L::at(s, 16));
                for j in 0..T {
                    summs[j] = L::fma(m, L::splat(ab[j].s), summs[j]);
                }
            }
            let q = L::at(s, hdr);
            if KIND == id::Q8_0 {
                for c in 0..8 {
                    let w = L::quants(L::at(q, 32 * c));
                    let u = if L::VNNI {
                        L::xor(w, L::isplat8(-128))
                    } else {
                        L::sign8(w, w)
                    };
                    for j in 0..T {
                        let y = L::word(ab[j].qs.as_ptr().add(4 * c));
                        let f = if L::VNNI {
                            let l = L::dot(L::isplat(LO_BITS + cj[j][c]), u, y);
                            L::sub(L::bits_f(l), lo_at)
                        } else {
                            L::to_f(L::dot(L::izero(), u, L::sign8(y, w)))
                        };
                        acc[j][c] = L::fma(sc[j], f, acc[j][c]);
                    }
                }
            } else if L::VNNI && KIND != id::Q5_0 {
                // Q4_0 and Q4_1 on VNNI: the high nibbles stay in place (16 times their value;
                // `vpdpbusd` does not saturate) and both lane sums come out offset into a
                // float's mantissa ([`LO_BITS`], [`HI_BITS`]): no shift, no `cvtdq2ps`.
                for c in 0..4 {
                    let v = L::quants(L::at(q, 32 * c));
                    let (lo, hi) = (L::and(v, m4), L::and(v, mf0));
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr();
                        let (il, ih) = if KIND == id::Q4_0 {
                            (
                                L::isplat(LO_BITS + cj[j][c]),
                                L::isplat(HI_BITS + 16 * cj[j][4 + c]),
                            )
                        } else {
                            (lo_bits, hi_bits)
                        };
                        let ll = L::dot(il, lo, L::word(y.add(4 * c)));
                        let lh = L::dot(ih, hi, L::word(y.add(16 + 4 * c)));
                        let (fl, fh) = (L::sub(L::bits_f(ll), lo_at), L::sub(L::bits_f(lh), hi_at));
                        acc[j][c] = L::fma(sc[j], fl, acc[j][c]);
                        acc[j][4 + c] = L::fma(sc[j], fh, acc[j][4 + c]);
                    }
                }
            } else {
                for c in 0..4 {
                    let (lo, hi) = nibbles::<L, KIND>(s, q, c, m4);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr();
                        let (il, ih) = if KIND == id::Q4_0 || KIND == id::Q5_0 {
                            (L::isplat(cj[j][c]), L::isplat(cj[j][4 + c]))
                        } else {
                            (L::izero(), L::izero())
                        };
                        let ll = L::dot(il, lo, L::word(y.add(4 * c)));
                        let lh = L::dot(ih, hi, L::word(y.add(16 + 4 * c)));
                        acc[j][c] = L::fma(sc[j], L::to_f(ll), acc[j][c]);
                        acc[j][4 + c] = L::fma(sc[j], L::to_f(lh), acc[j][4 + c]);
                    }
                }
            }
        }
        for j in 0..T {
            let x = &acc[j];
            let lo = L::add(L::add(x[0], x[4]), L::add(x[2], x[6]));
            let hi = L::add(L::add(x[1], x[5]), L::add(x[3], x[7]));
            let mut r = L::add(lo, hi);
            if KIND == id::Q4_1 {
                r = L::add(r, summs[j]);
            }
            L::store(out.as_mut_ptr().add(L::ROWS * j), r);
        }
    }
}

/// One token over a run of units (8-row groups, or pairs of them at [`Zmm`] width): `out`'s
/// `i`-th `L::ROWS` values from the unit at `unit(i)`, in ggml's order ([`body`]) or, with
/// `BLOCKS`, the block order ([`body_blocks`]), `T = 1`: the entry points' run loop
/// (`groups_one` in `arch/x86/qdot_r8.rs`, `pairs_one` in `arch/x86/qdot_r16.rs`).
///
/// [`Zmm`]: crate::kernels::arch::x86::lanes::Zmm
///
/// # Safety
/// As [`body`], for every unit `unit(i)` with `i < out.len() / L::ROWS`.
#[inline(always)]
pub(crate) unsafe fn run_one<L: RowLanes, const KIND: u8, const BLOCKS: bool>(
    unit: impl Fn(usize) -> L::Src,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    for (i, o) in out.chunks_exact_mut(L::ROWS).enumerate() {
        // SAFETY: the contract above.
        unsafe {
            if BLOCKS {
                body_blocks::<L, KIND, 1>(unit(i), nb, a, corr, o);
            } else {
                body::<L, KIND, 1>(unit(i), nb, a, corr, o);
            }
        }
    }
}

/// The one-token runs' kinds: `$go!(KIND id, blocks)` for each `(Format, blocks)` that has one
/// (every 8-row kind in ggml's order but Q4_Z, every kind but Q4_1 in the block order).
macro_rules! one_token_kinds {
    ($kind:expr, $blocks:expr, $go:ident) => {
        match ($kind, $blocks) {
            (Format::Q4_1, false) => $go!(id::Q4_1, false),
            (Format::Q4_0, false) => $go!(id::Q4_0, false),
            (Format::Q5_0, false) => $go!(id::Q5_0, false),
            (Format::Q8_0, false) => $go!(id::Q8_0, false),
            (Format::Q4_0, true) => $go!(id::Q4_0, true),
            (Format::Q5_0, true) => $go!(id::Q5_0, true),
            (Format::Q8_0, true) => $go!(id::Q8_0, true),
            (Format::Q4_Z, true) => $go!(id::Q4_Z, true),
            other => unreachable!("{other:?} has no 8-row one-token run"),
        }
    };
}
pub(crate) use one_token_kinds;

/// Chunk `c` of the quants at `q` (after the headers of the superblocks at `s`) as low and
/// high nibbles, with Q5_0's fifth bits or'd in.
///
/// # Safety
/// As [`body`]: chunk `c` and the fifth bits are inside every group.
#[inline(always)]
unsafe fn nibbles<L: RowLanes, const KIND: u8>(
    s: L::Src,
    q: L::Src,
    c: usize,
    m4: L::I,
) -> (L::I, L::I) {
    // SAFETY: the contract above.
    unsafe {
        let v = L::quants(L::at(q, 32 * c));
        let mut lo = L::and(v, m4);
        let mut hi = L::and(L::srli16_4(v), m4);
        if KIND == id::Q5_0 {
            let (bl, bh) = L::fifth(L::at(s, 16), c);
            lo = L::or(lo, bl);
            hi = L::or(hi, bh);
        }
        (lo, hi)
    }
}

/// As [`body`] in the block order of `arch::generic::qdot_generic::dot_scalar_blocks` (Q4_0, Q5_0 and Q8_0):
/// the same integer steps summed into one `i32` per row and token for the whole block (exact:
/// at most `32 * 128 * 128`), then one FMA; `corr[j * nb + b][0]` holds block `b`'s whole
/// correction.
///
/// # Safety
/// As [`body`].
#[inline(always)]
pub(crate) unsafe fn body_blocks<L: RowLanes, const KIND: u8, const T: usize>(
    g: L::Src,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let (sb, hdr) = (superblock_bytes(kind_of(KIND)), header_bytes(kind_of(KIND)));
    // SAFETY: as `body`.
    unsafe {
        let mut acc = [L::zero(); T];
        let m4 = L::isplat8(0x0f);
        // `body`'s prefetches: one token (a decode step's LM head) streams the weights from
        // DRAM, and without them the block order read the default model's Q8_0 head about a
        // third slower than ggml's order did.
        let ahead = crate::kernels::simd::prefetch_ahead();
        let next = L::next_distance(nb * sb);
        for b in 0..nb {
            let s = L::at(g, b * sb);
            L::prefetch(s, sb, ahead, next);
            let d = L::halves(s);
            let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            // Q4_Z: `corr` holds `-sum(y)`, which each row's zero point multiplies.
            let mut isum: [L::I; T] = std::array::from_fn(|j| {
                let c = corr.get_unchecked(j * nb + b)[0];
                if KIND == id::Q4_Z {
                    L::zero_terms(L::at(s, 16), c)
                } else {
                    L::isplat(c)
                }
            });
            let q = L::at(s, hdr);
            if KIND == id::Q8_0 {
                for c in 0..8 {
                    let w = L::quants(L::at(q, 32 * c));
                    let u = if L::VNNI {
                        L::xor(w, L::isplat8(-128))
                    } else {
                        L::sign8(w, w)
                    };
                    for j in 0..T {
                        let y = L::word(ab[j].qs.as_ptr().add(4 * c));
                        let y = if L::VNNI { y } else { L::sign8(y, w) };
                        isum[j] = L::dot(isum[j], u, y);
                    }
                }
            } else {
                // Without VNNI, `maddubs` pairs are added in `i16` across the 4 chunks (one sum
                // for the low nibbles, one for the high: at most 4 * 2 * 31 * 128 = 31744 for
                // Q5_0, so exact), then widened once: 2 `madd`s per block and token, not 8
                // (about 10% less CPU per Q4_0 prefill matmul on Zen 3).
                let mut p16 = [[L::izero(); 2]; T];
                for c in 0..4 {
                    let (lo, hi) = nibbles::<L, KIND>(s, q, c, m4);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr();
                        let (yl, yh) = (L::word(y.add(4 * c)), L::word(y.add(16 + 4 * c)));
                        if L::VNNI {
                            isum[j] = L::dot(isum[j], lo, yl);
                            isum[j] = L::dot(isum[j], hi, yh);
                        } else {
                            let [pl, ph] = &mut p16[j];
                            *pl = L::add16(*pl, L::maddubs(lo, yl));
                            *ph = L::add16(*ph, L::maddubs(hi, yh));
                        }
                    }
                }
                if !L::VNNI {
                    for (isum, [pl, ph]) in isum.iter_mut().zip(&p16) {
                        let w = L::add32(L::widen16(*pl), L::widen16(*ph));
                        *isum = L::add32(*isum, w);
                    }
                }
            }
            for j in 0..T {
                let sc = L::mul(d, L::splat(ab[j].d));
                acc[j] = L::fma(sc, L::to_f(isum[j]), acc[j]);
            }
        }
        for (j, v) in acc.iter().enumerate() {
            L::store(out.as_mut_ptr().add(L::ROWS * j), *v);
        }
    }
}
