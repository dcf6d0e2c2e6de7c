//! Scatter-add of rows: `out[ids[t]] += src[t]` over zeroed `out` (torch's `index_add_` into
//! zeros), the adjoint of a row gather and so an embedding table's gradient.
//!
//! Invariants: every id is checked against `0..rows` before anything is written (the first bad
//! one is `IndexOutOfRange`); each output element is `0.0` plus its rows' values added one at a
//! time in order of `t`, so the result does not depend on threads and equals any other
//! runtime that adds in the same order (the wgpu kernel does).
//!
//! Cost: O(T * D) adds, O(rows * D) writes; no allocation.

use crate::error::{check_len, mul};
use crate::KernelError;

/// `out` [rows, d] = zeros, then row `ids[t]` += `src` row `t` for each `t` in order.
pub fn scatter_add_rows(
    src: &[f32],
    ids: &[i32],
    d: usize,
    rows: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len(
        "scatter_add_rows src",
        mul(ids.len(), d, "scatter_add_rows src")?,
        src.len(),
    )?;
    check_len(
        "scatter_add_rows out",
        mul(rows, d, "scatter_add_rows out")?,
        out.len(),
    )?;
    if let Some((at, &bad)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id as usize >= rows)
    {
        return Err(KernelError::IndexOutOfRange {
            what: "scatter_add_rows ids",
            at,
            value: i64::from(bad),
            bound: rows,
        });
    }
    out.fill(0.0);
    if d == 0 {
        return Ok(());
    }
    for (&id, row) in ids.iter().zip(src.chunks_exact(d)) {
        let id = id as usize; // checked above: 0 <= id < rows
        for (o, &s) in out[id * d..(id + 1) * d].iter_mut().zip(row) {
            *o += s;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_ids_add_in_order_and_untouched_rows_are_zero() {
        let src = [1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 0.5, 0.25];
        let ids = [2, 0, 2, 2];
        let mut out = [f32::NAN; 8];
        scatter_add_rows(&src, &ids, 2, 4, &mut out).unwrap();
        assert_eq!(
            out,
            [
                10.0,
                20.0,
                0.0,
                0.0,
                1.0 + 100.0 + 0.5,
                2.0 + 200.0 + 0.25,
                0.0,
                0.0
            ]
        );
    }

    #[test]
    fn order_of_adds_is_the_order_of_ids() {
        // 1e8 + 1 - 1e8 in f32 is 0 in this order, 1 in another: the order is part of the op.
        let src = [1e8f32, 1.0, -1e8];
        let mut out = [0.0f32; 1];
        scatter_add_rows(&src, &[0, 0, 0], 1, 1, &mut out).unwrap();
        assert_eq!(out[0], ((0.0f32 + 1e8) + 1.0) - 1e8);
    }

    #[test]
    fn bad_ids_and_lengths_are_typed_errors_and_write_nothing() {
        let src = [1.0f32, 2.0];
        let mut out = [7.0f32; 4];
        for ids in [[0, 2], [-1, 0]] {
            let e = scatter_add_rows(&src, &ids, 1, 2, &mut out[..2]).unwrap_err();
            assert!(
                matches!(e, KernelError::IndexOutOfRange { bound: 2, .. }),
                "{e}"
            );
        }
        assert_eq!(out, [7.0; 4]);
        let e = scatter_add_rows(&src, &[0], 1, 2, &mut out[..2]).unwrap_err();
        assert!(matches!(e, KernelError::Length { .. }), "{e}");
        let e = scatter_add_rows(&src, &[0, 1], 1, 2, &mut out).unwrap_err();
        assert!(matches!(e, KernelError::Length { .. }), "{e}");
    }
}
