//! Hugging Face int4 layouts (GPTQ, AWQ) re-laid into [`DType::Q4_Z`] rows, and 8-bit GPTQ
//! into [`DType::Q8_Z`] rows ([`gptq8_to_q8z`]: the same layout with 4 quants a word).
//!
//! GPTQ (AutoGPTQ, GPTQModel, Optimum) packs eight 4-bit quants per little-endian `i32` along
//! the input dim: `qweight` is `[k / 8, n]`, element `(i, j)` is nibble `i % 8` of word
//! `[i / 8, j]`. `qzeros` is `[groups, n / 8]`, packed along the output dim in plain nibble
//! order; `scales` is `[groups, n]` F16; `g_idx` (`[k]` I32, optional) names the group of each
//! input column. The v1 format stores `zero - 1` (dequantization adds 1 back, so a stored 15
//! reads as 16); GPTQModel's `gptq_v2` stores the zero itself.
//!
//! AWQ (AutoAWQ's GEMM layout) packs along the output dim: `qweight` is `[k, n / 8]` and
//! `qzeros` `[groups, n / 8]`, with output `8c + e` in nibble `[0, 4, 1, 5, 2, 6, 3, 7][e]` of
//! word `c` (AutoAWQ writes its order `[0, 2, 4, 6, 1, 3, 5, 7]`); `scales` is `[groups, n]`.
//!
//! Both dequantize to `W[j][i] = (q(i, j) - z(g(i), j)) * s(g(i), j)`, which is exactly what one
//! Q4_Z block computes, so the re-lay loses nothing: row `j` of the output is `k / 32` Q4_Z
//! blocks, each taking the scale and zero of its columns' group.
//!
//! Invariants: the output is `n * k / 32 * 19` bytes (4.75 bits a weight: 1.14x the file's
//! int4 tensors at group 128, 1.06x at group 32); every check runs before the output is
//! allocated; a 32-column block must lie in one group, so `group_size` must be a multiple of 32
//! (or whole rows).
//!
//! Act-order (`desc_act = true`): `g_idx` may send the input columns to groups in any order.
//! When some 32-column block mixes groups, the columns are re-laid sorted by group (a stable
//! sort, [`input_order`]), so every block again lies in one group, and the caller must feed the
//! matmul the activations permuted the same way (`x'[i'] = x[order[i']]`; the weight store
//! serves `order` as `<prefix>.input_perm` and the tracer's `matmul` gathers the columns with
//! it). The permutation cannot be folded into the weights alone: a Q4_Z block holds one scale
//! and zero, and GPTQ's act-order scatters each group over the whole row, so the only exact
//! re-lay with one group a block is a reordered one, and a reordered weight needs reordered
//! inputs; folding it into the previous layer's outputs would permute the residual stream,
//! which every layer shares. A `g_idx` already constant on each block (`desc_act = false`
//! exports) keeps the stored order and needs no gather. Each group must then hold a multiple of
//! 32 columns ([`HfQuantError::ActOrder`] otherwise).

use thiserror::Error;

use crate::quant::layout::q4_z;

/// Which packing the tensors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntPacking {
    /// GPTQ with the v1 `zero - 1` convention.
    GptqV1,
    /// GPTQModel's `gptq_v2`: zeros stored as they are.
    GptqV2,
    /// AutoAWQ's GEMM layout.
    Awq,
}

/// A malformed or unsupported GPTQ/AWQ tensor set.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum HfQuantError {
    /// A tensor's byte length does not match the shape the others imply.
    #[error("{tensor}: expected {expected} bytes for a {k} x {n} weight, got {got}")]
    Shape {
        tensor: &'static str,
        k: usize,
        n: usize,
        expected: usize,
        got: usize,
    },
    /// The dims or group size cannot be laid into 32-element blocks.
    #[error("group_size {group_size} with in_features {k}, out_features {n}: {why}")]
    Geometry {
        group_size: i64,
        k: usize,
        n: usize,
        why: &'static str,
    },
    /// `g_idx` names a group the scales do not have.
    #[error("g_idx[{column}] = {group} is out of range (the scales hold {groups} groups)")]
    GroupIndex {
        column: usize,
        group: i64,
        groups: usize,
    },
    /// Even sorted by group, columns `start..start + 32` span two groups: some group's size
    /// is not a multiple of 32.
    #[error(
        "g_idx: sorted by group, columns {start}..{} still span two groups (every group must \
         hold a multiple of 32 input columns)",
        start + 32
    )]
    ActOrder { start: usize },
    /// A scale is not exactly an f16 (the blocks hold f16 scales; rounding would change the
    /// weights).
    #[error("scale #{index} ({value}) is not exactly representable as f16")]
    Scale { index: usize, value: String },
    /// An FP8 weight holds one of E4M3's NaN codes (0x7f, 0xff): no quantizer writes one, and
    /// a NaN weight would make every output it reaches NaN.
    #[error(
        "row {row}, column {column} holds the E4M3 NaN code {code:#04x} (a weight must be finite)"
    )]
    NanCode { row: usize, column: usize, code: u8 },
}

