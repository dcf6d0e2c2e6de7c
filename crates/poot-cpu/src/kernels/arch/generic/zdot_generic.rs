//! The portable form of the integer block dot of zero-point weight rows (`Q4_Z`, `Q8_Z`) with
//! Q8_0 activations (the zero-point arms of `arch/x86/qdot.rs`'s loop, in the same float order): per
//! 32-value block, 8 exact `i32` lane sums of `(q - z) * q_x` (lane `l` holds elements
//! `4l..4l+4`), then `acc[l] = fma(d_w * d_x, lane_l, acc[l])` block after block and `hsum8`,
//! the float steps of ggml's Q4_0 dot. Bit-identical to the x86 loops (the matmul's tests
//! compare them).

use crate::kernels::decode::f16_at;
use crate::kernels::format::Format;
use crate::kernels::ggml::hsum8;
use crate::kernels::qact::{BlockQ8, QK8};

/// The 32 integer weights `q - z` of one block of `kind` (Q4_Z, else read as Q8_Z; exact in
/// `i32` for any stored `z`) and its scale.
pub(crate) fn unpack(kind: Format, b: &[u8]) -> ([i32; QK8], f32) {
    let mut q = [0i32; QK8];
    let d = f16_at(b, 0);
    if kind == Format::Q4_Z {
        let z = i32::from(b[2]);
        for j in 0..16 {
            q[j] = i32::from(b[3 + j] & 15) - z;
            q[j + 16] = i32::from(b[3 + j] >> 4) - z;
        }
    } else {
        let z = i32::from(u16::from_le_bytes([b[2], b[3]]));
        for (v, &byte) in q.iter_mut().zip(&b[4..36]) {
            *v = i32::from(byte) - z;
        }
    }
    (q, d)
}

/// The portable reference: one weight row (`a.len()` blocks) against one activation row.
pub(crate) fn dot_scalar(kind: Format, w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.chunks_exact(kind.block_bytes()).zip(a) {
        let (q, d) = unpack(kind, wb);
        let scale = d * ab.d;
        for (l, acc) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4).map(|e| q[e] * i32::from(ab.qs[e])).sum();
            *acc = scale.mul_add(lane as f32, *acc);
        }
    }
    hsum8(&acc)
}
