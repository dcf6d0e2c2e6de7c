//! ggml-numerics tests: bit-exactness against ggml itself, and every ISA against the scalar
//! reference.
//!
//! The golden hashes below come from ggml's own x86 functions (`quantize_row_q8_0/1`,
//! `ggml_vec_dot_{q4_0,q4_1,q5_0,q8_0}_q8_{0,1}` of the ggml in llama-cpp-python 0.3.36, built
//! for AVX2, called through ctypes after `ggml_cpu_init`) on the real quant slices, with the
//! activations this file generates: FNV-1a 64 over the quantized blocks in ggml's byte layout,
//! and over the little-endian `f32` results, row by row, token 0 then token 1.

use poot_core::DType;

use super::*;
use crate::kernels::qact::quantize_row_q8;
use crate::testutil::{real_slices, synthetic_weights, Rng};

/// (slice name, hash of the quantized activations, hash of the dot products).
const GOLDEN: [(&str, u64, u64); 5] = [
    (
        "smollm2.blk0.attn_q.Q4_1",
        0x6b4c_4277_78b7_2301,
        0x8eac_61e2_5e4e_e3e4,
    ),
    (
        "smollm2.token_embd.Q8_0",
        0x160d_9034_2c96_2cdf,
        0x7197_5baf_1563_e01c,
    ),
    (
        "qwen05b.blk0.attn_q.Q5_0",
        0x95fe_57d1_39e1_6d67,
        0x0e8b_a52a_936d_1d24,
    ),
    (
        "stories260K.blk0.attn_q.Q4_0",
        0x89a4_a861_9489_19ef,
        0xad0b_2c1b_a79b_c133,
    ),
    (
        "stories260K.blk0.attn_q.Q8_0",
        0x89a4_a861_9489_19ef,
        0x6b57_d6a7_48f7_62df,
    ),
];

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// A block in ggml's layout: `d` (f16), for Q8_1 `s` (f16), then the 32 quants.
fn ggml_bytes(b: &BlockQ8, with_sum: bool) -> Vec<u8> {
    let mut v = half::f16::from_f32(b.d).to_le_bytes().to_vec();
    if with_sum {
        v.extend(half::f16::from_f32(b.s).to_le_bytes());
    }
    v.extend(b.qs.iter().map(|&q| q as u8));
    v
}

/// The golden activations: token 0 uniform in [-1, 1), token 1 the same law times 3.
fn golden_x(tok: u32, k: usize) -> Vec<f32> {
    let x = Rng::new(1000 + tok).vec(k, -1.0, 1.0);
    if tok == 0 {
        x
    } else {
        x.iter().map(|v| v * 3.0).collect()
    }
}

#[test]
fn bit_identical_to_ggml_on_real_slices() {
    let Some(g) = real_slices() else { return };
    for (name, want_q, want_out) in GOLDEN {
        let t = g.tensor(name).unwrap();
        let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
        let kind = Format::of(t.dtype).unwrap();
        let w = g.tensor_bytes(t);
        let rb = w.len() / n;
        for isa in Isa::available() {
            let ck = isa.checked().unwrap();
            let (mut hq, mut ho) = (FNV0, FNV0);
            for tok in 0..2 {
                let mut a = vec![BlockQ8::default(); k / 32];
                quantize_row_q8(&golden_x(tok, k), &mut a, kind.act_sum());
                for b in &a {
                    hq = fnv(hq, &ggml_bytes(b, kind.act_sum()));
                }
                // Rows in groups of 4 plus a ragged tail, as the matmul calls them.
                for r0 in (0..n).step_by(4) {
                    let nr = 4.min(n - r0);
                    let mut out = [0.0f32; 4];
                    dot_rows(ck, kind, &w[r0 * rb..], rb, nr, &a, 1, &mut out);
                    for v in &out[..nr] {
                        ho = fnv(ho, &v.to_le_bytes());
                    }
                }
            }
            assert_eq!(
                hq, want_q,
                "{name}: quantized activations differ from ggml's"
            );
            assert_eq!(
                ho, want_out,
                "{name} on {isa:?}: dot products differ from ggml's"
            );
        }
    }
}

#[test]
fn every_isa_matches_scalar_bit_for_bit() {
    let mut rng = Rng::new(3);
    for dt in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0] {
        let kind = Format::of(dt).unwrap();
        let (n, k) = (7, 256);
        let w = synthetic_weights(dt, n, k, 11);
        let rb = w.len() / n;
        // Three tokens: a pair and a single, the x86 tiles.
        let (t, nb) = (3, k / 32);
        let x: Vec<f32> = (0..t * k)
            .map(|i| rng.uniform(-4.0, 4.0) * (i % 5) as f32)
            .collect();
        let mut a = vec![BlockQ8::default(); t * nb];
        for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
            quantize_row_q8(xr, ar, kind.act_sum());
        }
        let want: Vec<u32> = (0..t * n)
            .map(|i| {
                let (j, r) = (i / n, i % n);
                let row = &w[r * rb..(r + 1) * rb];
                dot_scalar(kind, row, &a[j * nb..(j + 1) * nb]).to_bits()
            })
            .collect();
        for isa in Isa::available() {
            let ck = isa.checked().unwrap();
            let mut got = vec![0u32; t * n];
            for r0 in (0..n).step_by(4) {
                let nr = 4.min(n - r0);
                let mut out = [0.0f32; 12];
                dot_rows(ck, kind, &w[r0 * rb..], rb, nr, &a, t, &mut out);
                for j in 0..t {
                    for r in 0..nr {
                        got[j * n + r0 + r] = out[j * nr + r].to_bits();
                    }
                }
            }
            assert_eq!(got, want, "{dt} on {isa:?}");
        }
    }
}
