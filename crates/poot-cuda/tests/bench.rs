//! Matvec bandwidth on the GPU (run explicitly: `cargo test -p poot-cuda --release --test
//! bench -- --ignored --nocapture`): device time per matmul of `t` tokens, from CUDA events
//! over 200 replays, the weight bytes read per second (one token) and the multiply-adds per
//! second. Not a pass/fail test: it prints.
mod common;

use std::sync::Arc;

use common::{packed, Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, Runtime};

#[test]
#[ignore = "a benchmark: run with --ignored on a GPU"]
fn matvec_bandwidth() {
    let Some(rt) = common::gpu_runtime() else {
        return;
    };
    let mut rng = Rng(1);
    println!("device: {:?}", rt.device());
    println!(
        "{:<6} {:>4} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8}",
        "dtype", "t", "n", "k", "MB", "us", "GB/s", "GMAC/s"
    );
    let shapes = [
        (1536, 576),
        (576, 1536),
        (49152, 576),
        (4096, 4096),
        (14336, 4096),
        (4096, 14336),
    ];
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::F16] {
        for (n, k, tokens) in shapes
            .iter()
            .map(|&(n, k)| (n, k, 1))
            .chain([(4096, 4096, 8), (4096, 4096, 64)])
        {
            let w = packed(dtype, n, k, &mut rng);
            let bytes = w.len();
            let mut s = Store::default();
            s.add("w", dtype, vec![n, k], w);
            let s = Arc::new(s);
            let cat: Arc<dyn WeightCatalog> = s.clone();
            let mut t = Tracer::new(TraceLimits::default(), tokens, cat).unwrap();
            let x = t.input("x", DType::F32, vec![tokens, k]).unwrap();
            let wv = t.weight("w").unwrap();
            let y = t.matmul(x, wv).unwrap();
            t.output("y", y).unwrap();
            let p = rt
                .prepare(&t.finish(), s.clone(), &CompileLimits::default())
                .unwrap();
            let xs = [(
                "x",
                HostTensor::F32 {
                    shape: vec![tokens, k],
                    data: rng.vec(tokens * k),
                },
            )];
            let secs = rt
                .time_plan(p.as_ref(), &xs, 200, Deadline::default_device())
                .unwrap();
            let read = bytes + 4 * tokens * (k + n);
            println!(
                "{:<6} {:>4} {:>6} {:>6} {:>10.2} {:>10.2} {:>8.0} {:>8.0}",
                dtype.to_string(),
                tokens,
                n,
                k,
                bytes as f64 / 1e6,
                secs * 1e6,
                read as f64 / secs / 1e9,
                (tokens * n * k) as f64 / secs / 1e9
            );
        }
    }
}
