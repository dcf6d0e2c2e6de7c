//! The portable form of the grouped Q4_Z integer dot (`arch/x86/qdot_zg.rs`): one 8-row group
//! of the grouped layout (one scale and zero point per row per quantization group of `per`
//! 32-value blocks; `matmul/repack_zg.rs`) against `t` Q8 tokens, in plain Rust.
//!
//! Float order, per row and token (the x86 loop's, bit for bit): `acc = 0`; per quantization
//! group, with the row's scale `dw` and zero point `z`, the token's block scales `dx_b`:
//! `s = fma(dx_b, sum_b(q * y), s)` and `n = fma(dx_b, -sum_b(y), n)` over the group's blocks
//! in order from `s = n = 0` (the integer sums exact, `q` the unsigned nibbles), then
//! `acc = fma(dw, fma(z, n, s), acc)`. That is `dw * sum_b dx_b * sum_b((q - z) * y)` up to
//! `f32` rounding: the group's terms are summed before the scale multiplies them, where the
//! per-block Q4_Z order (`arch/generic/qdot_r8_generic.rs`) folds the zero into each block's
//! integer sum and multiplies each block by `dw * dx_b`.
//!
//! Why here: `matmul_r8` runs it where no SIMD path applies, and it is the oracle the x86 loop
//! is tested against. No allocation; each row's group is unpacked once per 4 tokens.

use crate::kernels::arch::generic::qdot_r8_generic::block_sum;
use crate::kernels::blocks::{zg_superblock_bytes, RG, ZG_HEADER};
use crate::kernels::decode::f16_at;
use crate::kernels::qact::{BlockQ8, QK8};

/// Tokens one pass over a row's group takes.
const TILE: usize = 4;

/// Row `r`'s unsigned nibbles of block `b` of the grouped superblock `s` (element order).
fn nibbles(s: &[u8], b: usize, r: usize) -> [i8; QK8] {
    let mut q = [0i8; QK8];
    for c in 0..4 {
        let at = ZG_HEADER + 128 * b + 32 * c + 4 * r;
        for (i, &v) in s[at..at + 4].iter().enumerate() {
            q[4 * c + i] = (v & 15) as i8;
            q[16 + 4 * c + i] = (v >> 4) as i8;
        }
    }
    q
}

/// `out[j * 8 + r]` = row `r` of the grouped Q4_Z group `grp` (`nb` blocks a row, `per` a
/// quantization group) dotted with token `j < t` (`a[j * nb..]`), in the order of the module
/// docs.
///
/// # Panics
/// If `per` does not divide `nb` or a slice is shorter than that (internal invariant).
pub(crate) fn group_z(per: usize, grp: &[u8], nb: usize, a: &[BlockQ8], t: usize, out: &mut [f32]) {
    assert!(
        matches!(per, 2 | 4) && nb.is_multiple_of(per),
        "group of {per}"
    );
    let sb = zg_superblock_bytes(per);
    assert!(grp.len() >= nb / per * sb, "group of {nb} blocks");
    assert!(a.len() >= t * nb && out.len() >= t * RG, "{t} tokens");
    let mut q = [[0i8; QK8]; 4];
    for j0 in (0..t).step_by(TILE) {
        let tt = TILE.min(t - j0);
        let mut acc = [[0.0f32; RG]; TILE];
        for (g, s) in grp.chunks_exact(sb).take(nb / per).enumerate() {
            for r in 0..RG {
                let dw = f16_at(s, 2 * r);
                let z = f32::from(s[16 + r]);
                for (b, qb) in q.iter_mut().enumerate().take(per) {
                    *qb = nibbles(s, b, r);
                }
                for (j, acc) in acc.iter_mut().enumerate().take(tt) {
                    let (mut part, mut nys) = (0.0f32, 0.0f32);
                    for (b, qb) in q.iter().enumerate().take(per) {
                        let y = &a[(j0 + j) * nb + g * per + b];
                        part = y.d.mul_add(block_sum(qb, &y.qs) as f32, part);
                        let ysum: i32 = y.qs.iter().map(|&v| i32::from(v)).sum();
                        nys = y.d.mul_add(-ysum as f32, nys);
                    }
                    acc[r] = dw.mul_add(z.mul_add(nys, part), acc[r]);
                }
            }
        }
        for (j, v) in acc.iter().enumerate().take(tt) {
            out[(j0 + j) * RG..(j0 + j + 1) * RG].copy_from_slice(v);
        }
    }
}
