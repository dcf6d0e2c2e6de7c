//! RoPE tests. Bounds: against an f64 rotation that uses the kernel's own `f32` angle (the
//! `f32` angle error is shared by every engine, see the module docs), each output is within
//! `4 * 2^-24 * (|x0| + |x1|)` (cos/sin rounding, two products, one add). Against llama2.c's
//! `run.c` formula: bit-identical.

#![allow(
    clippy::needless_range_loop,
    reason = "index-heavy numerical references"
)]

use super::*;
use crate::testutil::Rng;

fn cfg(style: RopeStyle, head_dim: usize, rot_dim: usize) -> RopeConfig {
    RopeConfig {
        style,
        head_dim,
        rot_dim,
        theta: 10000.0,
        scaling: RopeScaling::None,
    }
}

/// `(first, second)` indices of rotation pair `i` for `style`.
fn pair(style: RopeStyle, i: usize, rot_dim: usize) -> (usize, usize) {
    match style {
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        RopeStyle::NeoX => (i, i + rot_dim / 2),
    }
}

#[test]
fn matches_an_f64_rotation_for_both_styles_and_partial_rotary() {
    let (t, n_heads) = (4, 3);
    for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
        for (hd, rot) in [(16, 16), (32, 16), (64, 24), (8, 0)] {
            let table = RopeTable::new(&cfg(style, hd, rot)).unwrap();
            let x0 = Rng::new(hd as u32).vec(t * n_heads * hd, -2.0, 2.0);
            let positions = [0, 1, 17, 4095];
            let mut x = x0.clone();
            rope(&mut x, t, n_heads, &positions, &table).unwrap();
            for tok in 0..t {
                for h in 0..n_heads {
                    let base = (tok * n_heads + h) * hd;
                    for i in 0..rot / 2 {
                        let (a, b) = pair(style, i, rot);
                        let angle = f64::from(positions[tok] as f32 * table.inv_freq()[i]);
                        let (c, s) = (angle.cos(), angle.sin());
                        let (u, v) = (f64::from(x0[base + a]), f64::from(x0[base + b]));
                        let tol = 4.0 * 2f64.powi(-24) * (u.abs() + v.abs());
                        let (wa, wb) = (u * c - v * s, u * s + v * c);
                        assert!(
                            (f64::from(x[base + a]) - wa).abs() <= tol,
                            "{style:?} {hd}/{rot}"
                        );
                        assert!(
                            (f64::from(x[base + b]) - wb).abs() <= tol,
                            "{style:?} {hd}/{rot}"
                        );
                    }
                    // Partial rotary: the tail of each head is untouched.
                    assert_eq!(x[base + rot..base + hd], x0[base + rot..base + hd]);
                }
            }
        }
    }
}

#[test]
fn interleaved_is_bit_identical_to_llama2_c() {
    // run.c: freq = 1.0f / powf(10000.0f, head_dim / (float)head_size); val = pos * freq;
    // fcr = cosf(val); fci = sinf(val); v0 * fcr - v1 * fci; v0 * fci + v1 * fcr.
    let (hd, n_heads, pos) = (8usize, 8, 37);
    let table = RopeTable::new(&cfg(RopeStyle::Interleaved, hd, hd)).unwrap();
    let x0 = Rng::new(2).vec(n_heads * hd, -1.0, 1.0);
    let mut x = x0.clone();
    rope(&mut x, 1, n_heads, &[pos], &table).unwrap();
    for i in (0..n_heads * hd).step_by(2) {
        let head_dim = (i % hd) as f32;
        let freq = 1.0f32 / 10000.0f32.powf(head_dim / hd as f32);
        let val = pos as f32 * freq;
        let (fcr, fci) = (val.cos(), val.sin());
        let (v0, v1) = (x0[i], x0[i + 1]);
        assert_eq!(x[i].to_bits(), (v0 * fcr - v1 * fci).to_bits(), "{i}");
        assert_eq!(x[i + 1].to_bits(), (v0 * fci + v1 * fcr).to_bits(), "{i}");
    }
}

