//! Batched matmul of two f32 tensors (`a` [.., M, K] times `b` [.., K, N]), batch dims
//! broadcast numpy's way; what attention written as `q @ k.transpose(-2, -1)` lowers to.
//!
//! Numerics: each output is a sum over `k` in increasing order, one f32 FMA-free multiply and
//! add per term (the i-k-j loop; vectorizes along `n`). Its error against exact arithmetic is
//! the f32 sequential-sum bound, `K * 2^-24 * sum |a_ik b_kj|` (asserted in the tests); BLAS
//! sums in another order, so results differ from torch's by that bound, not bit for bit.
//! Cost: O(batch * M * K * N), no allocation beyond the batch index vectors.

use crate::error::check_len;
use crate::KernelError;
use poot_graph::broadcast_shape;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of a batch shape aligned at the right of `out`, 0 on a broadcast axis.
fn strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let mut s = vec![0; out.len()];
    let mut step = 1;
    for i in (0..shape.len()).rev() {
        let axis = out.len() - shape.len() + i;
        s[axis] = if shape[i] == 1 { 0 } else { step };
        step *= shape[i];
    }
    s
}

/// `out = a @ b` (see the module docs); `sa`, `sb` have rank >= 2.
pub fn batch_matmul(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let bad = || KernelError::InvalidArgument {
        what: "batch_matmul",
        detail: format!("a {sa:?} times b {sb:?}"),
    };
    let (ra, rb) = (sa.len(), sb.len());
    if ra < 2 || rb < 2 || sa[ra - 1] != sb[rb - 2] {
        return Err(bad());
    }
    check_len("batch_matmul a", numel(sa), a.len())?;
    check_len("batch_matmul b", numel(sb), b.len())?;
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let batch = broadcast_shape(&sa[..ra - 2], &sb[..rb - 2]).ok_or_else(bad)?;
    let nb = numel(&batch);
    check_len("batch_matmul out", nb * m * n, out.len())?;
    let (ta, tb) = (
        strides(&sa[..ra - 2], &batch),
        strides(&sb[..rb - 2], &batch),
    );
    let mut idx = vec![0usize; batch.len()];
    for p in 0..nb {
        // The batch index of plane p, then each operand's plane offset.
        let mut rest = p;
        for (axis, i) in idx.iter_mut().enumerate().rev() {
            *i = rest % batch[axis];
            rest /= batch[axis];
        }
        let pa: usize = idx.iter().zip(&ta).map(|(i, s)| i * s).sum::<usize>() * m * k;
        let pb: usize = idx.iter().zip(&tb).map(|(i, s)| i * s).sum::<usize>() * k * n;
        let (ap, bp) = (&a[pa..pa + m * k], &b[pb..pb + k * n]);
        let op = &mut out[p * m * n..(p + 1) * m * n];
        op.fill(0.0);
        for (arow, orow) in ap.chunks_exact(k.max(1)).zip(op.chunks_exact_mut(n.max(1))) {
            for (&av, brow) in arow.iter().zip(bp.chunks_exact(n.max(1))) {
                for (o, &bv) in orow.iter_mut().zip(brow) {
                    *o += av * bv;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|t| f64::from(a[i * k + t]) * f64::from(b[t * n + j]))
                    .sum();
            }
        }
        out
    }

    #[test]
    fn broadcast_batches_within_the_sum_bound() {
        let (m, k, n) = (3, 5, 4);
        let a: Vec<f32> = (0..2 * 3 * m * k)
            .map(|i| (i % 13) as f32 * 0.37 - 2.0)
            .collect();
        let b: Vec<f32> = (0..3 * k * n)
            .map(|i| (i % 7) as f32 * -0.29 + 1.0)
            .collect();
        let mut out = vec![0f32; 2 * 3 * m * n];
        batch_matmul(&a, &[2, 3, m, k], &b, &[3, k, n], &mut out).unwrap();
        for p in 0..6 {
            let q = p % 3;
            let want = naive(&a[p * m * k..][..m * k], &b[q * k * n..][..k * n], m, k, n);
            for (g, w) in out[p * m * n..][..m * n].iter().zip(&want) {
                let bound = k as f64 * f64::from(f32::EPSILON) * (w.abs() + 10.0);
                assert!((f64::from(*g) - w).abs() <= bound, "{g} vs {w}");
            }
        }
    }

    #[test]
    fn refuses_mismatched_shapes() {
        let mut out = vec![0f32; 4];
        let err = batch_matmul(&[0.0; 6], &[2, 3], &[0.0; 4], &[2, 2], &mut out);
        assert!(err.is_err());
        let err = batch_matmul(&[0.0; 4], &[2, 2], &[0.0; 4], &[2, 2], &mut out[..3]);
        assert!(err.is_err());
    }
}
