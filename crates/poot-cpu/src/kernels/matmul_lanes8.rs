//! The multi-token matmul in llamafile tinyBLAS's order (`ggml::dot_lanes8`: 8 FMA lanes per
//! output along `k`, then `ggml::hsum8`) for F16, BF16 and F32 weights, on the AVX2 and AVX-512
//! paths (BF16 only where there is no AVX512-BF16 or AMX path, `matmul_bf16.rs`).
//!
//! Both operands are packed once, in 8-element slices, in the order the tiles read them:
//! - the activations per call, rounded as ggml does (F16 weights: to f16, kept as f16 bits;
//!   BF16: to bf16, kept as `f32`), by groups of [`TG`] tokens, then chunks of [`KC`] elements
//!   along `k`, then token tiles;
//! - each row block (about 256 KiB) as the thread takes it, by chunks, then row quads (F16
//!   weights copied as stored, f16 bits; BF16 ones decoded to `f32`, exact; F32 as they are).
//!   For BF16, widening bf16 bits in the loop (two integer ops a slice) measured slower than
//!   `f32` operands, which the FMAs take straight from memory: 512x2048x2048 on 2 threads
//!   went from 42-50 GFLOP/s (the exact path) to 85 with `f32`, against 49 with bf16 bits.
//!
//! Loops: a token group, then a row quad, then the chunks, then tiles of 3 tokens (AVX2's 16
//! registers: 12 chains) or 6 (AVX-512VL's 32). A quad's chunk stays in L1 while every tile of
//! the group runs over it, every read is sequential (no 4 KiB aliasing between rows `k` apart),
//! and f16 operands halve the bytes the loop pulls from L2 (`vcvtph2ps` widens them exactly).
//! On the Zen 3 this was written on, a 512x2048x2048 F16 matmul on one core went from about
//! 35 GFLOP/s (decoded f32 rows read in place) to about 60; its FMA peak is about 89.
//!
//! Invariant: every output is bit-identical to `dot_lanes8(row, rounded x)`, whatever the
//! chunking, tiling or thread count (each lane's chain is the same FMA sequence).
//!
//! Cost: `2 * t * n * k` flops; memory: the packed activations (`t * k` elements) and, per
//! thread, a packed row block and the group's chains (`TG * NR * 8` floats).

use super::decode::Packed;
use super::scratch::{Parked, Scratch};
use super::simd::{self, Checked, Isa, NR};
use crate::pool::{SharedMut, ThreadPool};

/// Tokens per group: a group's activations (`TG * k` elements) stay in L2 beside the block.
const TG: usize = 12;
/// Elements per chunk along `k` (a multiple of 8).
const KC: usize = 1024;
/// Bytes of one packed row block.
const BLOCK_BYTES: usize = 256 * 1024;

/// Whether [`matmul_lanes8`] runs: a SIMD path, several tokens, `k % 8 == 0`, F16, F32 or
/// BF16.
pub(crate) fn applies(ck: Checked, p: Packed, t: usize, k: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && ck.isa() != Isa::Scalar
        && t >= 2
        && k.is_multiple_of(8)
        && matches!(p, Packed::F16 | Packed::F32 | Packed::BF16)
}

/// `out[t][n] = dot_lanes8(W[n], x'[t])` with `x'` the activations rounded to f16 for F16
/// weights and to bf16 for BF16 ones (ggml's `vec_dot_type`s), as they are for F32 (see the
/// module docs); [`applies`] holds and `matmul_cached` validated the shapes.
pub(crate) fn matmul_lanes8(
    ck: Checked,
    p: Packed,
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
        let cap = tile_cap(ck);
        if p == Packed::F16 {
            let xp = pack_x(x, t, k, cap, |v| half::f16::from_f32(v).to_bits());
            let row = |src: &[u8], dst: &mut [u16]| {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = u16::from_le_bytes([s[0], s[1]]);
                }
            };
            run(ck, &xp, (t, k), (w, row_bytes, n), row, out, pool);
        } else if p == Packed::BF16 {
            let r = |v: f32| f32::from_bits(u32::from(super::matmul_bf16::round_bf16(v)) << 16);
            let xp = pack_x(x, t, k, cap, r);
            let row = |src: &[u8], dst: &mut [f32]| simd::decode(ck, p, src, dst);
            run(ck, &xp, (t, k), (w, row_bytes, n), row, out, pool);
        } else {
            let xp = pack_x(x, t, k, cap, |v| v);
            let row = |src: &[u8], dst: &mut [f32]| simd::decode(ck, p, src, dst);
            run(ck, &xp, (t, k), (w, row_bytes, n), row, out, pool);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "no SIMD path off x86-64: {ck:?} {w:?} {row_bytes} {out:?} {}",
        pool.n_threads()
    );
}

