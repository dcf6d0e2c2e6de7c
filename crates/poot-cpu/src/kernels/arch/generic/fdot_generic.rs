//! The portable form of `arch/x86/fdot.rs`'s one-token loops over float weights read as
//! stored (F16 / BF16 halves or F32, widened exactly): [`lanes8_rows`] (tinyBLAS's 8 lanes)
//! and [`lanes32`] (`ggml_vec_dot_f16`'s 32 lanes). Each output lane is one chain of
//! `f32::mul_add` along `k`, which is what a vector FMA lane computes, so the results are the
//! x86 loops' bits at either width (tested below) and `ggml::dot_lanes8`'s before its `hsum8`.
//!
//! Why here: the template a new ISA's loop (e.g. `arch/aarch64/fdot.rs`) starts from and the
//! oracle its tests compare with. No matmul calls it yet: off x86 `matmul/float.rs` does not
//! apply, and the decoded path (`matmul/decoded.rs`, `ggml::dot_lanes8`) computes the same
//! chains from widened rows.

#![cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the portable template and test oracle; see the module docs"
    )
)]

use crate::kernels::decode::f16_to_f32;
use crate::kernels::format::Format;

/// Element `i` of a stored row of kind `p` (F16, BF16 or F32), widened (exact).
#[inline(always)]
fn widen(p: Format, row: &[u8], i: usize) -> f32 {
    match p {
        Format::F32 => f32::from_le_bytes(row[4 * i..4 * i + 4].try_into().expect("4 bytes")),
        Format::BF16 => {
            f32::from_bits(u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) << 16)
        }
        _ => f16_to_f32(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])),
    }
}

/// tinyBLAS's 8 lanes of `R` stored rows (`rb` bytes apart in `w`, kind `p`: F16, BF16 or
/// F32) against one token: `out[r][l] = fma(w[8(k/8 - 1) + l], x[..], ... fma(w[l], x[l], 0))`
/// for `k` (a multiple of 8) elements.
///
/// # Panics
/// If `k % 8 != 0` or the rows or `x` are shorter than `k` elements.
pub(crate) fn lanes8_rows<const R: usize>(
    p: Format,
    w: &[u8],
    rb: usize,
    k: usize,
    x: &[f32],
) -> [[f32; 8]; R] {
    assert!(k.is_multiple_of(8) && x.len() >= k, "k = {k}");
    let mut out = [[0.0f32; 8]; R];
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w[r * rb..];
        for i in (0..k).step_by(8) {
            for (l, v) in o.iter_mut().enumerate() {
                *v = widen(p, row, i + l).mul_add(x[i + l], *v);
            }
        }
    }
    out
}

