//! compressed-tensors (llm-compressor) `pack-quantized` int4/int8 layers re-laid into
//! [`DType::Q4_Z`](crate::DType::Q4_Z) / [`DType::Q8_Z`](crate::DType::Q8_Z) rows, like GPTQ.
//!
//! The layout is compressed-tensors' own (`compressors/quantized_compressors/pack_quantized.py`,
//! `pack_to_int32` / `unpack_from_int32`, read from neuralmagic/compressed-tensors):
//! - `weight_packed` is I32 `[n, ceil(k / f)]` with `f = 32 / bits` quants a word, packed along
//!   the *input* dim: input column `i` of output row `j` is bits `bits * (i % f)` of word
//!   `[j, i / f]`, stored unsigned (`q + 2^(bits - 1)`, the signed quant shifted);
//! - `weight_scale` is `[n, groups]` (group strategy; channel: `[n, 1]`), in the model's float
//!   type;
//! - `weight_zero_point` (asymmetric only) is I32 `[ceil(n / f), groups]`, packed along the
//!   *output* dim (`pack_to_int32(zero_point, bits, packed_dim=0)`): the zero of row `j`, group
//!   `g` is bits `bits * (j % f)` of word `[j / f, g]`, stored shifted the same way; symmetric
//!   layers have none and their zero is the shift, `2^(bits - 1)`;
//! - `weight_g_idx` (I32 `[k]`, `actorder: group`) names each column's group, as GPTQ's `g_idx`;
//!   `actorder: weight` stores none (its groups stay contiguous);
//! - `weight_shape` (I32 `[2]`) is `[n, k]`.
//!
//! compressed-tensors dequantizes `(q - zp) * scale` with both signed; with both shifted by the
//! same `2^(bits - 1)` that is `(u - uz) * scale`, exactly one Q4_Z/Q8_Z block. Invariants: the
//! scales must be exact f16 values (bf16 and f32 scales are converted and refused, naming the
//! first one, if rounding would change a weight: [`scales_to_f16`]); act-order `g_idx` is
//! handled as for GPTQ ([`super::hf::input_order`]); every check runs before the output is
//! allocated.

use half::{bf16, f16};

use super::hf::{block_groups, groups_for, HfQuantError};
use crate::quant::layout::{q4_z, q8_z};
use crate::DType;

/// One compressed-tensors layer's tensors, little-endian; `scale` already as f16 bytes
/// ([`scales_to_f16`]).
#[derive(Clone, Copy, Debug)]
pub struct CtTensors<'a> {
    pub packed: &'a [u8],
    pub scale: &'a [u8],
    pub zero_point: Option<&'a [u8]>,
    pub g_idx: Option<&'a [u8]>,
}

/// `F16`, `BF16` or `F32` scales as f16 bytes, refusing any value f16 cannot hold exactly.
pub fn scales_to_f16(dtype: DType, bytes: &[u8]) -> Result<Vec<u8>, HfQuantError> {
    let vals: Vec<f32> = match dtype {
        DType::F16 => return Ok(bytes.to_vec()),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        _ => {
            return Err(HfQuantError::Scale {
                index: 0,
                value: format!("dtype {dtype}"),
            })
        }
    };
    let mut out = Vec::with_capacity(2 * vals.len());
    for (index, v) in vals.into_iter().enumerate() {
        let h = f16::from_f32(v);
        // NaN never compares equal; a NaN scale is refused too.
        if h.to_f32() != v {
            return Err(HfQuantError::Scale {
                index,
                value: v.to_string(),
            });
        }
        out.extend_from_slice(&h.to_le_bytes());
    }
    Ok(out)
}

