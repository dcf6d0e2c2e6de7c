//! poot-core: the vocabulary every other poot crate shares.
//!
//! Dtypes and packed block layouts (`dtype`), and the exact reference dequantizers (`quant`)
//! that tests compare kernels against. Nothing here allocates without a caller-given bound, and
//! nothing here knows about files, devices or Python.

pub mod deadline;
pub mod dtype;
pub mod quant;

pub use deadline::{Deadline, DEFAULT_DEVICE_TIMEOUT};
pub use dtype::DType;
pub use quant::{dequantize, QuantError};
