use super::*;

#[test]
fn unary_kinds() {
    let x = [-2.0f32, -0.0, 0.5, f32::NAN];
    let mut out = [0f32; 4];
    unary(UnaryKind::Relu, &x, &mut out).unwrap();
    assert_eq!(&out[..3], &[0.0, -0.0, 0.5]);
    assert!(out[3].is_nan());
    unary(UnaryKind::Neg, &x[..3], &mut out[..3]).unwrap();
    assert_eq!(&out[..3], &[2.0, 0.0, -0.5]);
    unary(UnaryKind::Sigmoid, &[0.0], &mut out[..1]).unwrap();
    assert_eq!(out[0], 0.5);
    unary(UnaryKind::GeluErf, &[1.0], &mut out[..1]).unwrap();
    assert!((f64::from(out[0]) - 0.841_344_746_068_542_9).abs() < 1e-7);
    assert!(unary(UnaryKind::Exp, &x, &mut out[..2]).is_err());
    unary(UnaryKind::Step, &x, &mut out).unwrap();
    assert_eq!(out, [0.0, 0.0, 1.0, 0.0]);
    unary(UnaryKind::Log, &[1.0, 0.0], &mut out[..2]).unwrap();
    assert_eq!(&out[..2], &[0.0, f32::NEG_INFINITY]);
    // d/dx GELU(x) at 0 is 1/2; at 1 it is Phi(1) + phi(1) = 0.8413447 + 0.2419707.
    unary(UnaryKind::GeluErfGrad, &[0.0, 1.0], &mut out[..2]).unwrap();
    assert_eq!(out[0], 0.5);
    assert!((f64::from(out[1]) - 1.083_315_470_587_686).abs() < 1e-7);
}

#[test]
fn scalar_both_sides() {
    let mut out = [0f32; 2];
    scalar(BinaryKind::Sub, &[3.0, 1.0], 1.0, false, &mut out).unwrap();
    assert_eq!(out, [2.0, 0.0]);
    scalar(BinaryKind::Sub, &[3.0, 1.0], 1.0, true, &mut out).unwrap();
    assert_eq!(out, [-2.0, 0.0]);
    scalar(BinaryKind::Div, &[3.0, 1.0], 2.0, true, &mut out).unwrap();
    assert_eq!(out, [2.0 / 3.0, 2.0]);
}

#[test]
fn binary_broadcasts_like_numpy() {
    // a [2, 1, 3] - b [2, 1] -> [2, 2, 3]
    let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [10.0f32, 20.0];
    let mut out = [0f32; 12];
    binary(BinaryKind::Sub, &a, &[2, 1, 3], &b, &[2, 1], &mut out).unwrap();
    let want: Vec<f32> = (0..2)
        .flat_map(|i| (0..2).flat_map(move |j| (0..3).map(move |k| a[i * 3 + k] - b[j])))
        .collect();
    assert_eq!(out.to_vec(), want);
    // A scalar-shaped operand on the left.
    let mut out2 = [0f32; 6];
    binary(BinaryKind::Div, &[6.0], &[], &a, &[2, 3], &mut out2).unwrap();
    assert_eq!(out2[1], 3.0);
    assert!(binary(BinaryKind::Add, &a, &[2, 3], &b, &[2], &mut out2).is_err());
    assert!(binary(BinaryKind::Add, &a, &[2, 3], &a, &[2, 3], &mut out2[..5]).is_err());
}

#[test]
fn permute_matches_index_arithmetic() {
    let shape = [2, 3, 4];
    let x: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let mut out = vec![0f32; 24];
    permute(&x, &shape, &[2, 0, 1], &mut out).unwrap();
    for i in 0..4 {
        for j in 0..2 {
            for k in 0..3 {
                assert_eq!(out[(i * 2 + j) * 3 + k], x[(j * 3 + k) * 4 + i]);
            }
        }
    }
    assert!(permute(&x, &shape, &[0, 0, 1], &mut out).is_err());
}

#[test]
fn causal_mask_rectangular() {
    let mut x = vec![1.0f32; 2 * 3];
    causal_mask(&mut x, 2, 3).unwrap();
    let inf = f32::NEG_INFINITY;
    assert_eq!(x, [1.0, 1.0, inf, 1.0, 1.0, 1.0]);
    assert!(causal_mask(&mut x, 3, 2).is_err());
}

#[test]
fn reductions_over_rows() {
    let x = [1.0f32, 2.0, 4.0, -1.0, f32::NAN, 0.0];
    let mut out = [0f32; 2];
    reduce(ReduceKind::Sum, &x[..3], 3, &mut out[..1]).unwrap();
    assert_eq!(out[0], 7.0);
    reduce(ReduceKind::Mean, &x[..6], 3, &mut out).unwrap();
    assert_eq!(out[0], 7.0 / 3.0);
    assert!(out[1].is_nan());
    reduce(ReduceKind::Max, &x, 3, &mut out).unwrap();
    assert_eq!(out[0], 4.0);
    assert!(out[1].is_nan());
    assert!(reduce(ReduceKind::Max, &x, 4, &mut out).is_err());
    assert!(reduce(ReduceKind::Max, &x, 3, &mut out[..1]).is_err());
    let mut o = [0f32; 3];
    unary(UnaryKind::Rsqrt, &[4.0, 1.0, 0.25], &mut o).unwrap();
    assert_eq!(o, [0.5, 1.0, 2.0]);
}
