//! Every entry of the k-quant dot against the portable dot on the stored rows, bit for bit
//! (`matmul/rk_tests.rs` checks the dispatch through `matmul_rk` on every ISA as well).

use super::*;
use crate::kernels::matmul::qdot_k::dot_scalar;
use crate::kernels::matmul::repack_k::RepackedK;
use crate::kernels::qact::quantize_row_q8k;
use crate::testutil::{synthetic_weights, Rng};
use poot_core::DType;

fn quantized(x: &[f32], nb: usize) -> Vec<BlockQ8K> {
    let mut a = vec![BlockQ8K::default(); x.len() / 256];
    for (xr, ar) in x.chunks_exact(nb * 256).zip(a.chunks_exact_mut(nb)) {
        quantize_row_q8k(xr, ar);
    }
    a
}

/// The 256-bit entries' bits (`vnni` or not) for `t` tokens against the portable dot.
fn check(vnni: bool, dt: DType, w: &[u8], n: usize, nb: usize, x: &[f32], t: usize) {
    let kind = Format::of(dt).unwrap();
    let rp = RepackedK::new(kind, w, n, nb);
    let a = quantized(x, nb);
    let rb = w.len() / n;
    let mut out = [f32::NAN; 4 * RG];
    for g in 0..rp.groups() {
        group_on(vnni, kind, rp.group(g), nb, &a, t, &mut out);
        for j in 0..t {
            for r in 0..RG.min(n - g * RG) {
                let row = &w[(g * RG + r) * rb..][..rb];
                let want = dot_scalar(kind, row, &a[j * nb..(j + 1) * nb]);
                let got = out[j * RG + r];
                let at = format!("{dt} vnni={vnni} row {} token {j}", g * RG + r);
                assert_eq!(got.to_bits(), want.to_bits(), "{at}");
            }
        }
    }
}

/// The 256-bit forms this CPU runs: AVX2, and `vpdpbusd ymm` where detected.
fn forms() -> Vec<bool> {
    let f = crate::CpuFeatures::get();
    let mut forms = Vec::new();
    if crate::testutil::isa_runs("avx2", f.avx2_fma_f16c()) {
        forms.push(false);
    }
    if crate::testutil::isa_runs("vnni", f.vnni256() && f.avx512f && f.avx2_fma_f16c()) {
        forms.push(true);
    }
    forms
}

#[test]
fn every_tile_matches_the_portable_dot_on_ragged_rows() {
    let mut rng = Rng::new(31);
    for vnni in forms() {
        for dt in [DType::Q4_K, DType::Q6_K] {
            let tiles: &[usize] = if dt == DType::Q4_K {
                &[1, 2, 4]
            } else {
                &[1, 2]
            };
            for &(n, nb) in &[(8, 1), (13, 3), (21, 2), (5, 35)] {
                let w = synthetic_weights(dt, n, nb * 256, 7 + n as u32);
                for &t in tiles {
                    let x = rng.vec(t * nb * 256, -3.0, 3.0);
                    check(vnni, dt, &w, n, nb, &x, t);
                }
            }
        }
    }
}

#[test]
fn extreme_quants_scales_and_activations_stay_exact() {
    // Every quant at its maximum, Q4_K scales and mins at 63 (the `16 p` sums' worst case),
    // Q6_K scales at +-127, activations at the Q8_K extremes of either sign.
    let (n, nb) = (11, 4);
    for vnni in forms() {
        for dt in [DType::Q4_K, DType::Q6_K] {
            let mut w = synthetic_weights(dt, n, nb * 256, 3);
            let bb = Format::of(dt).unwrap().block_bytes();
            for b in w.chunks_exact_mut(bb) {
                match dt {
                    DType::Q4_K => b[4..144].fill(0xff),
                    _ => {
                        b[..192].fill(0xff);
                        for (s, v) in b[192..208].iter_mut().enumerate() {
                            *v = if s % 2 == 0 { 0x7f } else { 0x81 };
                        }
                    }
                }
            }
            for sign in [1.0f32, -1.0] {
                let x: Vec<f32> = (0..2 * nb * 256)
                    .map(|i| if i % 5 == 0 { -sign * 1e3 } else { sign * 1e3 })
                    .collect();
                check(vnni, dt, &w, n, nb, &x, 2);
                check(vnni, dt, &w, n, nb, &x[..nb * 256], 1);
            }
        }
    }
}

#[test]
fn two_groups_give_each_groups_bits() {
    if !crate::testutil::isa_runs("avx512", available512()) {
        return;
    }
    let mut rng = Rng::new(43);
    let (n, k) = (16, 512);
    let nb = k / 256;
    let rp = RepackedK::new(
        Format::Q4_K,
        &synthetic_weights(DType::Q4_K, n, k, 9),
        n,
        nb,
    );
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for t in 1..=TOKENS2 {
        let a = quantized(&rng.vec(t * k, -3.0, 3.0), nb);
        let mut want = vec![0.0f32; t * 16];
        for g in 0..2 {
            let mut one = [0.0f32; 4 * RG];
            group_on(false, Format::Q4_K, rp.group(g), nb, &a, t, &mut one);
            for j in 0..t {
                want[j * 16 + g * 8..][..8].copy_from_slice(&one[j * 8..][..8]);
            }
        }
        for vnni in [false, true] {
            if vnni && !crate::testutil::isa_runs("vnni", crate::CpuFeatures::get().vnni512()) {
                continue;
            }
            let mut got = vec![f32::NAN; t * 16];
            groups2_on(vnni, rp.group(0), rp.group(1), nb, &a, t, &mut got);
            assert_eq!(bits(&got), bits(&want), "t={t} vnni={vnni}");
        }
    }
}
