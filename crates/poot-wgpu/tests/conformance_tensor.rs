//! The general tensor ops of lowered torch graphs on wgpu against the CPU runtime:
//! `|wgpu - cpu| <= atol + rtol * |cpu|` elementwise, each case with its bound.
//!
//! Bounds and why: permutes and the causal mask move values (exact); broadcasting binaries are
//! one f32 operation (exact); batched matmuls sum K products in the same order but a shader may
//! fuse a multiply-add (1e-5 on outputs of size ~K); layer norm and reductions sum in f32 on
//! the device and in f64 on the CPU (1e-5); shader exp/tanh/sqrt differ from the CPU's libm by
//! ulps and GELU's erf is a polynomial (2e-6 absolute plus 1e-6 relative).
mod common;

use common::compare::{compare, f32s, open};
use common::{packed, Rng, Store};
use poot_core::DType;
use poot_graph::{BinaryKind, ReduceKind, UnaryKind};
use poot_wgpu::WgpuOptions;

/// The IR's `unary` kinds and `scalar` ops (eltwise.wgsl codes 6.. and 32..): shader exp,
/// tanh and sqrt differ from the CPU's libm by ulps, GELU's erf is a polynomial (1.5e-7
/// absolute), so 2e-6 absolute plus 1e-6 relative.
#[test]
fn unary_and_scalar_ops() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(12);
    let (t, d) = (3, 70);
    let x = f32s(vec![t, d], rng.vec(t * d).iter().map(|v| 4.0 * v).collect());
    compare(
        &rt,
        "unary/scalar",
        Store::default(),
        t,
        |tr| {
            let x = tr.input("x", DType::F32, vec![t, d]).unwrap();
            let a = tr.unary(x, UnaryKind::Abs).unwrap();
            let mut outs: Vec<(&'static str, _)> = UnaryKind::ALL
                .iter()
                .map(|&k| {
                    // sqrt, rsqrt and log of |x| (NaN for negatives compares unequal).
                    let on = if matches!(k, UnaryKind::Sqrt | UnaryKind::Rsqrt | UnaryKind::Log) {
                        a
                    } else {
                        x
                    };
                    (k.name(), tr.unary(on, k).unwrap())
                })
                .collect();
            for k in BinaryKind::ALL {
                outs.push((k.scalar_name(), tr.scalar(x, k, 1.75, false).unwrap()));
                let r = tr.scalar(x, k, -0.5, true).unwrap();
                outs.push((k.binary_name(), r));
            }
            outs
        },
        &[("x", x)],
        (2e-6, 1e-6),
    );
}

#[test]
fn broadcasts_permutes_and_the_causal_mask_are_exact() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(13);
    let mut s = Store::default();
    s.add(
        "w",
        DType::BF16,
        vec![1, 5, 1],
        packed(DType::BF16, 1, 5, &mut rng),
    );
    let x = f32s(vec![2, 5, 6], rng.vec(60));
    let y = f32s(vec![5, 1], rng.vec(5));
    compare(
        &rt,
        "strided",
        s,
        1,
        |tr| {
            let x = tr.input("x", DType::F32, vec![2, 5, 6]).unwrap();
            let y = tr.input("y", DType::F32, vec![5, 1]).unwrap();
            let w = tr.weight("w").unwrap();
            let mut outs = vec![];
            for k in BinaryKind::ALL {
                outs.push((k.binary_name(), tr.binary(x, y, k).unwrap()));
            }
            outs.push(("weight_left", tr.binary(w, x, BinaryKind::Sub).unwrap()));
            outs.push(("permute", tr.permute(x, vec![2, 0, 1]).unwrap()));
            let sq = tr.slice(x, 2, 0, 5).unwrap();
            outs.push(("causal_square", tr.causal_mask(sq).unwrap()));
            let wide = tr.permute(x, vec![0, 2, 1]).unwrap();
            let wide = tr.slice(wide, 1, 2, 6).unwrap();
            outs.push(("causal_wide", tr.causal_mask(wide).unwrap()));
            outs
        },
        &[("x", x), ("y", y)],
        (0.0, 0.0),
    );
}

#[test]
fn batch_matmul_layer_norm_and_reductions() {
    let Some(rt) = open(WgpuOptions::default()) else {
        return;
    };
    let mut rng = Rng(14);
    let (k, d) = (24, 40);
    let mut s = Store::default();
    s.add(
        "wb",
        DType::F32,
        vec![k, 9],
        packed(DType::F32, k, 9, &mut rng),
    );
    s.add("g", DType::F16, vec![d], packed(DType::F16, 1, d, &mut rng));
    s.add("b", DType::F32, vec![d], packed(DType::F32, 1, d, &mut rng));
    let a = f32s(vec![2, 3, 4, k], rng.vec(2 * 3 * 4 * k));
    let bm = f32s(vec![3, k, 7], rng.vec(3 * k * 7));
    let x = f32s(
        vec![3, d],
        rng.vec(3 * d).iter().map(|v| 3.0 * v + 1.0).collect(),
    );
    compare(
        &rt,
        "bmm/layer_norm/reduce",
        s,
        1,
        |tr| {
            let a = tr.input("a", DType::F32, vec![2, 3, 4, k]).unwrap();
            let bm = tr.input("bm", DType::F32, vec![3, k, 7]).unwrap();
            let x = tr.input("x", DType::F32, vec![3, d]).unwrap();
            let wb = tr.weight("wb").unwrap();
            let (g, b) = (tr.weight("g").unwrap(), tr.weight("b").unwrap());
            let mut outs = vec![
                ("bmm_broadcast", tr.batch_matmul(a, bm).unwrap()),
                ("bmm_weight", tr.batch_matmul(a, wb).unwrap()),
                (
                    "ln_affine",
                    tr.layer_norm(x, Some(g), Some(b), 1e-5).unwrap(),
                ),
                ("ln_plain", tr.layer_norm(x, None, None, 1e-5).unwrap()),
            ];
            for kind in ReduceKind::ALL {
                outs.push((kind.name(), tr.reduce(x, kind).unwrap()));
            }
            outs
        },
        &[("a", a), ("bm", bm), ("x", x)],
        (1e-5, 1e-5),
    );
}