/// ggml's 32 lanes of `R` F16 rows (`rb` bytes apart in `w`) against one token: `out[r][l] =
/// sum over whole 32-groups g of fma(w[32g + l], x[32g + l])`, in `g` order, for `k32` (a
/// multiple of 32) elements.
///
/// # Panics
/// If `k32 % 32 != 0` or the rows or `x` are shorter than `k32` elements.
pub(crate) fn lanes32<const R: usize>(
    w: &[u8],
    rb: usize,
    k32: usize,
    x: &[f32],
) -> [[f32; 32]; R] {
    assert!(k32.is_multiple_of(32) && x.len() >= k32, "k32 = {k32}");
    let mut out = [[0.0f32; 32]; R];
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w[r * rb..];
        for i in (0..k32).step_by(32) {
            for (l, v) in o.iter_mut().enumerate() {
                *v = widen(Format::F16, row, i + l).mul_add(x[i + l], *v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// `R` rows of `k` random elements of kind `p`, `rb` bytes apart (rows padded by 6 bytes,
    /// so that `rb` is not the row length).
    fn rows(p: Format, r: usize, k: usize, seed: u32) -> (Vec<u8>, usize) {
        let es = if p == Format::F32 { 4 } else { 2 };
        let rb = es * k + 6;
        let mut rng = Rng::new(seed);
        let mut w = vec![0u8; r * rb];
        for row in w.chunks_exact_mut(rb) {
            for (i, v) in rng.vec(k, -2.0, 2.0).into_iter().enumerate() {
                match p {
                    Format::F32 => row[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
                    Format::BF16 => {
                        let b = half::bf16::from_f32(v).to_le_bytes();
                        row[2 * i..2 * i + 2].copy_from_slice(&b);
                    }
                    _ => {
                        let b = half::f16::from_f32(v).to_le_bytes();
                        row[2 * i..2 * i + 2].copy_from_slice(&b);
                    }
                }
            }
        }
        (w, rb)
    }

    #[test]
    fn lanes8_is_ggmls_dot_lanes8_before_its_sum() {
        let k = 200;
        for (s, p) in [Format::F16, Format::BF16, Format::F32]
            .into_iter()
            .enumerate()
        {
            let (w, rb) = rows(p, 3, k, 11 + s as u32);
            let x = Rng::new(3).vec(k, -1.0, 1.0);
            let got = lanes8_rows::<3>(p, &w, rb, k, &x);
            for (r, g) in got.iter().enumerate() {
                let wf: Vec<f32> = (0..k).map(|i| widen(p, &w[r * rb..], i)).collect();
                let want = crate::kernels::ggml::dot_lanes8(&wf, &x);
                let sum = crate::kernels::ggml::hsum8(g);
                assert_eq!(sum.to_bits(), want.to_bits(), "{p:?} row {r}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_x86_loops_give_these_bits_at_every_width() {
        use crate::kernels::arch::x86::fdot;
        use crate::kernels::format::id;
        let f = crate::CpuFeatures::get();
        if !crate::testutil::isa_runs("avx2", f.avx2 && f.fma && f.f16c) {
            return;
        }
        let k = 320;
        for (s, p) in [Format::F16, Format::BF16, Format::F32]
            .into_iter()
            .enumerate()
        {
            let (w, rb) = rows(p, 4, k, 21 + s as u32);
            let x = Rng::new(7 + s as u32).vec(k, -1.0, 1.0);
            let want = lanes8_rows::<4>(p, &w, rb, k, &x);
            // SAFETY: AVX2, FMA and F16C detected above; 4 rows of k elements, rb apart, and
            // k floats at x.
            let got = unsafe {
                match p {
                    Format::F16 => {
                        fdot::lanes8_rows_avx2::<{ id::F16 }, 4>(w.as_ptr(), rb, k, x.as_ptr())
                    }
                    Format::BF16 => {
                        fdot::lanes8_rows_avx2::<{ id::BF16 }, 4>(w.as_ptr(), rb, k, x.as_ptr())
                    }
                    _ => fdot::lanes8_rows_avx2::<{ id::F32 }, 4>(w.as_ptr(), rb, k, x.as_ptr()),
                }
            };
            assert_eq!(
                got.as_flattened()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                want.as_flattened()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                "{p:?}"
            );
        }
        let (w, rb) = rows(Format::F16, 2, k, 31);
        let x = Rng::new(9).vec(k, -1.0, 1.0);
        let bits = |v: [[f32; 32]; 2]| {
            v.as_flattened()
                .iter()
                .map(|f| f.to_bits())
                .collect::<Vec<_>>()
        };
        let want = bits(lanes32::<2>(&w, rb, k, &x));
        // SAFETY: as above; 2 rows of 2k bytes, rb apart.
        let got = unsafe { fdot::lanes32_avx2::<2>(w.as_ptr(), rb, k, x.as_ptr()) };
        assert_eq!(bits(got), want, "lanes32 at 256 bits");
        if crate::testutil::isa_runs("avx512", f.avx512f) {
            // SAFETY: AVX-512F detected as well.
            let got = unsafe { fdot::lanes32_avx512::<2>(w.as_ptr(), rb, k, x.as_ptr()) };
            assert_eq!(bits(got), want, "lanes32 at 512 bits");
        }
    }
}
