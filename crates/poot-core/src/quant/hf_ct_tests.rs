//! compressed-tensors `pack-quantized` and act-order re-lays against the formats' definitions,
//! computed here element by element (packing as `pack_to_int32` writes it).

use super::hf::{input_order, int4_to_q4z, HfQuantError, IntPacking, PackedTensors};
use super::hf_ct::{pack_quantized_to_qz, scales_to_f16, CtTensors};
use crate::{dequantize, DType};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    /// A random permutation of `0..k` (Fisher-Yates).
    fn perm(&mut self, k: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..k).collect();
        for i in (1..k).rev() {
            p.swap(i, self.next() as usize % (i + 1));
        }
        p
    }
}

fn le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A `g_idx` with act-order: column `perm[r]` gets group `r / group` (what GPTQ writes).
fn act_order_g_idx(rng: &mut Rng, k: usize, group: usize) -> Vec<u32> {
    let perm = rng.perm(k);
    let mut g = vec![0u32; k];
    for (r, &c) in perm.iter().enumerate() {
        g[c] = (r / group) as u32;
    }
    g
}

fn f16_of(h: u16) -> f64 {
    f64::from(half::f16::from_bits(h).to_f32())
}

/// Packs a `[n, k]` layer the way compressed-tensors does, re-lays and checks every element.
fn check_ct(bits: u8, k: usize, n: usize, group: i64, asym: bool, actorder: bool) {
    let mut rng = Rng(0x1234_5678_9abc_def1 ^ (k * 7 + n * 3 + bits as usize) as u64);
    let groups = if group == -1 { 1 } else { k / group as usize };
    let levels = 1u32 << bits;
    let f = 32 / bits as usize;
    let q: Vec<u32> = (0..n * k).map(|_| rng.next() % levels).collect();
    let z: Vec<u32> = (0..n * groups)
        .map(|_| {
            if asym {
                rng.next() % levels
            } else {
                levels / 2
            }
        })
        .collect();
    let s: Vec<u16> = (0..n * groups)
        .map(|_| (rng.next() as u16 & 0x83ff) | (((rng.next() % 10) as u16 + 0x0c) << 10))
        .collect();
    let g_idx = actorder.then(|| act_order_g_idx(&mut rng, k, k / groups));
    let gof = |i: usize| g_idx.as_ref().map_or(i / (k / groups), |g| g[i] as usize);
    let wpr = k.div_ceil(f);
    let mut packed = vec![0u32; n * wpr];
    for j in 0..n {
        for i in 0..k {
            packed[j * wpr + i / f] |= q[j * k + i] << (bits as usize * (i % f));
        }
    }
    let mut zp = vec![0u32; n.div_ceil(f) * groups];
    for j in 0..n {
        for g in 0..groups {
            zp[(j / f) * groups + g] |= z[j * groups + g] << (bits as usize * (j % f));
        }
    }
    let (pb, zb) = (le(&packed), le(&zp));
    let sb: Vec<u8> = s.iter().flat_map(|h| h.to_le_bytes()).collect();
    let gb = g_idx.as_ref().map(|g| le(g));
    let t = CtTensors {
        packed: &pb,
        scale: &sb,
        zero_point: asym.then_some(&zb[..]),
        g_idx: gb.as_deref(),
    };
    let out = pack_quantized_to_qz(bits, t, (k, n), group).unwrap();
    let order: Vec<usize> = match input_order(gb.as_deref(), k, n, groups).unwrap() {
        Some(o) => o.into_iter().map(|i| i as usize).collect(),
        None => (0..k).collect(),
    };
    assert_eq!(actorder, order != (0..k).collect::<Vec<_>>());
    let dtype = if bits == 4 { DType::Q4_Z } else { DType::Q8_Z };
    let mut got = vec![0f32; k * n];
    dequantize(dtype, &out, &mut got).unwrap();
    for j in 0..n {
        for (new, &i) in order.iter().enumerate() {
            let g = gof(i);
            let want = (q[j * k + i] as f64 - z[j * groups + g] as f64) * f16_of(s[j * groups + g]);
            let what = format!("bits {bits} {k}x{n} g{group} asym {asym} act {actorder}");
            assert_eq!(f64::from(got[j * k + new]), want, "{what} ({j},{i})");
        }
    }
}

#[test]
fn pack_quantized_matches_the_definition() {
    for bits in [4, 8] {
        for (k, n, g) in [(64, 8, -1), (128, 16, 32), (256, 24, 128), (96, 8, 32)] {
            for asym in [false, true] {
                check_ct(bits, k, n, g, asym, false);
                if g != -1 {
                    check_ct(bits, k, n, g, asym, true);
                }
            }
        }
    }
}

