//! The portable form of the 8-row interleaved integer dot (`arch/x86/qdot_r.rs`): one
//! 8-row group of the repacked layout against `t` Q8 tokens, in plain Rust.
//!
//! It reads the layout as the SIMD loops do (row `r` of a chunk is its 32-bit lane `r`; Q5_0's
//! fifth bits from the `4r + i` header byte), but folds each quant's offset into the value
//! (`q - 8`, `q - 16`, the signed Q8_0 byte) where the SIMD loops add a precomputed correction:
//! either way every lane sum is exact in `i32`, so the float steps alone decide the result, and
//! they are the same: ggml's order ([`group`]: 8 lane sums a block, `fma(dw * dy, lane, acc)`,
//! `hsum8`, Q4_1's `summs`) or the block order ([`group_blocks`]: one exact sum a block, one
//! FMA). So results are bit-identical to `arch::generic::qdot_generic::dot_scalar{,_blocks}` on the stored
//! rows and to the x86 8-row loops at either width (tested below).
//!
//! Why here: `matmul_r8` runs it where no SIMD path applies (the scalar ISA, any CPU), and it
//! is the template a new ISA's loop (e.g. `arch/aarch64/qdot_r8.rs`) starts from and is tested
//! against. Cost: each row's block is unpacked once per 4 tokens; no allocation. Against the
//! stored-row path it replaced (rebuild each row, then `dot_scalar`), on-CPU time per call
//! for `[t x 576] x [1536 x 576]` on one thread of the dev machine's EPYC: t = 64 0.3-1.0x
//! (Q5_0 gains most), t = 1 0.6-1.2x (Q8_0 the one slower, about 1.2x).

use crate::kernels::blocks::{chunks, header_bytes, superblock_bytes, RG};
use crate::kernels::decode::f16_at;
use crate::kernels::format::{id, Format};
use crate::kernels::ggml::hsum8;
use crate::kernels::qact::{BlockQ8, QK8};

/// Row `r`'s block in the superblock `s`: its 32 signed integer weights (element order), its
/// scale and (Q4_1) its offset `m`. Row `r`'s quant bytes are lane `r` (bytes `4r..4r+4`) of
/// every chunk, in the stored block's order; the rest is the stored format's unpacking.
#[inline(always)]
fn row_block<const KIND: u8>(s: &[u8], r: usize) -> ([i8; QK8], f32, f32) {
    let kind = kind_of(KIND);
    let f16 = |at: usize| f16_at(s, at);
    let d = f16(2 * r);
    let m = if kind == Format::Q4_1 {
        f16(16 + 2 * r)
    } else {
        0.0
    };
    let hdr = header_bytes(kind);
    let mut qs = [0u8; QK8];
    for (c, word) in qs.chunks_exact_mut(4).take(chunks(kind)).enumerate() {
        let at = hdr + 32 * c + 4 * r;
        word.copy_from_slice(&s[at..at + 4]);
    }
    let mut q = [0i8; QK8];
    if kind == Format::Q8_0 {
        for (v, &b) in q.iter_mut().zip(&qs) {
            *v = b as i8;
        }
        return (q, d, m);
    }
    // Q5_0's fifth bits of quant byte i (element 4c + i's in bit c, 16 + 4c + i's in 4 + c).
    let h: [u8; 4] = if kind == Format::Q5_0 {
        s[16 + 4 * r..20 + 4 * r].try_into().expect("4 bytes")
    } else {
        [0; 4]
    };
    let off = match kind {
        Format::Q4_0 => 8,
        Format::Q5_0 => 16,
        _ => 0,
    };
    for c in 0..4 {
        for (i, hb) in h.iter().enumerate() {
            let j = 4 * c + i;
            let (mut lo, mut hi) = (qs[j] & 15, qs[j] >> 4);
            if kind == Format::Q5_0 {
                lo |= ((hb >> c) & 1) << 4;
                hi |= ((hb >> (4 + c)) & 1) << 4;
            }
            q[j] = lo as i8 - off;
            q[j + 16] = hi as i8 - off;
        }
    }
    (q, d, m)
}

/// ggml's 8 lane sums of a block's products (lane `l`: elements `4l..4l+4`), exact. Not
/// inlined: alone, this loop vectorizes; inlined into the token and row loops it did not
/// (the scalar path ran 1.5-2x slower than the stored-row reference).
#[inline(never)]
fn lane_sums(q: &[i8; QK8], y: &[i8; QK8]) -> [i32; 8] {
    std::array::from_fn(|l| {
        (4 * l..4 * l + 4)
            .map(|e| i32::from(i16::from(q[e]) * i16::from(y[e])))
            .sum()
    })
}

/// The sum of a block's 32 products, exact; not inlined, as [`lane_sums`]. Each product is
/// formed in `i16` (exact: at most `128 * 128`), which vectorizes as `pmaddwd` on baseline
/// x86-64.
#[inline(never)]
pub(crate) fn block_sum(q: &[i8; QK8], y: &[i8; QK8]) -> i32 {
    q.iter()
        .zip(y)
        .map(|(&w, &x)| i32::from(i16::from(w) * i16::from(x)))
        .sum()
}

/// Tokens one pass over a row takes (their accumulators stay in registers).
const TILE: usize = 4;

/// The format a `KIND` id names (`Format::X as u8`): the loops below are monomorphized per
/// format so that each unpacks only its own.
const fn kind_of(k: u8) -> Format {
    Format::from_id(k)
}

