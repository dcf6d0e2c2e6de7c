//! The one mapping from poot's Rust errors to `poot.errors` classes.
//!
//! Invariants: a [`FormatError`] becomes `poot.errors.CheckpointFormatError` (or its subclass
//! `UnsupportedDTypeError` for an unknown dtype) carrying `kind`, `file`, `tensor` and `field`;
//! an I/O failure becomes the fitting `OSError` subclass (`FileNotFoundError`,
//! `PermissionError`, `IsADirectoryError`) with `errno`, `strerror` and `filename` set. Classes are
//! looked up in `poot.errors` by name at raise time, so Python code can catch them as usual.
//! A [`TraceError`] becomes `TraceError` (`TraceBudgetError` with `resource`, `limit`, `total`
//! for a budget); each [`CompileError`] variant its own `CompileError` subclass; each
//! [`RuntimeError`] variant the class that names it (`DeviceTimeoutError` is a `TimeoutError`,
//! `GraphInputError` a `ValueError`, ...). Every variant's fields become attributes. A
//! [`TokenizeError`] becomes `TokenizerError` (a `ValueError`) with its message.
//! An [`poot_engine::EngineError`] becomes `ContextLengthError` (prompt past `max_model_len`,
//! empty, or too big for the pool), `ConfigError`, `SamplingParamsError` or a `ValueError`.

use std::path::Path;

use poot_formats::FormatError;
use poot_graph::{CompileError, TraceError};
use poot_runtime::RuntimeError;
use poot_tokenize::TokenizeError;
use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyMemoryError, PyOSError, PyPermissionError,
    PyRuntimeError, PyTimeoutError, PyValueError,
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

