//! The block formats every kernel family shares, at the bottom of the kernel tree: which
//! packed weight dtypes have integer dots ([`QKind`] and [`ZKind`] against Q8 activations,
//! [`KKind`] against Q8_K), the bytes of their blocks and of the 8-row interleaved superblocks
//! (`matmul/repack.rs`, `matmul/repack_k.rs`), and the K-quant float steps every path (scalar and
//! SIMD) runs. Nothing here depends on another kernel module except `decode` and `qact` (so the
//! per-ISA loops and the generic ones can both import it without a cycle).

use poot_core::DType;

use crate::error::mul;
use crate::kernels::decode::f16_to_f32;
use crate::kernels::qact::BlockQ8K;
use crate::KernelError;

/// A weight dtype with an integer dot against Q8 activations.
#[allow(non_camel_case_types, reason = "ggml's names")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum QKind {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    /// GPTQ/AWQ int4 (`poot_core::DType::Q4_Z`: scale, zero point, 16 nibble bytes) in its
    /// 8-row layout only: as stored it has its own dot ([`ZKind`]), so [`QKind::new`] leaves it
    /// out and [`QKind::repacked`] names it.
    Q4_Z,
}

impl QKind {
    pub(crate) fn new(dtype: DType) -> Option<QKind> {
        Some(match dtype {
            DType::Q4_0 => QKind::Q4_0,
            DType::Q4_1 => QKind::Q4_1,
            DType::Q5_0 => QKind::Q5_0,
            DType::Q8_0 => QKind::Q8_0,
            _ => return None,
        })
    }

    /// The kinds with an 8-row layout (`matmul/repack.rs`): [`QKind::new`]'s and `Q4_Z`.
    pub(crate) fn repacked(dtype: DType) -> Option<QKind> {
        match dtype {
            DType::Q4_Z => Some(QKind::Q4_Z),
            _ => QKind::new(dtype),
        }
    }

    /// Bytes of one 32-value weight block.
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            QKind::Q4_0 => 18,
            QKind::Q4_1 => 20,
            QKind::Q5_0 => 22,
            QKind::Q8_0 => 34,
            QKind::Q4_Z => 19,
        }
    }

    /// Whether the activations are Q8_1 (carry `s`): ggml pairs Q4_1 with Q8_1.
    pub(crate) fn act_sum(self) -> bool {
        self == QKind::Q4_1
    }
}

/// A weight dtype with an integer zero point (`y = (q - z) * d`: GPTQ/AWQ, poot's `Q4_Z` and
/// `Q8_Z`) and an integer dot against Q8_0 activations: `(q - z)` is an exact
/// small integer, so each block's dot is `d_w * d_x * sum((q - z) * q_x)`, no offset term.
#[allow(non_camel_case_types, reason = "poot_core::DType's names")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ZKind {
    Q4_Z,
    Q8_Z,
}

impl ZKind {
    pub(crate) fn new(dtype: DType) -> Option<ZKind> {
        match dtype {
            DType::Q4_Z => Some(ZKind::Q4_Z),
            DType::Q8_Z => Some(ZKind::Q8_Z),
            _ => None,
        }
    }

    /// Bytes of one 32-value weight block (`poot_core::quant::layout`'s `q4_z`, `q8_z`).
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            ZKind::Q4_Z => 19,
            ZKind::Q8_Z => 36,
        }
    }
}

/// A k-quant weight dtype with an integer dot here.
#[allow(non_camel_case_types, reason = "ggml's names")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KKind {
    Q4_K,
    Q6_K,
}

impl KKind {
    pub(crate) fn new(dtype: poot_core::DType) -> Option<KKind> {
        match dtype {
            poot_core::DType::Q4_K => Some(KKind::Q4_K),
            poot_core::DType::Q6_K => Some(KKind::Q6_K),
            _ => None,
        }
    }

    pub(crate) fn block_bytes(self) -> usize {
        match self {
            KKind::Q4_K => 144,
            KKind::Q6_K => 210,
        }
    }
}

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
/// per super-block, accumulated in order.
#[inline(always)]
pub(crate) fn finish(kind: KKind, b: &[u8], y: &BlockQ8K, ints: (i32, i32), acc: &mut [f32; 2]) {
    let (d, dmin) = match kind {
        KKind::Q4_K => (
            f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            f16_to_f32(u16::from_le_bytes([b[2], b[3]])),
        ),
        KKind::Q6_K => (f16_to_f32(u16::from_le_bytes([b[208], b[209]])), 0.0),
    };
    acc[0] = (d * y.d).mul_add(ints.0 as f32, acc[0]);
    acc[1] = (dmin * y.d).mul_add(ints.1 as f32, acc[1]);
}

/// Rows per interleaved group.
pub(crate) const RG: usize = 8;

/// Bytes of the header (scales, and Q4_1's offsets or Q5_0's high bits) of one superblock.
pub(crate) const fn header_bytes(kind: QKind) -> usize {
    match kind {
        QKind::Q4_1 => 32,
        QKind::Q5_0 => 48,
        // The 8 rows' scales, then their zero points (one byte each).
        QKind::Q4_Z => 24,
        _ => 16,
    }
}

/// Quant chunks (32 bytes each) per superblock.
pub(crate) const fn chunks(kind: QKind) -> usize {
    match kind {
        QKind::Q8_0 => 8,
        _ => 4,
    }
}

/// Bytes of one superblock (8 stored blocks).
pub(crate) const fn superblock_bytes(kind: QKind) -> usize {
    header_bytes(kind) + 32 * chunks(kind)
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
