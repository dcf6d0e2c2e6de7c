//! Matmul and decoder tests: exact decoding, every dtype and ISA against an f64 reference on
//! real packed weights, SIMD against scalar, thread-count determinism, typed errors.
//!
//! Bound per output (all dtypes, all ISAs): `|got - exact| <= (k / 8 + 16) * 2^-24 *
//! sum_k |x||w|`, where `exact` is the f64 dot product of `x` with poot-core's reference
//! dequantization. Decoding is bit-exact, so only `f32` accumulation is charged.

#![allow(
    clippy::needless_range_loop,
    reason = "index-heavy numerical references"
)]

use super::*;
use crate::kernels::format::DECODABLE;
use crate::kernels::simd;
use crate::testutil::{assert_close, real_slices, reference, synthetic_weights, Rng};

/// The f64 reference product and the per-output error bound.
fn reference_product(x: &[f32], t: usize, k: usize, w: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut want = vec![0.0; t * n];
    let mut tol = vec![0.0; t * n];
    let gamma = (k / 8 + 16) as f64 * 2f64.powi(-24);
    for tok in 0..t {
        for row in 0..n {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for i in 0..k {
                let p = f64::from(x[tok * k + i]) * f64::from(w[row * k + i]);
                s += p;
                a += p.abs();
            }
            want[tok * n + row] = s;
            tol[tok * n + row] = gamma * a;
        }
    }
    (want, tol)
}

#[allow(clippy::too_many_arguments, reason = "mirrors matmul_with")]
fn run(
    isa: Isa,
    threads: usize,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    dt: DType,
    n: usize,
) -> Vec<f32> {
    let pool = ThreadPool::new(threads).unwrap();
    let mut out = vec![f32::NAN; t * n];
    matmul_with(isa, x, t, k, w, dt, n, &mut out, &pool).unwrap();
    out
}

/// Checks one weight matrix on every ISA, several token counts and thread counts.
fn check_matrix(name: &str, dt: DType, w: &[u8], n: usize, k: usize, seed: u32) {
    let wf = reference(dt, w, n * k);
    for t in [1, 2, 3, 5, 9] {
        let x = Rng::new(seed + t as u32).vec(t * k, -1.0, 1.0);
        let (want, tol) = reference_product(&x, t, k, &wf, n);
        let mut per_isa = Vec::new();
        for isa in Isa::available() {
            let got = run(isa, 2, &x, t, k, w, dt, n);
            assert_close(&format!("{name} {dt} t={t} {isa:?}"), &got, &want, &tol);
            let again = run(isa, 3, &x, t, k, w, dt, n);
            assert!(
                got.iter()
                    .zip(&again)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} {isa:?}: result depends on the thread count"
            );
            per_isa.push(got);
        }
        // SIMD against the scalar path: both are within `tol` of the exact value.
        let scalar = &per_isa[0];
        for got in &per_isa[1..] {
            for i in 0..got.len() {
                let d = f64::from((got[i] - scalar[i]).abs());
                assert!(
                    d <= 2.0 * tol[i],
                    "{name} t={t}: SIMD vs scalar at {i}: {d:e}"
                );
            }
        }
    }
}

#[test]
fn decoders_are_bit_exact_on_real_slices_for_every_isa() {
    let Some(file) = real_slices() else { return };
    let mut seen = 0;
    for info in file.tensors() {
        let bytes = file.tensor_bytes(info);
        let elems = info.n_elements() as usize;
        let want = reference(info.dtype, bytes, elems);
        let p = Format::of(info.dtype).unwrap();
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; elems];
            simd::decode(isa.checked().unwrap(), p, bytes, &mut got);
            for i in 0..elems {
                assert_eq!(
                    got[i].to_bits(),
                    want[i].to_bits(),
                    "{} {isa:?} at {i}",
                    info.name
                );
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 9, "the slices file holds nine tensors");
}