/// A malformed GPTQ/AWQ layer: `CheckpointFormatError` naming the tensor.
pub fn gptq_awq_error(py: Python<'_>, e: poot_runtime::GptqAwqError) -> PyErr {
    let message = e.to_string();
    poot_error(
        py,
        "CheckpointFormatError",
        message,
        |kw| {
            kw.set_item("kind", e.kind)?;
            kw.set_item("tensor", &e.tensor)?;
            kw.set_item("field", "quantization_config")
        },
        PyValueError::new_err,
    )
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

/// Builds `poot.errors.<class>(message, **fields)`; `fallback` keeps the message and the
/// builtin base when `poot.errors` itself cannot be imported.
fn poot_error(
    py: Python<'_>,
    class: &str,
    message: String,
    fields: impl FnOnce(&Bound<'_, PyDict>) -> PyResult<()>,
    fallback: fn(String) -> PyErr,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("poot.errors")?.getattr(class)?;
        let kwargs = PyDict::new(py);
        fields(&kwargs)?;
        Ok(PyErr::from_value(cls.call((&message,), Some(&kwargs))?))
    };
    match build() {
        Ok(err) => err,
        Err(import_err) => {
            let err = fallback(message.clone());
            err.set_cause(py, Some(import_err));
            err
        }
    }
}

fn value_error(m: String) -> PyErr {
    PyValueError::new_err(m)
}

fn runtime_error_builtin(m: String) -> PyErr {
    PyRuntimeError::new_err(m)
}

/// `poot.errors.TokenizerError` for an unusable vocabulary.
pub fn tokenize_error(py: Python<'_>, e: TokenizeError) -> PyErr {
    tokenizer_error(py, e.to_string())
}

/// `poot.errors.TokenizerError` with `message`.
pub fn tokenizer_error(py: Python<'_>, message: String) -> PyErr {
    poot_error(py, "TokenizerError", message, |_| Ok(()), value_error)
}

/// The Python exception for a refused trace: `TraceBudgetError` for a budget, else
/// `TraceError` with `kind`, `op` and `name`.
pub fn trace_error(py: Python<'_>, e: TraceError) -> PyErr {
    let message = e.to_string();
    if let TraceError::Budget {
        resource,
        limit,
        total,
    } = e
    {
        return poot_error(
            py,
            "TraceBudgetError",
            message,
            |k| {
                k.set_item("resource", resource.name())?;
                k.set_item("limit", limit)?;
                k.set_item("total", total)
            },
            value_error,
        );
    }
    let (kind, op, name): (&str, Option<&str>, Option<String>) = match e {
        TraceError::Budget { .. } => unreachable!("handled above"),
        TraceError::Shape { op, .. } => ("shape", Some(op), None),
        TraceError::UnknownWeight { name } => ("unknown_weight", None, Some(name)),
        TraceError::BadValue { .. } => ("bad_value", None, None),
        TraceError::DuplicateInput { name } => ("duplicate_input", None, Some(name)),
        TraceError::DuplicateOutput { name } => ("duplicate_output", None, Some(name)),
    };
    trace_error_kind(py, kind, op, name, message)
}

/// A `TraceError` raised by the bindings themselves (a finished tracer, a foreign value).
pub fn trace_error_kind(
    py: Python<'_>,
    kind: &str,
    op: Option<&str>,
    name: Option<String>,
    message: String,
) -> PyErr {
    poot_error(
        py,
        "TraceError",
        message,
        |k| {
            k.set_item("kind", kind)?;
            k.set_item("op", op)?;
            k.set_item("name", name)
        },
        value_error,
    )
}

/// The Python exception for a refused compilation (each variant its own `CompileError`
/// subclass).
pub fn compile_error(py: Python<'_>, e: CompileError) -> PyErr {
    let message = e.to_string();
    match e {
        CompileError::Expansion { pass, limit, total } => poot_error(
            py,
            "CompileExpansionError",
            message,
            |k| {
                k.set_item("pass_name", pass)?;
                k.set_item("limit", limit)?;
                k.set_item("total", total)
            },
            runtime_error_builtin,
        ),
        CompileError::BodyLimit {
            kernel,
            what,
            limit,
            total,
        } => poot_error(
            py,
            "KernelBodyLimitError",
            message,
            |k| {
                k.set_item("kernel", kernel)?;
                k.set_item("what", what)?;
                k.set_item("limit", limit)?;
                k.set_item("total", total)
            },
            runtime_error_builtin,
        ),
        CompileError::ArtifactTooLarge { limit, total } => poot_error(
            py,
            "ArtifactTooLargeError",
            message,
            |k| {
                k.set_item("limit", limit)?;
                k.set_item("total", total)
            },
            runtime_error_builtin,
        ),
        CompileError::Unsupported { backend, op } => poot_error(
            py,
            "UnsupportedOpError",
            message,
            |k| {
                k.set_item("backend", backend)?;
                k.set_item("op", op)
            },
            runtime_error_builtin,
        ),
        CompileError::Invalid(_) => poot_error(
            py,
            "CompileError",
            message,
            |_| Ok(()),
            runtime_error_builtin,
        ),
    }
}

/// The Python exception for a runtime failure.
pub fn runtime_error(py: Python<'_>, e: RuntimeError) -> PyErr {
    let message = e.to_string();
    match e {
        RuntimeError::Compile(c) => compile_error(py, c),
        RuntimeError::MissingInput { name } => poot_error(
            py,
            "GraphInputError",
            message,
            |k| k.set_item("name", name),
            value_error,
        ),
        RuntimeError::InputMismatch {
            name,
            expected,
            got,
        } => poot_error(
            py,
            "GraphInputError",
            message,
            |k| {
                k.set_item("name", name)?;
                k.set_item("expected", expected)?;
                k.set_item("got", got)
            },
            value_error,
        ),
        RuntimeError::MissingWeight { .. } => poot_error(
            py,
            "CompileError",
            message,
            |_| Ok(()),
            runtime_error_builtin,
        ),
        RuntimeError::Kernel { op, .. } => poot_error(
            py,
            "KernelError",
            message,
            |k| k.set_item("op", op),
            value_error,
        ),
        RuntimeError::Timeout { during } => poot_error(
            py,
            "DeviceTimeoutError",
            message,
            |k| k.set_item("during", during),
            PyTimeoutError::new_err,
        ),
        RuntimeError::Poisoned { reason } => poot_error(
            py,
            "RuntimePoisonedError",
            message,
            |k| k.set_item("reason", reason),
            runtime_error_builtin,
        ),
        RuntimeError::OutOfMemory {
            what,
            requested,
            limit,
        } => poot_error(
            py,
            "DeviceMemoryError",
            message,
            |k| {
                k.set_item("what", what)?;
                k.set_item("requested", requested)?;
                k.set_item("limit", limit)
            },
            PyMemoryError::new_err,
        ),
        RuntimeError::KvNotConfigured => poot_error(
            py,
            "KvCacheNotConfiguredError",
            message,
            |_| Ok(()),
            runtime_error_builtin,
        ),
        RuntimeError::DeviceUnavailable { backend, missing } => poot_error(
            py,
            "DeviceUnavailableError",
            message,
            |k| {
                k.set_item("backend", backend)?;
                k.set_item("missing", missing)
            },
            runtime_error_builtin,
        ),
        RuntimeError::NotCompiledIn { backend } => poot_error(
            py,
            "BackendNotCompiledError",
            message,
            |k| k.set_item("backend", backend),
            runtime_error_builtin,
        ),
    }
}

/// Raises the Python exception the mapping gives for one sample of each Rust error variant
/// (`poot._native._mapping_probe`). Errors with no natural trigger on a given backend (a
/// kernel body limit on the CPU) are still covered by the mapping tests through it.
#[pyfunction]
#[pyo3(name = "_mapping_probe")]
pub fn mapping_probe(py: Python<'_>, variant: &str) -> PyResult<()> {
    use poot_graph::Resource;
    let err = match variant {
        "trace_budget" => trace_error(
            py,
            TraceError::Budget {
                resource: Resource::Values,
                limit: 1,
                total: 2,
            },
        ),
        "trace_shape" => trace_error(
            py,
            TraceError::Shape {
                op: "matmul",
                detail: "x [1, 2] vs w [3, 4]".into(),
            },
        ),
        "expansion" => compile_error(
            py,
            CompileError::Expansion {
                pass: "probe",
                limit: 1,
                total: 2,
            },
        ),
        "body_limit" => compile_error(
            py,
            CompileError::BodyLimit {
                kernel: "fused_probe".into(),
                what: "instructions",
                limit: 1,
                total: 2,
            },
        ),
        "artifact" => compile_error(py, CompileError::ArtifactTooLarge { limit: 1, total: 2 }),
        "unsupported" => compile_error(
            py,
            CompileError::Unsupported {
                backend: "probe",
                op: "rope",
            },
        ),
        "invalid" => compile_error(py, CompileError::Invalid("probe".into())),
        "missing_input" => runtime_error(py, RuntimeError::MissingInput { name: "ids".into() }),
        "input_mismatch" => runtime_error(
            py,
            RuntimeError::InputMismatch {
                name: "ids".into(),
                expected: "I32[4]".into(),
                got: "F32[4]".into(),
            },
        ),
        "missing_weight" => runtime_error(py, RuntimeError::MissingWeight { name: "w".into() }),
        "kernel" => runtime_error(
            py,
            RuntimeError::Kernel {
                op: "embedding",
                detail: "ids[0] = 9 is out of range 0..4".into(),
            },
        ),
        "timeout" => runtime_error(
            py,
            RuntimeError::Timeout {
                during: "run".into(),
            },
        ),
        "poisoned" => runtime_error(
            py,
            RuntimeError::Poisoned {
                reason: "probe".into(),
            },
        ),
        "out_of_memory" => runtime_error(
            py,
            RuntimeError::OutOfMemory {
                what: "kv cache",
                requested: 2,
                limit: 1,
            },
        ),
        "kv_not_configured" => runtime_error(py, RuntimeError::KvNotConfigured),
        "not_compiled_in" => runtime_error(py, RuntimeError::NotCompiledIn { backend: "cuda" }),
        "device_unavailable" => runtime_error(
            py,
            RuntimeError::DeviceUnavailable {
                backend: "cuda",
                missing: "the NVIDIA driver library libcuda.so.1".into(),
            },
        ),
        other => return Err(PyValueError::new_err(format!("unknown variant {other:?}"))),
    };
    Err(err)
}

/// The Python exception for a scheduler refusal: `ContextLengthError` for a prompt past
/// `max_model_len` or a request too big for the KV pool, `ConfigError` for a bad setting,
/// `SamplingParamsError` / `ValueError` for a bad request or call order.
pub fn engine_error(py: Python<'_>, e: poot_engine::EngineError) -> PyErr {
    use poot_engine::EngineError as E;
    let message = e.to_string();
    match e {
        E::PromptTooLong {
            prompt,
            max_model_len,
            ..
        } => poot_error(
            py,
            "ContextLengthError",
            message,
            |k| {
                k.set_item("needed", prompt + 1)?;
                k.set_item("limit", max_model_len)
            },
            value_error,
        ),
        E::TooLargeForPool { needed, usable, .. } => poot_error(
            py,
            "ContextLengthError",
            message,
            |k| {
                k.set_item("needed", needed)?;
                k.set_item("limit", usable)
            },
            value_error,
        ),
        E::EmptyPrompt(_) => poot_error(py, "ContextLengthError", message, |_| Ok(()), value_error),
        E::InvalidConfig { .. } => poot_error(py, "ConfigError", message, |_| Ok(()), value_error),
        E::ZeroMaxTokens(_) => poot_error(
            py,
            "SamplingParamsError",
            message,
            |k| k.set_item("field", "max_tokens"),
            value_error,
        ),
        E::Internal(_) | E::Kv(_) => runtime_error_builtin(message),
        E::DuplicateRequest(_)
        | E::StepInFlight
        | E::NoStepInFlight
        | E::OutputMismatch { .. }
        | E::DimsTooSmall { .. } => value_error(message),
    }
}
