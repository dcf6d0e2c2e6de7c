//! Asymmetric Q4_Z (GPTQ/AWQ int4) weights re-laid 8 rows at a time with one scale and one zero
//! point per row per quantization group, not per 32-value block.
//!
//! Why: a GPTQ/AWQ checkpoint stores one f16 scale and one 4-bit zero per row per group of
//! `group_size` inputs (64 or 128, usually); the stored Q4_Z copy repeats them in every
//! 32-value block (4.75 bits a weight). Stored once per group, the layout is 4.19 bits a weight
//! at group 128 (4.375 at 64), and the kernel (`arch/x86/qdot_zg.rs`) converts, multiplies and
//! folds the scale and the zero term once per group instead of once per block.
//!
//! Which tensors: the group size is read off the data, not passed in: a tensor takes this
//! layout with `qgroup = 4` when every row's scale and zero point (the first 3 bytes of each
//! stored block) repeat over each aligned run of 4 blocks, else `qgroup = 2` for runs of 2,
//! else it keeps the per-block Q4_Z layout (`matmul/repack.rs`). So group 128 (and `-1`, one
//! group a row, when `k` is a multiple of 128) lays out in runs of 4, group 64 in runs of 2, and
//! group 32 keeps the per-block layout, which at that size stores the same bytes. An act-order
//! checkpoint re-laid with its columns sorted by group (`poot_core::quant::hf`, `input_perm`)
//! has whole groups of `group_size` columns and takes this layout too; one whose groups do not
//! line up with the runs keeps the per-block one. A symmetric tensor (every zero 8) is re-laid
//! as Q4_0 before this is tried. Whatever the detection finds, the result is the stored tensor
//! exactly: a run that shares its header bytes has one scale and one zero.
//!
//! Layout: rows in groups of 8 (the last padded with zero rows); group `g` is `nb / qgroup`
//! superblocks in order, superblock `q` holding blocks `q * qgroup..(q + 1) * qgroup` of rows
//! `8g..8g + 8`:
//! - `d[8]`: the 8 rows' f16 scales (16 bytes), `z[8]`: their zero points (8 bytes);
//! - per block `b < qgroup`, 4 chunks of 32 bytes at `24 + 128 b + 32 c`: lane `r` (bytes
//!   `4r..4r + 4`) is bytes `4c..4c + 4` of row `r`'s stored quants of that block (the low
//!   nibbles elements `4c..4c + 4`, the high ones `16 + 4c..16 + 4c + 4`), as in
//!   `matmul/repack.rs`.
//!
//! Invariant: `data.len() == groups * (nb / qgroup) * (24 + 128 qgroup)`; `qgroup` is 2 or 4 and
//! divides `nb`; rows read back ([`Repacked::grouped_stored_row`]) are the stored Q4_Z blocks.

use crate::kernels::blocks::{over_groups, zg_superblock_bytes, RG, ZG_HEADER};
use crate::kernels::format::Format;
use crate::kernels::matmul::repack::Repacked;

/// Stored Q4_Z block bytes: f16 scale, zero byte, 16 quant bytes.
const BB: usize = 19;

/// The run length (2 or 4 blocks) over which every row's scale and zero point of the stored
/// Q4_Z rows `w` (`nb` blocks a row) repeat, or `None` (see the module docs).
pub(crate) fn repeated_headers(w: &[u8], nb: usize) -> Option<usize> {
    [4, 2].into_iter().find(|&per| {
        nb.is_multiple_of(per)
            && w.chunks_exact(per * BB)
                .all(|run| run.chunks_exact(BB).all(|b| b[..3] == run[..3]))
    })
}

impl Repacked {
    /// `n` stored Q4_Z rows of `nb` blocks re-laid with one header per quantization group, or
    /// `None` where [`repeated_headers`] finds no run (see the module docs).
    ///
    /// # Panics
    /// If `w.len() != n * nb * 19` (callers check it).
    pub(crate) fn grouped_q4z_on(
        w: &[u8],
        n: usize,
        nb: usize,
        pool: Option<&crate::ThreadPool>,
    ) -> Option<Repacked> {
        assert_eq!(w.len(), n * nb * BB, "repack length");
        let per = repeated_headers(w, nb)?;
        let sb = zg_superblock_bytes(per);
        let nq = nb / per;
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * nq * sb);
        let fill = |g: usize, out: &mut [u8]| {
            for (q, s) in out.chunks_exact_mut(sb).enumerate() {
                for r in 0..RG.min(n - g * RG) {
                    let row = &w[(g * RG + r) * nb * BB..][..nb * BB];
                    let first = &row[q * per * BB..][..BB];
                    s[2 * r..2 * r + 2].copy_from_slice(&first[..2]);
                    s[16 + r] = first[2];
                    for b in 0..per {
                        let src = &row[(q * per + b) * BB..][..BB];
                        for c in 0..4 {
                            let at = ZG_HEADER + 128 * b + 32 * c + 4 * r;
                            s[at..at + 4].copy_from_slice(&src[3 + 4 * c..3 + 4 * c + 4]);
                        }
                    }
                }
            }
        };
        over_groups(&mut data, nq * sb, pool, fill);
        Some(Repacked {
            kind: Format::Q4_Z,
            n,
            nb,
            qgroup: per,
            data,
        })
    }

    /// Row `r`'s stored Q4_Z blocks, rebuilt from the grouped layout (each block takes its
    /// group's scale and zero point).
    pub(crate) fn grouped_stored_row(&self, r: usize, out: &mut [u8]) {
        let (per, sb) = (self.qgroup, self.superblock_bytes());
        let (g, lane) = (r / RG, r % RG);
        let grp = self.group(g);
        for (b, dst) in out[..self.nb * BB].chunks_exact_mut(BB).enumerate() {
            let s = &grp[(b / per) * sb..][..sb];
            dst[..2].copy_from_slice(&s[2 * lane..2 * lane + 2]);
            dst[2] = s[16 + lane];
            for c in 0..4 {
                let at = ZG_HEADER + 128 * (b % per) + 32 * c + 4 * lane;
                dst[3 + 4 * c..3 + 4 * c + 4].copy_from_slice(&s[at..at + 4]);
            }
        }
    }
}

#[cfg(test)]
#[path = "zg_tests.rs"]
mod tests;
