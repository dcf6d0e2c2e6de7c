//! Timing of allocate/free at several pool sizes (ignored by default; no wall-clock asserts).
//!
//! `cargo test --release -p poot-kv --test bench_pool -- --ignored --nocapture` prints ns per
//! operation; O(1) shows as a flat line across pool sizes.

use std::hint::black_box;
use std::time::Instant;

use poot_kv::{BlockId, BlockPool, BlockPoolConfig, BlockTable};

fn pool(num_blocks: usize, caching: bool) -> BlockPool {
    BlockPool::new(BlockPoolConfig {
        num_blocks,
        block_size: 16,
        enable_caching: caching,
        model_key: 1,
        layout: None,
    })
    .unwrap()
}

/// A cheap deterministic shuffle (xorshift), so frees land in the middle of the free list.
fn shuffle(v: &mut [BlockId], mut s: u64) {
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

#[test]
#[ignore = "timing; run with --ignored --nocapture"]
fn allocate_free_cost_is_flat_in_pool_size() {
    // Shuffled frees scatter the free list over memory: past the CPU caches (1M blocks) each
    // allocate then pays a cache miss, which is memory latency, not list length.
    for (n, shuffled) in [1usize << 10, 1 << 16, 1 << 20]
        .into_iter()
        .flat_map(|n| [(n, false), (n, true)])
    {
        let mut p = pool(n, false);
        let usable = p.num_usable_blocks();
        let rounds = (1usize << 22) / usable;
        let mut held = Vec::with_capacity(usable);
        let (mut t_alloc, mut t_free) = (0u128, 0u128);
        for r in 0..rounds.max(1) {
            let t0 = Instant::now();
            while let Some(b) = p.allocate() {
                held.push(b);
            }
            t_alloc += t0.elapsed().as_nanos();
            if shuffled {
                shuffle(&mut held, 0x9e37_79b9 + r as u64);
            }
            let t0 = Instant::now();
            for b in held.drain(..) {
                p.free(black_box(b)).unwrap();
            }
            t_free += t0.elapsed().as_nanos();
        }
        let ops = (rounds.max(1) * usable) as f64;
        println!(
            "pool {n:>8} blocks, {} frees: allocate {:.1} ns/op, free {:.1} ns/op",
            if shuffled { "shuffled" } else { "in-order" },
            t_alloc as f64 / ops,
            t_free as f64 / ops
        );
        assert_eq!(p.num_used_blocks(), 0);
    }
}

#[test]
#[ignore = "timing; run with --ignored --nocapture"]
fn prefix_hit_and_eviction_cost() {
    for &n in &[1usize << 10, 1 << 16, 1 << 20] {
        let mut p = pool(n, true);
        // Fill the cache with 64-block sequences, then free them (all cached, all free).
        let seq_blocks = 64;
        let seqs = p.num_usable_blocks() / seq_blocks;
        let prompts: Vec<Vec<u32>> = (0..seqs)
            .map(|s| {
                (0..(seq_blocks * 16) as u32)
                    .map(|t| t ^ (s as u32) << 12)
                    .collect()
            })
            .collect();
        for prompt in &prompts {
            let mut t = BlockTable::new(16);
            t.append_tokens(&mut p, prompt).unwrap();
            t.free(&mut p).unwrap();
        }
        let t0 = Instant::now();
        let mut tables = Vec::new();
        for prompt in prompts.iter().step_by(2) {
            tables.push(BlockTable::from_cached_prefix(&mut p, prompt));
        }
        let hit_ns = t0.elapsed().as_nanos() as f64 / (tables.len() * seq_blocks) as f64;
        // Every allocation now evicts a cached block.
        let t0 = Instant::now();
        let mut evicted = 0usize;
        while let Some(b) = p.allocate() {
            black_box(b);
            evicted += 1;
        }
        let evict_ns = t0.elapsed().as_nanos() as f64 / evicted.max(1) as f64;
        println!("pool {n:>8} blocks: prefix hit {hit_ns:.1} ns/block (16-token hash + compare), allocate+evict {evict_ns:.1} ns/op");
    }
}
