//! The grouped Q4_Z integer dot (`matmul/repack_zg.rs`: 8 rows, one scale and one zero point
//! per row per quantization group of `P` 32-value blocks) on 256-bit registers, one 8-row group
//! a step, `maddubs` + `madd` ([`Avx2`]) or `vpdpbusd ymm` ([`Avx2Vnni`]), written once over
//! [`RowLanes`]. Results are bit-identical to `arch::generic::qdot_zg_generic::group_z`
//! (tested on every ISA this CPU runs).
//!
//! Float order, per row `r` and token `j` (the module doc of `arch/generic/qdot_zg_generic.rs`
//! states the same): `acc = 0`; for each quantization group, with the row's scale `dw`, zero
//! point `z` and the token's block scales `dx_b`:
//! - `s = 0; for b in group: s = fma(dx_b, isum_b, s)`, `isum_b = sum(q * y)` over block `b`'s
//!   32 unsigned nibbles `q` and Q8 activations `y`, exact in `i32` (at most `32 * 15 * 128`)
//!   and so exact in `f32`;
//! - `n = 0; for b in group: n = fma(dx_b, -sum_b(y), n)` (a token's value, the same for every
//!   row: once per group and token, in scalar);
//! - `acc = fma(dw, fma(z, n, s), acc)`.
//!
//! So per block only the integer dot and one FMA run per token; the f16 scales, the zero
//! bytes and the zero term are converted and folded once per group. Without VNNI, each
//! block's 8 `maddubs` results add up in `i16` (at most `8 * 2 * 15 * 128 = 30720`: exact)
//! and widen once.
//!
//! Invariant (soundness): [`body_z`] is `#[inline(always)]`, reached only from the entry
//! functions below, whose `#[target_feature]` covers `L`'s ops and whose asserts cover the
//! bounds it reads within; [`group_z`] is reached only through `matmul_r8` (or the expert
//! matmul) with a `Checked` AVX2 or AVX-512 token, and with `vnni` only after `avx512vnni` and
//! `avx512vl` were detected. The 512-bit width (`Zmm`) is not instantiated.

use crate::kernels::arch::x86::lanes::{Avx2, Avx2Vnni};
use crate::kernels::arch::x86::lanes_rows::RowLanes;
use crate::kernels::blocks::{zg_superblock_bytes, RG, ZG_HEADER};
use crate::kernels::qact::BlockQ8;

/// `out[j * 8 + r]` = row `r` of the grouped Q4_Z group `grp` (`nb` blocks a row, `per` of them
/// a quantization group) dotted with token `j < t` (`a[j * nb..]`), in the order of the module
/// docs; `corr[j * nb + b][0]` holds `-sum(y)` of block `b` (`matmul_r8`'s corrections). `t` is
/// at most 2, or 4 with `vnni` (`arch::x86::qdot_r8::tile_tokens`).
///
/// # Panics
/// If `per` is not 2 or 4, does not divide `nb`, or a slice is shorter than that (internal
/// invariant; the callers size them).
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn group_z(
    vnni: bool,
    per: usize,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    assert!(
        matches!(per, 2 | 4) && nb.is_multiple_of(per),
        "group of {per}"
    );
    assert!(grp.len() >= nb / per * zg_superblock_bytes(per));
    assert!(t >= 1 && t <= if vnni { 4 } else { 2 });
    assert!(a.len() >= t * nb && corr.len() >= t * nb && out.len() >= t * RG);
    macro_rules! go {
        ($p:expr) => {
            // SAFETY (every arm): AVX2/FMA/F16C by the module invariant, VNNI/VL by the
            // caller's detection when `vnni`; the asserts above are the bounds every call reads
            // within.
            match (vnni, t) {
                // SAFETY: see above.
                (true, 4) => unsafe { z_vnni::<{ $p }, 4>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, 3) => unsafe { z_vnni::<{ $p }, 3>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, 2) => unsafe { z_vnni::<{ $p }, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, _) => unsafe { z_vnni::<{ $p }, 1>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, 2) => unsafe { z_avx2::<{ $p }, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, _) => unsafe { z_avx2::<{ $p }, 1>(grp, nb, a, corr, out) },
            }
        };
    }
    if per == 4 {
        go!(4)
    } else {
        go!(2)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn z_avx2<const P: usize, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { body_z::<Avx2, P, T>(grp.as_ptr(), nb, a, corr, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn z_vnni<const P: usize, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's, VNNI included.
    unsafe { body_z::<Avx2Vnni, P, T>(grp.as_ptr(), nb, a, corr, out) }
}

/// [`group_z`]'s loop at width `L`, `P` blocks a quantization group, `T` tokens.
///
/// # Safety
/// `L`'s features enabled by the caller; `nb / P` grouped superblocks at `g`, `T * nb` blocks
/// in `a` and `corr`, `T * L::ROWS` values in `out`.
#[inline(always)]
unsafe fn body_z<L: RowLanes, const P: usize, const T: usize>(
    g: L::Src,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let sb = zg_superblock_bytes(P);
    let nq = nb / P;
    // SAFETY: superblock `q < nb / P` is inside the group, activation/correction `j * nb + b`
    // inside `a`/`corr` for `j < T`, `b < nb`, and `out` holds `T * L::ROWS` values (the
    // contract); the features are the caller's.
    unsafe {
        let mut acc = [L::zero(); T];
        let m4 = L::isplat8(0x0f);
        let ahead = crate::kernels::simd::prefetch_ahead();
        let next = L::next_distance(nq * sb);
        for q in 0..nq {
            let s = L::at(g, q * sb);
            L::prefetch(s, sb, ahead, next);
            let mut part = [L::zero(); T];
            let mut nys = [0.0f32; T];
            for bi in 0..P {
                let b = q * P + bi;
                let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
                let qb = L::at(s, ZG_HEADER + 128 * bi);
                let mut isum = [L::izero(); T];
                for c in 0..4 {
                    let v = L::quants(L::at(qb, 32 * c));
                    let lo = L::and(v, m4);
                    let hi = L::and(L::srli16_4(v), m4);
                    for j in 0..T {
                        let y = ab[j].qs.as_ptr();
                        let (yl, yh) = (L::word(y.add(4 * c)), L::word(y.add(16 + 4 * c)));
                        if L::VNNI {
                            isum[j] = L::dot(isum[j], lo, yl);
                            isum[j] = L::dot(isum[j], hi, yh);
                        } else {
                            // `i16` pairs, widened once per block (see the module docs).
                            isum[j] = L::add16(isum[j], L::maddubs(lo, yl));
                            isum[j] = L::add16(isum[j], L::maddubs(hi, yh));
                        }
                    }
                }
                for j in 0..T {
                    let i = if L::VNNI {
                        isum[j]
                    } else {
                        L::widen16(isum[j])
                    };
                    part[j] = L::fma(L::splat(ab[j].d), L::to_f(i), part[j]);
                    let ny = corr.get_unchecked(j * nb + b)[0] as f32;
                    nys[j] = ab[j].d.mul_add(ny, nys[j]);
                }
            }
            let d = L::halves(s);
            let z = L::to_f(L::zero_terms(L::at(s, 16), 1));
            for j in 0..T {
                let v = L::fma(z, L::splat(nys[j]), part[j]);
                acc[j] = L::fma(d, v, acc[j]);
            }
        }
        for (j, v) in acc.iter().enumerate() {
            L::store(out.as_mut_ptr().add(L::ROWS * j), *v);
        }
    }
}
