//! The ggml-numerics matmul of FP8 weights (`F8_S`: compressed-tensors `float-quantized` and
//! `quant_method: fp8` as loaded): `out[t][n] = dot(W[n], x[t])`, the E4M3 bytes widened to
//! `f32` in registers, never decoded to memory, activations as computed (FP8 weight-only,
//! W8A16 in the checkpoint's terms; llama.cpp has no such type).
//!
//! How: rows of `W` in 4-row groups claimed by the pool's threads (`groups::over_row_groups`),
//! each group dotted against every token in place ([`dot_rows`]): per 32-value block, 8 lanes of `e * x` (`e` the E4M3
//! value over 256, exact) summed by FMAs, then `acc = fma(256 * d, inner, acc)` per lane and
//! `hsum8` at the end (`arch/generic/f8dot_generic.rs`).
//!
//! Numerics: scalar and AVX2 are bit-identical (`f8_tests.rs`; AVX-512 CPUs run the AVX2
//! loop); a token's result does not depend on the tokens beside it (one chain per output
//! whatever the tile). Error vs the exact product of the dequantized weights with `x`: `f32`
//! accumulation only, `|got - exact| <= (k / 32 + 8) * 2^-24 * 1.01 * sum_k |w x|` (in each
//! lane 4 roundings a block and one for its scaled sum, `k / 32` blocks, then 3 for the lane
//! sum; the tests assert it). A NaN code (0x7f, 0xff) gives NaN, as the reference decode does. A block scale
//! above `2^120` would overflow `256 * d` (no FP8 checkpoint has one: E4M3's largest value is
//! 448, so such a block's weights would be beyond f32 range).
//!
//! Cost: `2 * t * n * k` flops, the weights read once per call; no scratch beyond `4 * t`
//! floats a thread.

use crate::kernels::arch::generic::f8dot_generic::{dot_scalar, F8_BLOCK};
use crate::kernels::matmul::groups::{over_row_groups, Layout};
use crate::kernels::simd::{Checked, Isa};
use crate::pool::ThreadPool;

/// See the module docs. Shapes were validated by `matmul_numerics`: `x` is `[t, k]`, `w` is `n`
/// rows of `row_bytes`, `out` is `[t, n]`, `k` is whole 32-blocks and positive.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_f8(
    ck: Checked,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    debug_assert!(k.is_multiple_of(32) && x.len() == t * k);
    over_row_groups(pool, (w, row_bytes, n), t, out, |rows, nr, res| {
        dot_rows(ck, rows, row_bytes, nr, x, k, t, res);
        Layout {
            tok_stride: nr,
            row_stride: 1,
        }
    });
}

/// `out[j * nr + r] = dot(row r, token j)` for `nr` (at most 4) consecutive `F8_S` rows of
/// `row_bytes` bytes at `w` and `t` rows of `k` activations at `x`, on the path `ck` names
/// (bit-identical across paths).
///
/// # Panics
/// If `w` holds fewer than `nr` rows, `x` fewer than `t` rows, `out` fewer than `t * nr`
/// values, or `nr > 4` (internal invariants; the matmul validates shapes first).
#[allow(clippy::too_many_arguments, reason = "one tile's shapes")]
pub(crate) fn dot_rows(
    ck: Checked,
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    x: &[f32],
    k: usize,
    t: usize,
    out: &mut [f32],
) {
    assert!(
        nr <= 4
            && row_bytes == k / 32 * F8_BLOCK
            && w.len() >= nr * row_bytes
            && x.len() >= t * k
            && out.len() >= t * nr,
        "f8 shapes"
    );
    match ck.isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => {
            crate::kernels::arch::x86::f8dot::dot_rows(w, row_bytes, nr, x, k, t, out);
        }
        _ => {
            for j in 0..t {
                for r in 0..nr {
                    let row = &w[r * row_bytes..(r + 1) * row_bytes];
                    out[j * nr + r] = dot_scalar(row, &x[j * k..(j + 1) * k]);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "f8_tests.rs"]
mod tests;
