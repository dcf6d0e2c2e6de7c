//! K-quant weights (Q4_K, Q6_K) against Q8_K-quantized activations with integer dots: the
//! ggml-numerics matmul for these dtypes (llama.cpp pairs them with Q8_K the same way).
//!
//! Activations: per 256 values `amax`, `max` (the signed value of largest magnitude),
//! `iscale = -127 / max`, `q = round(iscale * x)` clamped to 127, `d = 1 / iscale`, and the
//! sums of each 16 quants (`bsums`), as ggml's `quantize_row_q8_K`.
//!
//! Dot of one 256-value super-block: every sub-block product `sum q_w * q_x` and the scale
//! and min corrections are exact `i32` arithmetic, reduced to one integer per super-block
//! (`sumi`, and `summ` for Q4_K's mins); then `acc = fma(d_w * d_x, sumi as f32, acc)` (and
//! `accm = fma(dmin_w * d_x, summ as f32, accm)`, result `acc - accm`). Because every integer
//! step is exact, the scalar, AVX2 and VNNI paths give the same bits (tests check this).
//! This is not llama.cpp's lane order, so logits are close to but not bit-identical with
//! llama.cpp's for these dtypes.
//!
//! Error vs the exact product with unquantized activations, per output: the activation
//! rounding `sum_i |w_i| * 0.5 * d_x(i) * (1 + 2^-20)`, plus `sumi`'s rounding to `f32` and the
//! accumulation, `(nb + 2) * 2^-23 * sum_i |w_i * d_x q_i|` (`nb` super-blocks); the tests
//! assert this bound. Cost: `k` integer multiply-adds per row and token, a few scalar ops per
//! 256 values; activations are quantized once per matmul (292 bytes per 256 values).

use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::{finish, scale_min_k4};
use crate::kernels::format::Format;
use crate::kernels::matmul::groups::{over_row_groups, Layout};
use crate::kernels::qact::{quantize_row_q8k, BlockQ8K, QK_K};
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::{Checked, Isa};
use crate::pool::ThreadPool;

/// Exact `(sumi, summ)` of one Q4_K block `b` against `y` (portable reference).
pub(crate) fn q4k_ints(b: &[u8], y: &BlockQ8K) -> (i32, i32) {
    let sc = &b[4..16];
    let (mut sumi, mut summ) = (0i32, 0i32);
    for c in 0..4 {
        let (s1, m1) = scale_min_k4(2 * c, sc);
        let (s2, m2) = scale_min_k4(2 * c + 1, sc);
        let (mut p1, mut p2) = (0i32, 0i32);
        for l in 0..32 {
            let q = b[16 + c * 32 + l];
            p1 += i32::from(q & 0xF) * i32::from(y.qs[c * 64 + l]);
            p2 += i32::from(q >> 4) * i32::from(y.qs[c * 64 + 32 + l]);
        }
        sumi += s1 * p1 + s2 * p2;
        let bs = |j: usize| i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]);
        summ += m1 * bs(2 * c) + m2 * bs(2 * c + 1);
    }
    (sumi, summ)
}

/// Exact `sumi` of one Q6_K block `b` against `y` (portable reference).
pub(crate) fn q6k_ints(b: &[u8], y: &BlockQ8K) -> i32 {
    let mut sumi = 0i32;
    for n in 0..2 {
        let (ql, qh, sc) = (&b[n * 64..], &b[128 + n * 32..], &b[192 + n * 8..]);
        let mut p = [0i32; 8];
        for l in 0..32 {
            let (a, c, h) = (ql[l], ql[l + 32], qh[l]);
            let q = [
                (a & 0xF) | ((h & 3) << 4),
                (c & 0xF) | (((h >> 2) & 3) << 4),
                (a >> 4) | (((h >> 4) & 3) << 4),
                (c >> 4) | (((h >> 6) & 3) << 4),
            ];
            for (g, &qv) in q.iter().enumerate() {
                p[2 * g + l / 16] += i32::from(qv) * i32::from(y.qs[n * 128 + g * 32 + l]);
            }
        }
        for (g, pg) in p.iter().enumerate() {
            // Sub-block g (16 values) has scale sc[g] and quants offset by 32.
            let s = i32::from(sc[g] as i8);
            sumi += s * (pg - 32 * i32::from(y.bsums[n * 8 + g]));
        }
    }
    sumi
}

/// One weight row against one activation row, portable; `kind` is Q4_K or Q6_K.
pub(crate) fn dot_scalar(kind: Format, w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 2];
    for (b, y) in w.chunks_exact(kind.block_bytes()).zip(a) {
        let ints = match kind {
            Format::Q4_K => q4k_ints(b, y),
            _ => (q6k_ints(b, y), 0),
        };
        finish(kind, b, y, ints, &mut acc);
    }
    acc[0] - acc[1]
}

/// `out[j] = dot(w, a[j * nb..(j + 1) * nb])` for every token `j < out.len()`, on the path
/// `ck` names (the same bits on every path and for any number of tokens).
fn dot_tokens(ck: Checked, kind: Format, w: &[u8], a: &[BlockQ8K], nb: usize, out: &mut [f32]) {
    match ck.isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => {
            crate::kernels::arch::x86::qdot_k::dot_tokens(ck, kind, w, a, nb, out)
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = dot_scalar(kind, w, &a[j * nb..(j + 1) * nb]);
            }
        }
    }
}

/// `x` (whole super-blocks) as Q8_K blocks: from the activation cache when the caller has one,
/// else quantized into `local`.
pub(crate) fn quantized_k<'a>(
    x: &[f32],
    cache: Option<(&'a mut ActCache, u64)>,
    local: &'a mut Scratch<BlockQ8K>,
) -> &'a [BlockQ8K] {
    match cache {
        Some((c, key)) => c.q8k(key, x),
        None => {
            local.resize(x.len() / QK_K, BlockQ8K::default());
            quantize_row_q8k(x, local);
            local
        }
    }
}

/// `out[t][n] = dot(W[n], Q8_K(x[t]))`; shapes validated by `matmul_numerics` (`k` whole
/// super-blocks, `w` `n` rows of `row_bytes`).
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_q8k(
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
    let nb = k / QK_K;
    // Super-blocks quantize independently, so quantizing `x` whole (the cache) equals row by
    // row.
    let mut local = Scratch::<BlockQ8K>::zeroed(0);
    let xq = quantized_k(x, cache, &mut local);
    over_row_groups(pool, (w, row_bytes, n), t, out, |rows, nr, res| {
        for r in 0..nr {
            let row = &rows[r * row_bytes..(r + 1) * row_bytes];
            dot_tokens(ck, kind, row, xq, nb, &mut res[r * t..(r + 1) * t]);
        }
        Layout {
            tok_stride: 1,
            row_stride: t,
        }
    });
}

#[cfg(test)]
#[path = "qdot_k_tests.rs"]
mod tests;
