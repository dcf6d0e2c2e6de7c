//! Matvec bandwidth on the GPU (run explicitly: `cargo test -p poot-cuda --release --test
//! bench -- --ignored --nocapture`): device time per one-token matmul, from CUDA events over
//! 200 replays, and the weight bytes read per second. Not a pass/fail test: it prints.
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
        "{:<6} {:>6} {:>6} {:>10} {:>10} {:>8}",
        "dtype", "n", "k", "MB", "us", "GB/s"
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
        for (n, k) in shapes {
            let w = packed(dtype, n, k, &mut rng);
            let bytes = w.len();
            let mut s = Store::default();
            s.add("w", dtype, vec![n, k], w);
            let s = Arc::new(s);
            let cat: Arc<dyn WeightCatalog> = s.clone();
            let mut t = Tracer::new(TraceLimits::default(), 1, cat).unwrap();
            let x = t.input("x", DType::F32, vec![1, k]).unwrap();
            let wv = t.weight("w").unwrap();
            let y = t.matmul(x, wv).unwrap();
            t.output("y", y).unwrap();
            let p = rt
                .prepare(&t.finish(), s.clone(), &CompileLimits::default())
                .unwrap();
            let xs = [(
                "x",
                HostTensor::F32 {
                    shape: vec![1, k],
                    data: rng.vec(k),
                },
            )];
            let secs = rt
                .time_plan(p.as_ref(), &xs, 200, Deadline::default_device())
                .unwrap();
            let read = bytes + 4 * k + 4 * n;
            println!(
                "{:<6} {:>6} {:>6} {:>10.2} {:>10.2} {:>8.0}",
                dtype.to_string(),
                n,
                k,
                bytes as f64 / 1e6,
                secs * 1e6,
                read as f64 / secs / 1e9
            );
        }
    }
}
