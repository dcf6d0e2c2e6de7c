//! The block arithmetic every kernel family shares, at the bottom of the kernel tree: the bytes
//! of the 8-row interleaved superblocks of the integer-dot formats (the repacked layouts), the
//! K-quant float steps every path (scalar and SIMD) runs, and a stored row's byte count. Which
//! formats there are, and their block shapes, is `format.rs`'s [`Format`]. Nothing here depends
//! on another kernel module except `format`, `decode` and `qact` (so the per-ISA loops and the
//! generic ones can both import it without a cycle).

use poot_core::DType;

use crate::error::mul;
use crate::kernels::decode::f16_to_f32;
use crate::kernels::format::Format;
use crate::kernels::qact::BlockQ8K;
use crate::KernelError;

/// Q4_K's 6-bit scale and min of sub-block `j` from the 12 packed bytes `q`.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    let (s, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (i32::from(s), i32::from(m))
}

/// The float steps shared by every path: `(d_w * d_x, sumi)` and Q4_K's `(dmin_w * d_x, summ)`
/// per super-block, accumulated in order. `kind` is Q4_K or Q6_K (any other reads as Q6_K).
#[inline(always)]
pub(crate) fn finish(kind: Format, b: &[u8], y: &BlockQ8K, ints: (i32, i32), acc: &mut [f32; 2]) {
    let (d, dmin) = if kind == Format::Q4_K {
        (
            f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            f16_to_f32(u16::from_le_bytes([b[2], b[3]])),
        )
    } else {
        (f16_to_f32(u16::from_le_bytes([b[208], b[209]])), 0.0)
    };
    acc[0] = (d * y.d).mul_add(ints.0 as f32, acc[0]);
    acc[1] = (dmin * y.d).mul_add(ints.1 as f32, acc[1]);
}

/// Rows per interleaved group.
pub(crate) const RG: usize = 8;

/// Bytes of the header (scales, and Q4_1's offsets or Q5_0's high bits) of one superblock.
pub(crate) const fn header_bytes(kind: Format) -> usize {
    match kind {
        Format::Q4_1 => 32,
        Format::Q5_0 => 48,
        // The 8 rows' scales, then their zero points (one byte each).
        Format::Q4_Z => 24,
        _ => 16,
    }
}

/// Quant chunks (32 bytes each) per superblock.
pub(crate) const fn chunks(kind: Format) -> usize {
    match kind {
        Format::Q8_0 => 8,
        _ => 4,
    }
}

/// Bytes of one superblock (8 stored blocks).
pub(crate) const fn superblock_bytes(kind: Format) -> usize {
    header_bytes(kind) + 32 * chunks(kind)
}

/// Bytes of the header of one grouped Q4_Z superblock (`matmul/repack_zg.rs`): the 8 rows'
/// f16 scales, then their zero points (one byte each), once per quantization group.
pub(crate) const ZG_HEADER: usize = 24;

/// Bytes of one grouped Q4_Z superblock: 8 rows of a quantization group of `per` 32-value
/// blocks (the header, then `per` blocks of 4 quant chunks).
pub(crate) const fn zg_superblock_bytes(per: usize) -> usize {
    ZG_HEADER + 128 * per
}

/// `fill(g, group g's bytes)` for every group of `data` (`group` bytes each), on `pool`'s
/// threads where there is one (groups are disjoint, so the result is the same).
pub(crate) fn over_groups(
    data: &mut [u8],
    group: usize,
    pool: Option<&crate::ThreadPool>,
    fill: impl Fn(usize, &mut [u8]) + Sync,
) {
    if group == 0 {
        return;
    }
    match pool {
        Some(p) => p.for_each_chunk_mut(data, group, || (), |(), g, out| fill(g, out)),
        None => data
            .chunks_exact_mut(group)
            .enumerate()
            .for_each(|(g, out)| fill(g, out)),
    }
}

/// Bytes of one row of `k` elements of `dtype`, or a typed error when `k` is not whole blocks.
pub(crate) fn row_bytes(op: &'static str, dtype: DType, k: usize) -> Result<usize, KernelError> {
    let block = dtype.block_elems() as usize;
    if !k.is_multiple_of(block) {
        return Err(KernelError::NotWholeBlocks {
            op,
            dtype,
            len: k,
            block,
        });
    }
    mul(k / block, dtype.block_bytes() as usize, "row bytes")
}
