//! The 8-row interleaved integer dot (`matmul/repack.rs`, `matmul/r8.rs`) on 256-bit registers,
//! one 8-row group a step: the entry points that pick the token tile and run the shared bodies
//! of `arch/x86/qdot_r.rs` at [`Avx2`] (`maddubs` + `madd`) or [`Avx2Vnni`] (`vpdpbusd ymm`)
//! width. Numerics and integer steps: `arch/x86/qdot_r.rs`; results are bit-identical to
//! `arch::generic::qdot_generic::dot_scalar{,_blocks}` and `arch::generic::qdot_r8_generic`.
//!
//! Invariant (soundness): reached only through `matmul_r8` with a `Checked` AVX2 or AVX-512
//! token (AVX2, FMA, F16C detected), and the VNNI variant only after `avx512vnni` and
//! `avx512vl` were detected.

use crate::kernels::arch::x86::lanes::{Avx2, Avx2Vnni};
use crate::kernels::arch::x86::qdot_r::{body, body_blocks, one_token_kinds, run_one};
use crate::kernels::blocks::{superblock_bytes, RG};
use crate::kernels::format::{id, Format};
use crate::kernels::qact::BlockQ8;

/// Whether this CPU has the 256-bit VNNI dot (`vpdpbusd ymm`).
pub(crate) fn has_vnni() -> bool {
    crate::CpuFeatures::get().vnni256()
}

/// Tokens one call handles: VNNI machines have 32 vector registers (16 accumulators fit);
/// the block order needs 2 registers per token, not 8. Q8_0's AVX2 block order takes 3: its
/// 8 chunks a block each load and sign-fold the weights once for every token of the tile,
/// which took a little less CPU than 2 (Q4_0 and Q5_0 measured alike with 2 and 3, so they keep
/// 2).
pub(crate) fn tile_tokens(vnni: bool, kind: Format, blocks: bool) -> usize {
    match (vnni, blocks) {
        (true, true) => 4,
        (false, true) if kind == Format::Q8_0 => 3,
        (false, true) | (true, false) => 2,
        (false, false) => 1,
    }
}

