//! One token against F16 or BF16 weights, read straight from their stored bytes (decode's
//! matvec): each row's halves are widened in registers and multiplied as they stream in, one
//! row after another, so each thread reads one sequential stream. No row is written to
//! scratch and read back, which is what made the decode-then-dot path run at half the
//! memory's speed on these dtypes.
//!
//! Numerics:
//! - [`Numerics::Exact`] (and BF16's ggml activations once rounded, off AVX512-BF16, see
//!   `matmul/bf16.rs`): 32 `f32` FMA lanes per row along `k` (two 16-lane accumulators on
//!   AVX-512, four 8-lane ones on AVX2, which then take one 16-element step in the first two),
//!   added and lane-summed, then the `k % 32` (AVX2: `k % 16`) tail in order; the exact
//!   path's bound, `(k / 8 + 16) * 2^-24 * sum_k |x||w|`, holds (the tests assert it).
//! - [`Numerics::Ggml`] with F16 weights: activations rounded to f16, then `ggml_vec_dot_f16`'s
//!   32 lanes, fold and `f64` tail (`ggml::dot_lanes32`), bit for bit.
//!
//! Results do not depend on the thread count. Cost: `2 * n * k` flops, `n * k` halves read
//! once; memory: the rounded activations (`k` floats) under ggml numerics.

use crate::kernels::decode::{f16_to_f32, Packed};
use crate::kernels::ggml::{fold32, Numerics};
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::{Checked, Isa};
use crate::pool::{SharedMut, ThreadPool};

/// Rows per task unit (tasks are runs of whole units).
const ROWS: usize = 4;

/// Whether [`gemv_float`] takes this call: one token, F16/BF16 weights, a SIMD path.
pub(crate) fn applies(ck: Checked, p: Packed, t: usize) -> bool {
    t == 1
        && matches!(p, Packed::F16 | Packed::BF16)
        && matches!(ck.isa(), Isa::Avx2 | Isa::Avx512 | Isa::Amx)
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
    let mut rounded = Scratch::<f32>::zeroed(if ggml { k } else { 0 });
    let x: &[f32] = if ggml {
        round_f16(ck, x, &mut rounded);
        &rounded
    } else {
        x
    };
    let quads = n.div_ceil(ROWS);
    let (per_task, tasks) = pool.split(quads);
    let shared = SharedMut::new(out);
    pool.for_each(tasks, |task| {
        let r_end = ((task + 1) * per_task * ROWS).min(n);
        for r in task * per_task * ROWS..r_end {
            let v = row_dot(ck, ggml, p, &w[r * row_bytes..(r + 1) * row_bytes], k, x);
            // SAFETY: row r belongs to this task only, so no other task writes it.
            unsafe { shared.write(r, v) };
        }
    });
}

/// `dst[i] = f16(src[i])` widened back (exact): `arch::x86::fdot16::f16_round_into` on the SIMD
/// paths (a software conversion per value cost about as much as a quarter of a 2048-row
/// matvec's stream).
fn round_f16(ck: Checked, src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let _ = ck;
        // SAFETY: `applies` holds (a SIMD path), so `ck` proves AVX2 and F16C.
        unsafe { crate::kernels::arch::x86::fdot16::f16_round_into(src, dst) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ck;
        for (s, d) in src.iter().zip(dst) {
            *d = half::f16::from_f32(*s).to_f32();
        }
    }
}

/// `dot(row, x)` for one stored row (`2 * k` bytes).
#[inline]
fn row_dot(ck: Checked, ggml: bool, p: Packed, row: &[u8], k: usize, x: &[f32]) -> f32 {
    assert!(row.len() >= 2 * k && x.len() >= k);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::arch::x86::fdot::{self as f, BF16, F16};
        let (wp, xp) = (row.as_ptr(), x.as_ptr());
        let avx512 = ck.isa().avx512();
        if ggml {
            let k32 = k & !31;
            // SAFETY: `Checked` proves the ISA's features (AVX-512 implies the AVX2 set
            // here); 2k bytes at wp and k floats at xp are asserted above.
            let [lanes] = unsafe {
                if avx512 {
                    f::lanes32_avx512::<1>(wp, 0, k32, xp)
                } else {
                    f::lanes32_avx2::<1>(wp, 0, k32, xp)
                }
            };
            // ggml_vec_dot_f16's tail: products rounded in f32, summed in f64.
            let mut s = f64::from(fold32(&lanes));
            for j in k32..k {
                let h = u16::from_le_bytes([row[2 * j], row[2 * j + 1]]);
                s += f64::from(f16_to_f32(h) * x[j]);
            }
            return s as f32;
        }
        // SAFETY: as above.
        unsafe {
            match (avx512, p == Packed::F16) {
                (true, true) => f::gemv_avx512::<F16>(wp, k, xp),
                (true, false) => f::gemv_avx512::<BF16>(wp, k, xp),
                (false, true) => f::gemv_avx2::<F16>(wp, k, xp),
                (false, false) => f::gemv_avx2::<BF16>(wp, k, xp),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("applies() is false off x86-64: {ck:?} {ggml} {p:?} {row:?} {k} {x:?}");
}
