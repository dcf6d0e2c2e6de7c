//! Fused matmuls (`matmul_repacked_fused`): several re-laid weights that read one input, in one
//! pool dispatch, give each weight's own call's bits, on every ISA, token count and ragged
//! shape; mixed kinds fall back to one call each with the same result.

use super::*;
use crate::testutil::{synthetic_weights, Rng};

/// Each weight's product on its own, as bits.
fn alone(isa: Isa, x: &[f32], t: usize, k: usize, w: &Repack, pool: &ThreadPool) -> Vec<u32> {
    let mut out = vec![f32::NAN; t * w.n()];
    matmul_repacked(isa, x, t, k, w, &mut out, pool).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

fn fused(
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    ws: &[&Repack],
    pool: &ThreadPool,
) -> Vec<Vec<u32>> {
    let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; t * w.n()]).collect();
    let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    let mut cache = crate::kernels::act_cache::ActCache::default();
    matmul_repacked_fused(isa, x, t, k, ws, &mut slices, pool, Some((&mut cache, 1))).unwrap();
    outs.iter()
        .map(|o| o.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn a_fused_call_gives_each_weights_own_bits() {
    let pool = ThreadPool::new(3).unwrap();
    let mut rng = Rng::new(41);
    let k = 512;
    let mut checked = 0;
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        // q/k/v-like rows: a large one, two small ones, one not a multiple of 8; 2100 rows takes
        // Q4_1's two-groups-per-step path for one token. gate/up-like: two weights each below
        // that path's size, together above it, so the fused call takes pairs where each
        // weight alone takes single groups.
        for ns in [&[2100, 64, 20][..], &[1040, 1040][..]] {
            let ws: Vec<Repack> = ns
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let w = synthetic_weights(dt, n, k, 11 + i as u32);
                    repack_for(Numerics::Ggml, Isa::detect(), &w, dt, n, k)
                        .unwrap()
                        .expect("every 8-row kind is re-laid under ggml numerics")
                })
                .collect();
            let refs: Vec<&Repack> = ws.iter().collect();
            for isa in Isa::available() {
                for t in [1, 3, 9] {
                    let x = rng.vec(t * k, -2.0, 2.0);
                    let got = fused(isa, &x, t, k, &refs, &pool);
                    for (w, g) in ws.iter().zip(&got) {
                        let want = alone(isa, &x, t, k, w, &pool);
                        assert_eq!(*g, want, "{dt} {isa:?} t={t} rows {ns:?}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 36, "every kind ran on at least one ISA");
}

#[test]
fn mixed_kinds_fall_back_to_one_call_each() {
    let pool = ThreadPool::new(2).unwrap();
    let k = 256;
    let isa = Isa::detect();
    let a = synthetic_weights(DType::Q4_0, 24, k, 3);
    let b = synthetic_weights(DType::Q4_K, 16, k, 4);
    let wa = repack_for(Numerics::Ggml, isa, &a, DType::Q4_0, 24, k)
        .unwrap()
        .unwrap();
    let wb = repack_for(Numerics::Ggml, isa, &b, DType::Q4_K, 16, k)
        .unwrap()
        .unwrap();
    let x = Rng::new(5).vec(2 * k, -1.0, 1.0);
    let got = fused(isa, &x, 2, k, &[&wa, &wb], &pool);
    assert_eq!(got[0], alone(isa, &x, 2, k, &wa, &pool));
    assert_eq!(got[1], alone(isa, &x, 2, k, &wb, &pool));
}

#[test]
fn bad_shapes_are_typed_errors() {
    let pool = ThreadPool::new(1).unwrap();
    let isa = Isa::detect();
    let w = synthetic_weights(DType::Q8_0, 8, 64, 1);
    let rp = repack_for(Numerics::Ggml, isa, &w, DType::Q8_0, 8, 64)
        .unwrap()
        .unwrap();
    let x = vec![0.0f32; 64];
    let mut short = vec![0.0f32; 7];
    let err = matmul_repacked_fused(isa, &x, 1, 64, &[&rp], &mut [&mut short], &pool, None);
    assert!(matches!(err, Err(KernelError::Length { .. })), "{err:?}");
    let mut ok = vec![0.0f32; 8];
    let err = matmul_repacked_fused(isa, &x, 1, 64, &[&rp, &rp], &mut [&mut ok], &pool, None);
    assert!(
        matches!(err, Err(KernelError::InvalidArgument { .. })),
        "{err:?}"
    );
}
