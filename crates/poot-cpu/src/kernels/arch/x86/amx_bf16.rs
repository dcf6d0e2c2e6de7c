//! AMX-BF16 tiles for BF16 weights under ggml numerics, every token count (`matmul/bf16.rs`).
//!
//! Why: one `tdpbf16ps` multiplies 16 tokens' 32 bf16 activations by 16 weight rows' into
//! `f32` sums, 8192 products, where AVX512-BF16's `vdpbf16ps` does 32; the products of two bf16
//! values are exact and there is no per-block scale, so the sums stay in the tile for the whole
//! row and nothing runs between the tile steps.
//!
//! How: the weights are the A operand, read as stored (16 rows of 32 columns by stride; the
//! last partial panel from a zero-padded copy), and the activations the B operand, laid out
//! once per call: per 16 tokens and 32 columns, 16 tile rows of 64 bytes, row `i` holding
//! columns `2i, 2i + 1` of token `j` at bytes `4j..4j + 4` (tokens past `t` zeros). Tasks take
//! panels of 16 weight rows; for each pair of token tiles, two sum tiles run over all `k / 32`
//! steps sharing each weight tile, and are stored once (weight rows by tokens, written out
//! transposed).
//!
//! Numerics: each output is `sum_k w x'` (`x'` the bf16-rounded activations, as the other
//! BF16 paths) accumulated in one `f32` chain in column order, products exact, each addition
//! rounded to nearest even, subnormal inputs and results flushed to zero (the tile unit's
//! fixed mode): within `(k + 16) * 2^-24 * sum_k |w x'| + k * 2^-126` of the exact sum
//! (tested). Not the bits of `vdpbf16ps`' 16 lanes; the same for any thread count or tiling.
//!
//! Safety: as `arch/x86/amx.rs` (tile permission asked once; each task loads its configuration and
//! puts back the thread's). Needs `k % 32 == 0`; callers check [`applies`].

use std::arch::asm;

use crate::kernels::arch::x86::amx::{TileConfig, Tiles};
use crate::kernels::scratch::Scratch;
use crate::pool::{SharedMut, ThreadPool};

/// Rows per panel and tokens per tile.
const P: usize = 16;
/// Bytes of one 32-column B tile (16 rows of 64).
const BT: usize = 1024;

/// Whether the tiles run here (AMX-BF16 besides `arch::x86::amx::available`) for rows of `k`
/// columns.
pub(crate) fn applies(k: usize) -> bool {
    crate::CpuFeatures::get().amx_bf16 && k > 0 && k.is_multiple_of(32)
}

