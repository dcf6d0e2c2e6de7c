//! Rough matmul timings:
//! `cargo run --release -p poot-cpu --example matmul_bench [dtype [isa [t [threads [numerics]]]]]`
//! (`all` skips a filter; numerics `exact` or `ggml`, the Q8-activation integer-dot path).
//!
//! Times `[t x 576] x [1536 x 576]^T` (SmolLM2-135M's ffn_gate shape; k = 768 for k-quants)
//! for t = 1 and 64 (or the given t; `BENCH_N` sets another row count n, e.g. a big one to stream
//! from DRAM, `BENCH_K` another k), on every available ISA with 1 and 2 threads, with random packed
//! weights (finite scales). No assertions: this prints GFLOP/s (2 * t * n * k flops per call) and
//! calls per second. `BENCH_REPACK=1` runs ggml numerics on the 8-row interleaved layout where the
//! dtype has one (`kernels::matmul::repack_for`), as the runtime does; `BENCH_COPIES=N` cycles
//! through N distinct copies of the weights, so a small matrix streams from DRAM as in a decode
//! step. `BENCH_GAP_US=g` busy-waits g microseconds between calls (untimed), as a decode step's
//! serial ops leave the pool idle between matmuls.

use std::time::{Duration, Instant};

use poot_core::quant::layout;
use poot_cpu::kernels::matmul::{matmul_repacked, repack_for};
use poot_cpu::kernels::matmul_numerics;
use poot_cpu::{DType, Isa, Numerics, ThreadPool};

