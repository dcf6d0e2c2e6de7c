//! FP8 weights (`F8_S`) whose scale repeats over spans of 4 blocks (128 columns: per-tensor,
//! per-channel and 128x128-block FP8 checkpoints) re-laid 8 rows at a time with one scale per
//! row per span, for the grouped FP8 matmul (`matmul/f8g.rs`).
//!
//! Why: `F8_S` keeps an `f32` scale per 32 codes (1.125 bytes a weight) because it serves any
//! scale pattern; the checkpoints that reach it repeat each scale over at least 128 columns,
//! so one per span is lossless (1.03 bytes a weight: the memory bound of issue 31). And the
//! kernel reads a row's codes 32 at a time against activation vectors held in registers:
//! no broadcast a code, one scale step per 128 codes.
//!
//! Layout: rows in groups of 8 (the last padded with zero rows: scale 0, codes 0; their
//! outputs are never written). Group `g` is its spans in column order; span `s` (blocks
//! `4s..min(4s + 4, nb)`, so the last may hold fewer) is the 8 rows' `f32` scales times
//! `2^72` (exact both ways; 32 bytes, row `r` at `4r`), then per block, per row `r`, the row's 32 codes, element
//! `8c + i` at byte `4i + c` (`code_pos`: the order the x86 loops widen 32 codes in). `data.len() == groups * group_bytes(nb)`; immutable once built.
//!
//! Invariants: no code is a NaN code (E4M3 `0x7f`, `0xff`) and every scale is finite with
//! `|d| < 2^48`, or the tensor is not re-laid here (it keeps `matmul/repack_f8.rs`'s layout):
//! the kernel widens codes without a NaN fix-up and scales by `d * 2^72` without overflow.

use crate::kernels::arch::generic::f8dot_generic::F8_BLOCK;
pub(crate) use crate::kernels::arch::generic::f8g_generic::{
    code_pos, group_bytes, spans, BLOCK8, D_SCALE, SPAN,
};
use crate::kernels::blocks::{over_groups, RG};
use crate::kernels::matmul::repack_f8::is_nan_code;

/// The largest scale magnitude the layout takes (the kernel multiplies it by `2^72`).
const MAX_SCALE: f32 = (1u64 << 48) as f32;

/// One FP8 weight matrix in the grouped-scale 8-row layout (see the module docs).
pub struct RepackedF8G {
    /// Rows of the stored matrix (the last group may hold padding beyond them).
    pub(crate) n: usize,
    /// 32-value blocks per row.
    pub(crate) nb: usize,
    pub(crate) data: crate::hugemem::HugeBytes,
}

impl std::fmt::Debug for RepackedF8G {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepackedF8G")
            .field("n", &self.n)
            .field("nb", &self.nb)
            .field("bytes", &self.data.len())
            .finish()
    }
}

/// Whether every row of `w` (stored `F8_S`, `nb` blocks a row) repeats its scale over each
/// span, with finite scales below the bound and no NaN code.
fn fits(w: &[u8], nb: usize) -> bool {
    w.chunks_exact(nb * F8_BLOCK).all(|row| {
        row.chunks(SPAN * F8_BLOCK).all(|span| {
            let d = &span[..4];
            let ok = |b: &[u8]| b[..4] == *d && !b[4..].iter().any(|&q| is_nan_code(q));
            let v = f32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            v.is_finite() && v.abs() < MAX_SCALE && span.chunks_exact(F8_BLOCK).all(ok)
        })
    })
}

impl RepackedF8G {
    /// Re-lays `n` stored `F8_S` rows of `nb` blocks (`w.len() == n * nb * 36`), or `None`
    /// when a scale does not repeat over a span, is out of bounds, or a code is NaN.
    ///
    /// # Panics
    /// If the length disagrees (callers check it).
    pub(crate) fn new_on(
        w: &[u8],
        n: usize,
        nb: usize,
        pool: Option<&crate::ThreadPool>,
    ) -> Option<RepackedF8G> {
        assert_eq!(w.len(), n * nb * F8_BLOCK, "repack length");
        if nb == 0 || !fits(w, nb) {
            return None;
        }
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * group_bytes(nb));
        let fill = |g: usize, out: &mut [u8]| {
            let mut at = 0;
            for s in 0..spans(nb) {
                let blocks = SPAN * s..(SPAN * s + SPAN).min(nb);
                for r in 0..RG.min(n - g * RG) {
                    let src = &w[((g * RG + r) * nb + blocks.start) * F8_BLOCK..];
                    let d = f32::from_le_bytes([src[0], src[1], src[2], src[3]]) * D_SCALE;
                    out[at + 4 * r..at + 4 * r + 4].copy_from_slice(&d.to_le_bytes());
                }
                at += 32;
                for b in blocks {
                    for r in 0..RG.min(n - g * RG) {
                        let src = &w[((g * RG + r) * nb + b) * F8_BLOCK + 4..][..32];
                        let dst = &mut out[at + 32 * r..at + 32 * r + 32];
                        for (e, &q) in src.iter().enumerate() {
                            dst[code_pos(e)] = q;
                        }
                    }
                    at += BLOCK8;
                }
            }
        };
        over_groups(&mut data, group_bytes(nb), pool, fill);
        Some(RepackedF8G { n, nb, data })
    }

    /// [`RepackedF8G::new_on`] on the calling thread.
    #[cfg(test)]
    pub(crate) fn new(w: &[u8], n: usize, nb: usize) -> Option<RepackedF8G> {
        RepackedF8G::new_on(w, n, nb, None)
    }

    /// Interleaved groups (`n / 8` rounded up).
    pub(crate) fn groups(&self) -> usize {
        self.n.div_ceil(RG)
    }

    /// The bytes of group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let len = group_bytes(self.nb);
        &self.data[g * len..(g + 1) * len]
    }

    /// Row `r`'s stored bytes (`nb` blocks of 36, each block its span's scale), rebuilt from
    /// the layout: the inverse of [`RepackedF8G::new_on`].
    pub(crate) fn stored_row(&self, r: usize, out: &mut [u8]) {
        let (grp, lane) = (self.group(r / RG), r % RG);
        let mut at = 0;
        for s in 0..spans(self.nb) {
            let d: [u8; 4] = grp[at + 4 * lane..at + 4 * lane + 4].try_into().unwrap();
            let d = (f32::from_le_bytes(d) / D_SCALE).to_le_bytes();
            at += 32;
            for b in SPAN * s..(SPAN * s + SPAN).min(self.nb) {
                let dst = &mut out[b * F8_BLOCK..(b + 1) * F8_BLOCK];
                dst[..4].copy_from_slice(&d);
                let src = &grp[at + 32 * lane..at + 32 * lane + 32];
                for (e, q) in dst[4..].iter_mut().enumerate() {
                    *q = src[code_pos(e)];
                }
                at += BLOCK8;
            }
        }
    }

    /// Bytes this copy holds.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}
