//! Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_Z weights re-laid 8 rows at a time, for the ggml-numerics integer
//! matmul.
//!
//! Why: in the stored layout each row's block is dotted alone, so every 32-value block pays its
//! own scale conversion, broadcast and lane bookkeeping (about 14 vector ops per row block).
//! Interleaving 8 rows puts one row in each 32-bit lane of a 256-bit register: one load holds 4
//! quant bytes of each of 8 rows, one `dpbusd` (or `maddubs` + `madd`) with a broadcast
//! activation word gives 8 rows' lane sums at once, and one `cvtph2ps` converts 8 row scales.
//! That is about 6 vector ops per row block, in the same float order (see below).
//!
//! Layout: rows are taken in groups of 8 (the last group padded with zero rows: scale 0, quants
//! 0, so padded outputs are 0 and never written). Group `g` is `nb` superblocks in block order;
//! superblock `b` holds, for rows `8g..8g+8`:
//! - `d[8]`: the 8 rows' f16 scales (16 bytes), then for Q4_1 `m[8]`: their f16 offsets, for
//!   Q4_Z (GPTQ/AWQ int4) `z[8]`: their zero points (8 bytes), or for
//!   Q5_0 32 bytes of fifth bits in the quants' lane order: byte `4r + i` holds row `r`'s
//!   fifth bits for byte `i` of every chunk, bit `c` for chunk `c`'s low nibble (element
//!   `4c + i`) and bit `4 + c` for its high one (element `16 + 4c + i`). A chunk's bits are
//!   then one 16-bit shift and a mask away from their places (`0x10` in each quant byte),
//!   where the older byte-per-chunk layout took a shuffle and two compares per chunk (Q5_0
//!   was the slowest one-token kernel on AVX2, compute-bound even from DRAM);
//! - the quants as 32-byte chunks. Chunk `c`, lane `r` (bytes `4r..4r+4`) = bytes `4c..4c+4` of
//!   row `r`'s block quants. Q4 blocks have 4 chunks (16 bytes of nibbles per row: the low
//!   nibbles of chunk `c` are elements `4c..4c+4`, the high ones `16+4c..16+4c+4`); Q8_0 blocks
//!   have 8 (element `4c..4c+4`).
//!
//! So a superblock is exactly 8 stored blocks (144, 160, 176, 272 or 152 bytes): the copy is the size of
//! the tensor, and nothing is decoded. ggml's lane `l` of a block dot (elements `4l..4l+4`) is
//! chunk `l` (Q8_0), or the low (`l < 4`) / high (`l >= 4`) nibbles of chunk `l % 4` (Q4), so
//! every integer lane sum of the stored-row dot is available per row and the float steps stay ggml's:
//! results are bit-identical to the portable `dot_scalar` on the stored rows (tested on every
//! ISA).
//!
//! An asymmetric Q4_Z tensor whose scales and zero points repeat over runs of 2 or 4 blocks
//! (GPTQ/AWQ group 64 or 128) takes the grouped layout of `matmul/repack_zg.rs` instead, its
//! superblocks one quantization group each (`qgroup` blocks a row).
//!
//! Invariant: `data.len() == groups * (nb / qgroup) * superblock_bytes`; a `Repacked` is
//! immutable once built and is only read by `matmul/r8.rs` (and the expert matmul).

use crate::kernels::blocks::{
    chunks, header_bytes, over_groups, superblock_bytes, zg_superblock_bytes, RG,
};
use crate::kernels::format::Format;
use crate::kernels::matmul::repack_k::RepackedK;

/// One weight matrix in the 8-row interleaved layout (see the module docs).
pub struct Repacked {
    pub(crate) kind: Format,
    /// Rows of the stored matrix (the last group may hold padding beyond them).
    pub(crate) n: usize,
    /// 32-value blocks per row.
    pub(crate) nb: usize,
    /// Blocks of a row in one superblock: 1, except in the grouped Q4_Z layout
    /// (`matmul/repack_zg.rs`), whose superblock holds a whole quantization group (2 or 4).
    pub(crate) qgroup: usize,
    pub(crate) data: crate::hugemem::HugeBytes,
}

