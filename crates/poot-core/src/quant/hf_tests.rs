//! The GPTQ/AWQ re-lay against the formats' definitions, computed here element by element.

use super::hf::{gptq8_to_q8z, int4_to_q4z, HfQuantError, IntPacking, PackedTensors};
use crate::{dequantize, DType};

/// A small deterministic generator (xorshift), so the test needs no crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
}

fn le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Packs `q[i][j]` (k x n quants) and zeros, re-lays, and checks every element.
fn check(packing: IntPacking, k: usize, n: usize, group: i64) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (k * 31 + n) as u64);
    let groups = if group == -1 { 1 } else { k / group as usize };
    let q: Vec<u32> = (0..k * n).map(|_| rng.next() % 16).collect();
    let z: Vec<u32> = (0..groups * n).map(|_| rng.next() % 16).collect();
    // Scales: small f16 values (exponent 0x30..0x3a), signs mixed.
    let s: Vec<u16> = (0..groups * n)
        .map(|_| (rng.next() as u16 & 0x83ff) | (((rng.next() % 10) as u16 + 0x0c) << 10))
        .collect();
    let awq_pos = [0, 4, 1, 5, 2, 6, 3, 7];
    let (qw, qz) = match packing {
        IntPacking::Awq => {
            let mut qw = vec![0u32; k * n / 8];
            for i in 0..k {
                for j in 0..n {
                    qw[i * n / 8 + j / 8] |= q[i * n + j] << (4 * awq_pos[j % 8]);
                }
            }
            let mut qz = vec![0u32; groups * n / 8];
            for g in 0..groups {
                for j in 0..n {
                    qz[g * n / 8 + j / 8] |= z[g * n + j] << (4 * awq_pos[j % 8]);
                }
            }
            (qw, qz)
        }
        _ => {
            let mut qw = vec![0u32; k * n / 8];
            for i in 0..k {
                for j in 0..n {
                    qw[(i / 8) * n + j] |= q[i * n + j] << (4 * (i % 8));
                }
            }
            let v1 = packing == IntPacking::GptqV1;
            let mut qz = vec![0u32; groups * n / 8];
            for g in 0..groups {
                for j in 0..n {
                    let stored = if v1 {
                        z[g * n + j].wrapping_sub(1) & 0xF
                    } else {
                        z[g * n + j]
                    };
                    qz[g * n / 8 + j / 8] |= stored << (4 * (j % 8));
                }
            }
            (qw, qz)
        }
    };
    let sb: Vec<u8> = s.iter().flat_map(|h| h.to_le_bytes()).collect();
    let (qw, qz) = (le(&qw), le(&qz));
    let t = PackedTensors {
        qweight: &qw,
        qzeros: &qz,
        scales: &sb,
        g_idx: None,
    };
    let out = int4_to_q4z(packing, t, (k, n), group).unwrap();
    let mut got = vec![0f32; k * n];
    dequantize(DType::Q4_Z, &out, &mut got).unwrap();
    for j in 0..n {
        for i in 0..k {
            let g = i / (k / groups);
            let mut zz = z[g * n + j] as i32;
            if packing == IntPacking::GptqV1 && zz == 0 {
                zz = 16; // v1 stores zero - 1 in 4 bits; a zero of 0 reads back as 16
            }
            let want = (q[i * n + j] as i32 - zz) as f64
                * f64::from(half::f16::from_bits(s[g * n + j]).to_f32());
            assert_eq!(
                f64::from(got[j * k + i]),
                want,
                "{packing:?} {k}x{n} g{group} ({j},{i})"
            );
        }
    }
}

#[test]
fn every_packing_and_group_size_matches_the_definition() {
    for packing in [IntPacking::GptqV1, IntPacking::GptqV2, IntPacking::Awq] {
        for (k, n, g) in [
            (64, 8, -1),
            (128, 16, 32),
            (128, 24, 64),
            (256, 40, 128),
            (96, 8, 32),
        ] {
            check(packing, k, n, g);
        }
    }
}

#[test]
fn bad_geometry_and_g_idx_are_typed_errors() {
    let qw = vec![0u8; 64 * 8 / 2];
    let qz = vec![0u8; 2 * 8 / 2];
    let sc = vec![0u8; 2 * 8 * 2];
    let run = |g_idx: Option<&[u8]>, group| {
        let t = PackedTensors {
            qweight: &qw,
            qzeros: &qz,
            scales: &sc,
            g_idx,
        };
        int4_to_q4z(IntPacking::GptqV2, t, (64, 8), group)
    };
    assert!(matches!(run(None, 48), Err(HfQuantError::Geometry { .. })));
    assert!(matches!(
        run(None, 64),
        Err(HfQuantError::Shape {
            tensor: "qzeros",
            ..
        })
    ));
    let mut g: Vec<u32> = (0..64).map(|i| i / 32).collect();
    assert!(run(Some(&le(&g)), 32).is_ok());
    g[40] = 2;
    assert!(matches!(
        run(Some(&le(&g)), 32),
        Err(HfQuantError::GroupIndex {
            column: 40,
            group: 2,
            groups: 2
        })
    ));
    g[40] = 0;
    assert!(matches!(
        run(Some(&le(&g)), 32),
        Err(HfQuantError::ActOrder { start: 32 })
    ));
}

#[test]
fn gptq_8bit_matches_the_definition() {
    let (k, n, group) = (128usize, 16usize, 64usize);
    let groups = k / group;
    let mut rng = Rng(77);
    let q: Vec<u32> = (0..k * n).map(|_| rng.next() % 256).collect();
    let z: Vec<u32> = (0..groups * n).map(|_| rng.next() % 256).collect();
    let s: Vec<u16> = (0..groups * n)
        .map(|_| 0x2c00 | (rng.next() as u16 & 0x3ff))
        .collect();
    for v1 in [false, true] {
        let mut qw = vec![0u32; k * n / 4];
        for i in 0..k {
            for j in 0..n {
                qw[(i / 4) * n + j] |= q[i * n + j] << (8 * (i % 4));
            }
        }
        let mut qz = vec![0u32; groups * n / 4];
        for g in 0..groups {
            for j in 0..n {
                let stored = if v1 {
                    z[g * n + j].wrapping_sub(1) & 0xFF
                } else {
                    z[g * n + j]
                };
                qz[g * n / 4 + j / 4] |= stored << (8 * (j % 4));
            }
        }
        let sb: Vec<u8> = s.iter().flat_map(|h| h.to_le_bytes()).collect();
        let (qw, qz) = (le(&qw), le(&qz));
        let t = PackedTensors {
            qweight: &qw,
            qzeros: &qz,
            scales: &sb,
            g_idx: None,
        };
        let out = gptq8_to_q8z(v1, t, (k, n), group as i64).unwrap();
        let mut got = vec![0f32; k * n];
        dequantize(DType::Q8_Z, &out, &mut got).unwrap();
        for j in 0..n {
            for i in 0..k {
                let g = i / group;
                let mut zz = z[g * n + j] as i32;
                if v1 && zz == 0 {
                    zz = 256;
                }
                let want = (q[i * n + j] as i32 - zz) as f64
                    * f64::from(half::f16::from_bits(s[g * n + j]).to_f32());
                assert_eq!(f64::from(got[j * k + i]), want, "v1={v1} ({j},{i})");
            }
        }
    }
}
