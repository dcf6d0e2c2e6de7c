//! Q4_K / Q6_K weights re-laid 8 rows at a time, for the ggml-numerics k-quant matmul.
//!
//! Why: in the stored layout each row's 256-value super-block is dotted alone, so every block
//! pays its own scale unpacking (scalar bit twiddling, 8 broadcasts), two horizontal integer
//! sums and scalar f16 conversions, which made these dtypes compute-bound at a third of the
//! DRAM read rate. Interleaving 8 rows puts one row in each 32-bit lane of a 256-bit
//! register: one load holds 4 quant bytes of each of 8 rows, one `maddubs` with a broadcast
//! activation word gives 8 rows' pair sums, the 6-bit scales of 8 rows unpack with a few lane
//! ops, and the float steps run once per super-block for 8 rows (`arch/x86/qdot_rk.rs`).
//!
//! Layout: rows in groups of 8 (the last group padded with zero rows: scales 0, quants 0, so
//! padded outputs are 0 and never written). Group `g` is `nb` super-blocks in block order;
//! each holds 8 stored blocks cut into pieces (see [`pieces`]). Piece `p` of the stored block
//! (`len` bytes at `src`) of row `r` lands at `base(p) + r * len`, where `base(p)` is
//! `8 * sum(len)` of the pieces before it. The pieces, in order:
//! - Q4_K: `d` (2 bytes), `dmin` (2), the 12 packed scale bytes as three 4-byte words, then the
//!   128 quant bytes 4 at a time. So quant word `8c + q` (bytes `32c + 4q..+4`) of 8 rows is
//!   one 32-byte vector: its low nibbles are elements `64c + 4q..+4` (sub-block `2c`), its high
//!   nibbles elements `64c + 32 + 4q..+4` (sub-block `2c + 1`).
//! - Q6_K: for each 4-byte word `w` of each 128-value half `n`, its two `ql` words and its
//!   `qh` word (so the kernel reads front to back), then the 16 `i8` scales one at a time,
//!   `d` (2). The three bytes of each position in such a triple hold the same 24 bits,
//!   re-mixed ([`mix_q6k`]): byte `g < 3` holds quant `g` of the position whole in its low 6
//!   bits and two bits of quant 3 on top, so the kernel unpacks with one mask per quant and
//!   gathers the fourth from the three top pairs (11 vector ops per triple instead of 17).
//!
//! So a super-block is exactly 8 stored blocks (1152 or 1680 bytes): the copy is the tensor's
//! size and only Q6_K's bits move within a triple. [`RepackedK::stored_row`] inverts the re-lay
//! exactly.
//!
//! Invariant: `data.len() == groups * nb * 8 * block_bytes`; a `RepackedK` is immutable once
//! built and is only read by `matmul/rk.rs` and the embedding.

use crate::kernels::blocks::RG;
use crate::kernels::format::Format;

/// `(offset in the stored block, length)` of each piece, in layout order (module docs).
/// An iterator over arithmetic, so the embedding's row rebuild allocates nothing. `kind` is
/// Q4_K, else read as Q6_K.
pub(crate) fn pieces(kind: Format) -> impl Iterator<Item = (usize, usize)> {
    let q4k = kind == Format::Q4_K;
    let count = if q4k { 2 + 3 + 32 } else { 32 + 16 + 16 + 1 };
    (0..count).map(move |i| match q4k {
        true => match i {
            0 | 1 => (2 * i, 2),
            _ if i < 5 => (4 + 4 * (i - 2), 4),
            _ => (16 + 4 * (i - 5), 4),
        },
        // Q6_K: word `w` of half `n`: its two `ql` words and its `qh` word, in the order read.
        false => match i {
            _ if i < 48 => {
                let (nw, part) = (i / 3, i % 3);
                let (n, w) = (nw / 8, nw % 8);
                match part {
                    0 => (64 * n + 4 * w, 4),
                    1 => (64 * n + 32 + 4 * w, 4),
                    _ => (128 + 32 * n + 4 * w, 4),
                }
            }
            _ if i < 64 => (192 + (i - 48), 1),
            _ => (208, 2),
        },
    })
}

/// The 6-bit quants of one position of a stored Q6_K word triple (`ql` low word `b0`, high
/// word `b1`, `qh` byte `h`; elements `+0`, `+32`, `+64`, `+96` of the half, as ggml reads
/// them).
fn q6k_quants(b0: u8, b1: u8, h: u8) -> [u8; 4] {
    [
        (b0 & 0xf) | (h & 3) << 4,
        (b1 & 0xf) | (h >> 2 & 3) << 4,
        (b0 >> 4) | (h >> 4 & 3) << 4,
        (b1 >> 4) | (h >> 6) << 4,
    ]
}

