//! A decode step's matmuls alone: Llama-3.2-1B's 16 layers of q, k, v, o, gate, up, down
//! (Q4_0, random; `LAYER_DTYPE=F16` or `BF16` for float weights) plus the 128256-row head, one
//! token, in order, each matrix distinct (so they stream from DRAM as in a real step). Prints
//! ms per step and GB/s of weights read.
//! `cargo run --release -p poot-cpu --example layer_seq [threads]`
use std::time::Instant;

use poot_cpu::kernels::matmul::{matmul_repacked, repack_for};
use poot_cpu::kernels::matmul_numerics;
use poot_cpu::{DType, Isa, Numerics, ThreadPool};

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    let pool = ThreadPool::new(threads).unwrap();
    let isa = Isa::detect();
    let shapes: Vec<(usize, usize)> = (0..16)
        .flat_map(|_| {
            [
                (2048, 2048),
                (512, 2048),
                (512, 2048),
                (2048, 2048),
                (8192, 2048),
                (8192, 2048),
                (2048, 8192),
            ]
        })
        .chain([(128256, 2048)])
        .collect();
    let float = match std::env::var("LAYER_DTYPE").as_deref() {
        Ok("F16") => Some(DType::F16),
        Ok("BF16") => Some(DType::BF16),
        Ok(other) => panic!("LAYER_DTYPE: F16 or BF16, not {other}"),
        Err(_) => None,
    };
    let mut seed = 1u32;
    let mut next = move || {
        seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
        (seed >> 24) as u8
    };
    if let Some(dt) = float {
        // Small finite values in [-0.5, 0.5).
        let mats: Vec<(Vec<u8>, usize, usize)> = shapes
            .iter()
            .map(|&(n, k)| {
                let w = (0..n * k)
                    .flat_map(|_| {
                        let v = f32::from(next()) / 256.0 - 0.5;
                        if dt == DType::F16 {
                            half::f16::from_f32(v).to_le_bytes()
                        } else {
                            half::bf16::from_f32(v).to_le_bytes()
                        }
                    })
                    .collect();
                (w, n, k)
            })
            .collect();
        let total: usize = mats.iter().map(|(w, _, _)| w.len()).sum();
        rounds(total, |x, out| {
            for (w, n, k) in &mats {
                let (x, o) = (&x[..*k], &mut out[..*n]);
                matmul_numerics(Numerics::Ggml, isa, x, 1, *k, w, dt, *n, o, &pool).unwrap();
            }
        });
        return;
    }
    let mats: Vec<_> = shapes
        .iter()
        .map(|&(n, k)| {
            let bytes = n * k / 32 * 18;
            let mut w: Vec<u8> = (0..bytes).map(|_| next()).collect();
            for b in w.chunks_exact_mut(18) {
                b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
            (
                repack_for(Numerics::Ggml, isa, &w, DType::Q4_0, n, k)
                    .unwrap()
                    .unwrap(),
                n,
                k,
            )
        })
        .collect();
    let total: usize = mats.iter().map(|(r, _, _)| r.bytes()).sum();
    rounds(total, |x, out| {
        for (rp, n, k) in &mats {
            matmul_repacked(isa, &x[..*k], 1, *k, rp, &mut out[..*n], &pool).unwrap();
        }
    });
}

/// Six timed rounds of `step(x, out)`, each reading `total` bytes of weights.
fn rounds(total: usize, mut step: impl FnMut(&[f32], &mut [f32])) {
    let x = vec![0.5f32; 8192];
    let mut out = vec![0f32; 128256];
    for round in 0..6 {
        let t0 = Instant::now();
        step(&x, &mut out);
        let s = t0.elapsed().as_secs_f64();
        println!(
            "round {round}: {:.2} ms/step, {:.1} GB/s",
            s * 1e3,
            total as f64 / s / 1e9
        );
    }
}