fn weights(dtype: DType, n: usize, k: usize) -> Vec<u8> {
    let mut s = 0x1234_5678u32;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    let l = layout::layout(dtype).expect("packed or float dtype");
    let bytes = dtype.bytes_for((n * k) as u64).expect("whole blocks") as usize;
    let mut w: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
    if !dtype.is_quantized() {
        // Plain floats: small finite values.
        for c in w.chunks_exact_mut(l.bytes()) {
            let v = (next() >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            match dtype {
                DType::F32 => c.copy_from_slice(&v.to_le_bytes()),
                DType::F16 => c.copy_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                _ => c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            }
        }
        return w;
    }
    if dtype == DType::F8_S {
        // One f32 scale (repeated over every 128 columns, as FP8 checkpoints' are), no NaN
        // code (0x7f, 0xff: it keeps a tensor in the stored layout; checkpoints hold none)
        // and no subnormal code (exponent 0: real weights rarely fall that low, and the
        // grouped layout widens them to f32 subnormals, which cost more a multiply).
        for block in w.chunks_exact_mut(l.bytes()) {
            block[..4].copy_from_slice(&0.01f32.to_le_bytes());
            block[4..].iter_mut().for_each(|q| *q = (*q & 0xf7) | 0x10);
        }
        return w;
    }
    for block in w.chunks_exact_mut(l.bytes()) {
        for f in l
            .fields
            .iter()
            .filter(|f| matches!(f.name, "d" | "m" | "dmin"))
        {
            let v = half::f16::from_f32(0.01).to_le_bytes();
            block[f.offset..f.offset + 2].copy_from_slice(&v);
        }
    }
    w
}

/// Nanoseconds this process's threads have spent on a CPU (Linux schedstat), if readable.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

fn main() {
    let dtype = std::env::args()
        .nth(1)
        .map(|name| {
            DType::ALL
                .into_iter()
                .find(|d| d.name() == name)
                .expect("a dtype name such as Q4_1")
        })
        .unwrap_or(DType::Q4_1);
    let arg = |i: usize| std::env::args().nth(i).filter(|a| a != "all");
    let isa_filter = arg(2);
    let t_filter: Option<usize> = arg(3).map(|s| s.parse().expect("t"));
    let threads_filter: Option<usize> = arg(4).map(|s| s.parse().expect("threads"));
    let numerics_filter = arg(5).map(|s| Numerics::from_name(&s).expect("exact or ggml"));
    // K-quants need k to be whole 256-blocks, so they run [1536 x 768] instead.
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1536);
    let k = std::env::var("BENCH_K")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if dtype.block_elems() == 256 { 768 } else { 576 });
    let w = weights(dtype, n, k);
    for threads in threads_filter.map_or(vec![1, 2], |t| vec![t]) {
        let pool = ThreadPool::new(threads).expect("pool");
        for isa in Isa::available() {
            if isa_filter
                .as_ref()
                .is_some_and(|f| *f != format!("{isa:?}"))
            {
                continue;
            }
            for (t, numerics) in t_filter
                .map_or(vec![1, 64], |t| vec![t])
                .into_iter()
                .flat_map(|t| [Numerics::Exact, Numerics::Ggml].map(|nu| (t, nu)))
            {
                if numerics_filter.is_some_and(|f| f != numerics) {
                    continue;
                }
                let x: Vec<f32> = (0..t * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
                let mut out = vec![0.0; t * n];
                // BENCH_COPIES distinct copies of the weights, used in turn, so that a matrix
                // smaller than the caches still streams from DRAM as in a decode step.
                let copies: usize = std::env::var("BENCH_COPIES")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1);
                let ws: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
                let repacked: Vec<_> = ws
                    .iter()
                    .filter_map(|w| {
                        std::env::var_os("BENCH_REPACK").and_then(|_| {
                            repack_for(numerics, isa, w, dtype, n, k).expect("repack")
                        })
                    })
                    .collect();
                let turn = std::cell::Cell::new(0usize);
                let run = |out: &mut [f32]| {
                    let i = turn.get();
                    turn.set((i + 1) % copies);
                    match repacked.get(i) {
                        Some(rp) => matmul_repacked(isa, &x, t, k, rp, out, &pool).expect("matmul"),
                        None => {
                            matmul_numerics(numerics, isa, &x, t, k, &ws[i], dtype, n, out, &pool)
                                .expect("matmul")
                        }
                    }
                };
                // A warm-up call.
                run(&mut out);
                // BENCH_GAP_US=g: the caller busy-waits g microseconds between calls
                // (untimed), as a decode step's serial ops leave the pool idle between its
                // matmuls.
                let gap = Duration::from_micros(
                    std::env::var("BENCH_GAP_US")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                );
                let (mut calls, start, cpu0) = (0u32, Instant::now(), cpu_ns());
                let mut gaps = Duration::ZERO;
                while start.elapsed() < Duration::from_millis(400) {
                    run(&mut out);
                    calls += 1;
                    if !gap.is_zero() {
                        let g0 = Instant::now();
                        while g0.elapsed() < gap {
                            std::hint::spin_loop();
                        }
                        gaps += g0.elapsed();
                    }
                }
                let per_call = (start.elapsed() - gaps).as_secs_f64() / f64::from(calls);
                let cpu_per_call = cpu0
                    .zip(cpu_ns())
                    .map(|(a, b)| (b - a) as f64 * 1e-9 / f64::from(calls));
                let gflops = 2.0 * (t * n * k) as f64 / per_call / 1e9;
                // On a shared machine the wall time includes time other processes held the
                // cores; on-CPU time per call divided by the threads is what an idle machine
                // would approach.
                let idle = cpu_per_call.map_or(String::new(), |c| {
                    let est = c / threads as f64;
                    format!(
                        " | on-CPU {:>8.1} us/call -> {:>6.1} GFLOP/s if idle",
                        c * 1e6,
                        2.0 * (t * n * k) as f64 / est / 1e9
                    )
                });
                println!(
                    "{dtype}{} [{t}x{k}]x[{n}x{k}] threads={threads} {isa:?} {:5} t={t:>2}: {:>8.1} us/call {gflops:>6.1} GFLOP/s \
                     {:>8.0} tok/s{idle}",
                    if repacked.is_empty() { "" } else { " r8" },
                    numerics.name(),
                    per_call * 1e6,
                    t as f64 / per_call
                );
            }
        }
    }
}
