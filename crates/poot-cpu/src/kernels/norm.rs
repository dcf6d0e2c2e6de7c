//! RMS normalization in ggml's operation order.
//!
//! For each of `t` rows of `d` values: `sum = sum_i (x_i * x_i)` with each product in `f32`
//! accumulated sequentially in `f64` (ggml's `ggml_float`), `mean = (sum / d) as f32`,
//! `scale = 1 / sqrt(mean + eps)` in `f32`, then `out_i = (x_i * scale) * w_i` in `f32` (ggml's
//! `rms_norm` followed by `mul`). So the result is bit-identical to llama.cpp's CPU backend.
//!
//! Error bound vs exact arithmetic (asserted in the tests): `|got - exact| <= 6 * 2^-24 *
//! |exact|` per element (four `f32` roundings plus the `f32` square root, with the `f64` sum
//! contributing far less).
//!
//! The weight stays in its stored dtype and is decoded 256 values at a time into a stack buffer
//! (norm weights are usually F32). Cost: O(t * d); no heap allocation.

use poot_core::DType;

use crate::error::{check_len, mul};
use crate::kernels::blocks::row_bytes;
use crate::kernels::format::Format;
use crate::kernels::simd::{self, Isa};
use crate::KernelError;

/// Decode chunk: a multiple of every block size (1, 32, 256).
const CHUNK: usize = 256;

/// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for `t` rows of `d` (see module docs).
pub fn rms_norm(
    x: &[f32],
    t: usize,
    d: usize,
    weight: &[u8],
    w_dtype: DType,
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let ck = Isa::detect().checked()?;
    let p = Format::of(w_dtype).ok_or(KernelError::UnsupportedDType {
        op: "rms_norm",
        dtype: w_dtype,
    })?;
    check_len(
        "rms_norm weight",
        row_bytes("rms_norm", w_dtype, d)?,
        weight.len(),
    )?;
    let n = mul(t, d, "rms_norm x")?;
    check_len("rms_norm x", n, x.len())?;
    check_len("rms_norm out", n, out.len())?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(KernelError::InvalidArgument {
            what: "rms_norm eps",
            detail: format!("{eps} is not a finite non-negative number"),
        });
    }
    if d == 0 {
        return Ok(());
    }
    // Bytes per CHUNK values: whole blocks, since CHUNK is a multiple of every block size.
    let chunk_bytes = CHUNK / w_dtype.block_elems() as usize * w_dtype.block_bytes() as usize;
    let mut w = [0.0f32; CHUNK];
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / d as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (c, (xc, yc)) in xr.chunks(CHUNK).zip(yr.chunks_mut(CHUNK)).enumerate() {
            let wb = &weight[c * chunk_bytes..(c * chunk_bytes + chunk_bytes).min(weight.len())];
            let wc = &mut w[..xc.len()];
            simd::decode(ck, p, wb, wc);
            for ((y, &v), &w) in yc.iter_mut().zip(xc).zip(wc.iter()) {
                *y = (v * scale) * w;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{reference, synthetic_weights, Rng};

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn matches_exact_arithmetic_within_six_ulps() {
        for (d, t) in [(576, 3), (64, 5), (7, 2), (300, 1)] {
            let mut rng = Rng::new(d as u32);
            let x = rng.vec(t * d, -3.0, 3.0);
            let w = rng.vec(d, 0.5, 1.5);
            let mut out = vec![0.0; t * d];
            rms_norm(&x, t, d, &f32_bytes(&w), DType::F32, 1e-5, &mut out).unwrap();
            for r in 0..t {
                let xr = &x[r * d..(r + 1) * d];
                let ms = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / d as f64;
                let inv = 1.0 / (ms + 1e-5f64).sqrt();
                for i in 0..d {
                    let want = f64::from(xr[i]) * inv * f64::from(w[i]);
                    let err = (f64::from(out[r * d + i]) - want).abs();
                    assert!(
                        err <= 6.0 * 2f64.powi(-24) * want.abs(),
                        "d={d} row {r} [{i}]"
                    );
                }
            }
        }
    }

    #[test]
    fn follows_ggml_operation_order_bit_for_bit() {
        // ggml_compute_forward_rms_norm_f32 then ggml_mul, transcribed.
        let (t, d) = (2, 96);
        let x = Rng::new(3).vec(t * d, -1.0, 1.0);
        let w = Rng::new(4).vec(d, -2.0, 2.0);
        let mut out = vec![0.0; t * d];
        rms_norm(&x, t, d, &f32_bytes(&w), DType::F32, 1e-6, &mut out).unwrap();
        for r in 0..t {
            let mut sum = 0.0f64;
            for i in 0..d {
                sum += f64::from(x[r * d + i] * x[r * d + i]);
            }
            let mean = (sum / d as f64) as f32;
            let scale = 1.0f32 / (mean + 1e-6f32).sqrt();
            for i in 0..d {
                let want = (x[r * d + i] * scale) * w[i];
                assert_eq!(out[r * d + i].to_bits(), want.to_bits(), "row {r} [{i}]");
            }
        }
    }

    #[test]
    fn packed_and_half_weights_are_decoded_exactly() {
        for dt in [DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K] {
            let d = 512;
            let wb = synthetic_weights(dt, 1, d, 8);
            let wf = reference(dt, &wb, d);
            let x = Rng::new(5).vec(d, -1.0, 1.0);
            let (mut got, mut want) = (vec![0.0; d], vec![0.0; d]);
            rms_norm(&x, 1, d, &wb, dt, 1e-5, &mut got).unwrap();
            rms_norm(&x, 1, d, &f32_bytes(&wf), DType::F32, 1e-5, &mut want).unwrap();
            assert_eq!(got, want, "{dt}");
        }
    }

    #[test]
    fn shape_errors_are_typed() {
        let w = f32_bytes(&[1.0; 4]);
        let mut out = [0.0; 8];
        assert_eq!(
            rms_norm(&[0.0; 7], 2, 4, &w, DType::F32, 1e-5, &mut out),
            Err(KernelError::Length {
                what: "rms_norm x",
                expected: 8,
                got: 7
            })
        );
        assert_eq!(
            rms_norm(&[0.0; 8], 2, 4, &w[..12], DType::F32, 1e-5, &mut out),
            Err(KernelError::Length {
                what: "rms_norm weight",
                expected: 16,
                got: 12
            })
        );
        assert!(matches!(
            rms_norm(&[0.0; 8], 2, 4, &w, DType::F32, f32::NAN, &mut out),
            Err(KernelError::InvalidArgument { .. })
        ));
        assert!(matches!(
            rms_norm(&[0.0; 8], 2, 4, &w, DType::Q4_0, 1e-5, &mut out),
            Err(KernelError::NotWholeBlocks { .. })
        ));
    }
}
