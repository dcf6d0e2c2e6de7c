//! The ggml-numerics matmul: `out[t][n] = dot(W[n], Q8(x[t]))` with integer block dots, for
//! the formats the Q8 dot reads: Q4_0, Q4_1, Q5_0, Q8_0, and the zero-point Q4_Z and Q8_Z (GPTQ
//! and AWQ as loaded; llama.cpp has no such type).
//!
//! How: each activation row is quantized once (`qact.rs`: Q8_1 for Q4_1 weights, Q8_0
//! otherwise, as ggml pairs them), then rows of `W` are split into tasks of whole 4-row groups
//! claimed by the pool's threads (`groups::over_row_groups`), and each group is dotted against
//! every token in place (`matmul/stored.rs`): no weight is decoded to floats, and a group's bytes
//! stay in L1 across tokens.
//!
//! Numerics: bit-identical to llama.cpp's CPU matmul for these dtypes (vec_dot for one token,
//! tinyBLAS for prefill; both reduce to the same float steps, see `matmul/stored.rs`), on every ISA
//! and thread count. Bound vs the exact product with the unquantized activations, per output, with
//! `d_b`, `amax_b` the scale and largest `|x|` of activation block `b` and `q` its quants: `|got -
//! exact| <= sum_i |w_i| * (0.51 * d_b(i) + amax_b(i) * 2^-11)` (activation rounding) `+ 2^-10 *
//! 1.01 * sum_b |m_b * d_b * sum(q_b)|` (Q4_1 only: ggml's f16 block sum `s`) `+ ((k / 32 + 4) *
//! 2^-24 * 1.01 + 2^-22) * (sum_i |w_i * d_b(i) * q_i| + Q4_1's sum_b |m_b s_b|)` (`f32`
//! accumulation). The first term dominates: each activation is off by up to `amax / 254` (0.4% of
//! its block's largest value), the price of agreeing with llama.cpp to the bit
//! (`matmul/q8_tests.rs` asserts the bound on real and synthetic weights). The zero-point
//! formats fold the zero into the integers, so their bound is this one without the Q4_1 term
//! (`matmul/zq_tests.rs`).
//!
//! Cost: `t * k` to quantize, then `t * n * k` integer multiply-adds; memory: `t * k / 32`
//! blocks of 40 bytes.

use crate::kernels::act_cache::ActCache;
use crate::kernels::format::Format;
use crate::kernels::matmul::groups::{over_row_groups, Layout};
use crate::kernels::matmul::stored::dot_rows;
use crate::kernels::qact::{quantize_rows_q8, BlockQ8, QK8};
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Checked;
use crate::pool::ThreadPool;

/// See the module docs. Shapes were validated by `matmul_numerics`: `x` is `[t, k]`, `w` is `n`
/// rows of `row_bytes` of `kind` (a format the Q8 dot reads), `out` is `[t, n]`, `k` is whole
/// 32-blocks and positive.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_q8(
    ck: Checked,
    kind: Format,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    debug_assert!(k.is_multiple_of(QK8) && x.len() == t * k);
    let mut local = Scratch::<BlockQ8>::zeroed(0);
    let xq = quantized(x, kind.act_sum(), cache, &mut local, pool);
    over_row_groups(pool, (w, row_bytes, n), t, out, |rows, nr, res| {
        dot_rows(ck, kind, rows, row_bytes, nr, xq, t, res);
        Layout {
            tok_stride: nr,
            row_stride: 1,
        }
    });
}

/// `x` (whole 32-blocks) as Q8 blocks (`with_sum`: Q8_1): from the activation cache when there
/// is one, else quantized into `local`. Rows quantize independently, so quantizing `x` whole
/// (what the cache does) equals row by row.
pub(crate) fn quantized<'a>(
    x: &[f32],
    with_sum: bool,
    cache: Option<(&'a mut ActCache, u64)>,
    local: &'a mut Scratch<BlockQ8>,
    pool: &ThreadPool,
) -> &'a [BlockQ8] {
    match cache {
        Some((c, key)) => c.q8(key, x, with_sum, pool),
        None => {
            local.resize(x.len() / QK8, BlockQ8::default());
            quantize_rows_q8(x, local, with_sum, pool);
            local
        }
    }
}

#[cfg(test)]
#[path = "q8_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "zq_tests.rs"]
mod zq_tests;