fn words(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
    b.chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

fn word_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn check_len(
    tensor: &'static str,
    (k, n): (usize, usize),
    expected: usize,
    got: usize,
) -> Result<(), HfQuantError> {
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
}

/// The number of groups for `group_size` (`-1`: one group per row), after checking that a
/// 32-column block never straddles two groups.
pub fn groups_for(group_size: i64, k: usize, n: usize) -> Result<usize, HfQuantError> {
    let bad = |why| HfQuantError::Geometry {
        group_size,
        k,
        n,
        why,
    };
    if k == 0 || n == 0 || !k.is_multiple_of(32) {
        return Err(bad("in_features must be a positive multiple of 32"));
    }
    if !n.is_multiple_of(8) {
        return Err(bad("out_features must be a multiple of 8"));
    }
    if group_size == -1 {
        return Ok(1);
    }
    let g = usize::try_from(group_size).map_err(|_| bad("group_size must be -1 or positive"))?;
    if g == 0 || !g.is_multiple_of(32) || !k.is_multiple_of(g) {
        return Err(bad(
            "group_size must be -1 or a multiple of 32 dividing in_features",
        ));
    }
    Ok(k / g)
}

/// The checked group of each input column, from `g_idx` (little-endian I32, `[k]`).
fn column_groups(
    g_idx: &[u8],
    k: usize,
    n: usize,
    groups: usize,
) -> Result<Vec<usize>, HfQuantError> {
    check_len("g_idx", (k, n), 4 * k, g_idx.len())?;
    words(g_idx)
        .enumerate()
        .map(|(column, w)| {
            let group = i64::from(w as i32);
            if group < 0 || group as usize >= groups {
                Err(HfQuantError::GroupIndex {
                    column,
                    group,
                    groups,
                })
            } else {
                Ok(group as usize)
            }
        })
        .collect()
}

/// Sorted by group, each 32-column block must lie in one group: the group of each block.
fn sorted_block_groups(gs: &[usize], order: &[u32]) -> Result<Vec<usize>, HfQuantError> {
    order
        .chunks_exact(32)
        .enumerate()
        .map(|(b, c)| {
            let g = gs[c[0] as usize];
            if c.iter().all(|&i| gs[i as usize] == g) {
                Ok(g)
            } else {
                Err(HfQuantError::ActOrder { start: b * 32 })
            }
        })
        .collect()
}

/// The order the re-lay gives the input columns: `None` when the stored order already keeps
/// each 32-column block in one group (no `g_idx`, or `desc_act = false`), else
/// `order[new] = original column`, the columns sorted by group (stable). Checks `g_idx`.
pub fn input_order(
    g_idx: Option<&[u8]>,
    k: usize,
    n: usize,
    groups: usize,
) -> Result<Option<Vec<u32>>, HfQuantError> {
    let Some(g_idx) = g_idx else {
        return Ok(None);
    };
    let gs = column_groups(g_idx, k, n, groups)?;
    if gs.chunks_exact(32).all(|c| c.iter().all(|&g| g == c[0])) {
        return Ok(None);
    }
    let mut order: Vec<u32> = (0..k as u32).collect();
    order.sort_by_key(|&i| gs[i as usize]);
    sorted_block_groups(&gs, &order)?;
    Ok(Some(order))
}

/// The group of each 32-column block in the re-laid order, and where each original column
/// goes (`None`: nowhere else).
pub(crate) fn block_groups(
    g_idx: Option<&[u8]>,
    k: usize,
    n: usize,
    groups: usize,
) -> Result<(Vec<usize>, Option<Vec<usize>>), HfQuantError> {
    let per = k / groups;
    let Some(raw) = g_idx else {
        return Ok(((0..k / 32).map(|b| b * 32 / per).collect(), None));
    };
    let gs = column_groups(raw, k, n, groups)?;
    match input_order(g_idx, k, n, groups)? {
        None => Ok((gs.iter().step_by(32).copied().collect(), None)),
        Some(order) => {
            let bg = sorted_block_groups(&gs, &order)?;
            let mut pos = vec![0usize; k];
            for (new, &old) in order.iter().enumerate() {
                pos[old as usize] = new;
            }
            Ok((bg, Some(pos)))
        }
    }
}

/// One layer's stored tensors, as little-endian bytes (I32 quants and zeros, F16 scales, I32
/// `g_idx`); `g_idx` is GPTQ's and must be `None` for AWQ.
#[derive(Clone, Copy, Debug)]
pub struct PackedTensors<'a> {
    pub qweight: &'a [u8],
    pub qzeros: &'a [u8],
    pub scales: &'a [u8],
    pub g_idx: Option<&'a [u8]>,
}

/// Bytes of the Q4_Z form of an `n x k` weight.
pub fn q4z_bytes(n: usize, k: usize) -> usize {
    n * (k / 32) * q4_z::BYTES
}

