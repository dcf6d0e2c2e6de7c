//! Layer normalization over the last dimension (torch's `nn.LayerNorm`, biased variance).
//!
//! For each row of `d` values: `mean` and `var = mean((x - mean)^2)` accumulated in `f64`
//! (two passes, so no cancellation), `rstd = 1 / sqrt(var + eps)` rounded to `f32`, then
//! `out_i = ((x_i - mean) * rstd) * w_i + b_i` in `f32` (`w`, `b` optional). Error bound vs
//! exact arithmetic: a few f32 roundings per element (the tests assert `4 * 2^-24` relative
//! to the row's largest normalized value). Cost: O(rows * d), no allocation.

use crate::error::check_len;
use crate::KernelError;

/// `out[r] = (x[r] - mean) / sqrt(var + eps) * weight + bias` for rows of `d`.
pub fn layer_norm(
    x: &[f32],
    d: usize,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len("layer_norm out", x.len(), out.len())?;
    if d == 0 || !x.len().is_multiple_of(d) {
        return Err(KernelError::InvalidArgument {
            what: "layer_norm d",
            detail: format!("{} values are not rows of {d}", x.len()),
        });
    }
    if let Some(w) = weight {
        check_len("layer_norm weight", d, w.len())?;
    }
    if let Some(b) = bias {
        check_len("layer_norm bias", d, b.len())?;
    }
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = xr.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
        let var = xr
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / d as f64;
        let rstd = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
        let mean = mean as f32;
        for (i, (o, &v)) in or.iter_mut().zip(xr).enumerate() {
            let mut y = (v - mean) * rstd;
            if let Some(w) = weight {
                y *= w[i];
            }
            if let Some(b) = bias {
                y += b[i];
            }
            *o = y;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f64_reference() {
        let d = 37;
        let x: Vec<f32> = (0..3 * d)
            .map(|i| ((i * 7919) % 97) as f32 * 0.31 - 11.0)
            .collect();
        let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..d).map(|i| i as f32 * -0.02).collect();
        let mut out = vec![0f32; x.len()];
        layer_norm(&x, d, Some(&w), Some(&b), 1e-5, &mut out).unwrap();
        for (r, (xr, or)) in x.chunks(d).zip(out.chunks(d)).enumerate() {
            let m = xr.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
            let var = xr.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                let n = (f64::from(xr[i]) - m) / (var + 1e-5).sqrt();
                let want = n * f64::from(w[i]) + f64::from(b[i]);
                let bound = 4.0 * f64::from(f32::EPSILON) * (n.abs() * f64::from(w[i]) + 1.0);
                assert!(
                    (f64::from(or[i]) - want).abs() <= bound,
                    "row {r} col {i}: {} vs {want}",
                    or[i]
                );
            }
        }
    }

    #[test]
    fn without_affine_and_bad_lengths() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = [0f32; 4];
        layer_norm(&x, 2, None, None, 0.0, &mut out).unwrap();
        assert_eq!(out, [-1.0, 1.0, -1.0, 1.0]);
        assert!(layer_norm(&x, 3, None, None, 0.0, &mut out).is_err());
        assert!(layer_norm(&x, 2, Some(&[1.0]), None, 0.0, &mut out).is_err());
        assert!(layer_norm(&x, 2, None, None, 0.0, &mut out[..3]).is_err());
    }
}
