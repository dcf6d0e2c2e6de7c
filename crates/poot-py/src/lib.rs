//! poot-py: the Python extension module `poot._native`, and the only crate that sees pyo3.

use pyo3::prelude::*;

/// The native module. Submodules register their classes and functions here.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
