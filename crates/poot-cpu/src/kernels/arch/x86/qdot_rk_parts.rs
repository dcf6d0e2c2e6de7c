//! Register steps shared by the 8-row k-quant bodies (`arch/x86/qdot_rk.rs`, on `maddubs` or
//! `vpdpbusd`, at 256 or 512 bits): the byte picks, Q4_K's scale and min unpacking and min
//! sums, Q6_K's quant unpacking. Each is exact integer work on the layout of
//! `matmul/repack_k.rs`, lane by lane, so every body sees the same integers for a row.
//!
//! Invariant (soundness): every function here is `#[inline(always)]` and register-only or
//! reads what its caller vouches for; callers are `#[target_feature]` functions enabling the
//! width's features.

use crate::kernels::arch::x86::lanes_k::KLanes;
use crate::kernels::matmul::repack_k::q4k;
use crate::kernels::qact::BlockQ8K;

/// Shuffle masks that copy byte `j` of every 32-bit lane into both of its 16-bit halves
/// (zero-extended): per lane the bytes `[4l + j, 0x80, 4l + j, 0x80]`.
#[inline(always)]
pub(super) unsafe fn pick_masks<L: KLanes>() -> [L::I; 4] {
    // SAFETY: register-only ops; the width's features enabled by the caller.
    unsafe {
        let lane = L::lane128([0, 0x4_0004, 0x8_0008, 0xc_000c]);
        std::array::from_fn(|j| {
            let base = (0x8000_8000u32 + 0x1_0001 * j as u32) as i32;
            L::add32(lane, L::isplat(base))
        })
    }
}

/// Shuffle masks that zero-extend byte `j` of every 32-bit lane to the whole lane: per lane
/// the bytes `[4l + j, 0x80, 0x80, 0x80]`.
#[inline(always)]
pub(super) unsafe fn pick32_masks<L: KLanes>() -> [L::I; 4] {
    // SAFETY: register-only ops; the width's features enabled by the caller.
    unsafe {
        let lane = L::lane128([0, 4, 8, 12]);
        std::array::from_fn(|j| L::add32(lane, L::isplat((0x8080_8000u32 + j as u32) as i32)))
    }
}

/// Bits 6-7 of every byte of `w`, moved to bits 4-5 (the high bits of scales and mins 4-7).
#[inline(always)]
unsafe fn top2<L: KLanes>(w: L::I, k3: L::I) -> L::I {
    // SAFETY: register-only ops; the width's features enabled by the caller.
    unsafe { L::slli32::<4>(L::and(L::srli32::<6>(w), k3)) }
}

/// ggml's 12-byte scale unpacking (its kmask1..3) of the Q4_K super-block at `s`, one row per
/// lane: the bytes of `sc[0]`, `sc[1]` are sub-blocks 0-3, 4-7's scales; `mn[0]`, `mn[1]`
/// their mins.
#[inline(always)]
pub(super) unsafe fn q4k_scales<L: KLanes>(s: L::Src) -> ([L::I; 2], [L::I; 2]) {
    // SAFETY: the super-block's 96 scale bytes are readable in every group (caller).
    unsafe {
        let k1 = L::isplat(0x3f3f_3f3f);
        let k2 = L::isplat(0x0f0f_0f0f);
        let k3 = L::isplat(0x0303_0303);
        let w0 = L::quants(L::at(s, q4k::SCALES));
        let w1 = L::quants(L::at(s, q4k::SCALES + 32));
        let w2 = L::quants(L::at(s, q4k::SCALES + 64));
        let sc = [L::and(w0, k1), L::or(L::and(w2, k2), top2::<L>(w0, k3))];
        let mn = [
            L::and(w1, k1),
            L::or(L::and(L::srli32::<4>(w2), k2), top2::<L>(w1, k3)),
        ];
        (sc, mn)
    }
}

/// Q4_K's `summ` per row and token: the sum over sub-blocks `m` of `min_m * (bsums[2m] +
/// bsums[2m + 1])`, with `mn` from [`q4k_scales`] and `pick` from [`pick_masks`].
#[inline(always)]
pub(super) unsafe fn q4k_mins<L: KLanes, const T: usize>(
    mn: [L::I; 2],
    pick: &[L::I; 4],
    ab: &[&BlockQ8K; T],
) -> [L::I; T] {
    // SAFETY: reads the `bsums` of `T` blocks (references); features enabled by the caller.
    unsafe {
        let mut msum = [L::izero(); T];
        for m in 0..8 {
            let mp = L::shuffle8(mn[m / 4], pick[m % 4]);
            for j in 0..T {
                let bs = L::word(ab[j].bsums.as_ptr().add(2 * m).cast());
                msum[j] = L::add32(msum[j], L::madd16(mp, bs));
            }
        }
        msum
    }
}

/// The 6-bit quants (0..63) of the Q6_K word triple at `qs` (layout: `repack_k::q6k::QS`, its
/// bits re-mixed by `repack_k::mix_q6k`), 8 rows' 4 bytes each per group and vector: vector
/// `g` holds elements `32 g + 4 w..+4` of the half.
#[inline(always)]
pub(super) unsafe fn q6k_unpack<L: KLanes>(qs: L::Src) -> [L::I; 4] {
    // SAFETY: 96 readable bytes at `qs` in every group (caller); features enabled by it.
    unsafe {
        let low = L::isplat8(0x3f);
        let top = L::isplat8(0xc0u8 as i8);
        let b0 = L::quants(qs);
        let b1 = L::quants(L::at(qs, 32));
        let b2 = L::quants(L::at(qs, 64));
        // Quant 3's bit pairs masked before the 16-bit shifts, so no bits cross into the
        // byte below: bits 4-5 from byte 0, 2-3 from byte 1, 0-1 from byte 2.
        let t = L::or(L::and(b0, top), L::srli16::<2>(L::and(b1, top)));
        let t = L::or(t, L::srli16::<4>(L::and(b2, top)));
        [
            L::and(b0, low),
            L::and(b1, low),
            L::and(b2, low),
            L::srli16::<2>(t),
        ]
    }
}
