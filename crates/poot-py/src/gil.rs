//! The one helper that runs Rust work with the GIL released.
//!
//! Invariant: heavy work (mapping and parsing files) runs inside [`without_gil`], so other
//! Python threads keep running; a pending signal (Ctrl-C) is raised as soon as the work returns.

use pyo3::prelude::*;

/// Runs `f` with the GIL released, then raises any pending signal (e.g. `KeyboardInterrupt`).
pub fn without_gil<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let out = py.allow_threads(f);
    py.check_signals()?;
    Ok(out)
}
