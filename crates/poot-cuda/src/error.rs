//! The crate's error enum, and how it becomes a `RuntimeError` at the `Runtime` seam.

use poot_runtime::RuntimeError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    /// No usable CUDA here: the driver library, a symbol, NVRTC or a device is missing.
    #[error("CUDA is not available: missing {what}")]
    Unavailable { what: String },
    /// A driver call failed (`name` is the driver's own, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`).
    #[error("{call} failed: {name} ({code})")]
    Driver {
        call: &'static str,
        code: i32,
        name: String,
    },
    /// NVRTC refused a kernel source; `log` is its compiler log.
    #[error("NVRTC could not compile {source_name}: {log}")]
    Compile { source_name: String, log: String },
    /// A wait passed its deadline.
    #[error("CUDA wait exceeded its deadline during {during}")]
    Timeout { during: String },
}

impl From<CudaError> for RuntimeError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Unavailable { what } => RuntimeError::DeviceUnavailable {
                backend: "cuda",
                missing: what,
            },
            CudaError::Timeout { during } => RuntimeError::Timeout { during },
            CudaError::Driver { call, .. } => RuntimeError::Kernel {
                op: call,
                detail: e.to_string(),
            },
            CudaError::Compile { .. } => RuntimeError::Kernel {
                op: "nvrtc",
                detail: e.to_string(),
            },
        }
    }
}