/// Re-lays one int4 linear weight (`k` = in_features, `n` = out_features) into `n` rows of
/// Q4_Z blocks.
pub fn int4_to_q4z(
    packing: IntPacking,
    t: PackedTensors<'_>,
    (k, n): (usize, usize),
    group_size: i64,
) -> Result<Vec<u8>, HfQuantError> {
    let PackedTensors {
        qweight,
        qzeros,
        scales,
        g_idx,
    } = t;
    let groups = groups_for(group_size, k, n)?;
    // Every stored tensor is 4 bits per quant and 2 bytes per scale, whichever dim is packed.
    check_len("qweight", (k, n), k * n / 2, qweight.len())?;
    check_len("qzeros", (k, n), groups * n / 2, qzeros.len())?;
    check_len("scales", (k, n), groups * n * 2, scales.len())?;
    let (bgroup, pos) = block_groups(g_idx, k, n, groups)?;
    let nb = k / 32;
    let row = nb * q4_z::BYTES;
    let mut out = vec![0u8; n * row];
    // AWQ's nibble for output `8c + e`.
    const AWQ_POS: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let zero = |g: usize, j: usize| -> u8 {
        let (w, pos) = match packing {
            IntPacking::Awq => (word_at(qzeros, g * n / 8 + j / 8), AWQ_POS[j % 8]),
            _ => (word_at(qzeros, g * n / 8 + j / 8), (j % 8) as u32),
        };
        let z = ((w >> (4 * pos)) & 0xF) as u8;
        if packing == IntPacking::GptqV1 {
            z + 1
        } else {
            z
        }
    };
    for j in 0..n {
        let r = &mut out[j * row..(j + 1) * row];
        for (b, &g) in bgroup.iter().enumerate() {
            let blk = &mut r[b * q4_z::BYTES..(b + 1) * q4_z::BYTES];
            let s = 2 * (g * n + j);
            blk[q4_z::D.range()].copy_from_slice(&scales[s..s + 2]);
            blk[q4_z::Z.offset] = zero(g, j);
        }
    }
    let mut put = |i: usize, j: usize, q: u8| {
        let i = pos.as_ref().map_or(i, |p| p[i]);
        let (b, e) = (i / 32, i % 32);
        let at = j * row + b * q4_z::BYTES + q4_z::QS.offset + e % 16;
        out[at] |= if e < 16 { q } else { q << 4 };
    };
    match packing {
        IntPacking::GptqV1 | IntPacking::GptqV2 => {
            for (wi, w) in words(qweight).enumerate() {
                let (i0, j) = (wi / n * 8, wi % n);
                for e in 0..8 {
                    put(i0 + e, j, ((w >> (4 * e)) & 0xF) as u8);
                }
            }
        }
        IntPacking::Awq => {
            for (wi, w) in words(qweight).enumerate() {
                let (i, c) = (wi / (n / 8), wi % (n / 8));
                for (e, &pos) in AWQ_POS.iter().enumerate() {
                    put(i, 8 * c + e, ((w >> (4 * pos)) & 0xF) as u8);
                }
            }
        }
    }
    Ok(out)
}

/// Re-lays one 8-bit GPTQ linear weight into `n` rows of Q8_Z blocks: `qweight` is
/// `[k / 4, n]` (byte `i % 4` of word `[i / 4, j]`), `qzeros` `[groups, n / 4]`, the rest as for
/// int4. AWQ has no 8-bit layout.
pub fn gptq8_to_q8z(
    v1: bool,
    t: PackedTensors<'_>,
    (k, n): (usize, usize),
    group_size: i64,
) -> Result<Vec<u8>, HfQuantError> {
    use crate::quant::layout::q8_z;
    let groups = groups_for(group_size, k, n)?;
    check_len("qweight", (k, n), k * n, t.qweight.len())?;
    check_len("qzeros", (k, n), groups * n, t.qzeros.len())?;
    check_len("scales", (k, n), groups * n * 2, t.scales.len())?;
    let (bgroup, pos) = block_groups(t.g_idx, k, n, groups)?;
    let row = (k / 32) * q8_z::BYTES;
    let mut out = vec![0u8; n * row];
    for j in 0..n {
        let r = &mut out[j * row..(j + 1) * row];
        for (b, &g) in bgroup.iter().enumerate() {
            let blk = &mut r[b * q8_z::BYTES..(b + 1) * q8_z::BYTES];
            let s = 2 * (g * n + j);
            blk[q8_z::D.range()].copy_from_slice(&t.scales[s..s + 2]);
            // The zeros are packed 4 a word along the output dim, in byte order.
            let z = u16::from(t.qzeros[g * n + j]) + u16::from(v1);
            blk[q8_z::Z.range()].copy_from_slice(&z.to_le_bytes());
        }
    }
    for (wi, w) in words(t.qweight).enumerate() {
        let (i0, j) = (wi / n * 4, wi % n);
        for e in 0..4 {
            let i = pos.as_ref().map_or(i0 + e, |p| p[i0 + e]);
            let at = j * row + (i / 32) * q8_z::BYTES + q8_z::QS.offset + i % 32;
            out[at] = (w >> (8 * e)) as u8;
        }
    }
    Ok(out)
}
