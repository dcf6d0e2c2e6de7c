//! The ggml-numerics FP8 matmul over the grouped-scale 8-row layout (`matmul/repack_f8g.rs`):
//! `out[t][n] = dot(W[n], x[t])` with activations as computed; several weights that read the
//! same `x` (a layer's q/k/v, its gate/up) in one pool dispatch, each output bit-identical to
//! its own call's.
//!
//! How: the activations are prescaled by `2^48` once a call (the layout's codes widen to their
//! values times `2^-120`; see `arch/generic/f8g_generic.rs`), then tasks are runs of whole
//! 8-row groups claimed by the pool's threads, as `matmul/f8r.rs`. One token runs with each
//! row's span lanes in registers; more go in passes of up to 8, each block widened once a
//! pass (`arch/x86/f8dot_g.rs`; AVX-512 and AMX CPUs run these AVX2 loops). Without SIMD the
//! portable loop reads the layout in the same order.
//!
//! Numerics: each output is one chain of the portable dot's float steps whatever the token
//! count, pass or thread count, so a token's result does not depend on the tokens beside it.
//! Against the stored layout's dot (`matmul/f8.rs`, one scale step per 32 codes) it differs
//! by `f32` rounding only (tested against float64). A token with an activation of magnitude
//! `2^78` or more (its prescale would overflow) takes the stored-row dot instead, every row.
//!
//! Cost: `2 * t * n * k` flops; the weights read once per pass of 8 tokens; scratch: the
//! prescaled activations (`t * k` floats) and 8 results a pass.

use crate::kernels::arch::generic::f8dot_generic::{dot_scalar, F8_BLOCK};
use crate::kernels::arch::generic::f8g_generic::{row_dot, X_SCALE};
use crate::kernels::blocks::RG;
use crate::kernels::matmul::groups::{over_segments, over_tokens, segments};
use crate::kernels::matmul::repack_f8g::RepackedF8G;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Checked;
use crate::pool::ThreadPool;

/// Activations at or above this magnitude would overflow the prescale (`2^80`) in some sum.
const TOO_BIG: f32 = (1u128 << 78) as f32;

/// See the module docs. `x` is `[t, k]` with `k = 32 * w.nb`, `out` is `[t, w.n]` (validated by
/// the caller).
pub(crate) fn matmul_f8g(
    ck: Checked,
    w: &RepackedF8G,
    x: &[f32],
    t: usize,
    k: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    matmul_f8g_fused(ck, &[w], x, t, k, &mut [out], pool);
}

/// [`matmul_f8g`] for up to `MAX_SEGMENTS` weights of the same `k` (`outs[i]` is
/// `[t, ws[i].n]`), in one dispatch; the activations are prescaled once.
pub(crate) fn matmul_f8g_fused(
    ck: Checked,
    ws: &[&RepackedF8G],
    x: &[f32],
    t: usize,
    k: usize,
    outs: &mut [&mut [f32]],
    pool: &ThreadPool,
) {
    debug_assert!(ws.iter().all(|w| k == 32 * w.nb) && x.len() == t * k);
    debug_assert!(ws.len() == outs.len());
    debug_assert!(ws.iter().zip(outs.iter()).all(|(w, o)| o.len() == t * w.n));
    let simd = crate::kernels::matmul::groups::simd_rows(ck);
    let mut xs = Scratch::<f32>::zeroed(t * k);
    let mut big = Scratch::<usize>::zeroed(0);
    for (tok, (xs, x)) in xs.chunks_exact_mut(k).zip(x.chunks_exact(k)).enumerate() {
        // One pass: the prescale and the token's largest magnitude together.
        let mut most = 0.0f32;
        for (xs, &x) in xs.iter_mut().zip(x) {
            *xs = x * X_SCALE;
            most = most.max(x.abs());
        }
        if most >= TOO_BIG {
            big.push(tok);
        }
    }
    let (xs, big) = (&xs[..], &big[..]);
    let segs = segments(ws, outs, |w| (w.groups(), 1, w.n));
    let stream = simd && t == 1;
    over_segments(
        pool,
        segs,
        stream.then_some(&|s: usize, g: usize| ws[s].group(g)),
        |s, g, write| {
            let w = ws[s];
            let (grp, rows) = (w.group(g), RG.min(w.n - g * RG));
            // The tokens too large for the prescale: the stored rows' dot, row by row.
            let exact = |tok: usize, res: &mut [f32]| {
                let mut row = Scratch::<u8>::zeroed(w.nb * F8_BLOCK);
                for (r, res) in res.iter_mut().enumerate().take(rows) {
                    w.stored_row(g * RG + r, &mut row);
                    *res = dot_scalar(&row, &x[tok * k..(tok + 1) * k]);
                }
            };
            if !simd {
                let mut res = [0.0f32; RG];
                for tok in 0..t {
                    if big.contains(&tok) {
                        exact(tok, &mut res);
                    } else {
                        for (r, res) in res.iter_mut().enumerate().take(rows) {
                            *res = row_dot(grp, w.nb, r, &xs[tok * k..(tok + 1) * k]);
                        }
                    }
                    write(tok, &res);
                }
                return;
            }
            #[cfg(target_arch = "x86_64")]
            {
                use crate::kernels::arch::x86::f8dot_g::{group_tokens, TILE};
                let mut res = [0.0f32; TILE * RG];
                over_tokens(
                    t,
                    |_| TILE,
                    RG,
                    &mut res,
                    write,
                    |tok, tt, res| {
                        group_tokens(grp, w.nb, &xs[tok * k..], tt, res);
                        for &b in big.iter().filter(|&&b| (tok..tok + tt).contains(&b)) {
                            exact(b, &mut res[(b - tok) * RG..(b - tok + 1) * RG]);
                        }
                    },
                );
            }
        },
    );
}

#[cfg(test)]
#[path = "f8g_tests.rs"]
mod tests;