impl std::fmt::Debug for Repacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repacked")
            .field("kind", &self.kind)
            .field("n", &self.n)
            .field("nb", &self.nb)
            .field("qgroup", &self.qgroup)
            .field("bytes", &self.data.len())
            .finish()
    }
}

/// Q5_0's fifth bits of quant byte `i` of every chunk in one byte (see the module docs): bit
/// `c` is `qh`'s bit `4c + i`, bit `4 + c` its bit `16 + 4c + i`.
fn high_bits(qh: u32, i: usize) -> u8 {
    (0..4).fold(0u8, |b, c| {
        let lo = (qh >> (4 * c + i)) & 1;
        let hi = (qh >> (16 + 4 * c + i)) & 1;
        b | (lo << c | hi << (4 + c)) as u8
    })
}

/// The inverse of [`high_bits`]: byte `i`'s bits back at their places in `qh`.
fn spread_bits(b: u8, i: usize) -> u32 {
    (0..4).fold(0u32, |qh, c| {
        let (lo, hi) = (u32::from(b >> c) & 1, u32::from(b >> (4 + c)) & 1);
        qh | lo << (4 * c + i) | hi << (16 + 4 * c + i)
    })
}

impl Repacked {
    /// Whether `kind` has this layout (the four signed Q8-dot formats; not the zero-point ones).
    pub(crate) fn supports(kind: Format) -> bool {
        matches!(
            kind,
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q8_0 | Format::Q4_Z
        )
    }

    /// Re-lays `n` stored rows of `nb` blocks (`w.len() == n * nb * block_bytes`).
    ///
    /// # Panics
    /// If `kind` is not [`Repacked::supports`]ed or the length disagrees (callers check both).
    #[cfg(test)]
    pub(crate) fn new(kind: Format, w: &[u8], n: usize, nb: usize) -> Repacked {
        Repacked::new_on(kind, w, n, nb, None)
    }

