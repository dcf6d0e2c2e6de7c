//! [`SharedMut`]: one mutable slice that pool tasks write in disjoint parts.
//!
//! Invariant: every access goes through an `unsafe` method whose caller promises that no other
//! task touches the same elements meanwhile; bounds are checked on every access.

use std::marker::PhantomData;
use std::ops::Range;

/// A mutable slice shared by pool tasks that touch disjoint parts of it.
pub(crate) struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut [T]>,
}

// SAFETY: `SharedMut` only hands out access through `unsafe` methods whose callers promise
// disjointness, so sharing it is as safe as sending `&mut [T]` pieces (`T: Send`).
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    pub(crate) fn new(data: &'a mut [T]) -> Self {
        SharedMut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _life: PhantomData,
        }
    }

    /// The elements in `range`.
    ///
    /// # Safety
    /// No other access to any element of `range` may happen while the result lives.
    #[allow(clippy::mut_from_ref, reason = "disjointness is the caller's contract")]
    pub(crate) unsafe fn slice_mut(&self, range: Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "SharedMut range"
        );
        // SAFETY: in bounds (checked above) of a slice borrowed mutably for 'a; exclusive by the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }

    /// Writes `value` at `index`.
    ///
    /// # Safety
    /// No other thread may access `index` concurrently.
    pub(crate) unsafe fn write(&self, index: usize, value: T) {
        assert!(index < self.len, "SharedMut index");
        // SAFETY: in bounds (checked above); exclusive by the caller's contract.
        unsafe { self.ptr.add(index).write(value) }
    }
}