/// `f::<KIND>(args)` for the id of `kind` (one of the five 8-row formats).
macro_rules! by_kind {
    ($kind:expr, $f:ident($($arg:expr),*)) => {
        match $kind {
            Format::Q4_0 => $f::<{ id::Q4_0 }>($($arg),*),
            Format::Q4_1 => $f::<{ id::Q4_1 }>($($arg),*),
            Format::Q5_0 => $f::<{ id::Q5_0 }>($($arg),*),
            Format::Q8_0 => $f::<{ id::Q8_0 }>($($arg),*),
            Format::Q4_Z => $f::<{ id::Q4_Z }>($($arg),*),
            other => unreachable!("{other:?} has no 8-row layout"),
        }
    };
}

/// The bounds both forms read and write within.
///
/// # Panics
/// If a slice is shorter (internal invariant; `matmul_r8` sizes them).
fn check(kind: Format, grp: &[u8], nb: usize, a: &[BlockQ8], t: usize, out: &[f32]) {
    assert!(
        grp.len() >= nb * superblock_bytes(kind),
        "group of {nb} superblocks"
    );
    assert!(a.len() >= t * nb && out.len() >= t * RG, "{t} tokens");
}

/// `out[j * 8 + r]` = row `r` of the group `grp` (`nb` superblocks of `kind`) dotted with
/// token `j < t` (`a[j * nb..]`) in ggml's order.
///
/// # Panics
/// If the slices are shorter than that (internal invariant).
pub(crate) fn group(kind: Format, grp: &[u8], nb: usize, a: &[BlockQ8], t: usize, out: &mut [f32]) {
    check(kind, grp, nb, a, t, out);
    assert!(kind != Format::Q4_Z, "Q4_Z takes the block order only");
    by_kind!(kind, group_k(grp, nb, a, t, out));
}

/// [`group`] for one kind.
fn group_k<const KIND: u8>(grp: &[u8], nb: usize, a: &[BlockQ8], t: usize, out: &mut [f32]) {
    let kind = kind_of(KIND);
    let sb = superblock_bytes(kind);
    for r in 0..RG {
        for j0 in (0..t).step_by(TILE) {
            let tt = TILE.min(t - j0);
            let mut acc = [[0.0f32; 8]; TILE];
            let mut summs = [0.0f32; TILE];
            for (b, s) in grp.chunks_exact(sb).take(nb).enumerate() {
                let (q, d, m) = row_block::<KIND>(s, r);
                for j in 0..tt {
                    let y = &a[(j0 + j) * nb + b];
                    let scale = d * y.d;
                    for (acc, lane) in acc[j].iter_mut().zip(lane_sums(&q, &y.qs)) {
                        *acc = scale.mul_add(lane as f32, *acc);
                    }
                    summs[j] = m.mul_add(y.s, summs[j]);
                }
            }
            for j in 0..tt {
                let v = hsum8(&acc[j]);
                out[(j0 + j) * RG + r] = if kind.act_sum() { v + summs[j] } else { v };
            }
        }
    }
}

/// As [`group`] in the block order (Q4_0, Q5_0 and Q8_0): each block's 32 products summed
/// exactly, then `acc = fma(dw * dy, sum, acc)`.
///
/// # Panics
/// As [`group`], and for Q4_1 (which keeps ggml's order: `matmul/r8.rs`).
pub(crate) fn group_blocks(
    kind: Format,
    grp: &[u8],
    nb: usize,
    a: &[BlockQ8],
    t: usize,
    out: &mut [f32],
) {
    check(kind, grp, nb, a, t, out);
    assert!(kind != Format::Q4_1, "Q4_1 keeps ggml's order");
    by_kind!(kind, group_blocks_k(grp, nb, a, t, out));
}

/// [`group_blocks`] for one kind.
fn group_blocks_k<const KIND: u8>(grp: &[u8], nb: usize, a: &[BlockQ8], t: usize, out: &mut [f32]) {
    let sb = superblock_bytes(kind_of(KIND));
    for j0 in (0..t).step_by(TILE) {
        let tt = TILE.min(t - j0);
        // One chain per row and token, the 8 rows' side by side (independent FMAs).
        let mut acc = [[0.0f32; RG]; TILE];
        for (b, s) in grp.chunks_exact(sb).take(nb).enumerate() {
            for r in 0..RG {
                let (q, d, _) = row_block::<KIND>(s, r);
                let z = if KIND == id::Q4_Z {
                    i32::from(s[16 + r])
                } else {
                    0
                };
                for (j, acc) in acc.iter_mut().enumerate().take(tt) {
                    let y = &a[(j0 + j) * nb + b];
                    let mut sum = block_sum(&q, &y.qs);
                    if KIND == id::Q4_Z {
                        // The zero point, exact: `sum((q - z) * y) = sum(q * y) - z * sum(y)`.
                        sum -= z * y.qs.iter().map(|&v| i32::from(v)).sum::<i32>();
                    }
                    acc[r] = (d * y.d).mul_add(sum as f32, acc[r]);
                }
            }
        }
        for (j, v) in acc.iter().enumerate().take(tt) {
            out[(j0 + j) * RG..(j0 + j + 1) * RG].copy_from_slice(v);
        }
    }
}

#[cfg(test)]
#[path = "qdot_r8_generic_tests.rs"]
mod tests;
