//! FP8 re-lay and E4M3 decoding against the format's definition, computed here.

use super::hf::HfQuantError;
use super::hf_fp8::{e4m3_to_f32, fp8_to_f8s, Fp8Scales};
use crate::{dequantize, DType};

/// E4M3FN by its definition, in f64: `(-1)^s * 2^(e - 7) * (1 + m / 8)`, subnormal
/// `(-1)^s * 2^-6 * m / 8`, NaN at `S.1111.111`.
fn e4m3_ref(q: u8) -> f64 {
    let s = if q & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((q >> 3) & 15), f64::from(q & 7));
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        return s * 2f64.powi(-6) * m / 8.0;
    }
    s * 2f64.powi(e - 7) * (1.0 + m / 8.0)
}

#[test]
fn every_e4m3_code_decodes_exactly() {
    for q in 0..=255u8 {
        let (got, want) = (e4m3_to_f32(q), e4m3_ref(q));
        if want.is_nan() {
            assert!(got.is_nan(), "{q:#04x}");
        } else {
            assert_eq!(f64::from(got), want, "{q:#04x}");
            assert_eq!(got.is_sign_negative(), q & 0x80 != 0, "{q:#04x} sign");
        }
    }
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    assert!((0..=255u8).all(|q| !e4m3_to_f32(q).is_infinite()));
}

#[test]
fn every_scale_layout_matches_the_definition() {
    let (k, n) = (320usize, 200usize);
    let w: Vec<u8> = (0..n * k)
        .map(|i| ((i * 2_654_435_761) >> 7) as u8 & 0xF7) // never NaN (0x7f/0xff)
        .collect();
    for layout in [
        Fp8Scales::Tensor,
        Fp8Scales::Channel,
        Fp8Scales::Block {
            rows: 128,
            cols: 128,
        },
        Fp8Scales::Block { rows: 64, cols: 32 },
    ] {
        // Scales with 8 significant bits (bf16's), so the product is exact.
        let s: Vec<f32> = (0..layout.count(k, n))
            .map(|i| (1 + (i * 37) % 255) as f32 / 4096.0)
            .collect();
        let out = fp8_to_f8s(&w, &s, layout, (k, n)).unwrap();
        let mut got = vec![0f32; n * k];
        dequantize(DType::F8_S, &out, &mut got).unwrap();
        for j in 0..n {
            for i in 0..k {
                let sc = match layout {
                    Fp8Scales::Tensor => s[0],
                    Fp8Scales::Channel => s[j],
                    Fp8Scales::Block { rows, cols } => s[(j / rows) * k.div_ceil(cols) + i / cols],
                };
                let want = e4m3_ref(w[j * k + i]) * f64::from(sc);
                assert_eq!(f64::from(got[j * k + i]), want, "{layout:?} ({j},{i})");
            }
        }
    }
}

#[test]
fn bad_fp8_geometry_is_a_typed_error() {
    let w = vec![0u8; 8 * 64];
    assert!(fp8_to_f8s(&w, &[1.0], Fp8Scales::Tensor, (64, 8)).is_ok());
    assert!(matches!(
        fp8_to_f8s(&w, &[1.0], Fp8Scales::Tensor, (48, 8)),
        Err(HfQuantError::Geometry { .. })
    ));
    let bad_block = Fp8Scales::Block { rows: 8, cols: 48 };
    assert!(matches!(
        fp8_to_f8s(&w, &[1.0; 2], bad_block, (64, 8)),
        Err(HfQuantError::Geometry { .. })
    ));
    assert!(matches!(
        fp8_to_f8s(&w, &[1.0; 3], Fp8Scales::Channel, (64, 8)),
        Err(HfQuantError::Shape {
            tensor: "weight_scale",
            ..
        })
    ));
    assert!(matches!(
        fp8_to_f8s(&w[1..], &[1.0], Fp8Scales::Tensor, (64, 8)),
        Err(HfQuantError::Shape {
            tensor: "weight",
            ..
        })
    ));
}

#[test]
fn a_nan_code_is_a_typed_error_naming_its_place() {
    for code in [0x7f, 0xff] {
        let mut w = vec![0x7eu8; 8 * 64];
        w[3 * 64 + 17] = code;
        assert_eq!(
            fp8_to_f8s(&w, &[1.0], Fp8Scales::Tensor, (64, 8)),
            Err(HfQuantError::NanCode {
                row: 3,
                column: 17,
                code
            })
        );
    }
    // Every other code is a weight.
    let w: Vec<u8> = (0..=255u8)
        .filter(|q| q & 0x7f != 0x7f)
        .cycle()
        .take(8 * 64)
        .collect();
    assert!(fp8_to_f8s(&w, &[1.0], Fp8Scales::Tensor, (64, 8)).is_ok());
}