#[test]
fn decoders_are_bit_exact_on_synthetic_blocks_of_every_dtype() {
    for (s, dt) in DECODABLE.into_iter().enumerate() {
        let elems = 4 * dt.block_elems() as usize + if dt.is_quantized() { 0 } else { 13 };
        let bytes = synthetic_weights(dt, 1, elems, 100 + s as u32);
        let want = reference(dt, &bytes, elems);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; elems];
            simd::decode(
                isa.checked().unwrap(),
                Format::of(dt).unwrap(),
                &bytes,
                &mut got,
            );
            for i in 0..elems {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{dt} {isa:?} at {i}");
            }
        }
    }
}

#[test]
fn f16_rows_keep_specials_on_every_isa() {
    // Every f16 bit pattern, through the row decoder (F16C on SIMD paths).
    let bytes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let want = reference(DType::F16, &bytes, 1 << 16);
    for isa in Isa::available() {
        let mut got = vec![0.0; 1 << 16];
        simd::decode(isa.checked().unwrap(), Format::F16, &bytes, &mut got);
        for i in 0..got.len() {
            assert_eq!(got[i].to_bits(), want[i].to_bits(), "{isa:?} f16 {i:#06x}");
        }
    }
}

#[test]
fn matmul_matches_the_reference_on_real_weights() {
    let Some(file) = real_slices() else { return };
    for (s, info) in file.tensors().iter().enumerate() {
        let (n, k) = (info.shape[0] as usize, info.shape[1] as usize);
        check_matrix(
            &info.name,
            info.dtype,
            file.tensor_bytes(info),
            n,
            k,
            7 * s as u32,
        );
    }
}

#[test]
fn matmul_matches_the_reference_for_every_dtype() {
    for (s, dt) in MATMUL_DTYPES.into_iter().enumerate() {
        // Odd row counts exercise partial row groups; plain floats get k that are not a
        // multiple of any vector width, with and without a 32-element step (AVX2's one-token
        // loop: 32-element steps, one 16-element step, a tail).
        let ks: &[usize] = if dt.is_quantized() {
            &[2 * dt.block_elems() as usize]
        } else {
            &[29, 61]
        };
        for &k in ks {
            let n = 7 + s % 3;
            let w = synthetic_weights(dt, n, k, 300 + s as u32);
            check_matrix("synthetic", dt, &w, n, k, 11 * s as u32);
        }
    }
}

#[test]
fn matmul_with_many_tokens_and_rows() {
    // A prefill-like shape: several tasks per thread, all token tile sizes.
    let (t, k, n) = (23, 256, 70);
    let w = synthetic_weights(DType::Q4_K, n, k, 5);
    let wf = reference(DType::Q4_K, &w, n * k);
    let x = Rng::new(9).vec(t * k, -2.0, 2.0);
    let (want, tol) = reference_product(&x, t, k, &wf, n);
    for isa in Isa::available() {
        for threads in [1, 2, 4] {
            let got = run(isa, threads, &x, t, k, &w, DType::Q4_K, n);
            assert_close(&format!("Q4_K {isa:?} x{threads}"), &got, &want, &tol);
        }
    }
}

#[test]
fn matmul_errors_are_typed_and_leave_out_alone() {
    let pool = ThreadPool::new(2).unwrap();
    let w = vec![0u8; 2 * 18];
    let x = vec![1.0; 32];
    let mut out = vec![7.0f32; 2];
    let go = |x: &[f32], k, w: &[u8], dt, n, out: &mut [f32]| matmul(x, 1, k, w, dt, n, out, &pool);
    assert_eq!(
        go(&x, 32, &w, DType::Q8_1, 2, &mut out),
        Err(KernelError::UnsupportedDType {
            op: "matmul",
            dtype: DType::Q8_1
        })
    );
    assert_eq!(
        go(&x[..16], 16, &w, DType::Q4_0, 2, &mut out),
        Err(KernelError::NotWholeBlocks {
            op: "matmul",
            dtype: DType::Q4_0,
            len: 16,
            block: 32
        })
    );
    assert_eq!(
        go(&x, 32, &w[..35], DType::Q4_0, 2, &mut out),
        Err(KernelError::Length {
            what: "matmul w",
            expected: 36,
            got: 35
        })
    );
    assert_eq!(
        go(&x[..31], 32, &w, DType::Q4_0, 2, &mut out),
        Err(KernelError::Length {
            what: "matmul x",
            expected: 32,
            got: 31
        })
    );
    assert_eq!(
        go(&x, 32, &w, DType::Q4_0, 2, &mut out[..1]),
        Err(KernelError::Length {
            what: "matmul out",
            expected: 2,
            got: 1
        })
    );
    assert!(out.iter().all(|&v| v == 7.0));
    assert!(matches!(
        go(&x, usize::MAX, &w, DType::F32, 2, &mut out),
        Err(KernelError::Overflow { .. })
    ));
}

