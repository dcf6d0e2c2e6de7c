//! The 8-row layout: a lossless re-lay, and its matmul bit-identical to the stored-layout
//! ggml matmul on every ISA, thread count and ragged shape.

use super::*;
use crate::kernels::matmul::ActCache;
use crate::kernels::matmul_q8::matmul_q8;
use crate::testutil::{real_slices, synthetic_weights, Rng};
use poot_core::DType;

const KINDS: [DType; 3] = [DType::Q4_0, DType::Q4_1, DType::Q8_0];

#[test]
fn stored_rows_round_trip() {
    for dt in KINDS {
        let kind = QKind::new(dt).unwrap();
        let (n, k) = (13, 96);
        let w = synthetic_weights(dt, n, k, 5);
        let rp = Repacked::new(kind, &w, n, k / 32);
        assert_eq!(
            rp.bytes(),
            2 * 8 * (k / 32) * kind.block_bytes(),
            "{dt}: 2 groups"
        );
        let rb = w.len() / n;
        let mut row = vec![0u8; rb];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            assert_eq!(row, w[r * rb..(r + 1) * rb], "{dt} row {r}");
        }
    }
}

/// Both matmuls, stored and repacked, on `isa`; returns (stored, repacked) result bits.
#[allow(
    clippy::too_many_arguments,
    reason = "a matmul's shapes plus the ISA and threads"
)]
fn both(
    isa: Isa,
    dt: DType,
    w: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    t: usize,
    threads: usize,
) -> (Vec<u32>, Vec<u32>) {
    let kind = QKind::new(dt).unwrap();
    let ck = isa.checked().unwrap();
    let pool = ThreadPool::new(threads).unwrap();
    let mut want = vec![0.0f32; t * n];
    matmul_q8(ck, kind, x, t, k, w, w.len() / n, n, &mut want, &pool, None);
    let rp = Repacked::new(kind, w, n, k / 32);
    let mut got = vec![f32::NAN; t * n];
    let mut cache = ActCache::default();
    matmul_r8(ck, &rp, x, t, k, &mut got, &pool, Some((&mut cache, 7)));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect();
    (bits(&want), bits(&got))
}

#[test]
fn bit_identical_to_the_stored_layout_on_every_isa() {
    let mut rng = Rng::new(9);
    for dt in KINDS {
        // Ragged rows (not a multiple of 8), and 1, 2 and 3 tokens (the VNNI pair + a single).
        for (n, k, t) in [(21, 256, 1), (8, 64, 2), (19, 160, 3), (40, 512, 5)] {
            let w = synthetic_weights(dt, n, k, 17);
            let x: Vec<f32> = (0..t * k)
                .map(|i| rng.uniform(-4.0, 4.0) * (i % 7) as f32)
                .collect();
            for isa in Isa::available() {
                for threads in [1, 3] {
                    let (want, got) = both(isa, dt, &w, n, k, &x, t, threads);
                    assert_eq!(got, want, "{dt} n={n} k={k} t={t} {isa:?} x{threads}");
                }
            }
        }
    }
}

#[test]
fn bit_identical_on_real_slices() {
    let Some(g) = real_slices() else { return };
    let mut rng = Rng::new(4);
    for t in g.tensors() {
        if !KINDS.contains(&t.dtype) {
            continue;
        }
        let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
        let w = g.tensor_bytes(t);
        let x = rng.vec(2 * k, -2.0, 2.0);
        for isa in Isa::available() {
            let (want, got) = both(isa, t.dtype, w, n, k, &x, 2, 2);
            assert_eq!(got, want, "{} on {isa:?}", t.name);
        }
    }
}

#[test]
fn extreme_weights_and_activations_stay_exact() {
    // Q8_0 weights of -128 and 127 against activations at +-127: the sign trick's and the
    // sign-flip's worst cases for `maddubs` and `dpbusd`.
    let (n, k, t) = (9, 64, 2);
    let mut w = synthetic_weights(DType::Q8_0, n, k, 3);
    for (i, b) in w.chunks_exact_mut(34).enumerate() {
        for (j, q) in b[2..].iter_mut().enumerate() {
            *q = if (i + j) % 3 == 0 { 0x80 } else { 0x7f };
        }
    }
    let x: Vec<f32> = (0..t * k)
        .map(|i| if i % 2 == 0 { 1e3 } else { -1e3 })
        .collect();
    for isa in Isa::available() {
        let (want, got) = both(isa, DType::Q8_0, &w, n, k, &x, t, 2);
        assert_eq!(got, want, "{isa:?}");
    }
}
