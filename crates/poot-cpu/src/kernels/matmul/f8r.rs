//! The ggml-numerics FP8 matmul over 8-row interleaved weights (`matmul/repack_f8.rs`):
//! `out[t][n] = dot(W[n], x[t])` with activations as computed, as the stored-layout FP8
//! matmul (`matmul/f8.rs`) and bit-identical to it.
//!
//! How: tasks are runs of whole 8-row groups claimed by the pool's threads; each group's
//! superblocks are read as one stream. One token (a decode step) runs with the 8 lane
//! accumulators in registers; more tokens go in passes of up to 8, each superblock widened
//! once a pass (`arch/x86/f8dot_r8.rs`; AVX-512 and AMX CPUs run these AVX2 loops: there is no
//! 512-bit form yet). Without SIMD, each row is rebuilt in its stored form
//! and dotted by the portable loop.
//!
//! Numerics: each output is one chain of the stored-row dot's float steps, whatever the token
//! count, pass or thread count, so a token's result does not depend on the tokens beside it;
//! the error bound is the stored FP8 matmul's.
//!
//! Cost: `2 * t * n * k` flops; the weights read once per pass of 8 tokens (from cache after
//! the first while the group is hot); scratch: 8 results a pass and, on the portable path,
//! one stored row.

use crate::kernels::arch::generic::f8dot_generic::{dot_scalar, F8_BLOCK};
use crate::kernels::blocks::RG;
use crate::kernels::matmul::groups::{over_segments, over_tokens, Segment, Segments};
use crate::kernels::matmul::repack_f8::RepackedF8;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Checked;
use crate::pool::ThreadPool;

/// See the module docs. `x` is `[t, k]` with `k = 32 * w.nb`, `out` is `[t, w.n]` (validated by
/// the caller).
pub(crate) fn matmul_f8r(
    ck: Checked,
    w: &RepackedF8,
    x: &[f32],
    t: usize,
    k: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    debug_assert!(k == 32 * w.nb && x.len() == t * k && out.len() == t * w.n);
    let simd = crate::kernels::matmul::groups::simd_rows(ck);
    let segs: Segments<'_> = [
        Some(Segment {
            groups: w.groups(),
            per: 1,
            n: w.n,
            out,
        }),
        None,
        None,
        None,
    ];
    let stream = simd && t == 1;
    over_segments(
        pool,
        segs,
        stream.then_some(&|_: usize, g: usize| w.group(g)),
        |_, g, write| {
            if !simd {
                let mut row = Scratch::<u8>::zeroed(w.nb * F8_BLOCK);
                let mut res = Scratch::<f32>::zeroed(t * RG);
                // Padding rows beyond `n` are never written.
                for r in 0..RG.min(w.n - g * RG) {
                    w.stored_row(g * RG + r, &mut row);
                    for tok in 0..t {
                        res[tok * RG + r] = dot_scalar(&row, &x[tok * k..(tok + 1) * k]);
                    }
                }
                for tok in 0..t {
                    write(tok, &res[tok * RG..(tok + 1) * RG]);
                }
                return;
            }
            #[cfg(target_arch = "x86_64")]
            {
                use crate::kernels::arch::x86::f8dot_r8::{group_tokens, TILE};
                let grp = w.group(g);
                let mut res = [0.0f32; TILE * RG];
                over_tokens(
                    t,
                    |_| TILE,
                    RG,
                    &mut res,
                    write,
                    |tok, tt, res| {
                        group_tokens(grp, w.nb, &x[tok * k..], tt, res);
                    },
                );
            }
        },
    );
}

#[cfg(test)]
#[path = "f8r_tests.rs"]
mod tests;
