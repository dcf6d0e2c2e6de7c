//! General tensor kernels for lowered `torch.export` graphs: elementwise functions, numpy
//! broadcasting arithmetic, scalar arithmetic, permutes and the causal mask.
//!
//! Numerics: every result is one IEEE f32 operation per element (`relu`, `neg`, the binary and
//! scalar ops, `step`: exact as f32 arithmetic, the same bits as torch's CPU kernels), or the
//! f32 libm function (`tanh`, `exp`, `log`, `sigmoid = 1 / (1 + exp(-x))`: within a few ulp),
//! or the exact GELU of `act::gelu_erf_f32` and its derivative `act::gelu_erf_grad_f32`
//! (within 1 ulp). Permute and the mask move values without arithmetic.
//!
//! Shapes are checked before anything is written (`KernelError`), and no kernel allocates
//! beyond a few index vectors of the tensors' rank. Cost: O(output elements).

use crate::error::check_len;
use crate::kernels::act::{gelu_erf_f32, gelu_erf_grad_f32};
use crate::KernelError;
use poot_graph::{broadcast_shape, BinaryKind, ReduceKind, UnaryKind};

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// `out[i] = kind(x[i])`.
pub fn unary(kind: UnaryKind, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("unary out", x.len(), out.len())?;
    let f: fn(f32) -> f32 = match kind {
        // NaN stays NaN (torch's relu propagates it; `max` would not).
        UnaryKind::Relu => |v| if v < 0.0 { 0.0 } else { v },
        UnaryKind::GeluErf => gelu_erf_f32,
        UnaryKind::Tanh => f32::tanh,
        UnaryKind::Sigmoid => |v| 1.0 / (1.0 + (-v).exp()),
        UnaryKind::Neg => |v| -v,
        UnaryKind::Exp => f32::exp,
        UnaryKind::Sqrt => f32::sqrt,
        UnaryKind::Rsqrt => |v| 1.0 / v.sqrt(),
        UnaryKind::Abs => f32::abs,
        UnaryKind::Log => f32::ln,
        UnaryKind::Step => |v| if v > 0.0 { 1.0 } else { 0.0 },
        UnaryKind::GeluErfGrad => gelu_erf_grad_f32,
    };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
    Ok(())
}

/// `out[i] = x[i] kind value`, or `value kind x[i]` when `reverse`.
pub fn scalar(
    kind: BinaryKind,
    x: &[f32],
    value: f32,
    reverse: bool,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len("scalar out", x.len(), out.len())?;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = if reverse {
            kind.apply(value, v)
        } else {
            kind.apply(v, value)
        };
    }
    Ok(())
}

/// Row-major strides of `shape` aligned to `rank` axes at the right, 0 on a broadcast axis.
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let rank = out.len();
    let mut strides = vec![0; rank];
    let mut step = 1;
    for i in (0..shape.len()).rev() {
        let axis = rank - shape.len() + i;
        strides[axis] = if shape[i] == 1 && out[axis] != 1 {
            0
        } else {
            step
        };
        step *= shape[i];
    }
    strides
}

/// Calls `f(out_index, a_index, b_index)` for every element of `out_shape` in row-major order.
fn walk2(out_shape: &[usize], sa: &[usize], sb: &[usize], mut f: impl FnMut(usize, usize, usize)) {
    let n = numel(out_shape);
    let rank = out_shape.len();
    if rank == 0 {
        if n == 1 {
            f(0, 0, 0);
        }
        return;
    }
    let inner = out_shape[rank - 1];
    let (ia_step, ib_step) = (sa[rank - 1], sb[rank - 1]);
    let mut idx = vec![0usize; rank];
    let (mut ia, mut ib, mut o) = (0usize, 0usize, 0usize);
    while o < n {
        for j in 0..inner {
            f(o + j, ia + j * ia_step, ib + j * ib_step);
        }
        o += inner;
        // Advance the outer index like an odometer, keeping the operands' offsets.
        let mut axis = rank - 1;
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            ia += sa[axis];
            ib += sb[axis];
            if idx[axis] < out_shape[axis] {
                break;
            }
            ia -= sa[axis] * idx[axis];
            ib -= sb[axis] * idx[axis];
            idx[axis] = 0;
        }
    }
}

