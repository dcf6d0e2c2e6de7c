//! One decode token's ggml paged attention at Llama-3.2-1B's head shape (32 query heads, 8 KV
//! heads, head_dim 64, f16 cache), one thread: on-CPU microseconds per call at a few context
//! lengths (`BENCH_CTX=64,128`: others). `cargo run --release -p poot-cpu --example attn_bench`; `BENCH_T=512` runs a
//! 512-token prefill step instead (positions 0..512, causal), on-CPU ms per call; `BENCH_COLD=1`
//! evicts the caches between calls, as a decode step does.
use half::f16;
use poot_cpu::kernels::{
    paged_attention_numerics, AttentionInputs, AttentionShape, KvCacheMut, Numerics,
};
use poot_cpu::ThreadPool;

/// This thread's on-CPU nanoseconds.
fn cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    stat.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    // BENCH_HEADS / BENCH_KV_HEADS / BENCH_HD / BENCH_THREADS: another head shape (SmolLM2: 9 / 3,
    // head_dim 64).
    let (nh, nkv, hd, bs) = (
        env("BENCH_HEADS", 32),
        env("BENCH_KV_HEADS", 8),
        env("BENCH_HD", 64),
        16,
    );
    let pool = ThreadPool::new(env("BENCH_THREADS", 1)).unwrap();
    // BENCH_WALL=1: wall-clock time instead (with more than one thread, the caller's on-CPU
    // time leaves out the others' work).
    let now: fn() -> u64 = if env("BENCH_WALL", 0) != 0 {
        wall_ns
    } else {
        cpu_ns
    };
    // BENCH_CTX=a,b,..: other context lengths.
    let ctxs: Vec<usize> = std::env::var("BENCH_CTX")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 256, 1024]);
    for ctx in ctxs {
        // A prefill step of `t` tokens at positions 0..t, or one decode token at ctx - 1.
        let t: usize = std::env::var("BENCH_T")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (t, ctx) = if t > 0 { (t, t) } else { (1, ctx) };
        let nblocks = ctx.div_ceil(bs) + 1;
        let shape = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            num_blocks: nblocks,
            max_blocks_per_seq: nblocks,
            scale: 0.125,
        };
        let cells = nblocks * bs * nkv * hd;
        let mut kc: Vec<f16> = (0..cells)
            .map(|i| f16::from_f32(((i % 13) as f32 - 6.0) / 7.0))
            .collect();
        let mut vc = kc.clone();
        let q: Vec<f32> = (0..t * nh * hd)
            .map(|i| ((i % 11) as f32 - 5.0) / 5.0)
            .collect();
        let kv: Vec<f32> = (0..t * nkv * hd)
            .map(|i| ((i % 7) as f32 - 3.0) / 3.0)
            .collect();
        let table: Vec<i32> = (0..nblocks as i32).collect();
        let pos: Vec<i32> = if t > 1 {
            (0..t as i32).collect()
        } else {
            vec![ctx as i32 - 1]
        };
        let seqs = vec![0i32; t];
        let inputs = AttentionInputs {
            q: &q,
            k: &kv,
            v: &kv,
            slot_mapping: &pos,
            token_seq: &seqs,
            positions: &pos,
            block_tables: &table,
        };
        let mut out = vec![0f32; t * nh * hd];
        let mut run = || {
            let c = KvCacheMut {
                k: &mut kc,
                v: &mut vc,
            };
            paged_attention_numerics(Numerics::Ggml, &shape, &inputs, c, &mut out, &pool).unwrap();
        };
        run();
        // BENCH_COLD=1: stream 64 MiB between calls (untimed), as a decode step's weights
        // evict the KV cache between one layer's attention calls.
        let cold = env("BENCH_COLD", 0) != 0;
        let mut evict = if cold {
            vec![1u8; 64 << 20]
        } else {
            Vec::new()
        };
        let (n, mut spent) = (
            if t > 1 {
                5
            } else if cold {
                100
            } else {
                400
            },
            0u64,
        );
        for i in 0..n {
            if cold {
                for x in evict.iter_mut().step_by(64) {
                    *x = x.wrapping_add(i as u8);
                }
            }
            let t0 = now();
            run();
            spent += now() - t0;
        }
        std::hint::black_box(&evict);
        println!(
            "ctx {ctx:>5}: {:>8.1} us/call {}",
            spent as f64 / 1e3 / n as f64,
            if env("BENCH_WALL", 0) != 0 {
                "wall"
            } else {
                "on-CPU"
            }
        );
    }
}

/// Nanoseconds since the first call (wall clock: with more than one thread, on-CPU time of
/// the caller alone says little).
fn wall_ns() -> u64 {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}
