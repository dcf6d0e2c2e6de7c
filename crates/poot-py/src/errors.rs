//! The one mapping from poot's Rust errors to `poot.errors` classes.
//!
//! Invariants: a [`FormatError`] becomes `poot.errors.CheckpointFormatError` (or its subclass
//! `UnsupportedDTypeError` for an unknown dtype) carrying `kind`, `file`, `tensor` and `field`;
//! an I/O failure becomes the fitting `OSError` subclass (`FileNotFoundError`,
//! `PermissionError`, `IsADirectoryError`) with `errno`, `strerror` and `filename` set. Classes are
//! looked up in `poot.errors` by name at raise time, so Python code can catch them as usual.

use std::path::Path;

use poot_formats::FormatError;
use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The Python exception for `e`.
pub fn format_error(py: Python<'_>, e: FormatError) -> PyErr {
    if let FormatError::Io { path, source } = &e {
        return io_error(path, source);
    }
    let class = if matches!(e, FormatError::UnknownDType { .. }) {
        "UnsupportedDTypeError"
    } else {
        "CheckpointFormatError"
    };
    let message = e.to_string();
    match build_checkpoint_error(py, class, &message, &e) {
        Ok(err) => err,
        // Only when poot.errors itself cannot be imported: keep the message and the builtin base.
        Err(import_err) => {
            let err = PyValueError::new_err(message);
            err.set_cause(py, Some(import_err));
            err
        }
    }
}

fn build_checkpoint_error(
    py: Python<'_>,
    class: &str,
    message: &str,
    e: &FormatError,
) -> PyResult<PyErr> {
    let cls = py.import("poot.errors")?.getattr(class)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("kind", e.kind())?;
    kwargs.set_item("file", e.file().to_string_lossy())?;
    kwargs.set_item("tensor", e.tensor())?;
    kwargs.set_item("field", e.field())?;
    let value = cls.call((message,), Some(&kwargs))?;
    Ok(PyErr::from_value(value))
}

/// `EISDIR`, the same on Linux and macOS.
const EISDIR: i32 = 21;

/// An `OSError` subclass for an I/O failure on `path`.
pub fn io_error(path: &Path, source: &std::io::Error) -> PyErr {
    let filename = path.to_string_lossy().into_owned();
    let mut message = source.to_string();
    if let Some(n) = source.raw_os_error() {
        // Python prints "[Errno n]" itself; drop Rust's " (os error n)" suffix.
        if let Some(m) = message.strip_suffix(&format!(" (os error {n})")) {
            message = m.to_owned();
        }
    }
    let args = (source.raw_os_error(), message, filename.clone());
    match source.kind() {
        std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(args),
        std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(args),
        _ if path.is_dir() => PyIsADirectoryError::new_err((EISDIR, "Is a directory", filename)),
        _ => PyOSError::new_err(args),
    }
}