#[test]
fn gptq_act_order_relays_sorted_columns() {
    let (k, n, group) = (256usize, 16usize, 64usize);
    let groups = k / group;
    let mut rng = Rng(99);
    let q: Vec<u32> = (0..k * n).map(|_| rng.next() % 16).collect();
    let z: Vec<u32> = (0..groups * n).map(|_| rng.next() % 16).collect();
    let s: Vec<u16> = (0..groups * n)
        .map(|_| 0x2c00 | (rng.next() as u16 & 0x3ff))
        .collect();
    let g_idx = act_order_g_idx(&mut rng, k, group);
    let mut qw = vec![0u32; k * n / 8];
    for i in 0..k {
        for j in 0..n {
            qw[(i / 8) * n + j] |= q[i * n + j] << (4 * (i % 8));
        }
    }
    let mut qz = vec![0u32; groups * n / 8];
    for g in 0..groups {
        for j in 0..n {
            qz[g * n / 8 + j / 8] |= z[g * n + j] << (4 * (j % 8));
        }
    }
    let (qw, qz, gb) = (le(&qw), le(&qz), le(&g_idx));
    let sb: Vec<u8> = s.iter().flat_map(|h| h.to_le_bytes()).collect();
    let t = PackedTensors {
        qweight: &qw,
        qzeros: &qz,
        scales: &sb,
        g_idx: Some(&gb),
    };
    let out = int4_to_q4z(IntPacking::GptqV2, t, (k, n), group as i64).unwrap();
    let order = input_order(Some(&gb), k, n, groups).unwrap().unwrap();
    // Sorted stably by group.
    assert!(order.windows(2).all(|w| {
        let (a, b) = (g_idx[w[0] as usize], g_idx[w[1] as usize]);
        a < b || a == b && w[0] < w[1]
    }));
    let mut got = vec![0f32; k * n];
    dequantize(DType::Q4_Z, &out, &mut got).unwrap();
    for j in 0..n {
        for (new, &i) in order.iter().enumerate() {
            let (i, g) = (i as usize, g_idx[i as usize] as usize);
            let want = (q[i * n + j] as f64 - z[g * n + j] as f64) * f16_of(s[g * n + j]);
            assert_eq!(f64::from(got[j * k + new]), want, "({j},{i})");
        }
    }
}

#[test]
fn malformed_pack_quantized_is_a_typed_error() {
    let (k, n) = (64, 8);
    let pb = vec![0u8; 4 * n * k / 8];
    let sb = vec![0u8; 2 * n * 2];
    let run = |packed: &[u8], scale: &[u8], zp: Option<&[u8]>, bits| {
        let t = CtTensors {
            packed,
            scale,
            zero_point: zp,
            g_idx: None,
        };
        pack_quantized_to_qz(bits, t, (k, n), 32)
    };
    assert!(run(&pb, &sb, None, 4).is_ok());
    let short = &pb[..pb.len() - 4];
    assert!(matches!(
        run(short, &sb, None, 4),
        Err(HfQuantError::Shape {
            tensor: "weight_packed",
            ..
        })
    ));
    assert!(matches!(
        run(&pb, &sb[2..], None, 4),
        Err(HfQuantError::Shape {
            tensor: "weight_scale",
            ..
        })
    ));
    assert!(matches!(
        run(&pb, &sb, Some(&[0u8; 4]), 4),
        Err(HfQuantError::Shape {
            tensor: "weight_zero_point",
            ..
        })
    ));
    assert!(matches!(
        run(&pb, &sb, None, 3),
        Err(HfQuantError::Geometry { .. })
    ));
}

#[test]
fn scales_convert_to_f16_only_when_exact() {
    let bf: Vec<u8> = [0.0078125f32, -3.5, 1.0e-3]
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let h = scales_to_f16(DType::BF16, &bf).unwrap();
    assert_eq!(h.len(), 6);
    let exact: Vec<u8> = [0.25f32, 0.001_953_125]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert!(scales_to_f16(DType::F32, &exact).is_ok());
    let inexact: Vec<u8> = [0.25f32, 0.1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert!(matches!(
        scales_to_f16(DType::F32, &inexact),
        Err(HfQuantError::Scale { index: 1, .. })
    ));
    // bf16's range is f32's: a tiny scale underflows f16.
    let tiny: Vec<u8> = half::bf16::from_f32(1.0e-30).to_le_bytes().to_vec();
    assert!(scales_to_f16(DType::BF16, &tiny).is_err());
}
