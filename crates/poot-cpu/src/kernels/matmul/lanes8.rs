//! The multi-token matmul in llamafile tinyBLAS's order (`ggml::dot_lanes8`: 8 FMA lanes per
//! output along `k`, then `ggml::hsum8`) for F16, BF16 and F32 weights, on the AVX2 and AVX-512
//! paths (BF16 where there is no AMX-BF16 path, `matmul/bf16.rs`).
//!
//! Two callers: ggml numerics (`matmul/float_ggml.rs`, `matmul/bf16.rs`), which round the
//! activations as ggml does (F16 weights: to f16; BF16: to bf16), and the exact path's
//! multi-token float matmuls (`matmul/mod.rs`), which take them as given. The exact path's bound,
//! `(k / 8 + 16) * 2^-24 * sum |w x|`, holds for these tiles' `(k / 8 + 4)` one.
//!
//! Both operands are packed once, in 8-element slices, in the order the tiles read them:
//! - the activations per call (rounded under ggml numerics), by groups of [`TG`] tokens, then
//!   chunks of the tiling's `kc` elements along `k`, then token tiles;
//! - each row block as the thread takes it, by chunks, then row quads.
//!
//! Two tilings ([`Tiling`]):
//! - [`WIDE`] (AVX-512): `f32` operands (f16 and bf16 values widened when packed, exact),
//!   one tile per group: `NR` rows against 12 tokens, two tokens' chains per 512-bit register
//!   (`fdot16_x86`). Loops: group, chunk, quad; the group's chunk (24 KiB) stays in L1 while
//!   the block's quads stream past it from L2, each quad's chains parked in `part` between
//!   chunks; the block is about 1 MiB so that every group reads it back from L2. Buffers start
//!   on 64-byte lines ([`Aligned`]). It runs about twice the 8-lane tiles below on AVX-512, and
//!   1 MiB blocks beat 256 KiB ones at large `k` (measurements: `docs/performance-history.md`,
//!   "Measurements behind the kernels").
//! - [`NARROW`] (AVX2): F16 operands as f16 bits under ggml numerics (widened by `vcvtph2ps`,
//!   exact; unrounded activations make both `f32` on the exact path), BF16 as `f32` (widening bf16
//!   bits in the loop, two integer ops a slice, measured slower), 256 KiB blocks, tiles of 3
//!   tokens (AVX2's 16 registers: 12 chains). Loops: group, quad, chunk, tile. A quad's chunk
//!   stays in L1 while every tile of the group runs over it, every read is sequential (no 4 KiB
//!   aliasing between rows `k` apart), and f16 operands halve the bytes pulled from L2; it runs
//!   well above decoded f32 rows read in place (measurements: `docs/performance-history.md`,
//!   "Measurements behind the kernels").
//!
//! Invariant: every output is bit-identical to `dot_lanes8(row, x')` (`x'` the activations,
//! rounded under ggml numerics), whatever the chunking, tiling or thread count (each lane's
//! chain is the same FMA sequence).
//!
//! Cost: `2 * t * n * k` flops; memory: the packed activations (`t * k` elements) and, per
//! thread, a packed row block and the chains (`TG * NR * 8` floats; [`WIDE`]: `TG * 8` per
//! block row).

use crate::kernels::format::Format;
use crate::kernels::ggml::Numerics;
use crate::kernels::scratch::{Parked, Scratch};
use crate::kernels::simd::{Checked, Isa, NR};
use crate::pool::{SharedMut, ThreadPool};

/// Tokens per group.
const TG: usize = 12;
/// Bytes of one packed row block.
const BLOCK_BYTES: usize = 256 * 1024;
/// Bytes of one packed row block on the [`WIDE`] path, where every group reads the block back
/// from L2 (its quads stream past the group's chunk).
const WIDE_BLOCK_BYTES: usize = 1024 * 1024;

/// Whether [`matmul_lanes8`] runs: a SIMD path, several tokens, `k % 8 == 0`, F16, F32 or
/// BF16.
pub(crate) fn applies(ck: Checked, p: Format, t: usize, k: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && ck.isa() != Isa::Scalar
        && t >= 2
        && k.is_multiple_of(8)
        && matches!(p, Format::F16 | Format::F32 | Format::BF16)
}