/// The re-mixed bytes of a stored triple position (module docs): quants 0-2 whole in the low 6
/// bits of bytes 0-2, quant 3's bits 4-5, 2-3 and 0-1 on top of bytes 0, 1 and 2, so that
/// `(B0 & 0xc0) >> 2 | (B1 & 0xc0) >> 4 | B2 >> 6` is quant 3.
pub(crate) fn mix_q6k(b0: u8, b1: u8, h: u8) -> [u8; 3] {
    let q = q6k_quants(b0, b1, h);
    [
        q[0] | (q[3] >> 4) << 6,
        q[1] | (q[3] >> 2 & 3) << 6,
        q[2] | (q[3] & 3) << 6,
    ]
}

/// The stored `(b0, b1, h)` of a position from its [`mix_q6k`] bytes (its inverse).
pub(crate) fn unmix_q6k(m: [u8; 3]) -> (u8, u8, u8) {
    let q = [
        m[0] & 63,
        m[1] & 63,
        m[2] & 63,
        (m[0] >> 6) << 4 | (m[1] >> 6) << 2 | m[2] >> 6,
    ];
    let b0 = (q[0] & 0xf) | (q[2] & 0xf) << 4;
    let b1 = (q[1] & 0xf) | (q[3] & 0xf) << 4;
    let h = q[0] >> 4 | (q[1] >> 4) << 2 | (q[2] >> 4) << 4 | (q[3] >> 4) << 6;
    (b0, b1, h)
}

/// Re-mixes every triple of a re-laid Q6_K super-block in place (after the pieces are copied).
fn mix_superblock_q6k(s: &mut [u8]) {
    for t in 0..16 {
        for i in 0..32 {
            let at = |part: usize| q6k::QS + 96 * t + 32 * part + i;
            let m = mix_q6k(s[at(0)], s[at(1)], s[at(2)]);
            for (part, v) in m.into_iter().enumerate() {
                s[at(part)] = v;
            }
        }
    }
}

/// Undoes [`mix_superblock_q6k`] on one rebuilt stored Q6_K block.
fn unmix_block_q6k(b: &mut [u8]) {
    for n in 0..2 {
        for l in 0..32 {
            let at = [64 * n + l, 64 * n + 32 + l, 128 + 32 * n + l];
            let (b0, b1, h) = unmix_q6k([b[at[0]], b[at[1]], b[at[2]]]);
            (b[at[0]], b[at[1]], b[at[2]]) = (b0, b1, h);
        }
    }
}

/// Byte offsets inside a Q4_K super-block of the layout (module docs).
pub(crate) mod q4k {
    /// The 8 rows' f16 `d`, then their f16 `dmin` (16 bytes each).
    pub(crate) const D: usize = 0;
    pub(crate) const DMIN: usize = 16;
    /// Three 32-byte vectors: packed scale word `w` of row `r` at `SCALES + 32 w + 4 r`.
    pub(crate) const SCALES: usize = 32;
    /// 32 vectors of quant words: word `8c + q` at `QS + 32 (8c + q)`.
    pub(crate) const QS: usize = 128;
}

/// Byte offsets inside a Q6_K super-block of the layout (module docs).
pub(crate) mod q6k {
    /// 16 triples of vectors, one per word `w` of half `n` at `QS + 96 (8n + w)`: the `ql`
    /// word of elements `128n + 4w..` and `+64..` (stored bytes `64n + 4w..+4`), the one of
    /// `+32..` and `+96..` (bytes `64n + 32 + 4w..`), then their `qh` word (bytes
    /// `128 + 32n + 4w..`). So the kernel reads a super-block front to back.
    pub(crate) const QS: usize = 0;
    /// The `i8` scale of sub-block `s` of row `r` at `SCALES + 8 s + r`.
    pub(crate) const SCALES: usize = 1536;
    /// The 8 rows' f16 `d`.
    pub(crate) const D: usize = 1664;
}

/// One k-quant weight matrix in the 8-row interleaved layout (see the module docs).
pub struct RepackedK {
    pub(crate) kind: Format,
    /// Rows of the stored matrix (the last group may hold padding beyond them).
    pub(crate) n: usize,
    /// 256-value super-blocks per row.
    pub(crate) nb: usize,
    pub(crate) data: crate::hugemem::HugeBytes,
}

