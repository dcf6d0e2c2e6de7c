//! FP8 (E4M3) linear weights re-laid into [`DType::F8_S`](crate::DType::F8_S) rows: each block
//! of 32 input columns keeps its 32 E4M3 bytes as stored and takes the f32 scale that covers
//! it.
//!
//! Two layouts store these: compressed-tensors `float-quantized` (llm-compressor: `weight` F8_E4M3
//! `[n, k]` and `weight_scale`, per tensor `[1]`, per channel `[n, 1]` or per 128 x 128 block
//! `[ceil(n / 128), ceil(k / 128)]`) and `quant_method: fp8` (transformers' fine-grained FP8,
//! DeepSeek-V3 and Qwen3's exports: `weight_scale_inv`, despite its name also multiplied,
//! `[ceil(n / bn), ceil(k / bk)]` for `weight_block_size: [bn, bk]`). Both dequantize to
//! `W[j][i] = e4m3(q[j][i]) * s(j, i)`.
//!
//! E4M3 is the OCP "E4M3FN" format (torch's `float8_e4m3fn`): a sign, 4 exponent bits (bias 7),
//! 3 mantissa bits; exponent 0 is subnormal (`m * 2^-9`); `S.1111.111` (0x7f, 0xff) is NaN and
//! there is no infinity, so the largest finite value is 448. [`e4m3_to_f32`] decodes every
//! code exactly (each is an f32 value).
//!
//! Invariants: the weight bytes are copied, never re-quantized, and hold no NaN code (refused
//! as [`HfQuantError::NanCode`]: no quantizer writes one); the scales are converted to f32
//! exactly (F32, BF16, F16 scales; [`scales_to_f32`]); a 32-column block must lie in one scale
//! block, so the block width must be a multiple of 32 and `k` a multiple of 32; every check
//! runs before the output is allocated. The block is 36 bytes for 32 weights: 9 bits a weight,
//! 1.125x the file's FP8 weight. The decode's one f32 multiply is exact when the scale has at
//! most 20 significant bits (bf16 and f16 scales); an f32 scale may round it once, to nearest,
//! as every FP8 runtime's dequantization does.

use half::{bf16, f16};

use super::hf::HfQuantError;
use crate::quant::layout::f8_s;
use crate::DType;

/// The value of an OCP E4M3 (E4M3FN) byte, exactly.
#[inline(always)]
pub fn e4m3_to_f32(q: u8) -> f32 {
    let sign = u32::from(q & 0x80) << 24;
    let e = u32::from((q >> 3) & 0xF);
    let m = u32::from(q & 7);
    if e == 15 && m == 7 {
        return f32::from_bits(sign | 0x7fc0_0000);
    }
    if e == 0 {
        // Subnormal: m * 2^-9, exact in f32.
        let v = m as f32 * (1.0 / 512.0);
        return if sign != 0 { -v } else { v };
    }
    // (1 + m / 8) * 2^(e - 7): the f32 exponent field is e - 7 + 127.
    f32::from_bits(sign | ((e + 120) << 23) | (m << 20))
}

/// How the scales cover the weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Scales {
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per output row.
    Channel,
    /// One scale per `rows x cols` block (`[ceil(n / rows), ceil(k / cols)]`).
    Block { rows: usize, cols: usize },
}

impl Fp8Scales {
    /// How many scales an `n x k` weight needs.
    pub fn count(self, k: usize, n: usize) -> usize {
        match self {
            Fp8Scales::Tensor => 1,
            Fp8Scales::Channel => n,
            Fp8Scales::Block { rows, cols } => n.div_ceil(rows) * k.div_ceil(cols),
        }
    }
}

/// F32, BF16 or F16 scales as f32 (exact for all three).
pub fn scales_to_f32(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, HfQuantError> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => {
            return Err(HfQuantError::Scale {
                index: 0,
                value: format!("dtype {dtype}"),
            })
        }
    })
}

/// Re-lays one FP8 linear weight (`k` = in_features, `n` = out_features; `weight` its `n * k`
/// E4M3 bytes, row-major) into `n` rows of F8_S blocks.
pub fn fp8_to_f8s(
    weight: &[u8],
    scales: &[f32],
    layout: Fp8Scales,
    (k, n): (usize, usize),
) -> Result<Vec<u8>, HfQuantError> {
    let geometry = |why| HfQuantError::Geometry {
        group_size: match layout {
            Fp8Scales::Block { cols, .. } => cols as i64,
            _ => -1,
        },
        k,
        n,
        why,
    };
    if k == 0 || n == 0 || !k.is_multiple_of(32) {
        return Err(geometry("in_features must be a positive multiple of 32"));
    }
    if let Fp8Scales::Block { rows, cols } = layout {
        if rows == 0 || cols == 0 || !cols.is_multiple_of(32) {
            return Err(geometry("the scale block's width must be a multiple of 32"));
        }
    }
    let shape = |tensor, expected: usize, got: usize| {
        if expected == got {
            Ok(())
        } else {
            Err(HfQuantError::Shape {
                tensor,
                k,
                n,
                expected,
                got,
            })
        }
    };
    shape("weight", n * k, weight.len())?;
    shape("weight_scale", layout.count(k, n), scales.len())?;
    if let Some(i) = weight.iter().position(|&q| q & 0x7f == 0x7f) {
        return Err(HfQuantError::NanCode {
            row: i / k,
            column: i % k,
            code: weight[i],
        });
    }
    let nb = k / 32;
    let row = nb * f8_s::BYTES;
    let mut out = vec![0u8; n * row];
    for j in 0..n {
        for b in 0..nb {
            let s = match layout {
                Fp8Scales::Tensor => scales[0],
                Fp8Scales::Channel => scales[j],
                Fp8Scales::Block { rows, cols } => {
                    scales[(j / rows) * k.div_ceil(cols) + (32 * b) / cols]
                }
            };
            let blk = &mut out[j * row + b * f8_s::BYTES..j * row + (b + 1) * f8_s::BYTES];
            blk[f8_s::D.range()].copy_from_slice(&s.to_le_bytes());
            let src = j * k + 32 * b;
            blk[f8_s::QS.range()].copy_from_slice(&weight[src..src + 32]);
        }
    }
    Ok(out)
}