    /// [`Repacked::new`], the groups spread over `pool`'s threads where there is one (a
    /// model's first plan re-lays every weight; see `hugemem::HugeBytes::copy_of_on`).
    pub(crate) fn new_on(
        kind: Format,
        w: &[u8],
        n: usize,
        nb: usize,
        pool: Option<&crate::ThreadPool>,
    ) -> Repacked {
        let sb = superblock_bytes(kind);
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * nb * sb);
        Repacked::relay_into(kind, w, n, nb, &mut data, pool);
        Repacked {
            kind,
            n,
            nb,
            qgroup: 1,
            data,
        }
    }

    /// [`Repacked::new_on`]'s layout written into `out` (zeroed, `n / 8` rounded up groups of
    /// `nb` super-blocks): where the re-lay has a home already (an expert's span of its stack,
    /// `matmul/experts_stack.rs`), so no temporary is made and copied.
    ///
    /// # Panics
    /// If `kind` is not [`Repacked::supports`]ed or a length disagrees (callers check them).
    pub(crate) fn relay_into(
        kind: Format,
        w: &[u8],
        n: usize,
        nb: usize,
        out: &mut [u8],
        pool: Option<&crate::ThreadPool>,
    ) {
        assert!(Repacked::supports(kind), "no 8-row layout for {kind:?}");
        let bb = kind.block_bytes();
        assert_eq!(w.len(), n * nb * bb, "repack length");
        let sb = superblock_bytes(kind);
        assert_eq!(out.len(), n.div_ceil(RG) * nb * sb, "re-laid length");
        let hdr = header_bytes(kind);
        // Quants start after the stored block's own header (d; d and m; d and z).
        let qoff = bb - 32 / if kind == Format::Q8_0 { 1 } else { 2 };
        let fill = |g: usize, out: &mut [u8]| {
            for (b, s) in out.chunks_exact_mut(sb).enumerate() {
                for r in 0..RG.min(n - g * RG) {
                    let src = &w[((g * RG + r) * nb + b) * bb..][..bb];
                    s[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                    if kind == Format::Q4_1 {
                        s[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
                    }
                    if kind == Format::Q4_Z {
                        s[16 + r] = src[2];
                    }
                    if kind == Format::Q5_0 {
                        let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]);
                        for i in 0..4 {
                            s[16 + 4 * r + i] = high_bits(qh, i);
                        }
                    }
                    for c in 0..chunks(kind) {
                        let at = hdr + 32 * c + 4 * r;
                        s[at..at + 4].copy_from_slice(&src[qoff + 4 * c..qoff + 4 * c + 4]);
                    }
                }
            }
        };
        over_groups(out, nb * sb, pool, fill);
    }

    /// `n` stored Q4_Z rows of `nb` blocks whose zero points are all 8 (a symmetric GPTQ/AWQ
    /// checkpoint's: v1's stored 7 plus one, v2's 8), re-laid as Q4_0, or `None` when some
    /// zero differs. `y = (q - 8) * d` is Q4_0's value, and the block order sums `q * y - 8 *
    /// sum(y)` in `i32` for both kinds, so results are bit-identical to the Q4_Z layout's,
    /// without the per-row zero terms. Rows read back ([`Repacked::stored_row`]) are Q4_0's.
    ///
    /// # Panics
    /// If `w.len() != n * nb * 19` (callers check it).
    pub(crate) fn symmetric_q4z_on(
        w: &[u8],
        n: usize,
        nb: usize,
        pool: Option<&crate::ThreadPool>,
    ) -> Option<Repacked> {
        let bb = Format::Q4_Z.block_bytes();
        assert_eq!(w.len(), n * nb * bb, "repack length");
        if w.chunks_exact(bb).any(|b| b[2] != 8) {
            return None;
        }
        let (sb, hdr) = (superblock_bytes(Format::Q4_0), header_bytes(Format::Q4_0));
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * nb * sb);
        let fill = |g: usize, out: &mut [u8]| {
            for (b, s) in out.chunks_exact_mut(sb).enumerate() {
                for r in 0..RG.min(n - g * RG) {
                    let src = &w[((g * RG + r) * nb + b) * bb..][..bb];
                    s[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                    for c in 0..4 {
                        let at = hdr + 32 * c + 4 * r;
                        s[at..at + 4].copy_from_slice(&src[3 + 4 * c..3 + 4 * c + 4]);
                    }
                }
            }
        };
        over_groups(&mut data, nb * sb, pool, fill);
        Some(Repacked {
            kind: Format::Q4_0,
            n,
            nb,
            qgroup: 1,
            data,
        })
    }

    /// Interleaved groups (`n / 8` rounded up).
    pub(crate) fn groups(&self) -> usize {
        self.n.div_ceil(RG)
    }

    /// Bytes of one superblock of this layout.
    pub(crate) fn superblock_bytes(&self) -> usize {
        if self.qgroup > 1 {
            zg_superblock_bytes(self.qgroup)
        } else {
            superblock_bytes(self.kind)
        }
    }

    /// The superblocks of group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        self.groups_at(g, 1)
    }

    /// The bytes of groups `g..g + count` (consecutive: group `g + i` is `i` groups' bytes on).
    pub(crate) fn groups_at(&self, g: usize, count: usize) -> &[u8] {
        let len = self.nb / self.qgroup * self.superblock_bytes();
        &self.data[g * len..(g + count) * len]
    }

    /// Row `r`'s stored bytes, rebuilt from the layout (the scalar path and the tests read
    /// rows this way; the inverse of [`Repacked::new`]).
    pub(crate) fn stored_row(&self, r: usize, out: &mut [u8]) {
        if self.qgroup > 1 {
            return self.grouped_stored_row(r, out);
        }
        let (kind, bb) = (self.kind, self.kind.block_bytes());
        let (sb, hdr) = (superblock_bytes(kind), header_bytes(kind));
        let qoff = bb - 32 / if kind == Format::Q8_0 { 1 } else { 2 };
        let (g, lane) = (r / RG, r % RG);
        let grp = self.group(g);
        for (b, dst) in out[..self.nb * bb].chunks_exact_mut(bb).enumerate() {
            let s = &grp[b * sb..(b + 1) * sb];
            dst[..2].copy_from_slice(&s[2 * lane..2 * lane + 2]);
            if kind == Format::Q4_1 {
                dst[2..4].copy_from_slice(&s[16 + 2 * lane..16 + 2 * lane + 2]);
            }
            if kind == Format::Q4_Z {
                dst[2] = s[16 + lane];
            }
            if kind == Format::Q5_0 {
                let qh = (0..4).fold(0u32, |qh, i| qh | spread_bits(s[16 + 4 * lane + i], i));
                dst[2..6].copy_from_slice(&qh.to_le_bytes());
            }
            for c in 0..chunks(kind) {
                let at = hdr + 32 * c + 4 * lane;
                dst[qoff + 4 * c..qoff + 4 * c + 4].copy_from_slice(&s[at..at + 4]);
            }
        }
    }

    /// Bytes this copy holds.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// A weight matrix in one of the 8-row layouts: the 32-value quants' (this module), the
