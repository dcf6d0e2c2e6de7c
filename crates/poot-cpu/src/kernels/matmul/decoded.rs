//! The matmul paths that decode weights inside the kernel, under the dispatch of `matmul/mod.rs`
//! and below every family that falls back to them (`matmul/bf16.rs` runs its rounded
//! activations through here): float weights with `k % 8 == 0` in tinyBLAS's 8-lane order, one
//! token read in place (`matmul/float.rs`), several in packed tiles (`matmul/lanes8.rs`);
//! otherwise (quantized weights, and float ones whose `k` is not a multiple of 8) row
//! blocks decoded to `f32` and register-tiled against token tiles (see `matmul/mod.rs`'s module
//! docs for the numerics and cost).

use crate::kernels::format::Format;
use crate::kernels::ggml::Numerics;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::{self, Checked, NR};
use crate::pool::{SharedMut, ThreadPool};

/// Decoded-row block size, in floats (see `matmul_cached`).
pub(crate) const BLOCK_FLOATS: usize = 64 * 1024;
/// Tokens run against a row block per pass: a multiple of every `dot_rows` tile width, so
/// the tiles (and so the results) are the same as one pass over all tokens.
pub(crate) const TOKEN_TILE: usize = 4;

/// `out[t][n] = sum_k x[t][k] * W[n][k]` on one of the paths above; `matmul_cached` validated
/// the shapes (`t, n, k > 0`, `row_bytes` per row of `p`).
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_decoded(
    ck: Checked,
    numerics: Numerics,
    p: Format,
    x: &[f32],
    (t, k): (usize, usize),
    (w, row_bytes, n): (&[u8], usize, usize),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    // Float weights with `k % 8 == 0`, in tinyBLAS's 8-lane order whatever the token count (so
    // that a token's result does not depend on the tokens beside it): one token read in place
    // (`matmul/float.rs`), several in packed tiles (`matmul/lanes8.rs`), the activations as
    // given, within this path's bound (`matmul/bf16.rs` passes its rounded ones).
    use crate::kernels::matmul::float::{self, Order};
    if float::applies(ck, p, t, k, Order::Lanes8) {
        float::gemv_float(ck, Order::Lanes8, p, x, k, (w, row_bytes, n), out, pool);
        return;
    }
    if crate::kernels::matmul::lanes8::applies(ck, p, t, k) {
        let f = crate::kernels::matmul::lanes8::matmul_lanes8;
        f(ck, (p, numerics), x, (t, k), (w, row_bytes, n), out, pool);
        return;
    }

    // Rows are decoded a block at a time (about 256 KiB of f32, so it stays in L2) and every
    // token tile is run against the whole block before the next one: an activation tile is
    // then read from memory once per block rather than once per NR rows (a 512-token prefill
    // re-read its activations from L3 hundreds of times per matmul before).
    let block = (BLOCK_FLOATS / k / NR).clamp(1, 16) * NR;
    let blocks = n.div_ceil(block);
    let (per_task, tasks) = pool.split(blocks);
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || (Scratch::zeroed(block * k), Scratch::zeroed(NR * TOKEN_TILE)),
        |(rows, res), task| {
            for b in task * per_task..((task + 1) * per_task).min(blocks) {
                let n0 = b * block;
                let nr = block.min(n - n0);
                for r in 0..nr {
                    let src = &w[(n0 + r) * row_bytes..(n0 + r + 1) * row_bytes];
                    simd::decode(ck, p, src, &mut rows[r * k..(r + 1) * k]);
                }
                for tok0 in (0..t).step_by(TOKEN_TILE) {
                    let tt = TOKEN_TILE.min(t - tok0);
                    let xs = &x[tok0 * k..(tok0 + tt) * k];
                    for q in (0..nr).step_by(NR) {
                        // Rows past nr in the last quad keep stale values; never written.
                        simd::dot_rows(ck, &rows[q * k..(q + NR) * k], k, xs, tt, res);
                        for tok in 0..tt {
                            for r in 0..NR.min(nr - q) {
                                let i = (tok0 + tok) * n + n0 + q + r;
                                // SAFETY: row n0 + q + r belongs to this task's blocks only,
                                // so no other task writes index i.
                                unsafe { shared.write(i, res[tok * NR + r]) };
                            }
                        }
                    }
                }
            }
        },
    );
}
