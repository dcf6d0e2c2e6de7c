//! Integer block dot products of packed weight rows with Q8-quantized activations, in ggml's
//! accumulation order, for every format whose rows the Q8 dot reads (Q4_0, Q4_1, Q5_0, Q8_0,
//! and the zero-point Q4_Z, Q8_Z).
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
//! The zero-point formats (GPTQ and AWQ as loaded, `y = (q - z) * d`) take the same float steps
//! as Q4_0 (llama.cpp has no such type): `(q - z)` is an exact small integer, so the zero point
//! is folded into the integer lane sums, no activation sum is needed and the offset adds no
//! rounding. A token's result does not depend on the tokens beside it (one chain per output
//! whatever the tile).
//!
//! Error vs the exact product of the weights with the unquantized activations: the activation
//! rounding of `qact.rs` plus `f32` accumulation; `matmul/q8.rs` states the bound its tests
//! assert.
//!
//! Cost per row: `k` integer multiply-adds and `k / 32` FMAs per lane; weights are read in
//! place, activations are the caller's quantized row.
//!
//! Where: [`dot_rows`] picks the path; the portable loops ([`dot_scalar`], and the block
//! order's reference) are `arch/generic/qdot_generic.rs` (zero points:
//! `arch/generic/zdot_generic.rs`), the x86 ones `arch/x86/qdot.rs`.

pub(crate) use crate::kernels::arch::generic::qdot_generic::dot_scalar;
#[cfg(test)]
pub(crate) use crate::kernels::arch::generic::qdot_generic::dot_scalar_blocks;
use crate::kernels::arch::generic::zdot_generic;
use crate::kernels::format::Format;
use crate::kernels::qact::BlockQ8;
use crate::kernels::simd::{Checked, Isa};

/// `out[j * nr + r] = dot(row r, token j)` for `nr` (at most 4) consecutive weight rows of
/// `row_bytes` bytes starting at `w`, and `t` activation rows of `row_bytes / block_bytes`
/// blocks each, on the path `ck` names (bit-identical across paths, see the module docs);
/// `kind` is a format the Q8 dot reads (`Rows::Q8`).
///
/// # Panics
/// If `w` holds fewer than `nr` rows, `a` fewer than `t` rows, `out` fewer than `t * nr`
/// values, or `nr > 4` (internal invariants; the matmul validates shapes first).
#[allow(clippy::too_many_arguments, reason = "one tile's shapes")]
pub(crate) fn dot_rows(
    ck: Checked,
    kind: Format,
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
                    let (row, aj) = (&w[r * row_bytes..(r + 1) * row_bytes], &a[j * nb..]);
                    out[j * nr + r] = if kind.zero_point() {
                        zdot_generic::dot_scalar(kind, row, &aj[..nb])
                    } else {
                        dot_scalar(kind, row, &aj[..nb])
                    };
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "stored_tests.rs"]
mod tests;
