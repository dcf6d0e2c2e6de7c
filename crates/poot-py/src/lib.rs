//! poot-py: the Python extension module `poot._native`, and the only crate that sees pyo3.
//!
//! `lib.rs` only registers; each submodule owns one area of the API: `formats` (checkpoint
//! files), `limits`, `weights`, `tracer` and `graph` (tracing), `runtime` (runtimes and plans; `wgpu`, the wgpu runtime behind the `wgpu` feature; `cuda`, the CUDA runtime behind the `cuda` feature),
//! `tokenize` (the byte-level BPE model), `engine` (the scheduler), `request_args` (the one parser of a request's keywords), `step` (the step driver: one call per step; `step_run` its plans and runs, `step_io` its conversions).
//! `errors` owns the mapping of Rust errors to `poot.errors`, and `gil` the one helper that
//! releases the GIL.

use pyo3::prelude::*;

mod arrays;
mod cuda;
mod engine;
mod errors;
mod formats;
mod gil;
mod graph;
mod late;
mod limits;
mod request_args;
mod rope_args;
mod runtime;
mod step;
mod step_driver;
mod step_io;
mod step_python;
mod step_run;
mod tokenize;
mod tracer;
mod tracer_state;
mod weights;
mod wgpu;
mod wgpu_tensor;

/// The native module. Submodules register their classes and functions here.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // How this module was compiled: an unoptimized build (`make develop`) runs 10-50x slower,
    // so `poot` warns at import and `poot doctor` shows it.
    m.add(
        "build_profile",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    engine::register(m)?;
    formats::register(m)?;
    graph::register(m)?;
    runtime::register(m)?;
    late::register(m)?;
    tokenize::register(m)?;
    step::register(m)?;
    m.add_function(wrap_pyfunction!(errors::mapping_probe, m)?)?;
    Ok(())
}
