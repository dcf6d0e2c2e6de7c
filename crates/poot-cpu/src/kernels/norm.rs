//! RMS normalization in ggml's operation order.
//!
//! For each of `t` rows of `d` values: `sum = sum_i (x_i * x_i)` with each product in `f32`
//! accumulated sequentially in `f64` (ggml's `ggml_float`), `mean = (sum / d) as f32`,
//! `scale = 1 / sqrt(mean + eps)` in `f32`, then `out_i = (x_i * scale) * w_i` in `f32` (ggml's
//! `rms_norm` followed by `mul`). So the result is bit-identical to llama.cpp's CPU backend.
//! The sequential sum's `f32` mean is usually read off a 16-lane sum and a bound on both
//! sums' error ([`mean_square`]), so the chain itself runs only where the bound cannot decide.
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
use crate::kernels::simd::{self, Checked, Isa};
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
    let norm = Norm {
        ck,
        p,
        weight,
        // Bytes per CHUNK values: whole blocks, since CHUNK is a multiple of every block size.
        chunk_bytes: CHUNK / w_dtype.block_elems() as usize * w_dtype.block_bytes() as usize,
        d,
        eps,
    };
    #[cfg(target_arch = "x86_64")]
    if ck.isa() != Isa::Scalar {
        // SAFETY: every ISA but Scalar implies AVX2 (`Checked` holds a detected one).
        unsafe { rows_avx2(&norm, x, out) };
        return Ok(());
    }
    rows(&norm, x, out);
    Ok(())
}

/// One [`rms_norm`] call's checked operands but the rows.
struct Norm<'a> {
    ck: Checked,
    /// The weight's format and bytes, `chunk_bytes` of them per [`CHUNK`] values.
    p: Format,
    weight: &'a [u8],
    chunk_bytes: usize,
    /// Values per row (> 0).
    d: usize,
    eps: f32,
}

/// [`rows`] compiled for AVX2 (the lanes' sum and the scaling 4 and 8 wide; the same
/// operations, so the same bits).
///
/// # Safety
/// AVX2 detected.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2(norm: &Norm<'_>, x: &[f32], out: &mut [f32]) {
    rows(norm, x, out);
}

/// Every row of [`rms_norm`].
#[inline(always)]
fn rows(norm: &Norm<'_>, x: &[f32], out: &mut [f32]) {
    let (weight, chunk_bytes) = (norm.weight, norm.chunk_bytes);
    let mut w = [0.0f32; CHUNK];
    for (xr, yr) in x.chunks_exact(norm.d).zip(out.chunks_exact_mut(norm.d)) {
        let mean = mean_square(xr);
        let scale = 1.0 / (mean + norm.eps).sqrt();
        for (c, (xc, yc)) in xr.chunks(CHUNK).zip(yr.chunks_mut(CHUNK)).enumerate() {
            let wb = &weight[c * chunk_bytes..(c * chunk_bytes + chunk_bytes).min(weight.len())];
            let wc = &mut w[..xc.len()];
            simd::decode(norm.ck, norm.p, wb, wc);
            for ((y, &v), &w) in yc.iter_mut().zip(xc).zip(wc.iter()) {
                *y = (v * scale) * w;
            }
        }
    }
}

/// Lanes of [`mean_square`]'s unordered sum: 16 short chains instead of one of `d` additions.
const LANES: usize = 16;

/// ggml's `(sum / d) as f32` of a row, where `sum` adds the `f32` squares to an `f64` one by
/// one. That chain is `d` dependent additions on the decode step's serial path (a 576-value
/// row took 620 ns with it, 178 ns this way), so the sum is first taken in [`LANES`] lanes.
/// Any order's sum of `d` non-negative terms is within `(d - 1) u` times the exact sum of it
/// (u = 2^-53, up to second-order terms), so the two sums differ by less than `err` below;
/// where every sum in that interval gives the same `f32` mean (rounding is monotone), that
/// mean is the sequential chain's bits. Otherwise (an interval across an `f32` rounding
/// boundary, about one row in 10^5 at d = 576, or a square that overflowed) the chain runs.
#[inline(always)]
fn mean_square(xr: &[f32]) -> f32 {
    let d = xr.len() as f64;
    if let Some(mean) = mean_from_lanes(lanes_sum(xr), d) {
        return mean;
    }
    let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
    (sum / d) as f32
}

