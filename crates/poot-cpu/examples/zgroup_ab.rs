//! An in-process A/B of the int4 layouts on one shape, for a loaded machine where only pairs
//! mean anything: `cargo run --release -p poot-cpu --example zgroup_ab [n [k [t [rounds]]]]`
//! (default `[1 x 2048] x [8192 x 2048]^T`, Llama-3.2-1B's gate/up, 1 token, 5 rounds).
//!
//! Each round times, one after the other, the same random nibbles as Q4_0 (4.5 bits a weight),
//! as Q4_Z with a scale and zero point per 32-value block (the per-block layout, 4.75 bits) and
//! as Q4_Z with one per 128 values (GPTQ/AWQ group 128: the grouped layout, 4.19 bits), each
//! re-laid as the runtime re-lays it (`repack_for`) on the detected ISA, one thread. Each
//! layout cycles through enough copies (`BENCH_COPIES`, default 8) that its weights stream
//! from DRAM, as in a decode step. Prints on-CPU microseconds per call (Linux schedstat; wall
//! time where unreadable) per layout and round, and the medians. No assertions.

use std::time::{Duration, Instant};

use poot_cpu::kernels::matmul::{matmul_repacked, repack::Repack, repack_for};
use poot_cpu::{DType, Isa, Numerics, ThreadPool};

/// Nanoseconds this process's threads have spent on a CPU (Linux schedstat), if readable.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// `n x k` int4 weights: Q4_0 blocks, and the same nibbles as Q4_Z with zero points in GPTQ's
/// range, their scale and zero repeating over runs of `per` blocks.
fn weights(n: usize, k: usize, per: usize, zero_point: bool) -> Vec<u8> {
    let mut s = 0x1234_5678u32;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    let bb = if zero_point { 19 } else { 18 };
    let mut w = vec![0u8; n * k / 32 * bb];
    let (mut d, mut z) = ([0u8; 2], 0u8);
    for (i, b) in w.chunks_exact_mut(bb).enumerate() {
        if i % per == 0 {
            d = half::f16::from_f32(0.005 + (next() % 100) as f32 * 1e-4).to_le_bytes();
            z = (next() % 16) as u8;
        }
        b[..2].copy_from_slice(&d);
        let q = if zero_point {
            b[2] = z;
            &mut b[3..]
        } else {
            &mut b[2..]
        };
        q.iter_mut().for_each(|v| *v = next() as u8);
    }
    w
}

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (n, k, t, rounds) = (arg(1, 8192), arg(2, 2048), arg(3, 1), arg(4, 5));
    let copies: usize = std::env::var("BENCH_COPIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let isa = Isa::detect();
    let pool = ThreadPool::new(1).expect("pool");
    let layouts: [(&str, DType, usize); 3] = [
        ("Q4_0", DType::Q4_0, 1),
        ("Q4_Z per block", DType::Q4_Z, 1),
        ("Q4_Z group 128", DType::Q4_Z, 4),
    ];
    let relaid: Vec<Vec<Repack>> = layouts
        .iter()
        .map(|&(_, dt, per)| {
            let w = weights(n, k, per, dt == DType::Q4_Z);
            (0..copies)
                .map(|_| {
                    repack_for(Numerics::Ggml, isa, &w, dt, n, k)
                        .expect("repack")
                        .expect("an 8-row layout")
                })
                .collect()
        })
        .collect();
    for ((name, _, _), rp) in layouts.iter().zip(&relaid) {
        println!("{name}: {} bytes a copy", rp[0].bytes());
    }
    let x: Vec<f32> = (0..t * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let mut out = vec![0.0f32; t * n];
    let mut times = vec![Vec::new(); layouts.len()];
    for round in 0..rounds {
        for (l, rp) in relaid.iter().enumerate() {
            for w in rp {
                matmul_repacked(isa, &x, t, k, w, &mut out, &pool).expect("matmul");
            }
            let (mut calls, start, cpu0) = (0u32, Instant::now(), cpu_ns());
            while start.elapsed() < Duration::from_millis(300) {
                let w = &rp[calls as usize % copies];
                matmul_repacked(isa, &x, t, k, w, &mut out, &pool).expect("matmul");
                calls += 1;
            }
            let wall = start.elapsed().as_secs_f64();
            let spent = cpu0
                .zip(cpu_ns())
                .map_or(wall, |(a, b)| (b - a) as f64 * 1e-9);
            let us = spent / f64::from(calls) * 1e6;
            times[l].push(us);
            println!("round {round} {:>15}: {us:>9.1} us/call", layouts[l].0);
        }
    }
    for ((name, _, _), ts) in layouts.iter().zip(&mut times) {
        ts.sort_by(f64::total_cmp);
        println!(
            "median {name:>15}: {:>9.1} us/call ({isa:?}, [{t}x{k}]x[{n}x{k}])",
            ts[ts.len() / 2]
        );
    }
}
