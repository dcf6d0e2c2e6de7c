//! FP8 weights (`F8_S`: E4M3 bytes and an `f32` scale per 32 values) re-laid 8 rows at a time,
//! for the FP8 matmul's 8-row loops.
//!
//! Why: the stored layout widens each row's block alone, one scale broadcast and one chain of
//! FMAs per row. With 8 rows interleaved, one row per `f32` lane, a 32-byte load widens to four
//! vectors that each hold one element of 8 rows, one activation broadcast serves 8 rows, and
//! one load gives the 8 rows' scales. Where every row's scale is the same over each run of 4
//! blocks (block-128 `quant_method: fp8`, per-channel and per-tensor scales), it is stored once
//! per 128 values: 3% of the code bytes instead of 12.5%, and one scale step per 16 FMAs. A
//! span whose codes hold no E4M3 subnormal is laid out for the integer widening (its codes'
//! bits moved into f32s, no conversion instruction; a subnormal code would become an f32
//! subnormal, which x86 FMAs take slowly); the others for F16C (`arch/generic/f8dot_generic.rs`
//! states both scalings).
//!
//! Layout: rows in groups of 8 (the last padded with zero rows: scale 0, codes 0; their
//! outputs are never written). [`RepackedF8::span`] (`s`, 1 or 4) is the blocks one scale
//! covers. Group `g` is `nb / s` spans of [`span_bytes`]`(s)` bytes in block order; span `p`
//! holds, for rows `8g..8g+8`:
//! - the 8 rows' `f32` scales (32 bytes, row `r` at `4r`): block `p * s`'s;
//! - `s` chunks of 256 bytes, one per block of the span; in each, 8 pieces of 32 bytes: piece
//!   `l` holds the block's elements `l + 8c` (`c < 4`, the reference's lane `l`) of the 8
//!   rows. For F16C (a span with a subnormal code) row `r`'s element `l + 8c` is at
//!   `16 (c / 2) + 8 (c % 2) + r`: each 128-bit half holds two elements, one per 8 bytes. For
//!   the integer widening ([`RepackedF8::shifted`]) it is at `16 (r / 4) + 4c + r % 4`: rows
//!   0..4 in the low half, 4..8 in the high half, so a byte shuffle within each half moves
//!   one element's 8 codes into the 8 `f32` lanes of a register.
//!
//! No code is decoded: the codes are the stored bytes, moved. Invariant: no byte of a re-laid
//! tensor is a NaN code (0x7f, 0xff): [`RepackedF8::new_on`] refuses such a tensor (it keeps
//! the stored layout, whose loop gives NaN), so the 8-row loops widen codes without the NaN
//! fix-up. With `s = 4`, every stored block of a span carries the span's scale, bit for bit
//! (checked while re-laying), so [`RepackedF8::stored_row`] rebuilds the stored rows exactly.
//! A span marked shifted holds no subnormal code of any of its 8 rows.
//! `data.len() == groups * (nb / s) * span_bytes(s)`, `shifted.len() == groups * (nb / s)`;
//! immutable once built.

use crate::kernels::arch::generic::f8dot_generic::F8_BLOCK;
use crate::kernels::blocks::{over_groups, RG};

/// The widest scale span (blocks): 128 values, the usual FP8 scale block.
pub(crate) const WIDE_SPAN: usize = 4;

/// Bytes of one span of `span` blocks: 8 scales and 8 rows' `32 * span` codes.
#[inline(always)]
pub(crate) const fn span_bytes(span: usize) -> usize {
    32 + 8 * 32 * span
}

/// Offset inside a span of its element `e` (< `32 * span`) of lane-row `r` (< 8), in the
/// F16C order or, `shifted`, the integer widening's.
#[inline(always)]
pub(crate) const fn code_at(e: usize, r: usize, shifted: bool) -> usize {
    let (b, l, c) = (e / 32, e % 8, e % 32 / 8);
    let within = if shifted {
        16 * (r / 4) + 4 * c + r % 4
    } else {
        16 * (c / 2) + 8 * (c % 2) + r
    };
    32 + 256 * b + 32 * l + within
}

/// Whether `q` is one of E4M3's subnormal codes (exponent 0, mantissa not 0).
#[inline(always)]
pub(crate) const fn is_subnormal_code(q: u8) -> bool {
    q & 0x78 == 0 && q & 0x07 != 0
}

/// Whether `q` is one of E4M3's NaN codes.
#[inline(always)]
pub(crate) const fn is_nan_code(q: u8) -> bool {
    q & 0x7f == 0x7f
}

