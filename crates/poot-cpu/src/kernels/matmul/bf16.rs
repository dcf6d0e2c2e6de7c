//! BF16 weights under [`Numerics::Ggml`]: activations rounded to bf16 (llama.cpp's
//! `vec_dot_type` for BF16, its round-to-nearest-even `GGML_FP32_TO_BF16`), then products of
//! the two bf16 values, which are exact in `f32`, summed in `f32`.
//!
//! Every token count takes the first of these that applies, so that a token's result does not
//! depend on the tokens beside it (batch invariance):
//! - on [`Isa::Amx`](crate::kernels::simd::Isa) with AMX-BF16, tiles (`arch/x86/amx_bf16.rs`), one
//!   `f32` chain per output, so `k + 16` replaces `k / 8 + 16` in the bound below;
//! - on an AVX-512 path with AVX512-BF16, `vdpbf16ps` over packed bf16 tiles
//!   (`matmul/dpbf16.rs`: 16 lanes of pairs, `k / 16 + 8` roundings); packed, with its loop
//!   allocated by hand, it beats the packed `f32` tiles (reading the stored rows in place had
//!   lost to them; measurements: `docs/performance-history.md`, "Measurements behind the kernels");
//! - with `k % 8 == 0`, tinyBLAS's 8-lane order: packed tiles (`matmul/lanes8.rs`, the
//!   rounded operands as `f32`) for several tokens, the stored rows read in place
//!   (`matmul/float.rs`) for one, on AVX2 and AVX-512 alike.
//!
//! Otherwise the rounded activations go through the exact path. Either way, per output, `|got - sum_k w x'|` is at most `(k / 8 +
//! 16) * 2^-24 * sum_k |w x'| + k * 2^-126`, with `x'` the rounded activations (up to 2 in
//! magnitude in the tests; `vdpbf16ps` drops products with a subnormal factor, see
//! `matmul/dpbf16.rs`); the rounding itself is at most `2^-9 * sum_k |w x|`. The tests assert
//! both, on every path. Results do not depend on the thread count or the token tiling; they
//! are not llama.cpp's bits (its lane order is not reproduced).
//!
//! Cost: `2 * t * n * k` flops; memory: the rounded activations (`4 * t * k` bytes; AMX:
//! `2 * t * k`).

use crate::kernels::format::Format;
use crate::kernels::ggml::round_bf16;
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::decoded::matmul_decoded;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Checked;
use crate::pool::ThreadPool;
use crate::KernelError;

