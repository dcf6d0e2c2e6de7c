//! The k-quant 8-row layout: a lossless re-lay, and its matmul bit-identical to the
//! stored-layout ggml k-quant matmul on every ISA, thread count, token tiling and ragged shape.

use super::*;
use crate::kernels::format::Format;
use crate::kernels::matmul::qdot_k::matmul_q8k;
use crate::testutil::{real_slices, synthetic_weights, Rng};
use crate::Isa;
use poot_core::DType;

const KINDS: [DType; 2] = [DType::Q4_K, DType::Q6_K];

#[test]
fn stored_rows_round_trip() {
    for dt in KINDS {
        let kind = Format::of(dt).unwrap();
        let (n, k) = (13, 512);
        let w = synthetic_weights(dt, n, k, 5);
        let rp = RepackedK::new(kind, &w, n, k / QK_K);
        assert_eq!(rp.bytes(), 2 * 8 * 2 * kind.block_bytes(), "{dt}: 2 groups");
        let rb = w.len() / n;
        let mut row = vec![0u8; rb];
        for r in 0..n {
            rp.stored_row(r, &mut row);
            assert_eq!(row, w[r * rb..(r + 1) * rb], "{dt} row {r}");
        }
    }
}

#[test]
fn pieces_cover_each_block_once() {
    for kind in [Format::Q4_K, Format::Q6_K] {
        let mut seen = vec![0u8; kind.block_bytes()];
        for (off, len) in crate::kernels::matmul::repack_k::pieces(kind) {
            seen[off..off + len].iter_mut().for_each(|s| *s += 1);
        }
        assert!(seen.iter().all(|&s| s == 1), "{kind:?}");
    }
}

/// Every stored Q6_K triple position survives the bit re-mix, and the re-mixed bytes hold the
/// quants where the kernel's unpacking reads them (low 6 bits; quant 3 from the top pairs).
#[test]
fn q6k_mix_is_exact_and_unpacks_by_masks() {
    use crate::kernels::matmul::repack_k::{mix_q6k, unmix_q6k};
    for v in 0u32..1 << 24 {
        let (b0, b1, h) = (v as u8, (v >> 8) as u8, (v >> 16) as u8);
        let m = mix_q6k(b0, b1, h);
        assert_eq!(unmix_q6k(m), (b0, b1, h));
        let want = [
            (b0 & 0xf) | (h & 3) << 4,
            (b1 & 0xf) | (h >> 2 & 3) << 4,
            (b0 >> 4) | (h >> 4 & 3) << 4,
            (b1 >> 4) | (h >> 6) << 4,
        ];
        let q3 = ((m[0] & 0xc0) >> 2) | ((m[1] & 0xc0) >> 4) | (m[2] >> 6);
        assert_eq!([m[0] & 63, m[1] & 63, m[2] & 63, q3], want, "{v:#x}");
    }
}

/// (stored-layout result, repacked result) as bits, on `isa` with `threads`.
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
    let kind = Format::of(dt).unwrap();
    let ck = isa.checked().unwrap();
    let pool = ThreadPool::new(threads).unwrap();
    let mut want = vec![0.0f32; t * n];
    // The stored layout on the scalar path: the reference every path must equal.
    let scalar = Isa::Scalar.checked().unwrap();
    matmul_q8k(
        scalar,
        kind,
        x,
        t,
        k,
        w,
        w.len() / n,
        n,
        &mut want,
        &pool,
        None,
    );
    let rp = RepackedK::new(kind, w, n, k / QK_K);
    let mut got = vec![f32::NAN; t * n];
    let mut cache = ActCache::default();
    matmul_rk(ck, &rp, x, t, k, &mut got, &pool, Some((&mut cache, 7)));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect();
    (bits(&want), bits(&got))
}

#[test]
fn bit_identical_to_the_stored_layout_on_every_isa() {
    let mut rng = Rng::new(9);
    for dt in KINDS {
        // Ragged rows (not a multiple of 8), and 1 to 7 tokens (every tile and a tail).
        for (n, k, t) in [
            (21, 256, 1),
            (8, 512, 2),
            (19, 256, 3),
            (40, 768, 5),
            (9, 256, 7),
        ] {
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
fn extreme_quants_and_activations_stay_exact() {
    // Every quant at its maximum (15 or 63), every scale and min at 63 (Q6_K scales at
    // +-127), activations at the Q8_K extremes: the i16 sums' and the madds' worst cases.
    let (n, k, t) = (9, 512, 4);
    for dt in KINDS {
        let mut w = synthetic_weights(dt, n, k, 3);
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
        let x: Vec<f32> = (0..t * k)
            .map(|i| if (i / 3) % 2 == 0 { 1e3 } else { -1e3 })
            .collect();
        for isa in Isa::available() {
            let (want, got) = both(isa, dt, &w, n, k, &x, t, 2);
            assert_eq!(got, want, "{dt} {isa:?}");
        }
    }
}

#[test]
fn bit_identical_on_real_slices() {
    let Some(g) = real_slices() else { return };
    let mut rng = Rng::new(4);
    let mut seen = 0;
    for t in g.tensors() {
        if !KINDS.contains(&t.dtype) {
            continue;
        }
        let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
        let n = n.min(96);
        let w = &g.tensor_bytes(t)[..n * t.dtype.bytes_for(k as u64).unwrap() as usize];
        for tokens in [1, 4] {
            let x = rng.vec(tokens * k, -2.0, 2.0);
            for isa in Isa::available() {
                let (want, got) = both(isa, t.dtype, w, n, k, &x, tokens, 2);
                assert_eq!(got, want, "{} t={tokens} on {isa:?}", t.name);
            }
        }
        seen += 1;
    }
    assert!(seen > 0, "the quant slices hold k-quant tensors");
}