/// Row `lane`'s stored bytes (`nb` blocks of `kind`) rebuilt from the bytes `grp` of the
/// 8-row group holding it ([`RepackedK::group`]'s layout; an expert stack's groups have it too).
pub(crate) fn stored_row_of(kind: Format, nb: usize, grp: &[u8], lane: usize, out: &mut [u8]) {
    let (bb, sb) = (kind.block_bytes(), RG * kind.block_bytes());
    for (b, dst) in out[..nb * bb].chunks_exact_mut(bb).enumerate() {
        let s = &grp[b * sb..(b + 1) * sb];
        let mut base = 0;
        for (off, len) in pieces(kind) {
            dst[off..off + len].copy_from_slice(&s[base + lane * len..][..len]);
            base += RG * len;
        }
        if kind == Format::Q6_K {
            unmix_block_q6k(dst);
        }
    }
}

impl std::fmt::Debug for RepackedK {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepackedK")
            .field("kind", &self.kind)
            .field("n", &self.n)
            .field("nb", &self.nb)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl RepackedK {
    /// Whether `kind` has this layout (Q4_K and Q6_K).
    pub(crate) fn supports(kind: Format) -> bool {
        matches!(kind, Format::Q4_K | Format::Q6_K)
    }

    /// Re-lays `n` stored rows of `nb` super-blocks (`w.len() == n * nb * block_bytes`).
    ///
    /// # Panics
    /// If the length disagrees (callers check it).
    #[cfg(test)]
    pub(crate) fn new(kind: Format, w: &[u8], n: usize, nb: usize) -> RepackedK {
        RepackedK::new_on(kind, w, n, nb, None)
    }

    /// [`RepackedK::new`], the groups spread over `pool`'s threads where there is one.
    pub(crate) fn new_on(
        kind: Format,
        w: &[u8],
        n: usize,
        nb: usize,
        pool: Option<&crate::ThreadPool>,
    ) -> RepackedK {
        let sb = RG * kind.block_bytes();
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * nb * sb);
        RepackedK::relay_into(kind, w, n, nb, &mut data, pool);
        RepackedK { kind, n, nb, data }
    }

    /// [`RepackedK::new_on`]'s layout written into `out` (zeroed, `n / 8` rounded up groups of
    /// `nb` super-blocks), as `Repacked::relay_into`.
    ///
    /// # Panics
    /// If `kind` is not [`RepackedK::supports`]ed or a length disagrees (callers check them).
    pub(crate) fn relay_into(
        kind: Format,
        w: &[u8],
        n: usize,
        nb: usize,
        out: &mut [u8],
        pool: Option<&crate::ThreadPool>,
    ) {
        assert!(RepackedK::supports(kind), "no 8-row layout for {kind:?}");
        let bb = kind.block_bytes();
        assert_eq!(w.len(), n * nb * bb, "repack length");
        let sb = RG * bb;
        assert_eq!(out.len(), n.div_ceil(RG) * nb * sb, "re-laid length");
        let fill = |g: usize, out: &mut [u8]| {
            for (b, s) in out.chunks_exact_mut(sb).enumerate() {
                for r in 0..RG.min(n - g * RG) {
                    let src = &w[((g * RG + r) * nb + b) * bb..][..bb];
                    let mut base = 0;
                    for (off, len) in pieces(kind) {
                        s[base + r * len..][..len].copy_from_slice(&src[off..off + len]);
                        base += RG * len;
                    }
                }
                if kind == Format::Q6_K {
                    mix_superblock_q6k(s);
                }
            }
        };
        crate::kernels::blocks::over_groups(out, nb * sb, pool, fill);
    }

    /// Interleaved groups (`n / 8` rounded up).
    pub(crate) fn groups(&self) -> usize {
        self.n.div_ceil(RG)
    }

    /// Bytes of one super-block (8 stored blocks).
    pub(crate) fn superblock_bytes(&self) -> usize {
        RG * self.kind.block_bytes()
    }

    /// The super-blocks of group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let len = self.nb * self.superblock_bytes();
        &self.data[g * len..(g + 1) * len]
    }

    /// Row `r`'s stored bytes, rebuilt from the layout (the scalar path, the embedding and the
    /// tests read rows this way; the inverse of [`RepackedK::new`]).
    pub(crate) fn stored_row(&self, r: usize, out: &mut [u8]) {
        stored_row_of(self.kind, self.nb, self.group(r / RG), r % RG, out);
    }

    /// Bytes this copy holds.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}