/// `out[t][n] = dot_lanes8(W[n], x'[t])` with `x'` under [`Numerics::Ggml`] the activations
/// rounded to f16 for F16 weights and to bf16 for BF16 ones (ggml's `vec_dot_type`s), as they
/// are for F32 and under [`Numerics::Exact`] (see the module docs); [`applies`] holds and
/// `matmul_cached` validated the shapes.
pub(crate) fn matmul_lanes8(
    ck: Checked,
    (p, numerics): (Format, Numerics),
    x: &[f32],
    (t, k): (usize, usize),
    (w, row_bytes, n): (&[u8], usize, usize),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    assert!(applies(ck, p, t, k) && x.len() >= t * k && out.len() >= t * n);
    assert!(w.len() >= n * row_bytes);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::arch::x86::fdot16::{bf16_round8, f16_bits8, f16_round8, widen8};
        use crate::kernels::format::id::{BF16, F16};
        // Activation slices (rounded as ggml does for the weights' dtype) and stored weight
        // slices (16 or 32 bytes) as the tiles' elements. `applies` excludes the scalar path,
        // so `ck` proves AVX2 and F16C, all these conversions need.
        // SAFETY: see above.
        let bf = |s: &[f32; 8], d: &mut [f32; 8]| *d = unsafe { bf16_round8(s) };
        // SAFETY: see above.
        let r16 = |s: &[f32; 8], d: &mut [f32; 8]| *d = unsafe { f16_round8(s) };
        // SAFETY: see above.
        let h16 = |s: &[f32; 8], d: &mut [u16; 8]| *d = unsafe { f16_bits8(s) };
        let id = |s: &[f32; 8], d: &mut [f32; 8]| *d = *s;
        // SAFETY: see above.
        let w16 = |s: &[u8], d: &mut [f32; 8]| *d = unsafe { widen8::<F16>(s) };
        // SAFETY: see above.
        let wbf = |s: &[u8], d: &mut [f32; 8]| *d = unsafe { widen8::<BF16>(s) };
        let w32 = |s: &[u8], d: &mut [f32; 8]| {
            for (d, h) in d.iter_mut().zip(s.chunks_exact(4)) {
                *d = f32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            }
        };
        let bits = |s: &[u8], d: &mut [u16; 8]| {
            for (d, h) in d.iter_mut().zip(s.chunks_exact(2)) {
                *d = u16::from_le_bytes([h[0], h[1]]);
            }
        };
        let shape = ((t, k), (w, row_bytes, n));
        macro_rules! go {
            ($tl:expr, $tiles:expr, $xconv:expr, $wconv:expr) => {{
                let xp = pack_x(x, (t, k), $tl, $xconv, pool);
                run(ck, ($tl, $tiles), &xp, shape, $wconv, out, pool)
            }};
        }
        let ggml = numerics == Numerics::Ggml;
        match (ck.isa().avx512(), p) {
            // The exact path: activations as given, weights widened to `f32` (exact).
            (true, Format::F16) if !ggml => go!(WIDE, wide_tiles, id, w16),
            (true, Format::BF16) if !ggml => go!(WIDE, wide_tiles, id, wbf),
            (false, Format::F16) if !ggml => go!(NARROW, narrow_tiles, id, w16),
            (false, Format::BF16) if !ggml => go!(NARROW, narrow_tiles, id, wbf),
            (true, Format::F16) => go!(WIDE, wide_tiles, r16, w16),
            (true, Format::BF16) => go!(WIDE, wide_tiles, bf, wbf),
            (true, _) => go!(WIDE, wide_tiles, id, w32),
            (false, Format::F16) => go!(NARROW, narrow_tiles, h16, bits),
            (false, Format::BF16) => go!(NARROW, narrow_tiles, bf, wbf),
            (false, _) => go!(NARROW, narrow_tiles, id, w32),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "no SIMD path off x86-64: {ck:?} {w:?} {row_bytes} {out:?} {}",
        pool.n_threads()
    );
}

/// How a path tiles the operands: tokens per tile (`cap`) and elements per chunk of `k`
/// (`kc`, a multiple of 8).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Tiling {
    cap: usize,
    kc: usize,
}

/// AVX2: 3-token tiles, f16 or `f32` operands, 1024-element chunks; loops group, quad, chunk.
const NARROW: Tiling = Tiling { cap: 3, kc: 1024 };

/// AVX-512: the whole group in one tile (two tokens a register, `fdot16_x86`), `f32`
/// operands, 512-element chunks; loops group, chunk, quad, so the group's chunk (24 KiB)
/// stays in L1 while the block's quads stream past it.
const WIDE: Tiling = Tiling { cap: TG, kc: 512 };

