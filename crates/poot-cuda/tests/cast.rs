//! Casts of stored float weights on CUDA: `cast_f32` over every 16-bit pattern (F16 and BF16)
//! and a spread of F32 words, bit for bit against the exact reference decoder (NaNs compared
//! as NaN), on the CPU shim; and a graph on the runtime (the CPU emulation of the driver where
//! no GPU exists) whose half matrix cast is fused into the matmul and whose half vector cast
//! runs as its own kernel, against the CPU runtime.
mod common;

use std::sync::Arc;

use common::{Rng, Store};
use poot_core::{dequantize, DType, Deadline};
use poot_cpu::{CpuOptions, CpuRuntime};
use poot_cuda::ops;
use poot_cuda::shim::Shim;
use poot_graph::{CompileLimits, Op, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{HostTensor, Runtime};

fn same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else {
            a.to_bits() == b.to_bits()
        };
        assert!(ok, "{what} [{i}]: {a:e} ({:#x}) vs {b:e}", a.to_bits());
    }
}

#[test]
fn cast_f32_decodes_every_half_pattern_exactly() {
    let s = match Shim::get() {
        Ok(s) => s,
        Err(e) if e.starts_with("running") => {
            eprintln!("SKIP: no host C++ compiler for the CUDA shim ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let halves: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let mut rng = Rng(5);
    let mut words: Vec<u8> = Vec::new();
    for i in 0..4099u32 {
        // Random words, with the extremes (zeros, subnormals, infinities) in among them.
        let w = match i % 7 {
            0 => rng.next_u32() & 0x807f_ffff,
            1 => (rng.next_u32() & 0x8000_0000) | 0x7f80_0000,
            _ => rng.next_u32(),
        };
        words.extend(w.to_le_bytes());
    }
    for (dtype, bytes) in [
        (DType::F16, &halves),
        (DType::BF16, &halves),
        (DType::F32, &words),
    ] {
        let n = bytes.len() / if dtype == DType::F32 { 4 } else { 2 };
        let mut got = vec![0.0f32; n];
        let l = ops::cast(
            bytes.as_ptr() as u64,
            dtype,
            got.as_mut_ptr() as u64,
            n as u64,
        );
        // SAFETY: `bytes` holds n words of `dtype` and `got` n floats, as the launch reads.
        unsafe { s.launch(&l) }.unwrap();
        let mut want = vec![0.0f32; n];
        dequantize(dtype, bytes, &mut want).unwrap();
        same_bits(&got, &want, &format!("{dtype}"));
    }
}

#[test]
fn a_half_matrix_cast_is_fused_and_a_vector_cast_runs() {
    let Some(rt) = common::runtime() else { return };
    let (n, k, t) = (67, 96, 3);
    let mut rng = Rng(9);
    let half = |v: Vec<f32>| -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    };
    let mut s = Store::default();
    s.add("w", DType::F16, vec![n, k], half(rng.vec(n * k)));
    s.add("b", DType::F16, vec![n], half(rng.vec(n)));
    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut tr = Tracer::new(TraceLimits::default(), t, cat).unwrap();
    let x = tr.input("x", DType::F32, vec![t, k]).unwrap();
    let w = tr.weight("w").unwrap();
    let b = tr.weight("b").unwrap();
    let y = tr.matmul(x, w).unwrap();
    let y = tr.add(y, b).unwrap();
    tr.output("y", y).unwrap();
    let g = tr.finish();
    let casts = |g: &poot_graph::Graph| {
        g.equations
            .iter()
            .filter(|op| matches!(op, Op::Cast { .. }))
            .count()
    };
    assert_eq!(
        casts(&g),
        2,
        "the tracer reads both half weights through a cast"
    );
    let lim = CompileLimits::default();
    let plan = rt.prepare(&g, s.clone(), &lim).unwrap();
    // The matmul decodes F16 itself; add_f32 takes f32, so the bias's cast stays.
    assert_eq!(casts(plan.graph()), 1);
    let inputs = [(
        "x",
        HostTensor::F32 {
            shape: vec![t, k],
            data: rng.vec(t * k),
        },
    )];
    let got = rt
        .run(plan.as_ref(), &inputs, Deadline::default_device())
        .unwrap();
    let cpu = CpuRuntime::new(CpuOptions {
        threads: 1,
        ..CpuOptions::default()
    })
    .unwrap();
    let pc = cpu.prepare(&g, s.clone(), &lim).unwrap();
    assert_eq!(casts(pc.graph()), 0, "the CPU fuses both");
    let want = cpu.run(pc.as_ref(), &inputs, Deadline::never()).unwrap();
    let (HostTensor::F32 { data: a, .. }, HostTensor::F32 { data: c, .. }) =
        (&got[0].1, &want[0].1)
    else {
        panic!("f32 outputs expected");
    };
    // Each output is a 96-term dot plus an exactly decoded bias: the matmul's own bound.
    for (i, (a, c)) in a.iter().zip(c).enumerate() {
        assert!(
            (a - c).abs() <= 1e-4 * c.abs().max(1.0),
            "[{i}]: {a} vs {c}"
        );
    }
}
