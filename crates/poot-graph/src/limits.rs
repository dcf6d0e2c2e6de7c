//! Budgets for tracing and compiling. Every bound is checked before the thing it bounds is
//! allocated, and every excess is a typed error naming the resource, the limit and the total.

use std::fmt;

/// What a trace may grow to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceLimits {
    /// Tokens in one step; longer prompts run as several chunks.
    pub max_tokens: usize,
    pub max_values: usize,
    pub max_equations: usize,
    /// Bytes of `Op::Literal` data.
    pub max_literal_bytes: usize,
    /// Owned records: names (inputs, weights, outputs) and operand lists.
    pub max_records: usize,
}

impl Default for TraceLimits {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            max_values: 1 << 16,
            max_equations: 1 << 16,
            max_literal_bytes: 1 << 20,
            max_records: 1 << 16,
        }
    }
}

/// What compilation may grow to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileLimits {
    /// Equations after every pass; a pass that would exceed it fails with `Expansion`.
    pub max_equations: usize,
    /// Instructions in one generated (fused) kernel body.
    pub max_kernel_instructions: usize,
    /// Live locals (registers, temporaries) in one generated kernel body.
    pub max_kernel_locals: usize,
    /// Bytes of one compiled artifact (plan, buffers, generated code), checked before it is
    /// loaded or cached.
    pub max_artifact_bytes: u64,
}

impl Default for CompileLimits {
    fn default() -> Self {
        Self {
            max_equations: 1 << 17,
            max_kernel_instructions: 256,
            max_kernel_locals: 64,
            max_artifact_bytes: 4 << 30,
        }
    }
}

/// A traced resource that has a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Tokens,
    Values,
    Equations,
    LiteralBytes,
    Records,
}

impl Resource {
    pub const fn name(self) -> &'static str {
        match self {
            Resource::Tokens => "tokens",
            Resource::Values => "values",
            Resource::Equations => "equations",
            Resource::LiteralBytes => "literal_bytes",
            Resource::Records => "records",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