/// Offset of tile `j` of chunk `c0` of group `g0` in the packed activations.
fn x_offset(g0: usize, gt: usize, k: usize, c0: usize, kc: usize, j: usize) -> usize {
    g0 * k + c0 * gt + j * kc
}

/// The activations in tile order: in each tile, slice `s` of token `jj` at `(s * step + jj)
/// * 8`, each slice through `conv` (8 values in, 8 out); one task a token group.
#[cfg(target_arch = "x86_64")]
fn pack_x<E: Copy + Parked + Send>(
    x: &[f32],
    (t, k): (usize, usize),
    tl: Tiling,
    conv: impl Fn(&[f32; 8], &mut [E; 8]) + Sync,
    pool: &ThreadPool,
) -> Aligned<E> {
    let mut xp = Aligned::<E>::zeroed(t * k);
    pool.for_each_chunk_mut(
        &mut xp,
        TG * k,
        || (),
        |(), i, dst| {
            // SAFETY: `applies` excludes the scalar path, so the caller's `Checked` proves AVX2
            // and F16C.
            unsafe { pack_group(x, (i * TG, dst.len() / k), k, tl, &conv, dst) };
        },
    );
    xp
}

/// Token group `g0..g0 + gt` of [`pack_x`] into `dst` (the group's `gt * k` elements),
/// compiled with F16C so that `conv`'s conversions inline.
///
/// # Safety
/// AVX2 and F16C detected.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_group<E: Copy>(
    x: &[f32],
    (g0, gt): (usize, usize),
    k: usize,
    tl: Tiling,
    conv: &impl Fn(&[f32; 8], &mut [E; 8]),
    dst: &mut [E],
) {
    for c0 in (0..k).step_by(tl.kc) {
        let kc = tl.kc.min(k - c0);
        let mut j = 0;
        while j < gt {
            let step = tl.cap.min(gt - j);
            let base = x_offset(0, gt, k, c0, kc, j);
            for jj in 0..step {
                let src = &x[(g0 + j + jj) * k + c0..(g0 + j + jj) * k + c0 + kc];
                for (s, piece) in src.chunks_exact(8).enumerate() {
                    let at = base + (s * step + jj) * 8;
                    let d = (&mut dst[at..at + 8]).try_into().expect("8 elements");
                    conv(piece.try_into().expect("8 values"), d);
                }
            }
            j += step;
        }
    }
}

/// `len` zeroed elements starting on a 64-byte boundary, so that no 512-bit load of the
/// packed operands splits a cache line (misaligned, every one of them would).
pub(crate) struct Aligned<E: Parked> {
    buf: Scratch<E>,
    off: usize,
    len: usize,
}

impl<E: Parked + Copy> Aligned<E> {
    pub(crate) fn zeroed(len: usize) -> Self {
        let per = 64 / size_of::<E>();
        let buf = Scratch::<E>::zeroed(len + per);
        let off = buf.as_ptr().align_offset(64).min(per);
        Self { buf, off, len }
    }
}

impl<E: Parked> std::ops::Deref for Aligned<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        &self.buf[self.off..self.off + self.len]
    }
}