fn config() -> TileConfig {
    let mut c = TileConfig::zeroed();
    c.palette = 1;
    // tmm0, tmm3: 16 x 16 f32 sums; tmm1, tmm4: 16 tokens x 32 bf16; tmm2: one B tile
    // (16 x 64 bytes). All 16 rows of 64 bytes.
    for t in 0..5 {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    c
}

/// `out[j][r] = sum_i w[r][i] x'[j][i]` for `t` tokens of bf16 activations `xb` (`t * k`
/// little-endian bf16) and `n` rows of stored BF16 weights (`row_bytes` apart); `out` is
/// `[t, n]`.
///
/// # Panics
/// If the shapes disagree (internal invariant; `matmul_bf16` validated them) or the tiles do
/// not [`apply`](applies).
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul(
    xb: &[u8],
    t: usize,
    k: usize,
    w: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    assert!(applies(k), "AMX-BF16 path where it does not apply");
    assert!(xb.len() >= 2 * t * k && row_bytes >= 2 * k && w.len() >= n * row_bytes);
    assert!(out.len() >= t * n);
    let (panels, steps, tiles) = (n.div_ceil(P), k / 32, t.div_ceil(P));
    // The activations as B tiles, once for every panel: token tile `i`, step `s` is 16 rows
    // of 64 bytes, row `c` holding columns `32s + 2c, + 1` of token `j` at bytes `4j..4j + 4`;
    // tokens past `t` are zeros.
    let mut bt = Scratch::<u8>::zeroed(tiles * steps * BT);
    for (tok, row) in xb[..2 * t * k].chunks_exact(2 * k).enumerate() {
        let (i, j) = (tok / P, tok % P);
        for (c, pair) in row.chunks_exact(4).enumerate() {
            let at = (i * steps + c / 16) * BT + 64 * (c % 16) + 4 * j;
            bt[at..at + 4].copy_from_slice(pair);
        }
    }
    let bt: &[u8] = &bt;
    // The last panel's rows, zero-padded to 16 (an A tile reads 16 rows).
    let tail = n % P;
    let mut last = Scratch::<u8>::zeroed(if tail > 0 { P * row_bytes } else { 0 });
    if tail > 0 {
        last[..tail * row_bytes].copy_from_slice(&w[(n - tail) * row_bytes..n * row_bytes]);
    }
    let last: &[u8] = &last;
    let (per_task, tasks) = pool.split(panels);
    let shared = SharedMut::new(out);
    let cfg = config();
    pool.for_each(tasks, |task| {
        let _tiles = Tiles::load_config(&cfg);
        #[repr(C, align(64))]
        struct Sums([f32; 2 * P * P]);
        let mut sums = Sums([0.0; 2 * P * P]);
        for p in task * per_task..((task + 1) * per_task).min(panels) {
            let rows = P.min(n - p * P);
            let wa: &[u8] = if rows == P {
                &w[p * P * row_bytes..(p + 1) * P * row_bytes]
            } else {
                last
            };
            // Two token tiles per pass: two independent sum chains share each weight tile (one
            // chain alone waits on its own latency).
            for i in (0..tiles).step_by(2) {
                let two = i + 1 < tiles;
                // SAFETY: tiles configured on this thread (`_tiles`); A loads read 16 weight
                // rows' 64 bytes of step `s` at stride `row_bytes` (inside `wa`), B loads 1 KiB
                // tiles of `bt` (token tiles `i`, `i + 1` when `two`), the stores write the
                // two halves of `sums`.
                unsafe {
                    asm!("tilezero tmm0", "tilezero tmm3", options(nostack, nomem));
                    for s in 0..steps {
                        asm!(
                            "tileloadd tmm1, [{a} + {sa} * 1]",
                            "tileloadd tmm2, [{b} + {sb} * 1]",
                            "tdpbf16ps tmm0, tmm1, tmm2",
                            a = in(reg) wa.as_ptr().add(64 * s),
                            b = in(reg) bt.as_ptr().add((i * steps + s) * BT),
                            sa = in(reg) row_bytes,
                            sb = in(reg) 64usize,
                            options(nostack, readonly)
                        );
                        if two {
                            asm!(
                                "tileloadd tmm4, [{b} + {sb} * 1]",
                                "tdpbf16ps tmm3, tmm1, tmm4",
                                b = in(reg) bt.as_ptr().add(((i + 1) * steps + s) * BT),
                                sb = in(reg) 64usize,
                                options(nostack, readonly)
                            );
                        }
                    }
                    asm!(
                        "tilestored [{c} + {sc} * 1], tmm0",
                        "tilestored [{c2} + {sc} * 1], tmm3",
                        c = in(reg) sums.0.as_mut_ptr(),
                        c2 = in(reg) sums.0.as_mut_ptr().add(P * P),
                        sc = in(reg) 64usize,
                        options(nostack)
                    );
                }
                // `sums[h][r][j]`: weight row `r`, token `16 (i + h) + j`.
                for h in 0..1 + usize::from(two) {
                    for j in 0..P.min(t - (i + h) * P) {
                        let at = ((i + h) * P + j) * n + p * P;
                        // SAFETY: columns p*16.. of every row belong to this panel's task.
                        let dst = unsafe { shared.slice_mut(at..at + rows) };
                        for (r, d) in dst.iter_mut().enumerate() {
                            *d = sums.0[h * P * P + r * P + j];
                        }
                    }
                }
            }
        }
    });
}
