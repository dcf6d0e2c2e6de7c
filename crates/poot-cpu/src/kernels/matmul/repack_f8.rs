//! FP8 weights (`F8_S`: E4M3 bytes and an `f32` scale per 32 values) re-laid 8 rows at a time,
//! for the FP8 matmul's 8-row loops.
//!
//! Why: the stored layout widens each row's block alone, one scale broadcast and one chain of
//! FMAs per row. With 8 rows interleaved, one row per `f32` lane, a 16-byte load widens to two
//! vectors that each hold one element of 8 rows, one activation broadcast serves 8 rows, and
//! one load gives the 8 rows' scales. The float steps stay the stored-row dot's, per row and
//! in the same order, so results are bit-identical to it (tested).
//!
//! Layout: rows in groups of 8 (the last padded with zero rows: scale 0, codes 0; their
//! outputs are never written). Group `g` is `nb` superblocks of [`SUPERBLOCK`] bytes in block
//! order; superblock `b` holds, for rows `8g..8g+8`:
//! - the 8 rows' `f32` scales (32 bytes, row `r` at `4r`);
//! - 16 chunks of 16 bytes: chunk `2l + h` (`l < 8`, `h < 2`) holds element `l + 16h` of the 8
//!   rows (byte `r`), then element `l + 16h + 8` (byte `8 + r`). So the stored dot's lane `l`
//!   (elements `l, l + 8, l + 16, l + 24`) is chunks `2l` and `2l + 1`, four vectors of 8 rows.
//!
//! A superblock is exactly 8 stored blocks (288 bytes): the copy is the tensor's size, and no
//! code is decoded. Invariant: no byte of a re-laid tensor is a NaN code (0x7f, 0xff):
//! [`RepackedF8::new_on`] refuses such a tensor (it keeps the stored layout, whose loop gives
//! NaN), so the 8-row loops widen codes without the NaN fix-up. `data.len() == groups * nb *
//! SUPERBLOCK`; immutable once built.

use crate::kernels::arch::generic::f8dot_generic::F8_BLOCK;
use crate::kernels::blocks::{over_groups, RG};

/// Bytes of one superblock: 8 scales and 8 rows' 32 codes.
pub(crate) const SUPERBLOCK: usize = 32 + 8 * 32;

/// Offset inside a superblock of element `e` (< 32) of lane-row `r` (< 8).
#[inline(always)]
pub(crate) const fn code_at(e: usize, r: usize) -> usize {
    let (l, c) = (e % 8, e / 8);
    32 + 16 * (2 * l + c / 2) + 8 * (c % 2) + r
}

/// Whether `q` is one of E4M3's NaN codes.
#[inline(always)]
pub(crate) const fn is_nan_code(q: u8) -> bool {
    q & 0x7f == 0x7f
}

/// One FP8 weight matrix in the 8-row layout (see the module docs).
pub struct RepackedF8 {
    /// Rows of the stored matrix (the last group may hold padding beyond them).
    pub(crate) n: usize,
    /// 32-value blocks per row.
    pub(crate) nb: usize,
    pub(crate) data: crate::hugemem::HugeBytes,
}

impl std::fmt::Debug for RepackedF8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepackedF8")
            .field("n", &self.n)
            .field("nb", &self.nb)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl RepackedF8 {
    /// Re-lays `n` stored `F8_S` rows of `nb` blocks (`w.len() == n * nb * 36`), or `None`
    /// when a code is NaN (the stored layout keeps NaN's meaning; see the module docs).
    ///
    /// # Panics
    /// If the length disagrees (callers check it).
    pub(crate) fn new_on(
        w: &[u8],
        n: usize,
        nb: usize,
        pool: Option<&crate::ThreadPool>,
    ) -> Option<RepackedF8> {
        assert_eq!(w.len(), n * nb * F8_BLOCK, "repack length");
        // Found while filling, on the pool's threads (a model's first plan re-lays every weight).
        let nan = std::sync::atomic::AtomicBool::new(false);
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * nb * SUPERBLOCK);
        let fill = |g: usize, out: &mut [u8]| {
            for (b, s) in out.chunks_exact_mut(SUPERBLOCK).enumerate() {
                for r in 0..RG.min(n - g * RG) {
                    let src = &w[((g * RG + r) * nb + b) * F8_BLOCK..][..F8_BLOCK];
                    s[4 * r..4 * r + 4].copy_from_slice(&src[..4]);
                    for (e, &q) in src[4..].iter().enumerate() {
                        s[code_at(e, r)] = q;
                    }
                    if src[4..].iter().any(|&q| is_nan_code(q)) {
                        nan.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        };
        over_groups(&mut data, nb * SUPERBLOCK, pool, fill);
        (!nan.into_inner()).then_some(RepackedF8 { n, nb, data })
    }

    /// [`RepackedF8::new_on`] on the calling thread.
    #[cfg(test)]
    pub(crate) fn new(w: &[u8], n: usize, nb: usize) -> Option<RepackedF8> {
        RepackedF8::new_on(w, n, nb, None)
    }

    /// Interleaved groups (`n / 8` rounded up).
    pub(crate) fn groups(&self) -> usize {
        self.n.div_ceil(RG)
    }

    /// The superblocks of group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let len = self.nb * SUPERBLOCK;
        &self.data[g * len..(g + 1) * len]
    }

    /// Row `r`'s stored bytes (`nb` blocks of 36), rebuilt from the layout (the inverse of
    /// [`RepackedF8::new_on`]; the portable loop and embedding lookups read rows this way).
    pub(crate) fn stored_row(&self, r: usize, out: &mut [u8]) {
        let (g, lane) = (r / RG, r % RG);
        let grp = self.group(g);
        for (b, dst) in out[..self.nb * F8_BLOCK]
            .chunks_exact_mut(F8_BLOCK)
            .enumerate()
        {
            let s = &grp[b * SUPERBLOCK..(b + 1) * SUPERBLOCK];
            dst[..4].copy_from_slice(&s[4 * lane..4 * lane + 4]);
            for (e, q) in dst[4..].iter_mut().enumerate() {
                *q = s[code_at(e, lane)];
            }
        }
    }

    /// Bytes this copy holds.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}