impl<E: Parked> std::ops::DerefMut for Aligned<E> {
    fn deref_mut(&mut self) -> &mut [E] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

/// `dst = v` for a tile's results (at most [`NR`] rows of one token): a whole quad as one
/// 16-byte move, since `copy_from_slice` of a length the compiler cannot see calls `memmove`
/// (a call per quad and token of every packed-tile matmul).
#[inline(always)]
pub(crate) fn put_rows(dst: &mut [f32], v: &[f32]) {
    match (
        <&mut [f32; NR]>::try_from(&mut *dst),
        <&[f32; NR]>::try_from(v),
    ) {
        (Ok(d), Ok(v)) => *d = *v,
        _ => dst.iter_mut().zip(v).for_each(|(d, v)| *d = *v),
    }
}

/// The loops over one packed block: `(isa, (rows, block, nr), xp, (t, k), part, put)`.
type Tiles<E> = fn(Checked, (&[E], usize, usize), &[E], (usize, usize), &mut [f32], Put<'_>);
/// `put(token, first row, values)`: a token's results for consecutive rows of the block.
pub(crate) type Put<'a> = &'a mut dyn FnMut(usize, usize, &[f32]);

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
fn run<E: crate::kernels::arch::x86::fdot::Lane8>(
    ck: Checked,
    (tl, tiles): (Tiling, Tiles<E>),
    xp: &[E],
    ((t, k), (w, row_bytes, n)): ((usize, usize), (&[u8], usize, usize)),
    conv: impl Fn(&[u8], &mut [E; 8]) + Sync,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let bytes = if tl == WIDE {
        WIDE_BLOCK_BYTES
    } else {
        BLOCK_BYTES
    };
    let block = (bytes / size_of::<E>() / k / NR).clamp(1, 32) * NR;
    let blocks = n.div_ceil(block);
    let (per_task, tasks) = pool.split(blocks);
    // The wide loops keep every quad's chains of the group between chunks.
    let lanes = if tl == WIDE {
        block * TG * 8
    } else {
        TG * NR * 8
    };
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || {
            let rows = Aligned::<E>::zeroed(block * k);
            (rows, Aligned::<f32>::zeroed(lanes))
        },
        |(rows, part), task| {
            for b in task * per_task..((task + 1) * per_task).min(blocks) {
                let n0 = b * block;
                let nr = block.min(n - n0);
                let src = &w[n0 * row_bytes..(n0 + nr) * row_bytes];
                // SAFETY: `applies` excludes the scalar path, so `ck` proves AVX2 and F16C.
                unsafe { pack_rows(src, row_bytes, &conv, (block, k, tl.kc), rows) };
                let mut put = |tok: usize, r: usize, v: &[f32]| {
                    let at = tok * n + n0 + r;
                    // SAFETY: rows n0 + r.. (inside the block) belong to this task's blocks
                    // only, so no other task writes these indices.
                    put_rows(unsafe { shared.slice_mut(at..at + v.len()) }, v);
                };
                tiles(ck, (rows, block, nr), xp, (t, k), part, &mut put);
            }
        },
    );
}

/// Every stored row of a block (`src`, rows of `row_bytes`) through [`pack_row`], compiled
/// with F16C so that the widening `conv` inlines (called per slice, it cost as much as a
/// separate decoding pass).
///
/// # Safety
/// AVX2 and F16C detected.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_rows<E: Copy>(
    src: &[u8],
    row_bytes: usize,
    conv: &impl Fn(&[u8], &mut [E; 8]),
    shape: (usize, usize, usize),
    rows: &mut [E],
) {
    for (r, row) in src.chunks_exact(row_bytes).enumerate() {
        pack_row(row, conv, r, shape, rows);
    }
}

/// Stored row `r` of a block (`src`, `k` elements, 8 at a time through `conv`) into the
/// block's packed order: chunk `c0` at `c0 * block`, quad `q` of it at `q * kc`, slice `s` of
/// the quad's row `r % NR` at `(s * NR + r % NR) * 8`.
#[inline(always)]
fn pack_row<E: Copy>(
    src: &[u8],
    conv: &impl Fn(&[u8], &mut [E; 8]),
    r: usize,
    (block, k, kc): (usize, usize, usize),
    rows: &mut [E],
) {
    let (q, rr) = (r / NR * NR, r % NR);
    let eb = src.len() / k;
    for c0 in (0..k).step_by(kc) {
        let kc = kc.min(k - c0);
        let base = c0 * block + q * kc;
        let stored = &src[c0 * eb..(c0 + kc) * eb];
        for (s, piece) in stored.chunks_exact(8 * eb).enumerate() {
            let at = base + (s * NR + rr) * 8;
            conv(
                piece,
                (&mut rows[at..at + 8]).try_into().expect("8 elements"),
            );
        }
    }
}

