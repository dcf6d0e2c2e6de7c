//! The ggml-numerics matmul over 8-row interleaved weights (`matmul/repack.rs`).
//!
//! How: as `matmul/q8.rs` (each activation row quantized once, to Q8_1 for Q4_1 and Q8_0
//! otherwise), plus, per activation block, the 8 lane corrections the integer steps fold in
//! (`-8 * sum(y)` over each lane's 4 activations for Q4_0; `-128 * sum(y)` for Q8_0 on VNNI;
//! `-sum(y)` for Q4_Z, times each row's zero point in the kernel;
//! none otherwise). Tasks are runs of whole 8-row groups claimed by the pool's threads; each
//! group's superblocks are read as one sequential stream and dotted against 1 (AVX2) or 2 (VNNI)
//! tokens per pass.
//!
//! Numerics: one order per weight kind whatever the token count, so that a token's result does
//! not depend on the tokens beside it (batch invariance), on every ISA and thread count:
//! - Q4_1 in ggml's order, bit-identical to `matmul/q8.rs` (and so to llama.cpp's vec_dot), so
//!   that the default model's logits match llama.cpp's AVX2 reference to 1e-5
//!   (`tests/test_models_smollm2.py`); a Q4_1 block order on AMX measured 15-25% faster matmuls
//!   but moved those logits by 0.57, activation quantization amplifying the rounding differences.
//! - Q4_Z (GPTQ/AWQ int4) in the block order too, `sum((q - z) * y)` exact in `i32` as
//!   `sum(q * y) - z * sum(y)`: no llama.cpp reference to keep, and one multiply per block; the
//!   stored-row path (ggml's lane order) only runs where nothing re-laid it. In the grouped
//!   layout (`matmul/repack_zg.rs`: one scale and zero point per quantization group) the
//!   scale and the zero term are folded once per group instead, in the order stated in
//!   `arch/generic/qdot_zg_generic.rs` (`arch/x86/qdot_zg.rs` on AVX2 and VNNI, one group a
//!   step: it has no 512-bit or AMX form), from the same per-block corrections (`-sum(y)`).
//! - Q4_0, Q5_0 and Q8_0 in the block order: each block's 32 products summed exactly in `i32`,
//!   then one FMA per block (the stored-row dot's `dot_scalar_blocks`; the order of llama.cpp's
//!   repacked Q4_0 GEMM and GEMV and of its AMX kernels), which needs an eighth of the float work
//!   and is the one order an AMX tile (whole-block `i32` sums) gives: `arch/x86/amx.rs` runs it
//!   for several tokens there, bit-identical to the other paths. llama.cpp's stored-layout Q8_0
//!   vec_dot (one token) differs from it only in `f32` rounding, within `(k / 32 + 8) * 2^-24 *
//!   sum_b |dw dx sum_b|` (tested), far below the activation rounding `matmul/q8.rs` bounds.
//!
//! Without SIMD, the portable loop (`arch/generic/qdot_r8_generic.rs`) reads the same layout, with the
//! same results.
//!
//! Cost: as `matmul/q8.rs`, with about half the vector work per weight block; memory: the
//! corrections, `t * k / 32` entries of 32 bytes, in reused scratch.

use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::RG;
use crate::kernels::format::Format;
#[cfg(target_arch = "x86_64")]
use crate::kernels::matmul::groups::over_segments_one;
use crate::kernels::matmul::groups::{over_segments, over_tokens, segments};
use crate::kernels::matmul::repack::Repacked;
use crate::kernels::qact::{BlockQ8, QK8};
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::{Checked, Isa};
use crate::pool::ThreadPool;

/// Groups (of 8 rows, summed over a fused call's weights) from which one-token calls take two
/// groups per step: 2048 rows.
pub(crate) const PAIRS_FROM: usize = 256;

/// Fills `corr[i]` with `-mult * sum(y[4l..4l+4])` for each lane `l` of activation block `i`.
pub(crate) fn corrections(a: &[BlockQ8], mult: i32, corr: &mut [[i32; 8]]) {
    for (c, b) in corr.iter_mut().zip(a) {
        for (l, v) in c.iter_mut().enumerate() {
            let s: i32 = b.qs[4 * l..4 * l + 4].iter().map(|&q| i32::from(q)).sum();
            *v = -mult * s;
        }
    }
}

/// The corrections of the first `blocks_n` activation blocks for the SIMD kernels (zeros where
/// `mult` is 0); in the block order the 8 lanes' sum sits in lane 0.
pub(crate) fn lane_corrections(
    xq: &[BlockQ8],
    blocks_n: usize,
    mult: i32,
    blocks: bool,
) -> Scratch<[i32; 8]> {
    let mut corr = Scratch::<[i32; 8]>::zeroed(0);
    corr.resize(blocks_n, [0; 8]);
    if mult != 0 {
        corrections(xq, mult, &mut corr);
        if blocks {
            for c in corr.iter_mut() {
                *c = [c.iter().sum(), 0, 0, 0, 0, 0, 0, 0];
            }
        }
    }
    corr
}

