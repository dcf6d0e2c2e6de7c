//! The portable 8-row dot against the stored-row references everywhere, and against the x86
//! loops (256 bits with and without VNNI, 512 bits) bit for bit where this CPU runs them.

use super::*;
use crate::kernels::arch::generic::qdot_generic::{dot_scalar, dot_scalar_blocks};
use crate::kernels::matmul::repack::Repacked;
use crate::kernels::qact::quantize_row_q8;
use crate::testutil::{synthetic_weights, Rng};
use poot_core::DType;

const KINDS: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4_Z,
];

/// Tokens quantized as `matmul_r8` quantizes them.
fn tokens(kind: Format, t: usize, k: usize, seed: u32) -> Vec<BlockQ8> {
    let mut rng = Rng::new(seed);
    let x = rng.vec(t * k, -3.0, 3.0);
    let nb = k / QK8;
    let mut a = vec![BlockQ8::default(); t * nb];
    for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
        quantize_row_q8(xr, ar, kind.act_sum());
    }
    a
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn equals_the_stored_row_references_bit_for_bit() {
    // 13 rows: the second group holds 3 padding rows, whose results are 0 and unread.
    let (n, k, t) = (13, 256, 3);
    let nb = k / QK8;
    for (s, dt) in KINDS.into_iter().enumerate() {
        let kind = Format::of(dt).unwrap();
        let rp = Repacked::new(kind, &synthetic_weights(dt, n, k, 3 + s as u32), n, nb);
        let a = tokens(kind, t, k, 17 + s as u32);
        let mut row = vec![0u8; nb * kind.block_bytes()];
        for g in 0..rp.groups() {
            let mut ggml = vec![f32::NAN; t * RG];
            if kind != Format::Q4_Z {
                group(kind, rp.group(g), nb, &a, t, &mut ggml);
            }
            let mut blocks = vec![f32::NAN; t * RG];
            if kind != Format::Q4_1 {
                group_blocks(kind, rp.group(g), nb, &a, t, &mut blocks);
            }
            for r in 0..RG.min(n - g * RG) {
                rp.stored_row(g * RG + r, &mut row);
                for j in 0..t {
                    let y = &a[j * nb..(j + 1) * nb];
                    if kind != Format::Q4_Z {
                        let want = dot_scalar(kind, &row, y);
                        assert_eq!(
                            ggml[j * RG + r].to_bits(),
                            want.to_bits(),
                            "{dt} {g} {r} {j}"
                        );
                    }
                    if kind != Format::Q4_1 {
                        let want = dot_scalar_blocks(kind, &row, y);
                        let got = blocks[j * RG + r];
                        assert_eq!(got.to_bits(), want.to_bits(), "{dt} blocks {g} {r} {j}");
                    }
                }
            }
        }
    }
}

/// `matmul_r8`'s corrections for the x86 loops: per lane of 4 activations (ggml's order) or
/// per block (`whole`), `-mult * sum(y)`.
#[cfg(target_arch = "x86_64")]
fn corrections(a: &[BlockQ8], mult: i32, whole: bool) -> Vec<[i32; 8]> {
    a.iter()
        .map(|b| {
            let lane = |l: usize| {
                b.qs[4 * l..4 * l + 4]
                    .iter()
                    .map(|&q| i32::from(q))
                    .sum::<i32>()
            };
            if whole {
                [-mult * (0..8).map(lane).sum::<i32>(), 0, 0, 0, 0, 0, 0, 0]
            } else {
                std::array::from_fn(|l| -mult * lane(l))
            }
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn equals_the_x86_loops_at_every_width_bit_for_bit() {
    use crate::kernels::arch::x86::{qdot_r16, qdot_r8};
    let f = crate::CpuFeatures::get();
    if !crate::testutil::isa_runs("avx2", f.avx2 && f.fma && f.f16c) {
        return;
    }
    let vnni = qdot_r8::has_vnni();
    let vnni512 = qdot_r16::has_vnni512();
    let (n, k) = (16, 256);
    let nb = k / QK8;
    for (s, dt) in KINDS.into_iter().enumerate() {
        let kind = Format::of(dt).unwrap();
        let rp = Repacked::new(kind, &synthetic_weights(dt, n, k, 5 + s as u32), n, nb);
        let mult = |v: bool| match kind {
            Format::Q4_0 => 8,
            Format::Q5_0 => 16,
            Format::Q8_0 if v => 128,
            Format::Q4_Z => 1,
            _ => 0,
        };
        for blocks in [false, true] {
            if (blocks && kind == Format::Q4_1) || (!blocks && kind == Format::Q4_Z) {
                continue;
            }
            for t in 1..=4 {
                let a = tokens(kind, t, k, 29 + t as u32);
                let mut want = vec![f32::NAN; t * 2 * RG];
                for g in 0..2 {
                    let mut one = vec![f32::NAN; t * RG];
                    if blocks {
                        group_blocks(kind, rp.group(g), nb, &a, t, &mut one);
                    } else {
                        group(kind, rp.group(g), nb, &a, t, &mut one);
                    }
                    for j in 0..t {
                        let at = j * 2 * RG + g * RG;
                        want[at..at + RG].copy_from_slice(&one[j * RG..(j + 1) * RG]);
                    }
                }
                for v in [false, true].into_iter().filter(|&v| !v || vnni) {
                    let corr = corrections(&a, mult(v), blocks);
                    let most = qdot_r8::tile_tokens(v, kind, blocks);
                    for g in 0..2 {
                        let mut got = [f32::NAN; 4 * RG];
                        for j0 in (0..t).step_by(most) {
                            let tt = most.min(t - j0);
                            let (aj, cj) = (&a[j0 * nb..], &corr[j0 * nb..]);
                            let o = &mut got[j0 * RG..];
                            if blocks {
                                qdot_r8::group_blocks(v, kind, rp.group(g), nb, aj, cj, tt, o);
                            } else {
                                qdot_r8::group(v, kind, rp.group(g), nb, aj, cj, tt, o);
                            }
                        }
                        for j in 0..t {
                            let at = j * 2 * RG + g * RG;
                            let w = &want[at..at + RG];
                            let msg = format!("{dt} vnni={v} blocks={blocks} t={t} g={g} j={j}");
                            assert_eq!(bits(&got[j * RG..(j + 1) * RG]), bits(w), "{msg}");
                        }
                    }
                }
                if vnni512 {
                    let corr = corrections(&a, mult(true), blocks);
                    let most = if blocks {
                        qdot_r16::BLOCK_TOKENS
                    } else {
                        qdot_r16::TOKENS
                    };
                    let mut got = vec![f32::NAN; t * 2 * RG];
                    for j0 in (0..t).step_by(most) {
                        let tt = most.min(t - j0);
                        let (aj, cj) = (&a[j0 * nb..], &corr[j0 * nb..]);
                        let (g0, g1) = (rp.group(0), rp.group(1));
                        let o = &mut got[j0 * 2 * RG..];
                        if blocks {
                            qdot_r16::groups2_blocks(kind, g0, g1, nb, aj, cj, tt, o);
                        } else {
                            qdot_r16::groups2(kind, g0, g1, nb, aj, cj, tt, o);
                        }
                    }
                    assert_eq!(bits(&got), bits(&want), "{dt} 512 blocks={blocks} t={t}");
                }
            }
        }
    }
}