#[test]
fn empty_shapes_are_fine() {
    let pool = ThreadPool::new(2).unwrap();
    let mut out = vec![5.0; 3];
    matmul(&[], 3, 0, &[], DType::Q4_0, 1, &mut out, &pool).unwrap();
    assert_eq!(out, [0.0; 3], "k = 0 gives zeros");
    matmul(&[], 0, 32, &[0; 36], DType::Q4_0, 2, &mut [], &pool).unwrap();
}

#[test]
fn float_weights_against_several_tokens_take_the_packed_tiles_within_the_bound() {
    // k past one chunk of either tiling (1024 on AVX2, 512 on AVX-512) and a multiple of 8;
    // n not a multiple of a quad; t across token tiles (3) and groups (12).
    let (n, k) = (13, 1040);
    for (s, dt) in [DType::F16, DType::BF16, DType::F32]
        .into_iter()
        .enumerate()
    {
        let w = synthetic_weights(dt, n, k, 40 + s as u32);
        let wf = reference(dt, &w, n * k);
        for t in [2, 3, 13, 25] {
            let x = Rng::new(50 + t as u32).vec(t * k, -1.0, 1.0);
            let (want, tol) = reference_product(&x, t, k, &wf, n);
            for isa in Isa::available() {
                let got = run(isa, 2, &x, t, k, &w, dt, n);
                assert_close(&format!("{dt} t={t} {isa:?}"), &got, &want, &tol);
                let one = run(isa, 1, &x, t, k, &w, dt, n);
                assert!(got
                    .iter()
                    .zip(&one)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                if isa == Isa::Scalar {
                    continue;
                }
                // The tiles' invariant with the activations as given (not rounded as ggml's
                // are): every output is the 8-lane dot bit for bit.
                for tok in 0..t {
                    for r in 0..n {
                        let d = crate::kernels::ggml::dot_lanes8(
                            &wf[r * k..(r + 1) * k],
                            &x[tok * k..(tok + 1) * k],
                        );
                        let g = got[tok * n + r];
                        assert_eq!(g.to_bits(), d.to_bits(), "{dt} {isa:?} t={t} {tok},{r}");
                    }
                }
            }
        }
    }
}

/// Each dtype's path under each numerics, and a stored path that does not fit the weight is a
/// typed error before anything is written.
#[test]
fn a_weight_path_follows_numerics_and_dtype_and_a_wrong_one_is_refused() {
    use crate::kernels::format::Format;
    let ggml = |dt| MatmulPath::choose(Numerics::Ggml, dt);
    assert_eq!(ggml(DType::Q4_0), MatmulPath::Q8(Format::Q4_0));
    assert_eq!(ggml(DType::Q6_K), MatmulPath::Q8K(Format::Q6_K));
    assert_eq!(ggml(DType::BF16), MatmulPath::Bf16Ggml);
    assert_eq!(ggml(DType::F16), MatmulPath::FloatGgml);
    assert_eq!(ggml(DType::Q5_1), MatmulPath::Decoded);
    for dt in DECODABLE {
        assert_eq!(
            MatmulPath::choose(Numerics::Exact, dt),
            MatmulPath::Decoded,
            "{dt}"
        );
    }
    let pool = ThreadPool::new(1).unwrap();
    let (k, n) = (32, 2);
    let w = vec![0u8; n * 4 * k];
    let mut out = vec![7.0f32; n];
    let err = matmul_on_path(
        MatmulPath::Q8(Format::Q4_0),
        Numerics::Ggml,
        Isa::Scalar,
        &[1.0; 32],
        1,
        k,
        &w,
        DType::F32,
        n,
        &mut out,
        &pool,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidArgument { .. }),
        "{err:?}"
    );
    assert_eq!(out, vec![7.0; n]);
}
