//! Cost of one pool broadcast with nothing to do, back to back:
//! `cargo run --release -p poot-cpu --example pool_bench [threads]`.
use std::time::Instant;

fn main() {
    let threads = std::env::args()
        .nth(1)
        .map_or(2, |s| s.parse().expect("threads"));
    let pool = poot_cpu::ThreadPool::new(threads).expect("pool");
    for round in 0..3 {
        let n = 200_000;
        let start = Instant::now();
        for _ in 0..n {
            pool.broadcast(|i| {
                std::hint::black_box(i);
            });
        }
        let per = start.elapsed().as_secs_f64() / n as f64;
        println!(
            "round {round}: {:.2} us per broadcast ({threads} threads)",
            per * 1e6
        );
    }
}