/// `out[j * 8 + r]` = row `r` of group `grp` dotted with token `j` in the block order of
/// `arch::generic::qdot_generic::dot_scalar_blocks` (Q4_0, Q5_0 and Q8_0), for `j < t` (up to [`tile_tokens`]);
/// `corr[j * nb + b][0]` holds block `b`'s whole correction (`matmul_r8`).
///
/// # Panics
/// As [`group`].
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn group_blocks(
    vnni: bool,
    kind: Format,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    assert!(grp.len() >= nb * superblock_bytes(kind));
    assert!(
        t >= 1 && t <= tile_tokens(vnni, kind, true) && a.len() >= t * nb && corr.len() >= t * nb
    );
    assert!(out.len() >= t * RG);
    macro_rules! go {
        ($k:expr) => {
            // SAFETY (every arm): AVX2/FMA/F16C by the module invariant, VNNI/VL by
            // `has_vnni` when `vnni`; the asserts above are the bounds every call reads within.
            match (vnni, t) {
                // SAFETY: see above.
                (true, 4) => unsafe { blocks_vnni::<{ $k }, 4>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, 3) => unsafe { blocks_vnni::<{ $k }, 3>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, 2) => unsafe { blocks_vnni::<{ $k }, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, _) => unsafe { blocks_vnni::<{ $k }, 1>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, 3) => unsafe { blocks_avx2::<{ $k }, 3>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, 2) => unsafe { blocks_avx2::<{ $k }, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, _) => unsafe { blocks_avx2::<{ $k }, 1>(grp, nb, a, corr, out) },
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blocks_avx2<const KIND: u8, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { body_blocks::<Avx2, KIND, T>(grp.as_ptr(), nb, a, corr, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn blocks_vnni<const KIND: u8, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's, VNNI included.
    unsafe { body_blocks::<Avx2Vnni, KIND, T>(grp.as_ptr(), nb, a, corr, out) }
}

/// `out[j * 8 + r]` = row `r` of group `grp` (`nb` superblocks of `kind`) dotted with token `j`
/// (`a[j * nb..]`, corrections `corr[j * nb..]`) for `j < t` (1, or 2 with VNNI).
///
/// # Panics
/// If the slices are shorter than that (internal invariant; `matmul_r8` sizes them).
#[allow(clippy::too_many_arguments, reason = "one tile's operands")]
pub(crate) fn group(
    vnni: bool,
    kind: Format,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    t: usize,
    out: &mut [f32],
) {
    assert!(grp.len() >= nb * superblock_bytes(kind));
    assert!(
        t >= 1 && t <= tile_tokens(vnni, kind, false) && a.len() >= t * nb && corr.len() >= t * nb
    );
    assert!(out.len() >= t * RG);
    macro_rules! go {
        ($k:expr) => {
            // SAFETY (all three): AVX2/FMA/F16C by the module invariant, VNNI/VL by `has_vnni`
            // when `vnni`; the asserts above are the bounds every call reads within.
            match (vnni, t) {
                // SAFETY: see above.
                (true, 2) => unsafe { group_vnni::<{ $k }, 2>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (true, _) => unsafe { group_vnni::<{ $k }, 1>(grp, nb, a, corr, out) },
                // SAFETY: see above.
                (false, _) => unsafe { group_avx2::<{ $k }>(grp, nb, a, corr, out) },
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const KIND: u8>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { body::<Avx2, KIND, 1>(grp.as_ptr(), nb, a, corr, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn group_vnni<const KIND: u8, const T: usize>(
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's, VNNI included.
    unsafe { body::<Avx2Vnni, KIND, T>(grp.as_ptr(), nb, a, corr, out) }
}

/// One token over a run of consecutive groups: `out[8 * i + r]` = row `r` of the `i`-th group
/// at `grps` (groups `gbytes` apart, `out.len() / 8` of them) dotted with the token (`a`,
/// corrections `corr`), in ggml's order ([`group`]) or, with `blocks`, the block order
/// ([`group_blocks`]); the same body as those at `t = 1`, so the same bits.
///
/// Why: one call per claimed run (`matmul/groups.rs::over_segments_one`) does the entry's checks
/// and set-up once instead of once per group.
///
/// # Panics
/// If `out.len()` is not a multiple of 8 or a slice is shorter than that (internal invariant).
#[allow(clippy::too_many_arguments, reason = "one run's operands")]
pub(crate) fn groups_one(
    (vnni, kind, blocks): (bool, Format, bool),
    grps: &[u8],
    gbytes: usize,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let count = out.len() / RG;
    assert!(out.len().is_multiple_of(RG) && gbytes >= nb * superblock_bytes(kind));
    assert!(grps.len() >= count * gbytes && a.len() >= nb && corr.len() >= nb);
    macro_rules! go {
        ($k:expr, $b:expr) => {
            if vnni {
                // SAFETY: AVX2/FMA/F16C by the module invariant, VNNI/VL by `has_vnni` when
                // `vnni`; the asserts above are the bounds every group reads within.
                unsafe { run_vnni::<{ $k }, { $b }>(grps, gbytes, nb, a, corr, out) }
            } else {
                // SAFETY: AVX2/FMA/F16C by the module invariant; the asserts above.
                unsafe { run_avx2::<{ $k }, { $b }>(grps, gbytes, nb, a, corr, out) }
            }
        };
    }
    one_token_kinds!(kind, blocks, go)
}

/// [`groups_one`]'s loop on 256-bit registers without VNNI.
///
/// # Safety
/// AVX2, FMA, F16C detected; [`groups_one`]'s bounds.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<const KIND: u8, const BLOCKS: bool>(
    grps: &[u8],
    gbytes: usize,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let unit = |i: usize| grps.as_ptr().wrapping_add(i * gbytes);
    // SAFETY: group i's `nb` superblocks lie inside `grps` (the caller's bounds).
    unsafe { run_one::<Avx2, KIND, BLOCKS>(unit, nb, a, corr, out) }
}

/// [`groups_one`]'s loop with 256-bit VNNI.
///
/// # Safety
/// As [`run_avx2`], and AVX-512 VNNI/VL detected.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn run_vnni<const KIND: u8, const BLOCKS: bool>(
    grps: &[u8],
    gbytes: usize,
    nb: usize,
    a: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    let unit = |i: usize| grps.as_ptr().wrapping_add(i * gbytes);
    // SAFETY: group i's `nb` superblocks lie inside `grps` (the caller's bounds).
    unsafe { run_one::<Avx2Vnni, KIND, BLOCKS>(unit, nb, a, corr, out) }
}