/// Older compressed-tensors releases stored an asymmetric layer's zero points unpacked, as I8
/// `[n, groups]` (signed); this packs them as `pack_to_int32(zp, bits, packed_dim=0)` does, so
/// [`pack_quantized_to_qz`] reads one form.
pub fn pack_i8_zero_points(
    zp: &[u8],
    (k, n): (usize, usize),
    groups: usize,
    bits: u8,
) -> Result<Vec<u8>, HfQuantError> {
    if zp.len() != n * groups {
        return Err(HfQuantError::Shape {
            tensor: "weight_zero_point",
            k,
            n,
            expected: n * groups,
            got: zp.len(),
        });
    }
    let f = 32 / usize::from(bits);
    let mask = (1u32 << bits) - 1;
    let mut words = vec![0u32; n.div_ceil(f) * groups];
    for j in 0..n {
        for g in 0..groups {
            let u = (i32::from(zp[j * groups + g] as i8) + (1 << (bits - 1))) as u32 & mask;
            words[(j / f) * groups + g] |= u << (u32::from(bits) * (j % f) as u32);
        }
    }
    Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
}

fn word_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Re-lays one `pack-quantized` layer (`k` = in_features, `n` = out_features, `bits` 4 or 8)
/// into `n` rows of Q4_Z (4 bits) or Q8_Z (8 bits) blocks.
pub fn pack_quantized_to_qz(
    bits: u8,
    t: CtTensors<'_>,
    (k, n): (usize, usize),
    group_size: i64,
) -> Result<Vec<u8>, HfQuantError> {
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
    if bits != 4 && bits != 8 {
        return Err(HfQuantError::Geometry {
            group_size,
            k,
            n,
            why: "num_bits must be 4 or 8",
        });
    }
    let groups = groups_for(group_size, k, n)?;
    let f = 32 / usize::from(bits);
    let wpr = k.div_ceil(f);
    shape("weight_packed", 4 * n * wpr, t.packed.len())?;
    shape("weight_scale", 2 * n * groups, t.scale.len())?;
    if let Some(zp) = t.zero_point {
        shape("weight_zero_point", 4 * n.div_ceil(f) * groups, zp.len())?;
    }
    let (bgroup, pos) = block_groups(t.g_idx, k, n, groups)?;
    let mask = (1u32 << bits) - 1;
    let shift = 1u16 << (bits - 1);
    let zero = |g: usize, j: usize| -> u16 {
        match t.zero_point {
            // `pack_to_int32(..., packed_dim=0)`: rows packed `f` a word, per group column.
            Some(zp) => {
                ((word_at(zp, (j / f) * groups + g) >> (u32::from(bits) * (j % f) as u32)) & mask)
                    as u16
            }
            None => shift,
        }
    };
    let (bytes, qs_at) = if bits == 4 {
        (q4_z::BYTES, q4_z::QS.offset)
    } else {
        (q8_z::BYTES, q8_z::QS.offset)
    };
    let row = (k / 32) * bytes;
    let mut out = vec![0u8; n * row];
    for j in 0..n {
        let r = &mut out[j * row..(j + 1) * row];
        for (b, &g) in bgroup.iter().enumerate() {
            let blk = &mut r[b * bytes..(b + 1) * bytes];
            let s = 2 * (j * groups + g);
            let z = zero(g, j);
            if bits == 4 {
                blk[q4_z::D.range()].copy_from_slice(&t.scale[s..s + 2]);
                // A 4-bit zero is at most 15.
                blk[q4_z::Z.offset] = z as u8;
            } else {
                blk[q8_z::D.range()].copy_from_slice(&t.scale[s..s + 2]);
                blk[q8_z::Z.range()].copy_from_slice(&z.to_le_bytes());
            }
        }
        for c in 0..wpr {
            let w = word_at(t.packed, j * wpr + c);
            for e in 0..f {
                let i0 = c * f + e;
                if i0 >= k {
                    break; // `pack_to_int32` pads the last word with zeros.
                }
                let i = pos.as_ref().map_or(i0, |p| p[i0]);
                let q = ((w >> (u32::from(bits) * e as u32)) & mask) as u8;
                let at = (i / 32) * bytes + qs_at;
                if bits == 4 {
                    let e32 = i % 32;
                    r[at + e32 % 16] |= if e32 < 16 { q } else { q << 4 };
                } else {
                    r[at + i % 32] = q;
                }
            }
        }
    }
    Ok(out)
}