/// k-quants' (`matmul/repack_k.rs`) or FP8's (`matmul/repack_f8.rs`). What the runtime keeps per re-laid tensor.
#[derive(Debug)]
pub enum Repack {
    /// Q4_0, Q4_1, Q5_0, Q8_0.
    Q(Repacked),
    /// Q4_K, Q6_K.
    K(RepackedK),
    /// F8_S (FP8 checkpoints).
    F8(crate::kernels::matmul::repack_f8::RepackedF8),
    /// F8_S whose scales repeat over 128 columns (FP8 checkpoints), one scale a span.
    F8G(crate::kernels::matmul::repack_f8g::RepackedF8G),
}

impl Repack {
    /// Rows of the stored matrix.
    pub(crate) fn n(&self) -> usize {
        match self {
            Repack::Q(r) => r.n,
            Repack::K(r) => r.n,
            Repack::F8(r) => r.n,
            Repack::F8G(r) => r.n,
        }
    }

    /// Elements per row.
    pub(crate) fn k(&self) -> usize {
        match self {
            Repack::Q(r) => r.nb * 32,
            Repack::K(r) => r.nb * crate::kernels::qact::QK_K,
            Repack::F8(r) => r.nb * 32,
            Repack::F8G(r) => r.nb * 32,
        }
    }

    /// The dtype of the rows [`Repack::stored_row`] rebuilds (a symmetric Q4_Z tensor's
    /// re-lay gives Q4_0 rows).
    pub(crate) fn dtype(&self) -> poot_core::DType {
        match self {
            Repack::Q(r) => r.kind.dtype(),
            Repack::K(r) => r.kind.dtype(),
            Repack::F8(_) | Repack::F8G(_) => poot_core::DType::F8_S,
        }
    }

    /// Row `r`'s stored bytes, rebuilt from the layout.
    pub(crate) fn stored_row(&self, r: usize, out: &mut [u8]) {
        match self {
            Repack::Q(rp) => rp.stored_row(r, out),
            Repack::K(rp) => rp.stored_row(r, out),
            Repack::F8(rp) => rp.stored_row(r, out),
            Repack::F8G(rp) => rp.stored_row(r, out),
        }
    }

    /// Bytes this copy holds.
    pub fn bytes(&self) -> usize {
        match self {
            Repack::Q(r) => r.bytes(),
            Repack::K(r) => r.bytes(),
            Repack::F8(r) => r.bytes(),
            Repack::F8G(r) => r.bytes(),
        }
    }
}
