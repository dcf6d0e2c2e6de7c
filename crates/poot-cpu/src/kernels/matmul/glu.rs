//! A gated FFN's product for one token, `act(x @ gate^T) * (x @ up^T)`, in the dispatch that
//! computes the two matmuls (`CpuPlan::glu`): each claimed run of 8-row groups computes its gate
//! rows and its up rows (the one-token kernels of `matmul/r8.rs`, the same calls a fused gate/up
//! makes), then the activation and the multiply of those rows, so no single thread makes a pass
//! over the outputs afterwards.
//!
//! Invariant: every output is the unfused plan's bits. Each matmul row is the kernel's dot for
//! that row whatever run it lands in (the per-row order is fixed, `matmul/r8.rs`); the
//! activation runs on pieces that start at a multiple of 8 rows of the row (ggml's SiLU takes
//! 8-value groups and a scalar tail only at the row's end, the others are elementwise), and
//! the product is one `f32` multiply.

use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::RG;
use crate::kernels::format::Format;
use crate::kernels::matmul::groups::{over_segments_one, segments, simd_rows, vnni_rows};
use crate::kernels::matmul::r8::{lane_corrections, lane_mult, one_token, PAIRS_FROM};
use crate::kernels::matmul::repack::Repacked;
use crate::kernels::qact::BlockQ8;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::Checked;
use crate::pool::ThreadPool;

/// Groups per piece of a claimed run (an even count, so pairs stay whole): three stack tiles
/// of 128 rows. A claim holds at most 16 units (`groups::stream_units`), 32 groups in pairs.
const PIECE: usize = 16;

/// `out = act(x @ gate^T) * (x @ up^T)` for one token (`x` holds `k` values, `out` `gate.n`),
/// where `act(src, dst)` applies the activation to a piece of the gate row; returns false
/// (nothing written) where this path does not apply: no 8-row SIMD kernels, weights of
/// different kinds, shapes or block counts, or quantization groups (Q4_Z's grouped layout).
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_glu_one(
    ck: Checked,
    (gate, up): (&Repacked, &Repacked),
    x: &[f32],
    act: &(dyn Fn(&[f32], &mut [f32]) + Sync),
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) -> bool {
    let (kind, nb) = (gate.kind, gate.nb);
    let alike = up.kind == kind && up.nb == nb && up.n == gate.n && gate.qgroup == 1;
    if !(cfg!(target_arch = "x86_64") && simd_rows(ck) && alike && up.qgroup == 1) {
        return false;
    }
    if x.len() != nb * crate::kernels::qact::QK8 || out.len() != gate.n {
        return false;
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (act, pool, cache);
        false
    }
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = vnni_rows(ck);
        let mut local = Scratch::<BlockQ8>::zeroed(0);
        let xq = crate::kernels::matmul::q8::quantized(x, kind.act_sum(), cache, &mut local, pool);
        let mult = lane_mult(kind, vnni);
        // As `matmul_r8_fused`: Q4_1 keeps ggml's order, the others the block order.
        let blocks = kind != Format::Q4_1;
        let corr = lane_corrections(xq, nb, mult, blocks);
        // The fused gate/up's rule: the call's groups over both weights decide.
        let pairs = (blocks || gate.groups() + up.groups() >= PAIRS_FROM)
            && vnni
            && crate::kernels::arch::x86::qdot_r16::has_vnni512();
        let how = (kind, vnni, blocks, pairs);
        let mut outs = [out];
        let segs = segments(&[gate], &mut outs, |w| {
            (w.groups(), if pairs { 2 } else { 1 }, w.n)
        });
        let first = |_: usize, g: usize| gate.group(g);
        over_segments_one(pool, segs, &first, |_, g0, g1, o| {
            let (mut tg, mut tu) = ([0.0f32; PIECE * RG], [0.0f32; PIECE * RG]);
            let mut ta = [0.0f32; PIECE * RG];
            let mut g = g0;
            while g < g1 {
                let end = (g + PIECE).min(g1);
                let at = (g - g0) * RG;
                let rows = ((end - g) * RG).min(o.len() - at);
                one_token(gate, how, g..end, xq, &corr, &mut tg[..rows]);
                one_token(up, how, g..end, xq, &corr, &mut tu[..rows]);
                act(&tg[..rows], &mut ta[..rows]);
                for ((y, &a), &u) in o[at..at + rows].iter_mut().zip(&ta).zip(&tu) {
                    *y = a * u;
                }
                g = end;
            }
        });
        true
    }
}
