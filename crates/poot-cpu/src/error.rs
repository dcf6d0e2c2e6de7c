//! The one error type of poot-cpu's kernels.
//!
//! Every kernel validates all of its inputs (lengths, shapes, indices read from caller data)
//! before it writes anything, and reports the first problem as a [`KernelError`]; kernels never
//! panic on bad input. Variants carry the offending values so a caller can say exactly what was
//! wrong without parsing a message.

use poot_core::DType;
use thiserror::Error;

/// Why a kernel refused its inputs (nothing was written when this is returned).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum KernelError {
    /// A buffer does not have the length its shape implies.
    #[error("{what}: expected length {expected}, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A shape product does not fit `usize`.
    #[error("{what}: size overflows usize")]
    Overflow { what: &'static str },
    /// The kernel has no implementation for this stored dtype.
    #[error("{op}: dtype {dtype} is not supported")]
    UnsupportedDType { op: &'static str, dtype: DType },
    /// A row length is not a whole number of the dtype's blocks.
    #[error("{op}: row length {len} is not a multiple of the {dtype} block ({block} elements)")]
    NotWholeBlocks {
        op: &'static str,
        dtype: DType,
        len: usize,
        block: usize,
    },
    /// An index read from caller data lies outside `0..bound`.
    #[error("{what}[{at}] = {value} is out of range 0..{bound}")]
    IndexOutOfRange {
        what: &'static str,
        at: usize,
        value: i64,
        bound: usize,
    },
    /// A scalar or shape argument is invalid (zero head size, odd rotary dims, ...).
    #[error("{what}: {detail}")]
    InvalidArgument { what: &'static str, detail: String },
    /// The requested instruction set is not available on this CPU.
    #[error("instruction set {isa:?} is not available on this CPU")]
    IsaUnavailable { isa: crate::Isa },
    /// The thread pool could not start its worker threads.
    #[error("thread pool: could not spawn worker {index}: {detail}")]
    Spawn { index: usize, detail: String },
}

/// `a * b`, or [`KernelError::Overflow`] naming `what`.
pub(crate) fn mul(a: usize, b: usize, what: &'static str) -> Result<usize, KernelError> {
    a.checked_mul(b).ok_or(KernelError::Overflow { what })
}

/// Checks `got == expected` for the buffer named `what`.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Length {
            what,
            expected,
            got,
        })
    }
}
