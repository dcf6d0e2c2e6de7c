//! Activation tests against f64 references. Bounds (per element):
//! - silu: `4 * 2^-24 * |exact|`; gelu_erf: `2 * 2^-24 * |exact|` (one rounding from f64);
//! - gelu_tanh vs the same formula in f64: `8 * 2^-24 * (|exact| + |x|)` (`1 + tanh` cancels
//!   for very negative x, in ggml as here, so the bound is absolute in `|x|` there);
//! - softmax: `(4 + |x_i - max|) * 2^-24 * exact_i` (the f32 subtraction feeds exp);
//! - add/mul: exact.

#![allow(
    clippy::needless_range_loop,
    reason = "index-heavy numerical references"
)]

use super::*;
use crate::testutil::Rng;

const ULP: f64 = 1.0 / 16_777_216.0;

#[test]
fn erfc_matches_known_values() {
    // Python's math.erfc.
    let known = [
        (0.0, 1.0),
        (0.1, 0.887_537_083_981_715_2),
        (0.5, 0.479_500_122_186_953_5),
        (1.0, 0.157_299_207_050_285_13),
        (2.0, 0.004_677_734_981_047_265),
        (2.4999, 0.000_407_169_900_333_451_4),
        (2.5, 0.000_406_952_017_444_958_9),
        (3.0, 2.209_049_699_858_543_8e-5),
        (4.0, 1.541_725_790_028_002e-8),
        (6.0, 2.151_973_671_249_891_6e-17),
        (10.0, 2.088_487_583_762_545e-45),
        (26.0, 5.663_192_408_856_143e-296),
    ];
    for (z, want) in known {
        let got = erfc(z);
        assert!(
            (got - want).abs() <= 1e-10 * want,
            "erfc({z}) = {got}, want {want}"
        );
    }
    assert!(erfc(f64::NAN).is_nan());
    assert_eq!(erfc(f64::INFINITY), 0.0);
}

#[test]
fn unary_ops_match_f64_references() {
    let mut xs = Rng::new(1).vec(4000, -12.0, 12.0);
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 80.0, -80.0, 1e4, -1e4]);
    for &x in &xs {
        let xd = f64::from(x);
        let want = xd / (1.0 + (-xd).exp());
        let got = f64::from(silu_f32(x));
        assert!(
            (got - want).abs() <= 4.0 * ULP * want.abs(),
            "silu({x}): {got} vs {want}"
        );

        let erf_term = if xd < 0.0 {
            erfc(-xd * std::f64::consts::FRAC_1_SQRT_2)
        } else {
            2.0 - erfc(xd * std::f64::consts::FRAC_1_SQRT_2)
        };
        let want = 0.5 * xd * erf_term;
        let got = f64::from(gelu_erf_f32(x));
        assert!(
            (got - want).abs() <= 2.0 * ULP * want.abs(),
            "gelu_erf({x}): {got} vs {want}"
        );

        let s = (2.0 / std::f64::consts::PI).sqrt();
        let want = 0.5 * xd * (1.0 + (s * xd * (1.0 + 0.044715 * xd * xd)).tanh());
        let got = f64::from(gelu_tanh_f32(x));
        let tol = 8.0 * ULP * (want.abs() + xd.abs());
        assert!((got - want).abs() <= tol, "gelu_tanh({x}): {got} vs {want}");
    }
    // Known points: gelu(1) = 0.8413447460685429 (exact), gelu_tanh(1) = 0.8411919906082768.
    assert!((f64::from(gelu_erf_f32(1.0)) - 0.841_344_746_068_542_9).abs() < 1e-7);
    assert!((f64::from(gelu_tanh_f32(1.0)) - 0.841_191_990_608_276_8).abs() < 1e-7);
}

#[test]
fn in_place_and_out_of_place_agree() {
    let x = Rng::new(2).vec(37, -5.0, 5.0);
    let mut out = vec![0.0; 37];
    for (inplace, to) in [
        (
            silu as fn(&mut [f32]),
            silu_to as fn(&[f32], &mut [f32]) -> Result<(), KernelError>,
        ),
        (gelu_tanh, gelu_tanh_to),
        (gelu_erf, gelu_erf_to),
    ] {
        let mut y = x.clone();
        inplace(&mut y);
        to(&x, &mut out).unwrap();
        assert_eq!(y, out);
    }
    assert_eq!(
        silu_to(&x, &mut out[..3]),
        Err(KernelError::Length {
            what: "silu_to out",
            expected: 37,
            got: 3
        })
    );
}

#[test]
fn silu_mul_is_swiglu() {
    let g = Rng::new(3).vec(10, -4.0, 4.0);
    let u = Rng::new(4).vec(10, -4.0, 4.0);
    let mut out = vec![0.0; 10];
    silu_mul(&g, &u, &mut out).unwrap();
    for i in 0..10 {
        assert_eq!(out[i], silu_f32(g[i]) * u[i]);
    }
    assert!(silu_mul(&g, &u[..9], &mut out).is_err());
}

#[test]
fn add_and_mul_broadcast_a_row() {
    let a = Rng::new(5).vec(12, -1.0, 1.0);
    let row = Rng::new(6).vec(4, -1.0, 1.0);
    let full = Rng::new(7).vec(12, -1.0, 1.0);
    let mut out = vec![0.0; 12];
    add(&a, &row, &mut out).unwrap();
    assert!((0..12).all(|i| out[i] == a[i] + row[i % 4]));
    mul(&a, &full, &mut out).unwrap();
    assert!((0..12).all(|i| out[i] == a[i] * full[i]));
    let mut b = a.clone();
    mul_inplace(&mut b, &row).unwrap();
    assert!((0..12).all(|i| b[i] == a[i] * row[i % 4]));
    let mut b = a.clone();
    add_inplace(&mut b, &full).unwrap();
    assert!((0..12).all(|i| b[i] == a[i] + full[i]));
    assert!(matches!(
        add(&a, &full[..5], &mut out),
        Err(KernelError::InvalidArgument { .. })
    ));
    assert!(add(&a, &row[..0], &mut out).is_err());
    assert_eq!(
        mul(&a, &row, &mut out[..11]),
        Err(KernelError::Length {
            what: "mul out",
            expected: 12,
            got: 11
        })
    );
    add(&[], &[], &mut []).unwrap();
}

#[test]
fn softmax_matches_f64_and_sums_to_one() {
    let d = 50;
    let mut x = Rng::new(8).vec(3 * d, -10.0, 10.0);
    x[7] = f32::NEG_INFINITY; // a masked entry
    let x0 = x.clone();
    softmax(&mut x, d).unwrap();
    for r in 0..3 {
        let row = &x0[r * d..(r + 1) * d];
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row
            .iter()
            .map(|&v| (f64::from(v) - f64::from(m)).exp())
            .collect();
        let s: f64 = e.iter().sum();
        for i in 0..d {
            let want = e[i] / s;
            let tol = (4.0 + (f64::from(row[i]) - f64::from(m)).abs().min(1e3)) * ULP * want;
            let got = f64::from(x[r * d + i]);
            assert!((got - want).abs() <= tol, "row {r} [{i}]: {got} vs {want}");
        }
        let total: f64 = x[r * d..(r + 1) * d].iter().map(|&v| f64::from(v)).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
    assert_eq!(x[7], 0.0);
    assert!(softmax(&mut x, 7).is_err());
    softmax(&mut [], 0).unwrap();
}