#[test]
fn neox_is_interleaved_on_permuted_values() {
    let (hd, rot, n_heads) = (12, 8, 2);
    let neox = RopeTable::new(&cfg(RopeStyle::NeoX, hd, rot)).unwrap();
    let inter = RopeTable::new(&cfg(RopeStyle::Interleaved, hd, rot)).unwrap();
    let x0 = Rng::new(6).vec(n_heads * hd, -1.0, 1.0);
    // Move NeoX pair (i, i + rot/2) to interleaved slots (2i, 2i + 1).
    let perm: Vec<usize> = (0..hd)
        .map(|j| match j {
            j if j < rot => pair(RopeStyle::NeoX, j / 2, rot).0 + (j % 2) * rot / 2,
            j => j,
        })
        .collect();
    let mut a = x0.clone();
    let mut b: Vec<f32> = (0..n_heads * hd)
        .map(|i| x0[i / hd * hd + perm[i % hd]])
        .collect();
    rope(&mut a, 1, n_heads, &[123], &neox).unwrap();
    rope(&mut b, 1, n_heads, &[123], &inter).unwrap();
    for i in 0..n_heads * hd {
        assert_eq!(
            b[i].to_bits(),
            a[i / hd * hd + perm[i % hd]].to_bits(),
            "{i}"
        );
    }
}

#[test]
fn linear_scaling_divides_the_frequencies() {
    let plain = RopeTable::new(&cfg(RopeStyle::NeoX, 64, 64)).unwrap();
    let mut c = cfg(RopeStyle::NeoX, 64, 64);
    c.scaling = RopeScaling::Linear { factor: 4.0 };
    let lin = RopeTable::new(&c).unwrap();
    for (a, b) in plain.inv_freq().iter().zip(lin.inv_freq()) {
        assert_eq!(*b, a / 4.0);
    }
}

#[test]
fn llama3_scaling_follows_hf() {
    // Llama 3.1 8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192.
    let mut c = cfg(RopeStyle::NeoX, 128, 128);
    c.theta = 500_000.0;
    let plain = RopeTable::new(&c).unwrap();
    c.scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192,
    };
    let scaled = RopeTable::new(&c).unwrap();
    let (mut low, mut mid, mut high) = (0, 0, 0);
    for (&f, &g) in plain.inv_freq().iter().zip(scaled.inv_freq()) {
        // An independent f64 transcription of HF's rule; f32 rounding is the only difference.
        let wavelen = 2.0 * std::f64::consts::PI / f64::from(f);
        let want = if wavelen < 8192.0 / 4.0 {
            high += 1;
            f64::from(f)
        } else if wavelen > 8192.0 {
            low += 1;
            f64::from(f) / 8.0
        } else {
            mid += 1;
            let s = (8192.0 / wavelen - 1.0) / 3.0;
            (1.0 - s) * f64::from(f) / 8.0 + s * f64::from(f)
        };
        assert!(
            (f64::from(g) - want).abs() <= 4.0 * 2f64.powi(-24) * want,
            "{f}: {g} vs {want}"
        );
    }
    assert!(
        low > 0 && mid > 0 && high > 0,
        "all three bands exercised: {low} {mid} {high}"
    );
}

#[test]
fn position_zero_is_the_identity() {
    let table = RopeTable::new(&cfg(RopeStyle::Interleaved, 16, 16)).unwrap();
    let x0 = Rng::new(1).vec(2 * 16, -1.0, 1.0);
    let mut x = x0.clone();
    rope(&mut x, 1, 2, &[0], &table).unwrap();
    assert_eq!(x, x0);
}

#[test]
fn bad_configs_and_inputs_are_typed_errors() {
    assert!(RopeTable::new(&cfg(RopeStyle::NeoX, 8, 7)).is_err());
    assert!(RopeTable::new(&cfg(RopeStyle::NeoX, 8, 10)).is_err());
    let mut c = cfg(RopeStyle::NeoX, 8, 8);
    c.theta = 0.0;
    assert!(RopeTable::new(&c).is_err());
    c.theta = 10000.0;
    c.scaling = RopeScaling::Linear { factor: 0.0 };
    assert!(RopeTable::new(&c).is_err());
    let table = RopeTable::new(&cfg(RopeStyle::NeoX, 8, 8)).unwrap();
    let mut x = vec![1.0; 16];
    assert_eq!(
        rope(&mut x, 2, 1, &[0, -3], &table),
        Err(KernelError::IndexOutOfRange {
            what: "rope positions",
            at: 1,
            value: -3,
            bound: i32::MAX as usize
        })
    );
    assert_eq!(
        rope(&mut x, 2, 2, &[0, 1], &table),
        Err(KernelError::Length {
            what: "rope x",
            expected: 32,
            got: 16
        })
    );
    assert!(x.iter().all(|&v| v == 1.0));
}

