//! poot-py: the Python extension module `poot._native`, and the only crate that sees pyo3.
//!
//! `lib.rs` only registers; each submodule owns one area of the API (`formats`: checkpoint
//! files), `errors` owns the mapping of Rust errors to `poot.errors`, and `gil` the one helper
//! that releases the GIL.

use pyo3::prelude::*;

mod errors;
mod formats;
mod gil;

/// The native module. Submodules register their classes and functions here.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    formats::register(m)?;
    Ok(())
}
