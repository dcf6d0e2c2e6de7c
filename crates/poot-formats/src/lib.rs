//! poot-formats: GGUF and safetensors checkpoints over mmap, strict and zero-copy.
//!
//! A file is mapped read-only and its header parsed once; a tensor is then a [`TensorInfo`]
//! view (dtype, shape, absolute byte range) into the map, and `tensor_bytes` borrows the stored
//! bytes without copying. Parsing is pure over a byte slice ([`parse_gguf`],
//! [`parse_safetensors`]) so it can be tested on mutated buffers.
//!
//! Guarantees for any input bytes: parsing returns `Ok` or a typed [`FormatError`] naming the
//! file, the tensor (where one is concerned) and the header field; it never panics, never reads
//! out of bounds, and allocates at most a small multiple of the header's size: every count is
//! checked against the bytes left before anything is allocated for it, and against fixed limits.

pub mod error;
pub mod gguf;
mod json;
pub mod meta;
mod mmap;
pub mod reader;
pub mod safetensors;
pub mod sharded;
pub mod tensor;
#[cfg(test)]
mod testutil;

pub use error::{FormatError, Loc};
pub use gguf::{parse_gguf, parse_gguf_with_limits, GgufFile, GgufHeader, GgufLimits};
pub use meta::{MetaArray, MetaValue, StrArray};
pub use safetensors::{parse_safetensors, SafetensorsFile, SafetensorsHeader};
pub use sharded::SafetensorsModel;
pub use tensor::TensorInfo;
