//! The 8-row layout's ggml-order dot (`arch/x86/qdot_r8.rs`) two groups at a time in 512-bit
//! registers, for AVX-512 VNNI: lanes 0-7 hold group `g`'s rows, lanes 8-15 group `g + 1`'s.
//!
//! Why: Q4_1's prefill keeps ggml's order (8 lane sums per block, which AMX tiles cannot give),
//! so it is bound by these instructions; each step here does 16 rows' work for the same count.
//! The one-token matvec is faster too, but only large matrices gain end to end, so the 8-row
//! matmul picks this for those and for prefill (measurements: `docs/performance-history.md`, "Measurements
//! behind the kernels").
//!
//! Numerics: the body is the 256-bit one (`arch/x86/qdot_r.rs`, generic over the register
//! width), so every lane runs exactly the 256-bit steps for its row (the same integer lane sums,
//! the same `fma(dw * dy, lane, acc)` block after block, the same fold and Q4_1 term), and
//! results are bit-identical to `arch::x86::qdot_r8::group` and `arch::generic::qdot_generic::dot_scalar`
//! (tested).
//!
//! Invariant (soundness): reached only through `matmul_r8` after `has_vnni512` was true.

use crate::kernels::arch::x86::lanes::Zmm;
use crate::kernels::arch::x86::qdot_r;
use crate::kernels::blocks::{superblock_bytes, RG};
use crate::kernels::format::{id, Format};
use crate::kernels::qact::BlockQ8;

/// Whether this CPU has the 512-bit VNNI dot and the byte ops the Q4 unpacking uses.
pub(crate) fn has_vnni512() -> bool {
    crate::CpuFeatures::get().vnni512()
}

/// Tokens one call handles (8 accumulators of 16 rows each per token).
pub(crate) const TOKENS: usize = 2;

