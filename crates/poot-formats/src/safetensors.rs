//! safetensors over mmap.
//!
//! Layout: `u64` little-endian header length N, N bytes of UTF-8 JSON (an object of tensor
//! entries `{dtype, shape, data_offsets: [begin, end]}` plus an optional `__metadata__` object
//! of strings; trailing spaces allowed), then the data; offsets are relative to byte 8 + N.
//!
//! Invariants of a parsed [`SafetensorsHeader`]: N is at most [`MAX_HEADER_BYTES`] and inside
//! the file; tensor names and metadata keys are unique; every tensor has a known dtype, a byte
//! size equal to shape x dtype, and a range inside the file overlapping no other tensor. Gaps
//! between tensors are allowed (they are harmless). Parsing reads only the header: O(N + n log n).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use poot_core::DType;
use serde::de::DeserializeSeed;

use crate::error::{FormatError, Loc};
use crate::json::{Ctx, Entry, HeaderSeed, RawTensor, METADATA_KEY};
use crate::mmap::Mapped;
use crate::reader::Reader;
use crate::tensor::{check_ranges, checked_elements, TensorInfo};

/// The largest JSON header accepted (the safetensors reference implementation's limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A parsed safetensors header.
#[derive(Clone, Debug)]
pub struct SafetensorsHeader {
    data_offset: u64,
    file_size: u64,
    metadata: Vec<(String, String)>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl SafetensorsHeader {
    /// Absolute offset of the data section (8 + header length).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the parsed byte slice.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// `__metadata__` in header order.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// Tensors in header order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
}

/// Parses a safetensors header from `bytes` (the whole file).
pub fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<SafetensorsHeader, FormatError> {
    let mut r = Reader::new(path, bytes);
    let n = r.u64(None, "header_len")?;
    if n > MAX_HEADER_BYTES {
        return Err(FormatError::AbsurdCount {
            loc: Loc::new(path, "header_len"),
            count: n,
            limit: MAX_HEADER_BYTES,
        });
    }
    let json = r.str(n, None, "header")?;
    let data_offset = r.pos();
    let file_size = bytes.len() as u64;

    let ctx = Ctx::default();
    let entries = parse_json(path, json, &ctx, "header", HeaderSeed(&ctx))?;

    let mut metadata = None;
    let mut tensors = Vec::new();
    let mut index = HashMap::new();
    for (name, entry) in entries {
        match entry {
            Entry::Metadata(m) => {
                if metadata.is_some() {
                    return Err(FormatError::DuplicateName {
                        loc: Loc::new(path, METADATA_KEY),
                        name,
                    });
                }
                metadata = Some(check_metadata(path, m)?);
            }
            Entry::Tensor(raw) => {
                if index.contains_key(&name) {
                    return Err(FormatError::DuplicateName {
                        loc: Loc::tensor(path, &name, "name"),
                        name,
                    });
                }
                let t = tensor_info(path, name, raw, data_offset)?;
                index.insert(t.name.clone(), tensors.len());
                tensors.push(t);
            }
        }
    }
    check_ranges(path, &tensors, data_offset, file_size, "data_offsets")?;
    Ok(SafetensorsHeader {
        data_offset,
        file_size,
        metadata: metadata.unwrap_or_default(),
        tensors,
        index,
    })
}

/// Runs `seed` over `json`, mapping a JSON error to `BadJson` naming what was being read.
pub(crate) fn parse_json<'de, S: DeserializeSeed<'de>>(
    path: &Path,
    json: &'de str,
    ctx: &Ctx,
    default_field: &str,
    seed: S,
) -> Result<S::Value, FormatError> {
    let mut de = serde_json::Deserializer::from_str(json);
    let out = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    out.map_err(|e| {
        let field = match ctx.field.get() {
            "" => default_field,
            f => f,
        };
        FormatError::BadJson {
            loc: Box::new(Loc {
                file: path.to_path_buf(),
                tensor: ctx.key.borrow_mut().take(),
                field: field.to_owned(),
            }),
            message: e.to_string(),
        }
    })
}

fn check_metadata(
    path: &Path,
    m: Vec<(String, String)>,
) -> Result<Vec<(String, String)>, FormatError> {
    let mut seen = std::collections::HashSet::new();
    for (k, _) in &m {
        if !seen.insert(k.as_str()) {
            return Err(FormatError::DuplicateName {
                loc: Loc::new(path, METADATA_KEY),
                name: k.clone(),
            });
        }
    }
    Ok(m)
}

fn tensor_info(
    path: &Path,
    name: String,
    raw: RawTensor,
    data_offset: u64,
) -> Result<TensorInfo, FormatError> {
    let loc = |field: &str| Loc::tensor(path, &name, field);
    let dtype = DType::from_safetensors(&raw.dtype).ok_or_else(|| FormatError::UnknownDType {
        loc: loc("dtype"),
        dtype: raw.dtype.clone(),
    })?;
    let [begin, end] = raw.data_offsets;
    if begin > end {
        return Err(FormatError::InvalidValue {
            loc: loc("data_offsets"),
            reason: format!("begin {begin} > end {end}"),
        });
    }
    let nbytes = end - begin;
    let n = checked_elements(&raw.shape).ok_or_else(|| FormatError::Overflow {
        loc: loc("shape"),
        what: format!("element count of shape {:?}", raw.shape),
    })?;
    let expected = dtype.bytes_for(n).ok_or_else(|| FormatError::Overflow {
        loc: loc("shape"),
        what: format!("byte size of {n} {dtype} elements"),
    })?;
    if expected != nbytes {
        return Err(FormatError::SizeMismatch {
            loc: loc("data_offsets"),
            expected,
            actual: nbytes,
        });
    }
    let offset = data_offset
        .checked_add(begin)
        .ok_or_else(|| FormatError::Overflow {
            loc: loc("data_offsets"),
            what: format!("data offset {data_offset} + begin {begin}"),
        })?;
    Ok(TensorInfo {
        name,
        dtype,
        shape: raw.shape,
        offset,
        nbytes,
    })
}

/// A safetensors file, mapped read-only, with its parsed header.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mapped,
    header: SafetensorsHeader,
}

impl SafetensorsFile {
    /// Maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        let map = Mapped::open(&path)?;
        let header = parse_safetensors(&path, &map)?;
        Ok(SafetensorsFile { path, map, header })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &SafetensorsHeader {
        &self.header
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> u64 {
        self.header.file_size
    }

    /// `__metadata__` in header order.
    pub fn metadata(&self) -> &[(String, String)] {
        self.header.metadata()
    }

    /// Tensors in header order.
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
    /// that keeps its own copy of the tensor (a re-laid int4 layer). Later reads still work.
    pub fn release_tensor(&self, t: &TensorInfo) {
        self.map.release(self.tensor_bytes(t));
    }

    /// [`Self::release_tensor`] for the bytes `range` of `t` only (clamped to the tensor): for
    /// a caller that copies a large tensor span by span, so that its pages and the copy's
    /// never both hold the whole tensor.
    pub fn release_tensor_range(&self, t: &TensorInfo, range: std::ops::Range<usize>) {
        self.map
            .release(crate::tensor::clamped(self.tensor_bytes(t), range));
    }
}

#[cfg(test)]
#[path = "safetensors_tests.rs"]
mod tests;