/// `out = a kind b` with numpy broadcasting; `out` has the broadcast shape.
pub fn binary(
    kind: BinaryKind,
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len("binary a", numel(sa), a.len())?;
    check_len("binary b", numel(sb), b.len())?;
    let so = broadcast_shape(sa, sb).ok_or_else(|| KernelError::InvalidArgument {
        what: "binary",
        detail: format!("{sa:?} and {sb:?} do not broadcast"),
    })?;
    check_len("binary out", numel(&so), out.len())?;
    if sa == sb {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = kind.apply(x, y);
        }
        return Ok(());
    }
    let (ta, tb) = (broadcast_strides(sa, &so), broadcast_strides(sb, &so));
    walk2(&so, &ta, &tb, |o, i, j| out[o] = kind.apply(a[i], b[j]));
    Ok(())
}

/// `out` = `x` (shape `shape`) with its axes reordered: output axis `i` is input axis `perm[i]`.
pub fn permute(
    x: &[f32],
    shape: &[usize],
    perm: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len("permute x", numel(shape), x.len())?;
    check_len("permute out", x.len(), out.len())?;
    let mut seen = vec![false; shape.len()];
    if perm.len() != shape.len()
        || !perm
            .iter()
            .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true))
    {
        return Err(KernelError::InvalidArgument {
            what: "permute",
            detail: format!("{perm:?} for shape {shape:?}"),
        });
    }
    let in_strides = broadcast_strides(shape, shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let zero = vec![0; out_shape.len()];
    walk2(&out_shape, &src, &zero, |o, i, _| out[o] = x[i]);
    Ok(())
}

/// `kind` over each row of `d` values of `x` into `out` (one value per row). Sum and mean
/// accumulate in `f64` and round once (mean: the `f64` sum divided by `d`), so they are within
/// 1 ulp of exact; max is exact (a NaN anywhere gives NaN, as torch's `amax`).
pub fn reduce(kind: ReduceKind, x: &[f32], d: usize, out: &mut [f32]) -> Result<(), KernelError> {
    if d == 0 || !x.len().is_multiple_of(d) {
        return Err(KernelError::InvalidArgument {
            what: "reduce d",
            detail: format!("{} values are not rows of {d}", x.len()),
        });
    }
    check_len("reduce out", x.len() / d, out.len())?;
    for (row, o) in x.chunks_exact(d).zip(out.iter_mut()) {
        *o = match kind {
            ReduceKind::Sum => row.iter().map(|&v| f64::from(v)).sum::<f64>() as f32,
            ReduceKind::Mean => (row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64) as f32,
            ReduceKind::Max => row.iter().copied().fold(f32::NEG_INFINITY, |m, v| {
                if v.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    m.max(v)
                }
            }),
        };
    }
    Ok(())
}

/// In place over the last two dims [m, n] of `x`: (i, j) becomes -inf where `j > i + n - m`.
pub fn causal_mask(x: &mut [f32], m: usize, n: usize) -> Result<(), KernelError> {
    let plane = m * n;
    if plane == 0 || !x.len().is_multiple_of(plane) || m > n {
        return Err(KernelError::InvalidArgument {
            what: "causal_mask",
            detail: format!("{} values as [.., {m}, {n}] (needs m <= n)", x.len()),
        });
    }
    for p in x.chunks_exact_mut(plane) {
        for (i, row) in p.chunks_exact_mut(n).enumerate() {
            row[i + n - m + 1..]
                .iter_mut()
                .for_each(|v| *v = f32::NEG_INFINITY);
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "tensor_tests.rs"]
mod tests;