/// `out[j * 16 + r]` = row `r` of groups `g0` (`r < 8`) and `g1` (`r >= 8`) dotted with token
/// `j < t` (`t <= TOKENS`) in ggml's order; `a`, `corr` as for `arch::x86::qdot_r8::group`.
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_r8` sizes them).
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn groups2(
    kind: Format,
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    check(kind, (g0, g1, nb), (a, corr, t, TOKENS), out);
    macro_rules! go {
        ($k:expr) => {
            if t == 2 {
                // SAFETY: AVX-512 F/BW/VL/VNNI and F16C detected (`has_vnni512`, the module
                // invariant); the asserts above are the bounds every call reads within.
                unsafe { body::<{ $k }, 2>(g0, g1, nb, a, corr, out) }
            } else {
                // SAFETY: as above.
                unsafe { body::<{ $k }, 1>(g0, g1, nb, a, corr, out) }
            }
        };
    }
    match kind {
        Format::Q4_0 => go!(id::Q4_0),
        Format::Q4_1 => go!(id::Q4_1),
        Format::Q5_0 => go!(id::Q5_0),
        Format::Q8_0 => go!(id::Q8_0),
        other => unreachable!("{other:?} has no 8-row layout"),
    }
}

/// The bounds every two-group kernel reads and writes within: `nb` superblocks in each group,
/// `t` (1 to `most`) tokens' activations and corrections, `t * 16` results; and the CPU.
///
/// # Panics
/// If any is short (internal invariant; `matmul_r8` sizes them).
fn check(
    kind: Format,
    (g0, g1, nb): (&[u8], &[u8], usize),
    (a, corr, t, most): (&[BlockQ8], &[[i32; 8]], usize, usize),
    out: &[f32],
) {
    let need = nb * superblock_bytes(kind);
    assert!(g0.len() >= need && g1.len() >= need && has_vnni512());
    assert!((1..=most).contains(&t) && a.len() >= t * nb && corr.len() >= t * nb);
    assert!(out.len() >= t * 2 * RG);
}

/// The shared ggml-order body (`arch::x86::qdot_r::body`) at [`Zmm`] width: two groups a
/// step.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C detected; [`groups2`]'s bounds (asserted by [`check`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn body<const KIND: u8, const T: usize>(
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: the contract above; this function's features cover `Zmm`'s ops.
    unsafe { qdot_r::body::<Zmm, KIND, T>((g0.as_ptr(), g1.as_ptr()), nb, a, corr, out) }
}

/// Tokens one [`groups2_blocks`] call handles (one `f32` and one `i32` accumulator of 16
/// rows each per token, the unpacked nibbles shared by all of them).
pub(crate) const BLOCK_TOKENS: usize = 8;

/// `out[j * 16 + r]` = row `r` of groups `g0` (`r < 8`) and `g1` (`r >= 8`) dotted with token
/// `j < t` (`t <= BLOCK_TOKENS`) in the block order of `arch::generic::qdot_generic::dot_scalar_blocks` (Q4_0,
/// Q5_0 and Q8_0): each lane runs `arch::x86::qdot_r8::group_blocks`'s steps for its row, so the
/// bits are that function's. `corr[j * nb + b][0]` holds block `b`'s whole correction
/// (`matmul_r8`).
///
/// Why: the 256-bit kernel does 8 rows per `vpdpbusd`; here each one does 16, and the nibble
/// unpacking is shared by twice the tokens.
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_r8` sizes them).
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn groups2_blocks(
    kind: Format,
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    check(kind, (g0, g1, nb), (a, corr, t, BLOCK_TOKENS), out);
    macro_rules! go {
        ($k:expr) => {
            // SAFETY (every arm): AVX-512 F/BW/VL/VNNI and F16C detected (`has_vnni512`, the
            // module invariant); the asserts above are the bounds every call reads within.
            match t {
                // SAFETY: see above.
                8 => unsafe { body_blocks::<{ $k }, 8>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                7 => unsafe { body_blocks::<{ $k }, 7>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                6 => unsafe { body_blocks::<{ $k }, 6>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                5 => unsafe { body_blocks::<{ $k }, 5>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                4 => unsafe { body_blocks::<{ $k }, 4>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                3 => unsafe { body_blocks::<{ $k }, 3>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                2 => unsafe { body_blocks::<{ $k }, 2>(g0, g1, nb, a, corr, out) },
                // SAFETY: see above.
                _ => unsafe { body_blocks::<{ $k }, 1>(g0, g1, nb, a, corr, out) },
            }
        };
    }
    match kind {
        Format::Q4_0 => go!(id::Q4_0),
        Format::Q5_0 => go!(id::Q5_0),
        Format::Q8_0 => go!(id::Q8_0),
        Format::Q4_Z => go!(id::Q4_Z),
        other => unreachable!("{other:?} keeps ggml's order or has no 8-row layout"),
    }
}

/// The shared block-order body (`arch::x86::qdot_r::body_blocks`) at [`Zmm`] width.
///
/// # Safety
/// As [`body`], with [`groups2_blocks`]'s bounds.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn body_blocks<const KIND: u8, const T: usize>(
    g0: &[u8],
    g1: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: the contract above; this function's features cover `Zmm`'s ops.
    unsafe { qdot_r::body_blocks::<Zmm, KIND, T>((g0.as_ptr(), g1.as_ptr()), nb, a, corr, out) }
}

/// [`groups2`] (ggml's order) or, with `blocks`, [`groups2_blocks`] for one token over a run
/// of consecutive pairs of groups at `grps` (groups `gbytes` apart, `out.len() / 16` pairs):
/// `out[16 * i + r]` = row `r` of pair `i`; the same body at `t = 1`, so the same bits. One
/// call per claimed run, as `arch::x86::qdot_r8::groups_one`.
///
/// # Panics
/// If `out.len()` is not a multiple of 16 or a slice is shorter than that (internal
/// invariant).
#[allow(clippy::too_many_arguments, reason = "one run's operands")]
pub(crate) fn pairs_one(
    (kind, blocks): (Format, bool),
    grps: &[u8],
    gbytes: usize,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let pairs = out.len() / (2 * RG);
    assert!(out.len().is_multiple_of(2 * RG) && gbytes >= nb * superblock_bytes(kind));
    assert!(grps.len() >= 2 * pairs * gbytes && a.len() >= nb && corr.len() >= nb);
    assert!(has_vnni512());
    macro_rules! go {
        ($k:expr, $b:expr) => {
            // SAFETY: AVX-512 F/BW/VL/VNNI and F16C detected (asserted above); the asserts
            // are the bounds every pair reads within.
            unsafe { run_pairs::<{ $k }, { $b }>(grps, gbytes, nb, a, corr, out) }
        };
    }
    qdot_r::one_token_kinds!(kind, blocks, go)
}

/// [`pairs_one`]'s loop.
///
/// # Safety
/// As [`body`], with [`pairs_one`]'s bounds.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_pairs<const KIND: u8, const BLOCKS: bool>(
    grps: &[u8],
    gbytes: usize,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let p = grps.as_ptr();
    let unit = |i: usize| {
        (
            p.wrapping_add(2 * i * gbytes),
            p.wrapping_add((2 * i + 1) * gbytes),
        )
    };
    // SAFETY: pair i's two groups lie inside `grps` (the caller's bounds).
    unsafe { qdot_r::run_one::<Zmm, KIND, BLOCKS>(unit, nb, a, corr, out) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::repack::Repacked;
    use crate::kernels::qact::quantize_row_q8;
    use crate::testutil::{synthetic_weights, Rng};
    use poot_core::DType;

    #[test]
    fn two_groups_give_each_groups_bits_on_every_kind() {
        if !crate::testutil::isa_runs("vnni", has_vnni512()) {
            return;
        }
        let mut rng = Rng::new(31);
        for dt in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0] {
            let kind = Format::of(dt).unwrap();
            let (n, k) = (16, 256);
            let nb = k / 32;
            let rp = Repacked::new(kind, &synthetic_weights(dt, n, k, 7), n, nb);
            for t in 1..=TOKENS {
                let x: Vec<f32> = (0..t * k).map(|_| rng.uniform(-3.0, 3.0)).collect();
                let mut a = vec![BlockQ8::default(); t * nb];
                for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
                    quantize_row_q8(xr, ar, kind.act_sum());
                }
                // The corrections `matmul_r8` folds in (Q4_0: -8, Q5_0: -16, Q8_0: -128 on
                // VNNI, per lane of 4 activations).
                let mult =
                    [8, 0, 16, 128][[Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q8_0]
                        .iter()
                        .position(|&q| q == kind)
                        .unwrap()];
                let corr: Vec<[i32; 8]> = a
                    .iter()
                    .map(|b| {
                        std::array::from_fn(|l| {
                            -mult
                                * b.qs[4 * l..4 * l + 4]
                                    .iter()
                                    .map(|&q| i32::from(q))
                                    .sum::<i32>()
                        })
                    })
                    .collect();
                let mut want = vec![0.0f32; t * 16];
                for g in 0..2 {
                    let mut one = [0.0f32; 4 * RG];
                    crate::kernels::arch::x86::qdot_r8::group(
                        true,
                        kind,
                        rp.group(g),
                        nb,
                        &a,
                        &corr,
                        t,
                        &mut one,
                    );
                    for j in 0..t {
                        want[j * 16 + g * 8..j * 16 + g * 8 + 8]
                            .copy_from_slice(&one[j * 8..j * 8 + 8]);
                    }
                }
                let mut got = vec![f32::NAN; t * 16];
                groups2(kind, rp.group(0), rp.group(1), nb, &a, &corr, t, &mut got);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{dt} t={t}");
            }
        }
    }

    #[test]
    fn two_groups_in_block_order_give_each_groups_bits() {
        if !crate::testutil::isa_runs("vnni", has_vnni512()) {
            return;
        }
        let mut rng = Rng::new(37);
        for (dt, mult) in [(DType::Q4_0, 8), (DType::Q5_0, 16), (DType::Q8_0, 128)] {
            let kind = Format::of(dt).unwrap();
            let (n, k) = (16, 256);
            let nb = k / 32;
            let rp = Repacked::new(kind, &synthetic_weights(dt, n, k, 11), n, nb);
            for t in 1..=BLOCK_TOKENS {
                let x: Vec<f32> = (0..t * k).map(|_| rng.uniform(-3.0, 3.0)).collect();
                let mut a = vec![BlockQ8::default(); t * nb];
                for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
                    quantize_row_q8(xr, ar, kind.act_sum());
                }
                // Whole-block corrections, as `matmul_r8` gives the block order.
                let corr: Vec<[i32; 8]> = a
                    .iter()
                    .map(|b| {
                        let s: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
                        [-mult * s, 0, 0, 0, 0, 0, 0, 0]
                    })
                    .collect();
                let mut want = vec![0.0f32; t * 16];
                for g in 0..2 {
                    for tok in (0..t).step_by(4) {
                        let tt = 4.min(t - tok);
                        let mut one = [0.0f32; 4 * RG];
                        crate::kernels::arch::x86::qdot_r8::group_blocks(
                            true,
                            kind,
                            rp.group(g),
                            nb,
                            &a[tok * nb..],
                            &corr[tok * nb..],
                            tt,
                            &mut one,
                        );
                        for j in 0..tt {
                            let at = (tok + j) * 16 + g * 8;
                            want[at..at + 8].copy_from_slice(&one[j * 8..j * 8 + 8]);
                        }
                    }
                }
                let mut got = vec![f32::NAN; t * 16];
                groups2_blocks(kind, rp.group(0), rp.group(1), nb, &a, &corr, t, &mut got);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{dt} t={t}");
            }
        }
    }
}
