//! One token against F16 or BF16 weights, read straight from their stored bytes (decode's
//! matvec): each row's halves are widened in registers and multiplied as they stream in, 4 rows
//! per pass sharing each activation load. No row is written to scratch and read back, which
//! is what made the decode-then-dot path run at half the memory's speed on these dtypes.
//!
//! Numerics:
//! - [`Numerics::Exact`] (and BF16's ggml activations once rounded, off AVX512-BF16, see
//!   `matmul_bf16.rs`): one `f32` FMA accumulator of 16 lanes (AVX-512) or 8 (AVX2) per row along `k`, a lane sum, then
//!   the `k % 16` (or `% 8`) tail in order; the exact path's bound,
//!   `(k / 8 + 16) * 2^-24 * sum_k |x||w|`, holds (the tests assert it).
//! - [`Numerics::Ggml`] with F16 weights: activations rounded to f16, then `ggml_vec_dot_f16`'s
//!   32 lanes, fold and `f64` tail (`ggml::dot_lanes32`), bit for bit.
//!
//! Results do not depend on the thread count. Cost: `2 * n * k` flops, `n * k` halves read
//! once; memory: the rounded activations (`k` floats) under ggml numerics.

use super::decode::{f16_to_f32, Packed};
use super::ggml::{fold32, Numerics};
use super::scratch::Scratch;
use super::simd::{Checked, Isa};
use crate::pool::{SharedMut, ThreadPool};

/// Rows per pass.
const ROWS: usize = 4;

/// Whether [`gemv_float`] takes this call: one token, F16/BF16 weights, a SIMD path.
pub(crate) fn applies(ck: Checked, p: Packed, t: usize) -> bool {
    t == 1
        && matches!(p, Packed::F16 | Packed::BF16)
        && matches!(ck.isa(), Isa::Avx2 | Isa::Avx512)
        && cfg!(target_arch = "x86_64")
}

/// `out[r] = dot(W[r], x)` for one token (see the module docs); shapes were validated by
/// `matmul_cached` and [`applies`] holds.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn gemv_float(
    ck: Checked,
    numerics: Numerics,
    p: Packed,
    x: &[f32],
    k: usize,
    w: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    debug_assert!(applies(ck, p, 1) && x.len() == k && out.len() == n);
    let ggml = numerics == Numerics::Ggml && p == Packed::F16;
    let mut rounded = Scratch::<f32>::zeroed(0);
    let x: &[f32] = if ggml {
        rounded.extend(x.iter().map(|&v| half::f16::from_f32(v).to_f32()));
        &rounded
    } else {
        x
    };
    let quads = n.div_ceil(ROWS);
    // About four tasks per thread balances load when other processes share the cores.
    let per_task = quads.div_ceil(pool.n_threads() * 4).max(1);
    let tasks = quads.div_ceil(per_task);
    let shared = SharedMut::new(out);
    pool.for_each(tasks, |task| {
        let r_end = (((task + 1) * per_task) * ROWS).min(n);
        let mut r0 = task * per_task * ROWS;
        while r0 < r_end {
            let rows = if r_end - r0 >= ROWS { ROWS } else { 1 };
            let mut res = [0.0f32; ROWS];
            let w0 = &w[r0 * row_bytes..(r0 + rows) * row_bytes];
            rows_dot(ck, ggml, p, w0, row_bytes, rows, k, x, &mut res);
            for (r, v) in res.iter().take(rows).enumerate() {
                // SAFETY: row r0 + r belongs to this task only, so no other task writes it.
                unsafe { shared.write(r0 + r, *v) };
            }
            r0 += rows;
        }
    });
}

/// `res[r] = dot(row r of w0, x)` for `rows` (1 or [`ROWS`]) rows of `row_bytes` each.
#[allow(clippy::too_many_arguments, reason = "one pass's operands")]
#[inline]
fn rows_dot(
    ck: Checked,
    ggml: bool,
    p: Packed,
    w0: &[u8],
    row_bytes: usize,
    rows: usize,
    k: usize,
    x: &[f32],
    res: &mut [f32; ROWS],
) {
    assert!(w0.len() >= rows * row_bytes && row_bytes >= 2 * k && x.len() >= k);
    #[cfg(target_arch = "x86_64")]
    {
        use super::fdot_x86::{self as f, BF16, F16};
        let (wp, xp) = (w0.as_ptr(), x.as_ptr());
        let avx512 = ck.isa() == Isa::Avx512;
        if ggml {
            let k32 = k & !31;
            // SAFETY: `Checked` proves the ISA's features (AVX-512 implies the AVX2 set
            // here); rows * row_bytes bytes at wp and k floats at xp are asserted above.
            let lanes: [[f32; 32]; ROWS] = unsafe {
                match (avx512, rows) {
                    (true, ROWS) => f::lanes32_avx512::<ROWS>(wp, row_bytes, k32, xp),
                    (true, _) => pad(f::lanes32_avx512::<1>(wp, row_bytes, k32, xp)),
                    (false, ROWS) => {
                        let a = f::lanes32_avx2::<2>(wp, row_bytes, k32, xp);
                        let b = f::lanes32_avx2::<2>(wp.add(2 * row_bytes), row_bytes, k32, xp);
                        [a[0], a[1], b[0], b[1]]
                    }
                    (false, _) => pad(f::lanes32_avx2::<1>(wp, row_bytes, k32, xp)),
                }
            };
            for r in 0..rows {
                // ggml_vec_dot_f16's tail: products rounded in f32, summed in f64.
                let mut s = f64::from(fold32(&lanes[r]));
                let row = &w0[r * row_bytes..];
                for j in k32..k {
                    let h = u16::from_le_bytes([row[2 * j], row[2 * j + 1]]);
                    s += f64::from(f16_to_f32(h) * x[j]);
                }
                res[r] = s as f32;
            }
            return;
        }
        // SAFETY: as above.
        let v: [f32; ROWS] = unsafe {
            match (avx512, p == Packed::F16, rows) {
                (true, true, ROWS) => f::gemv_avx512::<F16, ROWS>(wp, row_bytes, k, xp),
                (true, false, ROWS) => f::gemv_avx512::<BF16, ROWS>(wp, row_bytes, k, xp),
                (true, true, _) => pad(f::gemv_avx512::<F16, 1>(wp, row_bytes, k, xp)),
                (true, false, _) => pad(f::gemv_avx512::<BF16, 1>(wp, row_bytes, k, xp)),
                (false, true, ROWS) => f::gemv_avx2::<F16, ROWS>(wp, row_bytes, k, xp),
                (false, false, ROWS) => f::gemv_avx2::<BF16, ROWS>(wp, row_bytes, k, xp),
                (false, true, _) => pad(f::gemv_avx2::<F16, 1>(wp, row_bytes, k, xp)),
                (false, false, _) => pad(f::gemv_avx2::<BF16, 1>(wp, row_bytes, k, xp)),
            }
        };
        *res = v;
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("applies() is false off x86-64: {ck:?} {ggml} {p:?} {rows} {k} {res:?}");
}

/// A one-row result in the first slot of a [`ROWS`]-row one.
fn pad<T: Copy + Default>(one: [T; 1]) -> [T; ROWS] {
    let mut all = [T::default(); ROWS];
    all[0] = one[0];
    all
}
