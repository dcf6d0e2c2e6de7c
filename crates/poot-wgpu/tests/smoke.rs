//! The smallest graph end to end: matmul + bias on the device equals the arithmetic.
mod common;

use std::sync::Arc;

use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{Health, HostTensor, Runtime};
use poot_wgpu::WgpuOptions;

#[test]
fn runs_a_linear_layer() {
    let Some(rt) = common::runtime(WgpuOptions::default()) else {
        return;
    };
    let mut s = common::Store::default();
    let w: Vec<u8> = [1f32, 2., 3., 4., 5., 6.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let b: Vec<u8> = [0.5f32, -1., 2.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    s.add("w", DType::F32, vec![3, 2], w);
    s.add("b", DType::F32, vec![3], b);
    let s = Arc::new(s);
    let cat: Arc<dyn WeightCatalog> = s.clone();
    let mut t = Tracer::new(TraceLimits::default(), 2, cat).unwrap();
    let x = t.input("x", DType::F32, vec![2, 2]).unwrap();
    let w = t.weight("w").unwrap();
    let b = t.weight("b").unwrap();
    let y = t.matmul(x, w).unwrap();
    let y = t.add(y, b).unwrap();
    t.output("y", y).unwrap();
    let g = t.finish();
    let plan = rt.prepare(&g, s, &CompileLimits::default()).unwrap();
    let x = HostTensor::F32 {
        shape: vec![2, 2],
        data: vec![1., 0., 0., 1.],
    };
    let out = rt
        .run(plan.as_ref(), &[("x", x)], Deadline::default_device())
        .unwrap();
    assert_eq!(
        out[0].1,
        HostTensor::F32 {
            shape: vec![2, 3],
            data: vec![1.5, 2., 7., 2.5, 3., 8.]
        }
    );
    assert_eq!(rt.health(), Health::Ok);
    eprintln!("adapter: {:?}, f16: {}", rt.adapter(), rt.has_f16());
}
