//! A decode step's matmuls alone: Llama-3.2-1B's 16 layers of q, k, v, o, gate, up, down
//! (Q4_0, random) plus the 128256-row head, one token, in order, each matrix distinct (so
//! they stream from DRAM as in a real step). Prints ms per step and GB/s of weights read.
//! `cargo run --release -p poot-cpu --example layer_seq [threads]`
use std::time::Instant;

use poot_cpu::kernels::matmul::{matmul_repacked, repack_for};
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
    let mut seed = 1u32;
    let mats: Vec<_> = shapes
        .iter()
        .map(|&(n, k)| {
            let bytes = n * k / 32 * 18;
            let mut w: Vec<u8> = (0..bytes)
                .map(|_| {
                    seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                    (seed >> 24) as u8
                })
                .collect();
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
    let x = vec![0.5f32; 8192];
    let mut out = vec![0f32; 128256];
    for round in 0..6 {
        let t0 = Instant::now();
        for (rp, n, k) in &mats {
            matmul_repacked(isa, &x[..*k], 1, *k, rp, &mut out[..*n], &pool).unwrap();
        }
        let s = t0.elapsed().as_secs_f64();
        println!(
            "round {round}: {:.2} ms/step, {:.1} GB/s",
            s * 1e3,
            total as f64 / s / 1e9
        );
    }
}
