//! Integer block dot products of packed weight rows with Q8-quantized activations, in ggml's
//! accumulation order.
//!
//! For each 32-value block `b` the 32 integer products are summed in 8 lanes of 4 (lane `l`
//! holds elements `4l..4l+4`, exact `i32`); then `acc[l] = fma(dw_b * dx_b, lane_l, acc[l])` in
//! `f32` block after block, and the result is `hsum8(acc)` (`(a0+a4 + a2+a6) + (a1+a5 + a3+a7)`),
//! plus for Q4_1 `summs = fma(m_b, s_b, summs)` accumulated alongside. That is, to the bit,
//! ggml's AVX2 `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` / `ggml_vec_dot_q4_1_q8_1` and llamafile's
//! tinyBLAS Q0 kernels (prefill): their integer steps (`maddubs` + `madd`, or VNNI `dpbusd`)
//! are exact, so only the float steps above decide the result, and every path here performs
//! exactly those. So scalar, AVX2 and VNNI results are bit-identical to each other and to ggml.
//!
//! Error vs the exact product of the weights with the unquantized activations: the activation
//! rounding of `qact.rs` plus `f32` accumulation; `matmul/q8.rs` states the bound its tests
//! assert.
//!
//! Cost per row: `k` integer multiply-adds and `k / 32` FMAs per lane; weights are read in
//! place, activations are the caller's quantized row.

use crate::kernels::blocks::QKind;
use crate::kernels::decode::f16_to_f32;
use crate::kernels::ggml::hsum8;
use crate::kernels::qact::{BlockQ8, QK8};
use crate::kernels::simd::{Checked, Isa};

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The 32 integer weights of one block, its scale and (Q4_1) its offset `m`.
fn unpack(kind: QKind, b: &[u8]) -> ([i8; QK8], f32, f32) {
    let mut q = [0i8; QK8];
    let d = f16_at(b, 0);
    let mut m = 0.0;
    match kind {
        QKind::Q4_0 | QKind::Q4_1 => {
            let (qs, off) = if kind == QKind::Q4_0 {
                (&b[2..18], 8)
            } else {
                m = f16_at(b, 2);
                (&b[4..20], 0)
            };
            for j in 0..16 {
                q[j] = (qs[j] & 15) as i8 - off;
                q[j + 16] = (qs[j] >> 4) as i8 - off;
            }
        }
        QKind::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let hi = |e: usize| (((qh >> e) & 1) << 4) as u8;
                q[j] = ((b[6 + j] & 15) | hi(j)) as i8 - 16;
                q[j + 16] = ((b[6 + j] >> 4) | hi(j + 16)) as i8 - 16;
            }
        }
        QKind::Q8_0 => {
            for (v, &byte) in q.iter_mut().zip(&b[2..34]) {
                *v = byte as i8;
            }
        }
    }
    (q, d, m)
}

/// The portable reference: one weight row (`a.len()` blocks) against one activation row.
pub(crate) fn dot_scalar(kind: QKind, w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (wb, ab) in w.chunks_exact(kind.block_bytes()).zip(a) {
        let (q, d, m) = unpack(kind, wb);
        let scale = d * ab.d;
        for (l, acc) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4)
                .map(|e| i32::from(q[e]) * i32::from(ab.qs[e]))
                .sum();
            *acc = scale.mul_add(lane as f32, *acc);
        }
        summs = m.mul_add(ab.s, summs);
    }
    if kind.act_sum() {
        hsum8(&acc) + summs
    } else {
        hsum8(&acc)
    }
}

/// The block order of multi-token matmuls (`matmul/r8.rs`): each block's 32 products summed
/// exactly in `i32`, then `acc = fma(dw * dx, sum, acc)` block after block. Q4_0, Q5_0 and
/// Q8_0 (not Q4_1, which keeps ggml's order: see `matmul/r8.rs`). The reference of that order
/// on stored rows, for the tests: the block order only runs on the repacked layout, whose
/// portable loop is `arch::generic::qdot_r8::group_blocks`.
#[cfg(test)]
pub(crate) fn dot_scalar_blocks(kind: QKind, w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(kind != QKind::Q4_1);
    let mut acc = 0.0f32;
    for (wb, ab) in w.chunks_exact(kind.block_bytes()).zip(a) {
        let (q, d, _) = unpack(kind, wb);
        let sum: i32 = q
            .iter()
            .zip(&ab.qs)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        acc = (d * ab.d).mul_add(sum as f32, acc);
    }
    acc
}

/// `out[j * nr + r] = dot(row r, token j)` for `nr` (at most 4) consecutive weight rows of
/// `row_bytes` bytes starting at `w`, and `t` activation rows of `row_bytes / block_bytes`
/// blocks each, on the path `ck` names (bit-identical across paths, see the module docs).
///
/// # Panics
/// If `w` holds fewer than `nr` rows, `a` fewer than `t` rows, `out` fewer than `t * nr`
/// values, or `nr > 4` (internal invariants; the matmul validates shapes first).
#[allow(clippy::too_many_arguments, reason = "one tile's shapes")]
pub(crate) fn dot_rows(
    ck: Checked,
    kind: QKind,
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    a: &[BlockQ8],
    t: usize,
    out: &mut [f32],
) {
    let nb = row_bytes / kind.block_bytes();
    assert!(
        nr <= 4
            && row_bytes == nb * kind.block_bytes()
            && w.len() >= nr * row_bytes
            && a.len() >= t * nb
            && out.len() >= t * nr,
        "qdot shapes"
    );
    match ck.isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => {
            crate::kernels::arch::x86::qdot::dot_rows(ck, kind, w, row_bytes, nr, a, t, out);
        }
        _ => {
            for j in 0..t {
                for r in 0..nr {
                    let row = &w[r * row_bytes..(r + 1) * row_bytes];
                    out[j * nr + r] = dot_scalar(kind, row, &a[j * nb..(j + 1) * nb]);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "qdot_tests.rs"]
mod tests;
