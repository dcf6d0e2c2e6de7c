//! The ggml-numerics matmul of zero-point weights (`Q4_Z`, `Q8_Z`: GPTQ and AWQ as loaded):
//! `out[t][n] = dot(W[n], Q8_0(x[t]))` with integer block dots, the weights read in place.
//!
//! How: as `matmul/q8.rs` (each activation row quantized once to Q8_0, rows of `W` in 4-row
//! groups claimed by the pool's threads, each group dotted against every token), with the dot
//! of [`dot_rows`]: per block the 8 exact `i32` lane sums of `(q - z) * q_x`, then
//! `fma(d_w * d_x, lane, acc)` and `hsum8` (the float steps of ggml's Q4_0 dot). The zero point
//! is folded into the integers, so no activation sum is needed and the offset adds no rounding.
//!
//! Numerics: scalar, AVX2 and VNNI are bit-identical (`zq_tests.rs`), and a token's result does
//! not depend on the tokens beside it (one chain per output whatever the tile). Error vs the
//! exact product with the unquantized activations: `matmul/q8.rs`'s bound without its Q4_1
//! term (activation rounding, up to `amax / 254` per activation, plus `f32` accumulation).
//!
//! Cost: `t * k` to quantize, `t * n * k` integer multiply-adds (`Q8_Z`, and `Q4_Z` with a zero
//! above 128, one more per 4 weights for the activation sums); memory: `t * k / 32` blocks of
//! 40 bytes.

use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::ZKind;
use crate::kernels::matmul::q8::quantized;
use crate::kernels::qact::{BlockQ8, QK8};
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::{Checked, Isa, NR};
use crate::pool::{SharedMut, ThreadPool};

pub(crate) use crate::kernels::arch::generic::zdot_generic::dot_scalar;

/// See the module docs. Shapes were validated by `matmul_numerics`: `x` is `[t, k]`, `w` is `n`
/// rows of `row_bytes`, `out` is `[t, n]`, `k` is whole 32-blocks and positive.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_zq(
    ck: Checked,
    kind: ZKind,
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
    let xq = quantized(x, false, cache, &mut local, pool);
    let groups = n.div_ceil(NR);
    let (per_task, tasks) = pool.split(groups);
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || Scratch::zeroed(t * NR),
        |res, task| {
            for g in task * per_task..((task + 1) * per_task).min(groups) {
                let n0 = g * NR;
                let nr = NR.min(n - n0);
                let rows = &w[n0 * row_bytes..(n0 + nr) * row_bytes];
                dot_rows(ck, kind, rows, row_bytes, nr, xq, t, res);
                for tok in 0..t {
                    for (r, &v) in res[tok * nr..(tok + 1) * nr].iter().enumerate() {
                        // SAFETY: row n0 + r belongs to this task's groups only, so no other
                        // task writes index tok * n + n0 + r.
                        unsafe { shared.write(tok * n + n0 + r, v) };
                    }
                }
            }
        },
    );
}

/// `out[j * nr + r] = dot(row r, token j)` for `nr` (at most 4) consecutive weight rows of
/// `row_bytes` bytes starting at `w`, and `t` activation rows of `row_bytes / block_bytes`
/// blocks each, on the path `ck` names (bit-identical across paths).
///
/// # Panics
/// If `w` holds fewer than `nr` rows, `a` fewer than `t` rows, `out` fewer than `t * nr`
/// values, or `nr > 4` (internal invariants; the matmul validates shapes first).
#[allow(clippy::too_many_arguments, reason = "one tile's shapes")]
pub(crate) fn dot_rows(
    ck: Checked,
    kind: ZKind,
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    a: &[BlockQ8],
    t: usize,
    out: &mut [f32],
) {
    let nb = row_bytes / kind.block_bytes();
    assert!(
        nr <= 4
            && row_bytes == nb * kind.block_bytes()
            && w.len() >= nr * row_bytes
            && a.len() >= t * nb
            && out.len() >= t * nr,
        "zdot shapes"
    );
    match ck.isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => {
            crate::kernels::arch::x86::zdot::dot_rows(ck, kind, w, row_bytes, nr, a, t, out);
        }
        _ => {
            for j in 0..t {
                for r in 0..nr {
                    let row = &w[r * row_bytes..(r + 1) * row_bytes];
                    out[j * nr + r] = dot_scalar(kind, row, &a[j * nb..(j + 1) * nb]);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "zq_tests.rs"]
mod tests;