/// The `f32` squares of `xr` summed in `f64` in [`LANES`] lanes (order unspecified).
#[inline(always)]
fn lanes_sum(xr: &[f32]) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut chunks = xr.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v * v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v * v)).sum();
    acc.iter().sum::<f64>() + tail
}

/// The mean every sum within twice the worst summation error of `sum` (of `d` non-negative
/// terms) gives, if they all give the same one.
fn mean_from_lanes(sum: f64, d: f64) -> Option<f32> {
    if !sum.is_finite() {
        return None;
    }
    // 2 (d - 1) u bounds the two sums' difference; 4 d u (EPSILON = 2u) leaves room for the
    // roundings of this bound and of `sum -+ err`.
    let err = sum * d * (2.0 * f64::EPSILON);
    let lo = ((sum - err) / d) as f32;
    let hi = ((sum + err) / d) as f32;
    (lo.to_bits() == hi.to_bits()).then_some(lo)
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

    /// The lanes' shortcut gives the sequential chain's mean on rows of every scale and length,
    /// including rows with tiny and huge elements together (the chain rounds most there).
    #[test]
    fn the_mean_of_squares_is_the_sequential_chains() {
        let mut rng = Rng::new(11);
        let mut fell_back = 0;
        for trial in 0..20_000 {
            let d = [1, 7, 16, 64, 576, 1536, 2049][trial % 7];
            let spread = (trial % 13) as i32 - 6;
            let x: Vec<f32> = (0..d)
                .map(|_| {
                    let e = rng.vec(1, -1.0, 1.0)[0] * spread as f32 * 6.0;
                    rng.vec(1, -1.0, 1.0)[0] * e.exp2()
                })
                .collect();
            let seq: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
            let want = (seq / d as f64) as f32;
            assert_eq!(mean_square(&x).to_bits(), want.to_bits(), "trial {trial}");
            fell_back += usize::from(mean_from_lanes(lanes_sum(&x), d as f64).is_none());
        }
        assert!(fell_back < 100, "{fell_back} rows took the chain");
    }

    /// A sum on an `f32` rounding boundary of the mean cannot be trusted to the lanes, nor a
    /// square that overflowed; both rows still get the chain's bits.
    #[test]
    fn a_mean_on_a_rounding_boundary_takes_the_chain() {
        // 1 + 2^-24 is halfway between two f32s: any error decides the rounding.
        let tie = 1.0 + 2f64.powi(-24);
        assert_eq!(mean_from_lanes(tie * 4.0, 4.0), None);
        assert_eq!(mean_from_lanes(f64::INFINITY, 4.0), None);
        assert_eq!(mean_from_lanes(3.0 * 4.0, 4.0), Some(3.0));
        assert_eq!(mean_from_lanes(0.0, 4.0), Some(0.0));
        // A real row whose 16-lane sum and sequential chain give different f32 means
        // (0.03125 against 0.031250004: 1 then 31 squares summing to about 2^-24).
        let row: Vec<f32> = [
            0x3f800000u32,
            0x38374a5d,
            0x384d5e42,
            0x3824c90d,
            0x384d46e1,
            0x382d397f,
            0x3832d61c,
            0x3847307b,
            0x38322014,
            0x3839310e,
            0x381eeaa8,
            0x3843748d,
            0x38389d85,
            0x382e2024,
            0x38453670,
            0x382cca37,
            0x38345add,
            0x382446ae,
            0x3831d1a8,
            0x3827c512,
            0x382abb75,
            0x38434bfc,
            0x382ba49e,
            0x3835f33b,
            0x384ee455,
            0x384dee7c,
            0x38420276,
            0x3838c540,
            0x382b774b,
            0x38259d8e,
            0x384e5905,
            0x38378117,
        ]
        .map(f32::from_bits)
        .to_vec();
        let seq: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let want = (seq / 32.0) as f32;
        assert_ne!(
            (lanes_sum(&row) / 32.0) as f32,
            want,
            "the lanes alone differ"
        );
        assert_eq!(mean_from_lanes(lanes_sum(&row), 32.0), None);
        assert_eq!(mean_square(&row).to_bits(), want.to_bits());
        let big = [f32::MAX, 1.0];
        assert_eq!(mean_square(&big), f32::INFINITY);
        let x = [1.0f32, f32::NAN];
        assert!(mean_square(&x).is_nan());
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
