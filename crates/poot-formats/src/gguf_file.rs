//! [`GgufFile`]: a GGUF file mapped read-only with its parsed header.
//!
//! Invariant: the header was parsed from exactly the mapped bytes, so every tensor range it
//! holds lies inside the map and `tensor_bytes` never copies.

use std::path::{Path, PathBuf};

use super::{parse_gguf, GgufHeader};
use crate::error::FormatError;
use crate::meta::MetaValue;
use crate::mmap::Mapped;
use crate::tensor::TensorInfo;

/// A GGUF file mapped read-only, with its parsed header.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mapped,
    header: GgufHeader,
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        let map = Mapped::open(&path)?;
        let header = parse_gguf(&path, &map)?;
        Ok(GgufFile { path, map, header })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The data alignment.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> u64 {
        self.header.file_size
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        self.header.metadata()
    }

    /// The value for `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.header.get(key)
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.header.tensors()
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// The stored bytes of `t`, borrowed from the map (zero-copy).
    ///
    /// # Panics
    /// If `t` did not come from this file and its range lies outside it.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        crate::tensor::slice_of(&self.map, t, &self.path)
    }

    /// Drops `t`'s pages from the process's resident set (see `Mapped::release`): for a caller
    /// that keeps its own copy of the tensor. Later reads of it still work.
    pub fn release_tensor(&self, t: &TensorInfo) {
        self.map.release(self.tensor_bytes(t));
    }

    /// [`Self::release_tensor`] for the bytes `range` of `t` only (clamped to the tensor).
    pub fn release_tensor_range(&self, t: &TensorInfo, range: std::ops::Range<usize>) {
        self.map
            .release(crate::tensor::clamped(self.tensor_bytes(t), range));
    }
}
