//! The ggml-numerics k-quant matmul over 8-row interleaved weights (`matmul/repack_k.rs`).
//!
//! How: as `matmul::qdot_k::matmul_q8k` (each activation row quantized to Q8_K once, through the
//! activation cache when the caller has one), then tasks of whole 8-row groups claimed by the
//! pool's threads; each group's super-blocks are read as one sequential stream and dotted
//! against up to 4 (Q4_K) or 2 (Q6_K) tokens per pass (`arch/x86/qdot_rk.rs`; with AVX-512 VNNI
//! its integer dots are `vpdpbusd`).
//!
//! Numerics: bit-identical to `matmul::qdot_k::matmul_q8k` on the stored rows, on every ISA, thread
//! count and token tiling (the integer steps are exact and the float steps run per row in
//! block order). The scalar path rebuilds each stored row and runs `matmul::qdot_k::dot_scalar`.
//!
//! Cost: the integer work of `matmul_q8k`, without its per-row-block scale unpacking, two
//! horizontal sums and scalar f16 conversions; memory: the Q8_K activations (292 bytes per 256
//! values and token) in reused scratch.

use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::RG;
use crate::kernels::format::Format;
use crate::kernels::matmul::groups::{over_segments, over_tokens, segments};
use crate::kernels::matmul::qdot_k::{dot_scalar, quantized_k};
use crate::kernels::matmul::repack_k::RepackedK;
use crate::kernels::qact::{BlockQ8K, QK_K};
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Checked;
use crate::pool::ThreadPool;

/// `out[t][n] = dot(W[n], Q8_K(x[t]))` with `W` repacked; `x` is `[t, k]` with `k = 256 * nb`
/// (validated by the caller).
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_rk(
    ck: Checked,
    w: &RepackedK,
    x: &[f32],
    t: usize,
    k: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    matmul_rk_fused(ck, &[w], x, t, k, &mut [out], pool, cache);
}

/// [`matmul_rk`] for several weights of one kind and `k` that read the same `x` (`outs[i]` is
/// `[t, ws[i].n]`), in one pool dispatch (`matmul/groups.rs`); each output is bit-identical to
/// its own call's.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_rk_fused(
    ck: Checked,
    ws: &[&RepackedK],
    x: &[f32],
    t: usize,
    k: usize,
    outs: &mut [&mut [f32]],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    let (kind, nb) = (ws[0].kind, ws[0].nb);
    debug_assert!(ws.iter().all(|w| w.kind == kind && w.nb == nb) && ws.len() == outs.len());
    debug_assert!(k == nb * QK_K && x.len() == t * k);
    debug_assert!(ws.iter().zip(outs.iter()).all(|(w, o)| o.len() == t * w.n));
    let mut local = Scratch::<BlockQ8K>::zeroed(0);
    let xq = quantized_k(x, cache, &mut local);
    let simd = crate::kernels::matmul::groups::simd_rows(ck);
    let stream = simd && t == 1;
    // Q4_K prefill on AVX-512 BW takes two groups per step (`arch/x86/qdot_rk.rs`'s `groups2`): a
    // 256x2048x2048 matmul 9.0-9.1 -> 7.7-8.0 ms. One-token calls measured the same either
    // way (423-439 us for 8192 rows), so they keep one.
    #[cfg(target_arch = "x86_64")]
    let pairs = simd
        && kind == Format::Q4_K
        && ck.isa().avx512()
        && t >= 2
        && crate::kernels::arch::x86::qdot_rk::available512();
    #[cfg(not(target_arch = "x86_64"))]
    let pairs = false;
    let segs = segments(ws, outs, |w| (w.groups(), if pairs { 2 } else { 1 }, w.n));
    over_segments(
        pool,
        segs,
        stream.then_some(&|s: usize, g: usize| ws[s].group(g)),
        |s, g, write| {
            let w = ws[s];
            let n = w.n;
            if !simd {
                let mut row = Scratch::<u8>::zeroed(nb * kind.block_bytes());
                let mut res = [0.0f32; RG];
                for tok in 0..t {
                    for (r, v) in res.iter_mut().enumerate().take(RG.min(n - g * RG)) {
                        w.stored_row(g * RG + r, &mut row);
                        *v = dot_scalar(kind, &row, &xq[tok * nb..(tok + 1) * nb]);
                    }
                    write(tok, &res);
                }
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if pairs && g + 1 < w.groups() {
                use crate::kernels::arch::x86::qdot_rk::{groups2, TOKENS2 as TOKENS};
                let (g0, g1) = (w.group(g), w.group(g + 1));
                let mut res = [0.0f32; TOKENS * 2 * RG];
                over_tokens(
                    t,
                    |_| TOKENS,
                    2 * RG,
                    &mut res,
                    write,
                    |tok, tt, res| {
                        groups2(g0, g1, nb, &xq[tok * nb..], tt, res);
                    },
                );
                return;
            }
            #[cfg(target_arch = "x86_64")]
            {
                use crate::kernels::arch::x86::qdot_rk::{group, tile_tokens};
                let grp = w.group(g);
                let mut res = [0.0f32; 4 * RG];
                let tile = |left| tile_tokens(kind, left);
                over_tokens(t, tile, RG, &mut res, write, |tok, tt, res| {
                    group(ck, kind, grp, nb, &xq[tok * nb..], tt, res);
                });
            }
        },
    );
}

#[cfg(test)]
#[path = "rk_tests.rs"]
mod tests;
