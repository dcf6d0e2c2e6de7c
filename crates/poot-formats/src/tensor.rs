//! Tensor views and the byte-range checks both formats share.
//!
//! Invariants: a [`TensorInfo`] produced by this crate has `nbytes == dtype.bytes_for(n_elements)`
//! and `offset..offset + nbytes` inside its file, not overlapping any other tensor of the same
//! file (zero-byte tensors overlap nothing). [`check_ranges`] is O(n log n) in the tensor count
//! and allocates one index vector of that length (already bounded by the header parse).

use std::path::Path;

use poot_core::DType;

use crate::error::{FormatError, Loc};

/// One tensor: a view (dtype, shape, byte range) into a mapped file; no data is copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name as stored.
    pub name: String,
    /// The stored element type (packed blocks stay packed).
    pub dtype: DType,
    /// Row-major, outermost dimension first (ggml's `ne[]` reversed).
    pub shape: Vec<u64>,
    /// Absolute byte offset of the first byte in the file.
    pub offset: u64,
    /// Stored size in bytes.
    pub nbytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of `shape`; 1 for a scalar).
    ///
    /// Parsers check that this product fits `u64`; for a hand-built `TensorInfo` an overflowing
    /// product saturates at `u64::MAX`.
    pub fn n_elements(&self) -> u64 {
        checked_elements(&self.shape).unwrap_or(u64::MAX)
    }

    /// The byte range in the file (`offset..offset + nbytes`).
    pub fn byte_range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.nbytes)
    }
}

/// The product of `shape`, or `None` on overflow.
pub fn checked_elements(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// The bytes of `t` within `data` (a whole mapped file).
///
/// # Panics
/// If `t`'s range lies outside `data`, which only happens for a `TensorInfo` from another file.
pub(crate) fn slice_of<'a>(data: &'a [u8], t: &TensorInfo, file: &Path) -> &'a [u8] {
    let range = usize::try_from(t.offset)
        .ok()
        .zip(usize::try_from(t.byte_range().end).ok())
        .and_then(|(s, e)| data.get(s..e));
    match range {
        Some(b) => b,
        None => panic!(
            "tensor '{}' ({:?}) is not a tensor of {}",
            t.name,
            t.byte_range(),
            file.display()
        ),
    }
}

/// `bytes[range]`, with `range` clamped to `bytes` (an empty slice where nothing is left).
pub(crate) fn clamped(bytes: &[u8], range: std::ops::Range<usize>) -> &[u8] {
    let end = range.end.min(bytes.len());
    &bytes[range.start.min(end)..end]
}

/// Checks that every tensor lies within `region_start..file_len` and that no two overlap.
///
/// A tensor that starts inside the file but runs past its end is `Truncated`; one that starts
/// beyond the end (or before the region) is `OutOfBounds`. Ranges are checked in offset order, so
/// for a file cut short the first error names the tensor the cut falls in. Range errors name
/// `offset_field`, the format's name for the stored offset.
pub fn check_ranges(
    file: &Path,
    tensors: &[TensorInfo],
    region_start: u64,
    file_len: u64,
    offset_field: &str,
) -> Result<(), FormatError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by_key(|&i| (tensors[i].offset, tensors[i].nbytes));
    // The nonempty tensor whose range ends last so far: (index, end).
    let mut last: Option<(usize, u64)> = None;
    for &i in &order {
        let t = &tensors[i];
        let loc = || Loc::tensor(file, &t.name, offset_field);
        let end = t
            .offset
            .checked_add(t.nbytes)
            .ok_or_else(|| FormatError::Overflow {
                loc: loc(),
                what: format!("offset {} + nbytes {}", t.offset, t.nbytes),
            })?;
        if t.offset < region_start || t.offset > file_len {
            return Err(FormatError::OutOfBounds {
                loc: loc(),
                start: t.offset,
                end,
                region_start,
                region_end: file_len,
            });
        }
        if end > file_len {
            return Err(FormatError::Truncated {
                loc: Loc::tensor(file, &t.name, "data"),
                offset: t.offset,
                needed: t.nbytes,
                available: file_len - t.offset,
            });
        }
        if t.nbytes == 0 {
            continue;
        }
        if let Some((j, last_end)) = last {
            if t.offset < last_end {
                let o = &tensors[j];
                return Err(FormatError::Overlap {
                    loc: loc(),
                    start: t.offset,
                    end,
                    other: o.name.clone(),
                    other_start: o.offset,
                    other_end: last_end,
                });
            }
        }
        if last.is_none_or(|(_, e)| end > e) {
            last = Some((i, end));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamped_ranges_stay_inside_the_bytes() {
        let b = [0u8, 1, 2, 3, 4];
        assert_eq!(clamped(&b, 1..3), &[1, 2]);
        assert_eq!(clamped(&b, 3..99), &[3, 4]);
        assert!(clamped(&b, 7..9).is_empty());
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is what is tested
        let reversed = 4..2;
        assert!(clamped(&b, reversed).is_empty());
    }

    fn t(name: &str, offset: u64, nbytes: u64) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: DType::U8,
            shape: vec![nbytes],
            offset,
            nbytes,
        }
    }

    #[test]
    fn ranges() {
        let f = Path::new("x");
        check_ranges(
            f,
            &[t("a", 10, 5), t("b", 15, 5), t("z", 20, 0)],
            10,
            20,
            "off",
        )
        .unwrap();
        let e = check_ranges(f, &[t("a", 10, 6), t("b", 15, 5)], 10, 20, "off").unwrap_err();
        assert_eq!(e.kind(), "overlap");
        assert_eq!(e.tensor(), Some("b"));
        let e = check_ranges(f, &[t("a", 10, 6), t("b", 16, 5)], 10, 20, "off").unwrap_err();
        assert_eq!(e.kind(), "truncated");
        assert_eq!(e.tensor(), Some("b"));
        let e = check_ranges(f, &[t("a", 30, 1)], 10, 20, "off").unwrap_err();
        assert_eq!(e.kind(), "out_of_bounds");
        let e = check_ranges(f, &[t("a", 5, 1)], 10, 20, "off").unwrap_err();
        assert_eq!(e.kind(), "out_of_bounds");
        let e = check_ranges(f, &[t("a", u64::MAX, 1)], 10, 20, "off").unwrap_err();
        assert_eq!(e.kind(), "overflow");
    }

    #[test]
    fn n_elements_saturates() {
        let mut x = t("a", 0, 0);
        x.shape = vec![];
        assert_eq!(x.n_elements(), 1);
        x.shape = vec![u64::MAX, 2];
        assert_eq!(x.n_elements(), u64::MAX);
    }
}
