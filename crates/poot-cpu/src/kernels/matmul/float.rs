//! One token against float weights (F16, BF16, F32), read straight from their stored bytes
//! (decode's matvec): each row's elements are widened in registers and multiplied as they
//! stream in, so no row is written to scratch and read back, which is what made the
//! decode-then-dot path run at half the memory's speed on these dtypes.
//!
//! Numerics: the order of the multi-token path the same weights take, so that a token's result
//! does not depend on how many tokens share its step (batch invariance):
//! - [`Order::Lanes8`], where `k % 8 == 0`: llamafile tinyBLAS's 8 FMA lanes per row along `k`
//!   then `ggml::hsum8`, bit-identical to `ggml::dot_lanes8` and so to `matmul/lanes8.rs`'s
//!   tiles. The exact path's bound, `(k / 8 + 16) * 2^-24 * sum_k |x||w|`, holds.
//! - [`Order::Lanes32`], ggml numerics with F16 weights whose shape tinyBLAS does not take:
//!   `ggml_vec_dot_f16`'s 32 lanes, fold and `f64` tail (`ggml::dot_lanes32`), bit for bit, as
//!   `matmul/float_ggml.rs` computes every token count there.
//!
//! The caller rounds the activations as its numerics wants (ggml: to f16 for F16 weights, to
//! bf16 for BF16). Results do not depend on the thread count. Cost: `2 * n * k` flops, the
//! weights read once; no scratch.

use crate::kernels::decode::f16_to_f32;
use crate::kernels::format::Format;
use crate::kernels::ggml::{fold32, hsum8};
use crate::kernels::simd::{Checked, Isa};
use crate::pool::{SharedMut, ThreadPool};

/// Rows per task unit (tasks are runs of whole units), and per [`Order::Lanes8`] pass: four
/// chains side by side keep the FMA unit busy while each waits on its own latency.
const ROWS: usize = 4;

/// The summation order of [`gemv_float`] (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// tinyBLAS's 8 lanes (`k % 8 == 0`; F16, BF16, F32).
    Lanes8,
    /// `ggml_vec_dot_f16`'s 32 lanes (F16).
    Lanes32,
}

/// Whether [`gemv_float`] takes one token against `p` in `order` here: a SIMD path, and the
/// order's shapes and dtypes.
pub(crate) fn applies(ck: Checked, p: Format, t: usize, k: usize, order: Order) -> bool {
    let dtype = match order {
        Order::Lanes8 => {
            k.is_multiple_of(8) && matches!(p, Format::F16 | Format::BF16 | Format::F32)
        }
        Order::Lanes32 => p == Format::F16,
    };
    t == 1
        && dtype
        && matches!(ck.isa(), Isa::Avx2 | Isa::Avx512 | Isa::Amx)
        && cfg!(target_arch = "x86_64")
}

/// `out[r] = dot(W[r], x)` for one token in `order` (see the module docs); shapes were
/// validated by `matmul_cached`, [`applies`] holds and `x` is rounded as the numerics wants.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn gemv_float(
    ck: Checked,
    order: Order,
    p: Format,
    x: &[f32],
    k: usize,
    (w, row_bytes, n): (&[u8], usize, usize),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    debug_assert!(applies(ck, p, 1, k, order) && x.len() == k && out.len() == n);
    let quads = n.div_ceil(ROWS);
    let (per_task, tasks) = pool.split(quads);
    let shared = SharedMut::new(out);
    pool.for_each(tasks, |task| {
        let r_end = ((task + 1) * per_task * ROWS).min(n);
        let mut r = task * per_task * ROWS;
        while r < r_end {
            let rows = ROWS.min(r_end - r);
            let mut res = [0.0f32; ROWS];
            rows_dot(
                ck,
                order,
                p,
                (&w[r * row_bytes..], row_bytes),
                rows,
                k,
                x,
                &mut res,
            );
            for (i, &v) in res.iter().enumerate().take(rows) {
                // SAFETY: row r + i belongs to this task only, so no other task writes it.
                unsafe { shared.write(r + i, v) };
            }
            r += rows;
        }
    });
}

/// `res[i] = dot(row i, x)` for `rows <= ROWS` stored rows `row_bytes` apart from `w[0]`.
#[allow(clippy::too_many_arguments, reason = "one pass's operands")]
#[inline]
fn rows_dot(
    ck: Checked,
    order: Order,
    p: Format,
    (w, row_bytes): (&[u8], usize),
    rows: usize,
    k: usize,
    x: &[f32],
    res: &mut [f32; ROWS],
) {
    let es = if p == Format::F32 { 4 } else { 2 };
    assert!(rows <= ROWS && w.len() >= (rows - 1) * row_bytes + es * k && x.len() >= k);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::arch::x86::fdot as f;
        use crate::kernels::format::id::{BF16, F16, F32};
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        if order == Order::Lanes8 {
            // SAFETY: `Checked` proves AVX2, FMA and F16C (every SIMD path has them); the
            // rows and x were asserted above (`k % 8 == 0` by `applies`).
            let lanes: [[f32; 8]; ROWS] = unsafe {
                match (p, rows == ROWS) {
                    (Format::F16, true) => f::lanes8_rows_avx2::<F16, ROWS>(wp, row_bytes, k, xp),
                    (Format::BF16, true) => f::lanes8_rows_avx2::<BF16, ROWS>(wp, row_bytes, k, xp),
                    (_, true) => f::lanes8_rows_avx2::<F32, ROWS>(wp, row_bytes, k, xp),
                    _ => {
                        let mut l = [[0.0f32; 8]; ROWS];
                        for (i, li) in l.iter_mut().enumerate().take(rows) {
                            let wi = wp.add(i * row_bytes);
                            [*li] = match p {
                                Format::F16 => f::lanes8_rows_avx2::<F16, 1>(wi, 0, k, xp),
                                Format::BF16 => f::lanes8_rows_avx2::<BF16, 1>(wi, 0, k, xp),
                                _ => f::lanes8_rows_avx2::<F32, 1>(wi, 0, k, xp),
                            };
                        }
                        l
                    }
                }
            };
            for (r, l) in res.iter_mut().zip(&lanes).take(rows) {
                *r = hsum8(l);
            }
            return;
        }
        let k32 = k & !31;
        for (i, r) in res.iter_mut().enumerate().take(rows) {
            let row = &w[i * row_bytes..];
            // SAFETY: as above (AVX-512 implies the AVX2 set here); 2k bytes at the row.
            let [lanes] = unsafe {
                if ck.isa().avx512() {
                    f::lanes32_avx512::<1>(row.as_ptr(), 0, k32, xp)
                } else {
                    f::lanes32_avx2::<1>(row.as_ptr(), 0, k32, xp)
                }
            };
            // ggml_vec_dot_f16's tail: products rounded in f32, summed in f64.
            let mut s = f64::from(fold32(&lanes));
            for j in k32..k {
                let h = u16::from_le_bytes([row[2 * j], row[2 * j + 1]]);
                s += f64::from(f16_to_f32(h) * x[j]);
            }
            *r = s as f32;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("applies() is false off x86-64: {ck:?} {order:?} {p:?} {rows} {k} {res:?}");
}