/// Every 3-token tile of one packed row block (`nr` of its `block` rows) against the packed
/// activations ([`NARROW`]): `put(token, row, value)` per result.
#[cfg(target_arch = "x86_64")]
fn narrow_tiles<E: crate::kernels::arch::x86::fdot::Lane8>(
    ck: Checked,
    (rows, block, nr): (&[E], usize, usize),
    xp: &[E],
    (t, k): (usize, usize),
    part: &mut [f32],
    put: Put<'_>,
) {
    use crate::kernels::arch::x86::fdot::chunk8_avx2 as a2;
    assert!(rows.len() >= block * k && block.is_multiple_of(NR) && nr <= block);
    assert!(xp.len() >= t * k && part.len() >= TG * NR * 8 && ck.isa() != Isa::Scalar);
    let (cap, kcs) = (NARROW.cap, NARROW.kc);
    let mut res = [0.0f32; 3 * NR];
    for g0 in (0..t).step_by(TG) {
        let gt = TG.min(t - g0);
        for q in (0..nr).step_by(NR) {
            for c0 in (0..k).step_by(kcs) {
                let kc = kcs.min(k - c0);
                let ends = (c0 == 0, c0 + kc == k);
                let wq = rows[c0 * block + q * kc..].as_ptr();
                let mut j = 0;
                while j < gt {
                    let step = cap.min(gt - j);
                    let xs = xp[x_offset(g0, gt, k, c0, kc, j)..].as_ptr();
                    let (pt, rs) = (&mut part[j * NR * 8..], &mut res[..]);
                    // SAFETY: the caller's `Checked` proves AVX2, FMA and F16C (asserted not
                    // scalar). Quad q's chunk c0 holds NR * kc elements from c0 * block + q *
                    // kc (q + NR <= block); the tile's step * kc elements start at its packed
                    // offset (`pack_x`, the same tiling); kc is a multiple of 8 as k and the
                    // tiling's chunk are; `part` holds TG * NR * 8 lanes (asserted).
                    unsafe {
                        match step {
                            3 => a2::<E, 3>(wq, xs, kc, pt, ends, rs),
                            2 => a2::<E, 2>(wq, xs, kc, pt, ends, rs),
                            _ => a2::<E, 1>(wq, xs, kc, pt, ends, rs),
                        }
                    }
                    if ends.1 {
                        for jj in 0..step {
                            put(g0 + j + jj, q, &res[jj * NR..jj * NR + NR.min(nr - q)]);
                        }
                    }
                    j += step;
                }
            }
        }
    }
}

/// [`narrow_tiles`] for the [`WIDE`] tiling: per group and chunk, every quad of the block
/// against the whole group, each quad's chains kept in `part` (`block * TG * 8` floats)
/// between chunks.
#[cfg(target_arch = "x86_64")]
fn wide_tiles(
    ck: Checked,
    (rows, block, nr): (&[f32], usize, usize),
    xp: &[f32],
    (t, k): (usize, usize),
    part: &mut [f32],
    put: Put<'_>,
) {
    use crate::kernels::arch::x86::fdot16::chunk16 as z;
    assert!(rows.len() >= block * k && block.is_multiple_of(NR) && nr <= block);
    assert!(xp.len() >= t * k && part.len() >= block * TG * 8 && ck.isa().avx512());
    let mut res = [0.0f32; TG * NR];
    for g0 in (0..t).step_by(TG) {
        let gt = TG.min(t - g0);
        for c0 in (0..k).step_by(WIDE.kc) {
            let kc = WIDE.kc.min(k - c0);
            let ends = (c0 == 0, c0 + kc == k);
            let xs = xp[x_offset(g0, gt, k, c0, kc, 0)..].as_ptr();
            let lo = (kc, gt % 2 == 1);
            for q in (0..nr).step_by(NR) {
                let wq = rows[c0 * block + q * kc..].as_ptr();
                let (pt, rs) = (&mut part[q * TG * 8..], &mut res[..]);
                // SAFETY: the caller's `Checked` proves AVX-512F with AVX2, FMA and F16C
                // (asserted). Quad q's chunk c0 holds NR * kc floats from c0 * block + q * kc
                // (q + NR <= block); the group's gt * kc floats of chunk c0 start at its
                // packed offset (`pack_x`, one tile a group); kc is a multiple of 8 as k and
                // the chunk are; quad q's chains are `part[q * TG * 8..][..NR * TG * 8]`.
                unsafe {
                    match gt {
                        11.. => z::<6>(wq, xs, lo, pt, ends, rs),
                        9.. => z::<5>(wq, xs, lo, pt, ends, rs),
                        7.. => z::<4>(wq, xs, lo, pt, ends, rs),
                        5.. => z::<3>(wq, xs, lo, pt, ends, rs),
                        3.. => z::<2>(wq, xs, lo, pt, ends, rs),
                        _ => z::<1>(wq, xs, lo, pt, ends, rs),
                    }
                }
                if ends.1 {
                    for jj in 0..gt {
                        put(g0 + jj, q, &res[jj * NR..jj * NR + NR.min(nr - q)]);
                    }
                }
            }
        }
    }
}