/// The scale span of `n` stored rows of `nb` blocks: [`WIDE_SPAN`] when `nb` is a multiple of
/// it and every row's scale bits repeat over each run of that many blocks, else 1.
pub(crate) fn scale_span(w: &[u8], n: usize, nb: usize) -> usize {
    let scale = |row: usize, b: usize| {
        let at = (row * nb + b) * F8_BLOCK;
        [w[at], w[at + 1], w[at + 2], w[at + 3]]
    };
    let wide = nb.is_multiple_of(WIDE_SPAN)
        && (0..n).all(|row| (0..nb).all(|b| scale(row, b) == scale(row, b - b % WIDE_SPAN)));
    if wide {
        WIDE_SPAN
    } else {
        1
    }
}

/// One FP8 weight matrix in the 8-row layout (see the module docs).
pub struct RepackedF8 {
    /// Rows of the stored matrix (the last group may hold padding beyond them).
    pub(crate) n: usize,
    /// 32-value blocks per row.
    pub(crate) nb: usize,
    /// Blocks per scale (1 or [`WIDE_SPAN`]).
    pub(crate) span: usize,
    pub(crate) data: crate::hugemem::HugeBytes,
    /// Per span of each group (`g * (nb / span) + p`): laid out for the integer widening (no
    /// subnormal code in it).
    pub(crate) shifted: Vec<bool>,
}

impl std::fmt::Debug for RepackedF8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepackedF8")
            .field("n", &self.n)
            .field("nb", &self.nb)
            .field("span", &self.span)
            .field("bytes", &self.data.len())
            .field("shifted", &self.shifted.iter().filter(|&&f| f).count())
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
        let span = scale_span(w, n, nb);
        let (sb, ns) = (span_bytes(span), nb / span);
        // Found while filling, on the pool's threads (a model's first plan re-lays every weight).
        let nan = std::sync::atomic::AtomicBool::new(false);
        let plain: Vec<std::sync::atomic::AtomicBool> = (0..n.div_ceil(RG) * ns)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        let mut data = crate::hugemem::HugeBytes::zeroed(n.div_ceil(RG) * ns * sb);
        let fill = |g: usize, out: &mut [u8]| {
            let rows = RG.min(n - g * RG);
            let row = |r: usize| &w[(g * RG + r) * nb * F8_BLOCK..][..nb * F8_BLOCK];
            for (p, s) in out.chunks_exact_mut(sb).enumerate() {
                let src = |r: usize| &row(r)[p * span * F8_BLOCK..][..span * F8_BLOCK];
                let codes = |r: usize| src(r).chunks_exact(F8_BLOCK).flat_map(|b| &b[4..]);
                let shifted = (0..rows).all(|r| !codes(r).any(|&q| is_subnormal_code(q)));
                plain[g * ns + p].store(shifted, std::sync::atomic::Ordering::Relaxed);
                for r in 0..rows {
                    s[4 * r..4 * r + 4].copy_from_slice(&src(r)[..4]);
                    for (e, &q) in codes(r).enumerate() {
                        s[code_at(e, r, shifted)] = q;
                    }
                    if codes(r).any(|&q| is_nan_code(q)) {
                        nan.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        };
        over_groups(&mut data, ns * sb, pool, fill);
        let shifted = plain.into_iter().map(|f| f.into_inner()).collect();
        (!nan.into_inner()).then_some(RepackedF8 {
            n,
            nb,
            span,
            data,
            shifted,
        })
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

    /// The spans of group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let len = self.nb / self.span * span_bytes(self.span);
        &self.data[g * len..(g + 1) * len]
    }

    /// Which spans of group `g` are laid out for the integer widening.
    pub(crate) fn group_shifted(&self, g: usize) -> &[bool] {
        let ns = self.nb / self.span;
        &self.shifted[g * ns..(g + 1) * ns]
    }

    /// Row `r`'s stored bytes (`nb` blocks of 36), rebuilt from the layout (the inverse of
    /// [`RepackedF8::new_on`]; the portable loop and embedding lookups read rows this way).
    pub(crate) fn stored_row(&self, r: usize, out: &mut [u8]) {
        let (g, lane) = (r / RG, r % RG);
        let (grp, sb) = (self.group(g), span_bytes(self.span));
        let shifted = self.group_shifted(g);
        for (b, dst) in out[..self.nb * F8_BLOCK]
            .chunks_exact_mut(F8_BLOCK)
            .enumerate()
        {
            let p = b / self.span;
            let s = &grp[p * sb..][..sb];
            dst[..4].copy_from_slice(&s[4 * lane..4 * lane + 4]);
            for (e, q) in dst[4..].iter_mut().enumerate() {
                *q = s[code_at(32 * (b % self.span) + e, lane, shifted[p])];
            }
        }
    }

    /// Bytes this copy holds.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}