/// ggml's recipe against the exact rotation by `pos * theta^(-2i/d)` in f64: its angle
/// `pos * theta_scale^i` is built with `i` roundings (plus one each for `theta_scale` and the
/// product), so each output is within `(|x0| + |x1|) * ((i + 3) * 2^-24 * angle + 4 * 2^-24)`.
#[test]
fn ggml_recipe_within_its_recurrence_bound() {
    let (hd, n_heads) = (64, 2);
    for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
        let c = cfg(style, hd, hd);
        let table = RopeTable::with_numerics(&c, Numerics::Ggml).unwrap();
        assert_ne!(table, RopeTable::new(&c).unwrap());
        let positions = [0, 1, 17, 4095];
        let x0 = Rng::new(5).vec(positions.len() * n_heads * hd, -2.0, 2.0);
        let mut x = x0.clone();
        rope(&mut x, positions.len(), n_heads, &positions, &table).unwrap();
        for (tok, &p) in positions.iter().enumerate() {
            for h in 0..n_heads {
                let base = (tok * n_heads + h) * hd;
                for i in 0..hd / 2 {
                    let (a, b) = pair(style, i, hd);
                    let angle = f64::from(p) * 10000f64.powf(-2.0 * i as f64 / hd as f64);
                    let (s, co) = angle.sin_cos();
                    let (u, v) = (f64::from(x0[base + a]), f64::from(x0[base + b]));
                    let tol = (u.abs() + v.abs())
                        * ((i + 3) as f64 * 2f64.powi(-24) * angle + 4.0 * 2f64.powi(-24));
                    assert!(
                        (f64::from(x[base + a]) - (u * co - v * s)).abs() <= tol,
                        "{p} {i}"
                    );
                    assert!(
                        (f64::from(x[base + b]) - (u * s + v * co)).abs() <= tol,
                        "{p} {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn precomputed_angles_give_the_same_bits() {
    let (hd, n_heads) = (64, 3);
    let positions = [0, 5, 17, 4095, 2];
    for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
        for numerics in [Numerics::Exact, Numerics::Ggml] {
            let table = RopeTable::with_numerics(&cfg(style, hd, 48), numerics).unwrap();
            let x0 = Rng::new(8).vec(positions.len() * n_heads * hd, -2.0, 2.0);
            let mut want = x0.clone();
            rope(&mut want, positions.len(), n_heads, &positions, &table).unwrap();
            let mut cs = vec![(9.0, 9.0); 3];
            rope_angles(&positions, &table, &mut cs).unwrap();
            assert_eq!(cs.len(), positions.len() * 24);
            let mut got = x0.clone();
            rope_with_angles(&mut got, positions.len(), n_heads, &positions, &table, &cs).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{style:?} {numerics:?}");
            // Angles of another step's length are a typed error, and x is untouched.
            let mut y = x0.clone();
            let err =
                rope_with_angles(&mut y, 4, n_heads, &positions[..4], &table, &cs).unwrap_err();
            assert!(matches!(err, KernelError::Length { .. }), "{err}");
            assert_eq!(bits(&y), bits(&x0));
        }
    }
    let table = RopeTable::new(&cfg(RopeStyle::NeoX, hd, hd)).unwrap();
    let err = rope_angles(&[3, -1], &table, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(err, KernelError::IndexOutOfRange { at: 1, .. }),
        "{err}"
    );
}

#[test]
fn frequency_factors_divide_each_pair_and_scale_cos_sin() {
    use poot_graph::MAX_ROPE_FACTORS;
    let (hd, rot) = (32, 24);
    let mut factors = [1.0f32; MAX_ROPE_FACTORS];
    for (i, f) in factors.iter_mut().take(rot / 2).enumerate() {
        *f = 1.0 + i as f32 * 0.75;
    }
    let plain = RopeTable::new(&cfg(RopeStyle::NeoX, hd, rot)).unwrap();
    let scaled_cfg = RopeConfig {
        scaling: RopeScaling::Factors {
            factors,
            attn_factor: 1.25,
        },
        ..cfg(RopeStyle::NeoX, hd, rot)
    };
    // Ggml numerics keeps the f32 recipe for factors (no repeated-multiplication form).
    for numerics in [Numerics::Exact, Numerics::Ggml] {
        let table = RopeTable::with_numerics(&scaled_cfg, numerics).unwrap();
        for (i, (&a, &b)) in table.inv_freq().iter().zip(plain.inv_freq()).enumerate() {
            assert_eq!(a, b / factors[i], "pair {i}");
        }
        let mut cs = Vec::new();
        rope_angles(&[7], &table, &mut cs).unwrap();
        for (i, &(c, s)) in cs.iter().enumerate() {
            let angle = 7.0f32 * table.inv_freq()[i];
            assert_eq!((c, s), (angle.cos() * 1.25, angle.sin() * 1.25), "pair {i}");
        }
    }
    let mut bad = factors;
    bad[3] = 0.0;
    let bad_cfg = RopeConfig {
        scaling: RopeScaling::Factors {
            factors: bad,
            attn_factor: 1.0,
        },
        ..scaled_cfg
    };
    assert!(RopeTable::new(&bad_cfg).is_err());
}
