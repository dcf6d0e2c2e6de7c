//! The runtime error enum.

use poot_graph::CompileError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("graph input '{name}' was not given")]
    MissingInput { name: String },
    #[error("graph input '{name}': expected {expected}, got {got}")]
    InputMismatch {
        name: String,
        expected: String,
        got: String,
    },
    #[error("weight '{name}' is not in the checkpoint")]
    MissingWeight { name: String },
    #[error("{op}: {detail}")]
    Kernel { op: &'static str, detail: String },
    #[error("device wait exceeded its deadline during {during}; the runtime is now poisoned")]
    Timeout { during: String },
    #[error("runtime is poisoned ({reason}); create a new one")]
    Poisoned { reason: String },
    #[error("{what} needs {requested} bytes, limit {limit}")]
    OutOfMemory {
        what: &'static str,
        requested: u64,
        limit: u64,
    },
    #[error("the KV cache is not configured (call configure_kv first)")]
    KvNotConfigured,
    #[error("the {backend} backend cannot run here: missing {missing}")]
    DeviceUnavailable {
        backend: &'static str,
        missing: String,
    },
    #[error("the {backend} backend is not compiled into this build")]
    NotCompiledIn { backend: &'static str },
}