/// See the module docs; shapes were validated by `matmul_cached`.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_bf16_ggml(
    ck: Checked,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    // AMX-BF16 tiles where the path has them (`arch/x86/amx_bf16.rs`: one `f32` chain per output).
    #[cfg(target_arch = "x86_64")]
    if ck.isa() == crate::kernels::simd::Isa::Amx && crate::kernels::arch::x86::amx_bf16::applies(k)
    {
        let mut xb = Scratch::<u8>::zeroed(0);
        xb.extend(x.iter().flat_map(|&v| round_bf16(v).to_le_bytes()));
        crate::kernels::arch::x86::amx_bf16::matmul(&xb, t, k, w, row_bytes, n, out, pool);
        return Ok(());
    }
    // AVX512-BF16: `vdpbf16ps` over packed bf16 tiles (`matmul/dpbf16.rs`).
    if ck.isa().avx512() && crate::kernels::matmul::dpbf16::available() {
        if t == 1 {
            // The same sums, the stored rows read in place (`matmul/dpbf16_one.rs`).
            crate::kernels::matmul::dpbf16_one::gemv(x, k, (w, row_bytes, n), out, pool);
        } else {
            crate::kernels::matmul::dpbf16::matmul(x, (t, k), (w, row_bytes, n), out, pool);
        }
        return Ok(());
    }
    // AVX2 and AVX-512: packed tiles in tinyBLAS's 8-lane order (`matmul/lanes8.rs`).
    if crate::kernels::matmul::lanes8::applies(ck, Format::BF16, t, k) {
        let f = crate::kernels::matmul::lanes8::matmul_lanes8;
        f(
            ck,
            (Format::BF16, Numerics::Ggml),
            x,
            (t, k),
            (w, row_bytes, n),
            out,
            pool,
        );
        return Ok(());
    }
    let mut rounded = Scratch::<f32>::zeroed(0);
    rounded.extend(
        x.iter()
            .map(|&v| f32::from_bits(u32::from(round_bf16(v)) << 16)),
    );
    let exact = Numerics::Exact;
    matmul_decoded(
        ck,
        exact,
        Format::BF16,
        &rounded,
        (t, k),
        (w, row_bytes, n),
        out,
        pool,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use poot_core::DType;

    use crate::kernels::format::Format;
    use crate::kernels::ggml::round_bf16;
    use crate::kernels::ggml::Numerics;
    use crate::kernels::matmul::matmul_numerics;
    use crate::testutil::{reference, synthetic_weights, Rng};
    use crate::{Isa, ThreadPool};

    #[cfg(target_arch = "x86_64")]
    fn amx_tiles(k: usize) -> bool {
        crate::kernels::arch::x86::amx_bf16::applies(k)
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn amx_tiles(_: usize) -> bool {
        false
    }

    #[test]
    fn rounding_is_ggmls() {
        for v in [
            1.0f32,
            -2.5,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            3.0e-40,
            1e38,
        ] {
            assert_eq!(round_bf16(v), half::bf16::from_f32(v).to_bits(), "{v}");
        }
        // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        let nan = f32::from_bits(0x7f80_0001);
        assert!(f32::from_bits(u32::from(round_bf16(nan)) << 16).is_nan());
    }

    #[test]
    fn within_bound_and_thread_independent_on_every_isa() {
        // k = 45 and 72: masked tails; n = 70, k = 1024: several row blocks and token tiles
        // and a last partial quad; k = 2056: the packed tiles' three k-chunks (AVX2).
        for (n, k) in [(7, 45), (9, 72), (70, 1024), (36, 2056)] {
            let w = synthetic_weights(DType::BF16, n, k, 41);
            let wf = reference(DType::BF16, &w, n * k);
            for t in [1, 3, 9, 20] {
                let x = Rng::new(5 + t as u32).vec(t * k, -2.0, 2.0);
                let xr: Vec<f32> = x
                    .iter()
                    .map(|&v| f32::from_bits(u32::from(round_bf16(v)) << 16))
                    .collect();
                // Every ISA's default path, and the 8-lane packed tiles on AVX-512 even where
                // `vdpbf16ps` (`matmul/dpbf16.rs`) takes the default.
                let lanes8 = |isa: Isa| {
                    let ck = isa.checked().unwrap();
                    isa.avx512() && crate::kernels::matmul::lanes8::applies(ck, Format::BF16, t, k)
                };
                let paths = Isa::available().into_iter().map(|isa| (isa, false)).chain(
                    Isa::available()
                        .into_iter()
                        .filter(|&i| lanes8(i))
                        .map(|i| (i, true)),
                );
                for (isa, direct) in paths {
                    let mut runs = Vec::new();
                    for threads in [1, 2] {
                        let pool = ThreadPool::new(threads).unwrap();
                        let mut out = vec![f32::NAN; t * n];
                        if direct {
                            let f = crate::kernels::matmul::lanes8::matmul_lanes8;
                            let ck = isa.checked().unwrap();
                            f(
                                ck,
                                (Format::BF16, Numerics::Ggml),
                                &x,
                                (t, k),
                                (&w, 2 * k, n),
                                &mut out,
                                &pool,
                            );
                        } else {
                            matmul_numerics(
                                Numerics::Ggml,
                                isa,
                                &x,
                                t,
                                k,
                                &w,
                                DType::BF16,
                                n,
                                &mut out,
                                &pool,
                            )
                            .unwrap();
                        }
                        runs.push(out);
                    }
                    assert!(
                        runs[0]
                            .iter()
                            .zip(&runs[1])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} n={n} k={k} t={t}: depends on the thread count"
                    );
                    for tok in 0..t {
                        for r in 0..n {
                            let (mut s, mut a, mut s0, mut a0) = (0.0f64, 0.0f64, 0.0f64, 0.0);
                            for i in 0..k {
                                let wv = f64::from(wf[r * k + i]);
                                let p = wv * f64::from(xr[tok * k + i]);
                                let p0 = wv * f64::from(x[tok * k + i]);
                                (s, a, s0, a0) = (s + p, a + p.abs(), s0 + p0, a0 + p0.abs());
                            }
                            let got = f64::from(runs[0][tok * n + r]);
                            // The AMX-BF16 tiles sum each output in one chain.
                            let tiles = isa == Isa::Amx
                                && !direct
                                && cfg!(target_arch = "x86_64")
                                && amx_tiles(k);
                            let chain = if tiles { k } else { k / 8 };
                            let tol = (chain + 16) as f64 * 2f64.powi(-24) * a
                                + k as f64 * 2f64.powi(-126);
                            let err = (got - s).abs();
                            assert!(err <= tol, "{isa:?} n={n} k={k} [{tok},{r}]: {err:e}");
                            // The activation rounding, vs the unrounded product.
                            let err0 = (got - s0).abs();
                            assert!(err0 <= tol + 2f64.powi(-9) * a0, "{isa:?} [{tok},{r}]");
                        }
                    }
                }
            }
        }
    }
}
