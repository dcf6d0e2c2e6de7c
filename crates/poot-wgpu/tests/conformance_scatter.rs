//! `scatter_add_rows` (an embedding table's gradient) on wgpu against the CPU runtime: equal
//! bit for bit (both add each row's values in order of the ids, from 0.0), and host ids out
//! of range refused on the host as the CPU refuses them.
mod common;

use std::sync::Arc;

use common::compare::{compare, f32s, i32s, open};
use common::{Rng, Store};
use poot_core::{DType, Deadline};
use poot_graph::{CompileLimits, TraceLimits, Tracer, WeightCatalog};
use poot_runtime::{Runtime, RuntimeError};
use poot_wgpu::WgpuOptions;

#[test]
fn scatter_add_rows_equals_the_cpu_exactly() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(31);
    let (t, d, rows) = (37, 13, 11);
    // Magnitudes from 1e-3 to 1e4: the f32 sum of a row's values depends on their order.
    let src: Vec<f32> = rng
        .vec(t * d)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 10f32.powi((i % 8) as i32 - 3))
        .collect();
    // Repeats in no order, and rows 1 and 10 never named (they stay 0).
    let ids: Vec<i32> = (0..t)
        .map(|i| [0, 2, 9, 3, 2, 5, 7, 2, 4, 6, 8, 0][(i * 7) % 12])
        .collect();
    compare(
        &rt,
        "scatter_add_rows",
        Store::default(),
        t,
        |tr| {
            let src = tr.input("src", DType::F32, vec![t, d]).unwrap();
            let ids = tr.input("ids", DType::I32, vec![t]).unwrap();
            vec![("y", tr.scatter_add_rows(src, ids, rows).unwrap())]
        },
        &[("src", f32s(vec![t, d], src)), ("ids", i32s(vec![t], ids))],
        (0.0, 0.0),
    );
}

#[test]
fn host_ids_out_of_range_are_refused_on_the_host() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let store = Arc::new(Store::default());
    let cat: Arc<dyn WeightCatalog> = store.clone();
    let mut tr = Tracer::new(TraceLimits::default(), 4, cat).unwrap();
    let src = tr.input("src", DType::F32, vec![4, 3]).unwrap();
    let ids = tr.input("ids", DType::I32, vec![2, 2]).unwrap();
    // Through a reshape, as a lowered embedding's ids arrive.
    let flat = tr.reshape(ids, vec![4]).unwrap();
    let y = tr.scatter_add_rows(src, flat, 5).unwrap();
    tr.output("y", y).unwrap();
    let g = tr.finish();
    let plan = rt.prepare(&g, store, &CompileLimits::default()).unwrap();
    let run = |idv: Vec<i32>| {
        rt.run(
            plan.as_ref(),
            &[
                ("src", f32s(vec![4, 3], vec![0.5; 12])),
                ("ids", i32s(vec![2, 2], idv)),
            ],
            Deadline::default_device(),
        )
    };
    for bad in [vec![0, 5, 1, 2], vec![0, 1, -1, 2]] {
        let err = run(bad).unwrap_err();
        assert!(
            matches!(
                &err,
                RuntimeError::Kernel {
                    op: "scatter_add_rows",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // Not poisoned: the next run works, and repeated ids add.
    let out = run(vec![4, 4, 0, 4]).unwrap();
    let poot_runtime::HostTensor::F32 { shape, data } = &out[0].1 else {
        panic!("f32 output")
    };
    assert_eq!(shape, &[5, 3]);
    assert_eq!(&data[..3], &[0.5; 3]);
    assert_eq!(&data[12..], &[1.5; 3]);
    assert!(data[3..12].iter().all(|&v| v == 0.0));
}