/// Tokens per tile on this path.
#[cfg(target_arch = "x86_64")]
fn tile_cap(ck: Checked) -> usize {
    let wide = ck.isa().avx512() && std::arch::is_x86_feature_detected!("avx512vl");
    if wide {
        6
    } else {
        3
    }
}

/// Calls `f(g0, gt, c0, kc, j, step)` for every token tile of every chunk of every group, in
/// the packed activations' order (tile `j..j + step` of group `g0..g0 + gt`, chunk
/// `c0..c0 + kc`).
fn for_tiles(
    t: usize,
    k: usize,
    cap: usize,
    mut f: impl FnMut(usize, usize, usize, usize, usize, usize),
) {
    for g0 in (0..t).step_by(TG) {
        let gt = TG.min(t - g0);
        for c0 in (0..k).step_by(KC) {
            let kc = KC.min(k - c0);
            let mut j = 0;
            while j < gt {
                let step = cap.min(gt - j);
                f(g0, gt, c0, kc, j, step);
                j += step;
            }
        }
    }
}

/// Offset of tile `j` of chunk `c0` of group `g0` in the packed activations.
fn x_offset(g0: usize, gt: usize, k: usize, c0: usize, kc: usize, j: usize) -> usize {
    g0 * k + c0 * gt + j * kc
}

/// The activations in tile order: in each tile, slice `s` of token `jj` at `(s * step + jj)
/// * 8`, each value through `conv`.
fn pack_x<E: Copy + Parked>(
    x: &[f32],
    t: usize,
    k: usize,
    cap: usize,
    conv: impl Fn(f32) -> E,
) -> Scratch<E> {
    let mut xp = Scratch::<E>::zeroed(t * k);
    for_tiles(t, k, cap, |g0, gt, c0, kc, j, step| {
        let base = x_offset(g0, gt, k, c0, kc, j);
        for jj in 0..step {
            let src = &x[(g0 + j + jj) * k + c0..(g0 + j + jj) * k + c0 + kc];
            for (s, piece) in src.chunks_exact(8).enumerate() {
                let at = base + (s * step + jj) * 8;
                for (d, &v) in xp[at..at + 8].iter_mut().zip(piece) {
                    *d = conv(v);
                }
            }
        }
    });
    xp
}

#[cfg(target_arch = "x86_64")]
fn run<E: super::fdot_x86::Lane8>(
    ck: Checked,
    xp: &[E],
    (t, k): (usize, usize),
    (w, row_bytes, n): (&[u8], usize, usize),
    row: impl Fn(&[u8], &mut [E]) + Sync,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let block = (BLOCK_BYTES / size_of::<E>() / k / NR).clamp(1, 32) * NR;
    let blocks = n.div_ceil(block);
    // About four tasks per thread balances load when other processes share the cores.
    let per_task = blocks.div_ceil(pool.n_threads() * 4).max(1);
    let tasks = blocks.div_ceil(per_task);
    let cap = tile_cap(ck);
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || {
            let (rows, one) = (Scratch::<E>::zeroed(block * k), Scratch::<E>::zeroed(k));
            (rows, one, Scratch::<f32>::zeroed(TG * NR * 8))
        },
        |(rows, one, part), task| {
            for b in task * per_task..((task + 1) * per_task).min(blocks) {
                let n0 = b * block;
                let nr = block.min(n - n0);
                for r in 0..nr {
                    row(&w[(n0 + r) * row_bytes..(n0 + r + 1) * row_bytes], one);
                    pack_row(one, r, block, k, rows);
                }
                let put = |tok: usize, r: usize, v: f32| {
                    // SAFETY: row n0 + r belongs to this task's blocks only, so no other task
                    // writes this index.
                    unsafe { shared.write(tok * n + n0 + r, v) }
                };
                block_tiles(cap, (rows, block, nr), xp, (t, k), part, put);
            }
        },
    );
}

