//! Errors of tracing and compiling.

use thiserror::Error;

use crate::limits::Resource;

/// A trace was refused. Nothing past the refused equation was allocated.
#[derive(Debug, Error, PartialEq)]
pub enum TraceError {
    #[error("trace budget exceeded: {resource} would reach {total}, limit {limit}")]
    Budget {
        resource: Resource,
        limit: u64,
        total: u64,
    },
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("unknown weight '{name}': the checkpoint has no such tensor")]
    UnknownWeight { name: String },
    #[error("value {id} does not exist in this trace")]
    BadValue { id: u32 },
    #[error("input '{name}' is defined twice")]
    DuplicateInput { name: String },
    #[error("output '{name}' is defined twice")]
    DuplicateOutput { name: String },
}

/// Compilation was refused.
#[derive(Debug, Error, PartialEq)]
pub enum CompileError {
    #[error("pass '{pass}' would grow the graph to {total} equations, limit {limit}")]
    Expansion {
        pass: &'static str,
        limit: u64,
        total: u64,
    },
    #[error("generated kernel '{kernel}' needs {total} {what}, limit {limit}")]
    BodyLimit {
        kernel: String,
        what: &'static str,
        limit: u64,
        total: u64,
    },
    #[error("compiled artifact would be {total} bytes, limit {limit}")]
    ArtifactTooLarge { limit: u64, total: u64 },
    #[error("the {backend} backend does not support op '{op}'")]
    Unsupported {
        backend: &'static str,
        op: &'static str,
    },
    #[error("invalid graph: {0}")]
    Invalid(String),
}