/// The multiplier of the lane corrections [`corrections`] folds in for `kind` (0: none).
pub(crate) fn lane_mult(kind: Format, vnni: bool) -> i32 {
    match kind {
        Format::Q4_0 => 8,
        Format::Q5_0 => 16,
        Format::Q8_0 if vnni => 128,
        // `-sum(y)`, which the kernels multiply by each row's zero point.
        Format::Q4_Z => 1,
        _ => 0,
    }
}

/// `out[t][n] = dot(W[n], Q8(x[t]))` with `W` repacked; `x` is `[t, k]` with `k = 32 * nb`
/// (validated by the caller, as for `matmul_q8`).
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_r8(
    ck: Checked,
    w: &Repacked,
    x: &[f32],
    t: usize,
    k: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    matmul_r8_fused(ck, &[w], x, t, k, &mut [out], pool, cache);
}

/// [`matmul_r8`] for several weights of one kind and `k` that read the same `x` (`outs[i]` is
/// `[t, ws[i].n]`), in one pool dispatch (`matmul/groups.rs`); each output is bit-identical to
/// its own call's.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_r8_fused(
    ck: Checked,
    ws: &[&Repacked],
    x: &[f32],
    t: usize,
    k: usize,
    outs: &mut [&mut [f32]],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    let (kind, nb) = (ws[0].kind, ws[0].nb);
    debug_assert!(ws.iter().all(|w| w.kind == kind && w.nb == nb) && ws.len() == outs.len());
    debug_assert!(k == nb * QK8 && x.len() == t * k);
    debug_assert!(ws.iter().zip(outs.iter()).all(|(w, o)| o.len() == t * w.n));
    let mut local = Scratch::<BlockQ8>::zeroed(0);
    let xq = crate::kernels::matmul::q8::quantized(x, kind.act_sum(), cache, &mut local, pool);
    let simd = crate::kernels::matmul::groups::simd_rows(ck);
    let vnni = crate::kernels::matmul::groups::vnni_rows(ck);
    let mult = lane_mult(kind, vnni);
    // Every call but Q4_1's takes the block order, whatever `t` is, so that a token's result
    // does not depend on the tokens beside it (see the module docs).
    let blocks = kind != Format::Q4_1;
    #[cfg(target_arch = "x86_64")]
    // AMX tiles have no per-row zero point: Q4_Z keeps the VNNI loops there.
    if blocks && t >= 2 && ck.isa() == Isa::Amx && kind != Format::Q4_Z {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            crate::kernels::arch::x86::amx::matmul(w, xq, t, out, pool);
        }
        return;
    }
    let corr = lane_corrections(xq, t * nb, if simd { mult } else { 0 }, blocks);
    let corr: &[[i32; 8]] = &corr;
    // ggml's order on AVX-512 VNNI takes two groups per step (`arch/x86/qdot_r16.rs`) with two or
    // more tokens (Q4_1's prefill) and for large one-token matrices: decoding the 1B Q8_0
    // model went 15.7-15.8 -> 17.4-18.0 tok/s (alternating runs). Small ones keep one group per
    // step: pairs on every matrix made the default model's decode slower (about 175 against
    // 200 tok/s), its small matrices splitting into half as many units.
    // The block order takes two groups per step on AVX-512 VNNI too, 8 tokens a pass
    // (`arch::x86::qdot_r16::groups2_blocks`).
    // A fused call (gate/up) is one dispatch over all its weights' groups, so its size is
    // what decides: SmolLM2's gate/up (2 x 192 groups) took single groups while one 3072-row
    // matrix of the same bytes took pairs, about 15% faster from L3.
    #[cfg(target_arch = "x86_64")]
    let call_groups: usize = ws.iter().map(|w| w.groups()).sum();
    #[cfg(target_arch = "x86_64")]
    let pairs = |w: &Repacked| {
        (blocks || t >= 2 || call_groups >= PAIRS_FROM)
            && w.qgroup == 1
            && vnni
            && crate::kernels::arch::x86::qdot_r16::has_vnni512()
    };
    #[cfg(not(target_arch = "x86_64"))]
    let pairs = |_: &Repacked| false;
    let segs = segments(ws, outs, |w| {
        (w.groups(), if pairs(w) { 2 } else { 1 }, w.n)
    });
    // One token (SIMD rows only exist on x86): a claimed run of groups per kernel call.
    #[cfg(target_arch = "x86_64")]
    if simd && t == 1 {
        let first = |s: usize, g: usize| ws[s].group(g);
        over_segments_one(pool, segs, &first, |s, g0, g1, out| {
            let w = ws[s];
            one_token(w, (kind, vnni, blocks, pairs(w)), g0..g1, xq, corr, out);
        });
        return;
    }
    over_segments(pool, segs, None, |s, g, write| {
        let w = ws[s];
        if !simd {
            // The portable loop on the layout as it is (`arch/generic/qdot_r8_generic.rs`).
            use crate::kernels::arch::generic::qdot_r8_generic;
            let mut res = Scratch::<f32>::zeroed(t * RG);
            if w.qgroup > 1 {
                use crate::kernels::arch::generic::qdot_zg_generic::group_z;
                group_z(w.qgroup, w.group(g), nb, xq, t, &mut res);
            } else if blocks {
                qdot_r8_generic::group_blocks(kind, w.group(g), nb, xq, t, &mut res);
            } else {
                qdot_r8_generic::group(kind, w.group(g), nb, xq, t, &mut res);
            }
            for tok in 0..t {
                write(tok, &res[tok * RG..(tok + 1) * RG]);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if pairs(w) && g + 1 < w.groups() {
            use crate::kernels::arch::x86::qdot_r16::{
                groups2, groups2_blocks, BLOCK_TOKENS, TOKENS,
            };
            let (g0, g1) = (w.group(g), w.group(g + 1));
            let mut res = [0.0f32; BLOCK_TOKENS * 2 * RG];
            let tile = if blocks { BLOCK_TOKENS } else { TOKENS };
            over_tokens(
                t,
                |_| tile,
                2 * RG,
                &mut res,
                write,
                |tok, tt, res| {
                    let (a, c) = (&xq[tok * nb..], &corr[tok * nb..]);
                    if blocks {
                        groups2_blocks(kind, g0, g1, nb, a, c, tt, res);
                    } else {
                        groups2(kind, g0, g1, nb, a, c, tt, res);
                    }
                },
            );
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::arch::x86::qdot_r8::{group, group_blocks, tile_tokens};
            let grp = w.group(g);
            let mut res = [0.0f32; 4 * RG];
            let tile = |_| tile_tokens(vnni, kind, blocks);
            over_tokens(t, tile, RG, &mut res, write, |tok, tt, res| {
                let (a, c) = (&xq[tok * nb..], &corr[tok * nb..]);
                if w.qgroup > 1 {
                    use crate::kernels::arch::x86::qdot_zg::group_z;
                    group_z(vnni, w.qgroup, grp, nb, a, c, tt, res);
                } else if blocks {
                    group_blocks(vnni, kind, grp, nb, a, c, tt, res);
                } else {
                    group(vnni, kind, grp, nb, a, c, tt, res);
                }
            });
        }
    });
}

/// One token over groups `gs` of `w` (whole units of the call), `out` their rows (padding past
/// `w.n` dropped): the run of groups whose rows are all in `out` (in pairs where `pairs`) in
/// one kernel call, then the rest (a short last group, or a pair's last group alone) through
/// the same entry points into a scratch tile, so every row gets the kernel, and so the bits,
/// the multi-token tiles give it (the same body at `t = 1`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn one_token(
    w: &Repacked,
    (kind, vnni, blocks, pairs): (Format, bool, bool, bool),
    gs: std::ops::Range<usize>,
    xq: &[BlockQ8],
    corr: &[[i32; 8]],
    out: &mut [f32],
) {
    use crate::kernels::arch::x86::{qdot_r16, qdot_r8};
    let (nb, g0) = (w.nb, gs.start);
    // Rows of group `g` in `out` get `res`'s first rows.
    let put = |out: &mut [f32], g: usize, res: &[f32]| {
        let at = (g - g0) * RG;
        let rows = res.len().min(out.len() - at);
        out[at..at + rows].copy_from_slice(&res[..rows]);
    };
    if w.qgroup > 1 {
        use crate::kernels::arch::x86::qdot_zg::group_z;
        for g in gs {
            let mut res = [0.0f32; RG];
            group_z(vnni, w.qgroup, w.group(g), nb, xq, corr, 1, &mut res);
            put(out, g, &res);
        }
        return;
    }
    let step = if pairs { 2 } else { 1 };
    let run = out.len() / RG / step * step;
    if run > 0 {
        let (bytes, gbytes) = (w.groups_at(g0, run), w.group(g0).len());
        let o = &mut out[..run * RG];
        if pairs {
            qdot_r16::pairs_one((kind, blocks), bytes, gbytes, nb, xq, corr, o);
        } else {
            qdot_r8::groups_one((vnni, kind, blocks), bytes, gbytes, nb, xq, corr, o);
        }
    }
    let mut g = g0 + run;
    while g < gs.end {
        // A pair where both groups exist (the second may be short), else one group.
        let k = if pairs && g + 1 < w.groups() { 2 } else { 1 };
        let mut tile = [0.0f32; 2 * RG];
        let (bytes, res) = (w.groups_at(g, k), &mut tile[..k * RG]);
        if k == 2 {
            qdot_r16::pairs_one((kind, blocks), bytes, bytes.len() / 2, nb, xq, corr, res);
        } else {
            qdot_r8::groups_one((vnni, kind, blocks), bytes, bytes.len(), nb, xq, corr, res);
        }
        put(out, g, res);
        g += k;
    }
}

#[cfg(test)]
#[path = "r8_tests.rs"]
mod tests;