/// Row `r` of a block (`one`, `k` elements) into the block's packed order: chunk `c0` at
/// `c0 * block`, quad `q` of it at `q * kc`, slice `s` of the quad's row `r % NR` at
/// `(s * NR + r % NR) * 8`.
fn pack_row<E: Copy>(one: &[E], r: usize, block: usize, k: usize, rows: &mut [E]) {
    let (q, rr) = (r / NR * NR, r % NR);
    for c0 in (0..k).step_by(KC) {
        let kc = KC.min(k - c0);
        let base = c0 * block + q * kc;
        for (s, piece) in one[c0..c0 + kc].chunks_exact(8).enumerate() {
            let at = base + (s * NR + rr) * 8;
            rows[at..at + 8].copy_from_slice(piece);
        }
    }
}

/// Every tile of one packed row block (`nr` of its `block` rows) against the packed
/// activations: `put(token, row, value)` per result.
#[cfg(target_arch = "x86_64")]
fn block_tiles<E: super::fdot_x86::Lane8>(
    cap: usize,
    (rows, block, nr): (&[E], usize, usize),
    xp: &[E],
    (t, k): (usize, usize),
    part: &mut [f32],
    mut put: impl FnMut(usize, usize, f32),
) {
    use super::fdot_x86::{chunk8_avx2 as a2, chunk8_avx512 as a5};
    assert!(rows.len() >= block * k && block.is_multiple_of(NR) && nr <= block);
    assert!(xp.len() >= t * k && part.len() >= TG * NR * 8 && (cap == 3 || cap == 6));
    let mut res = [0.0f32; 6 * NR];
    for g0 in (0..t).step_by(TG) {
        let gt = TG.min(t - g0);
        for q in (0..nr).step_by(NR) {
            for c0 in (0..k).step_by(KC) {
                let kc = KC.min(k - c0);
                let ends = (c0 == 0, c0 + kc == k);
                let wq = rows[c0 * block + q * kc..].as_ptr();
                let mut j = 0;
                while j < gt {
                    let step = cap.min(gt - j);
                    let xs = xp[x_offset(g0, gt, k, c0, kc, j)..].as_ptr();
                    let (pt, rs) = (&mut part[j * NR * 8..], &mut res[..]);
                    // SAFETY: the caller's `Checked` proves AVX2, FMA and F16C (and cap 6 only
                    // comes with AVX-512F and VL detected, `tile_cap`). Quad q's chunk c0 holds NR * kc
                    // elements from c0 * block + q * kc (q + NR <= block); the tile's step * kc
                    // elements start at its packed offset (`pack_x`, the same tiling); kc is a
                    // multiple of 8 as k and KC are; `part` holds TG * NR * 8 lanes (asserted).
                    unsafe {
                        match step {
                            6 => a5::<E, 6>(wq, xs, kc, pt, ends, rs),
                            5 => a5::<E, 5>(wq, xs, kc, pt, ends, rs),
                            4 => a5::<E, 4>(wq, xs, kc, pt, ends, rs),
                            3 => a2::<E, 3>(wq, xs, kc, pt, ends, rs),
                            2 => a2::<E, 2>(wq, xs, kc, pt, ends, rs),
                            _ => a2::<E, 1>(wq, xs, kc, pt, ends, rs),
                        }
                    }
                    if ends.1 {
                        for jj in 0..step {
                            for r in 0..NR.min(nr - q) {
                                put(g0 + j + jj, q + r, res[jj * NR + r]);
                            }
                        }
                    }
                    j += step;
                }
            }
        }
    }
}
