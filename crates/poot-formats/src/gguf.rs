//! GGUF v2/v3 over mmap.
//!
//! Layout: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count, metadata
//! key/value pairs, tensor infos (name, `u32` n_dims, `u64 ne[n_dims]`, `u32` ggml type, `u64`
//! offset relative to the data section), padding up to `general.alignment` (default 32), data.
//!
//! Invariants of a parsed [`GgufHeader`]:
//! - keys and tensor names are unique, valid UTF-8 and at most `max_name_len` bytes;
//! - `alignment` is a nonzero power of two, `data_offset` is the header end aligned up (for a
//!   file with no tensor data, such as a vocabulary-only file, it may lie past the file's end);
//! - every tensor has a known dtype, a row length that is a whole number of blocks, an offset
//!   that is a multiple of `alignment`, and lies inside the file without overlapping another.
//!
//! Every count is checked against the bytes left before anything is allocated for it (each
//! element needs at least a known number of bytes), and against the fixed [`GgufLimits`], so the
//! memory a parse can take is bounded by a small multiple of the header's size. Parsing walks
//! the header once: O(header bytes + n log n) for n tensors; tensor data is never read.

use std::collections::HashMap;
use std::path::Path;

use poot_core::DType;

use crate::error::{FormatError, Loc};
use crate::meta::{MetaArray, MetaValue, StrArray};
use crate::reader::Reader;
use crate::tensor::{check_ranges, checked_elements, TensorInfo};

/// The magic bytes a GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Fixed bounds on what a GGUF header may declare; exceeding one is `AbsurdCount` or `TooDeep`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgufLimits {
    /// Bytes from the start of the file to the end of the metadata section.
    pub max_metadata_bytes: u64,
    /// Metadata values in all, counting every array element.
    pub max_metadata_values: u64,
    /// Array nesting depth (an array of scalars has depth 1).
    pub max_array_depth: u32,
    /// Tensors in the file.
    pub max_tensors: u64,
    /// Bytes in one key or tensor name.
    pub max_name_len: u64,
    /// Dimensions of one tensor (ggml's `GGML_MAX_DIMS`).
    pub max_dims: u32,
}

impl Default for GgufLimits {
    fn default() -> Self {
        GgufLimits {
            max_metadata_bytes: 1 << 30,
            max_metadata_values: 1 << 22,
            max_array_depth: 8,
            max_tensors: 1 << 20,
            max_name_len: 65_535,
            max_dims: 4,
        }
    }
}

/// Metadata value type tags, as stored.
mod tag {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The fewest bytes one value of type `t` occupies, or `None` for an unknown tag.
fn min_value_bytes(t: u32) -> Option<u64> {
    Some(match t {
        tag::U8 | tag::I8 | tag::BOOL => 1,
        tag::U16 | tag::I16 => 2,
        tag::U32 | tag::I32 | tag::F32 => 4,
        tag::U64 | tag::I64 | tag::F64 | tag::STRING => 8,
        tag::ARRAY => 12,
        _ => return None,
    })
}

/// The fewest bytes of one key/value pair: key length, type tag, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// A parsed GGUF header: everything but the tensor data.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    version: u32,
    alignment: u64,
    data_offset: u64,
    file_size: u64,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufHeader {
    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment (a nonzero power of two).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section (header end aligned up).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the parsed byte slice.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value for `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// Parses a GGUF header from `bytes` (the whole file) with the default limits.
pub fn parse_gguf(path_for_errors: &Path, bytes: &[u8]) -> Result<GgufHeader, FormatError> {
    parse_gguf_with_limits(path_for_errors, bytes, &GgufLimits::default())
}

/// Parses a GGUF header from `bytes` (the whole file) with the given limits.
pub fn parse_gguf_with_limits(
    path: &Path,
    bytes: &[u8],
    limits: &GgufLimits,
) -> Result<GgufHeader, FormatError> {
    let mut p = Parser {
        r: Reader::new(path, bytes),
        limits,
        values: 0,
    };
    p.header(bytes.len() as u64)
}

struct Parser<'a, 'l> {
    r: Reader<'a>,
    limits: &'l GgufLimits,
    /// Metadata values read so far, array elements included.
    values: u64,
}

impl<'a> Parser<'a, '_> {
    fn file(&self) -> &'a Path {
        self.r.file()
    }

    fn loc(&self, field: &str) -> Box<Loc> {
        Loc::new(self.file(), field)
    }

    /// Refuses `count` items of at least `min_bytes` each, before anything is allocated: above
    /// `limit` it is `AbsurdCount`; when the bytes left cannot hold them it is `Truncated`.
    fn check_count(
        &self,
        count: u64,
        min_bytes: u64,
        limit: u64,
        tensor: Option<&str>,
        field: &str,
    ) -> Result<(), FormatError> {
        let loc = || Loc::at(self.file(), tensor, field);
        let needed = count.checked_mul(min_bytes);
        match needed {
            _ if count > limit => Err(FormatError::AbsurdCount {
                loc: loc(),
                count,
                limit,
            }),
            None => Err(FormatError::AbsurdCount {
                loc: loc(),
                count,
                limit: u64::MAX / min_bytes,
            }),
            Some(n) if n > self.r.remaining() => Err(self.r.truncated(n, tensor, field)),
            Some(_) => Ok(()),
        }
    }

    /// A `u64`-length-prefixed UTF-8 string of at most `max_len` bytes.
    fn string(
        &mut self,
        max_len: u64,
        tensor: Option<&str>,
        field: &str,
    ) -> Result<&'a str, FormatError> {
        let len = self.r.u64(tensor, field)?;
        if len > max_len {
            return Err(FormatError::AbsurdCount {
                loc: Loc::at(self.file(), tensor, field),
                count: len,
                limit: max_len,
            });
        }
        self.r.str(len, tensor, field)
    }

    fn header(&mut self, file_size: u64) -> Result<GgufHeader, FormatError> {
        let magic: [u8; 4] = self.r.array(None, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(FormatError::BadMagic {
                loc: self.loc("magic"),
                found: magic.to_vec(),
                expected: GGUF_MAGIC.to_vec(),
            });
        }
        let version = self.r.u32(None, "version")?;
        if !(2..=3).contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                loc: self.loc("version"),
                version: version.into(),
                supported: "2, 3",
            });
        }
        let tensor_count = self.r.u64(None, "tensor_count")?;
        let kv_count = self.r.u64(None, "metadata_kv_count")?;
        self.check_count(
            tensor_count,
            MIN_TENSOR_INFO_BYTES,
            self.limits.max_tensors,
            None,
            "tensor_count",
        )?;
        self.check_count(
            kv_count,
            MIN_KV_BYTES,
            self.limits.max_metadata_values,
            None,
            "metadata_kv_count",
        )?;

        let (metadata, meta_index) = self.metadata(kv_count)?;
        let alignment = match metadata_alignment(self.file(), &metadata, &meta_index)? {
            Some(a) => a,
            None => DEFAULT_ALIGNMENT,
        };

        self.check_count(
            tensor_count,
            MIN_TENSOR_INFO_BYTES,
            self.limits.max_tensors,
            None,
            "tensor_count",
        )?;
        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        for i in 0..tensor_count {
            let t = self.tensor_info(i, alignment)?;
            if tensor_index.contains_key(&t.name) {
                return Err(FormatError::DuplicateName {
                    loc: Loc::tensor(self.file(), &t.name, "name"),
                    name: t.name,
                });
            }
            tensor_index.insert(t.name.clone(), tensors.len());
            tensors.push(t);
        }

        let header_end = self.r.pos();
        let data_offset = align_up(header_end, alignment).ok_or_else(|| FormatError::Overflow {
            loc: self.loc("data_offset"),
            what: format!("header end {header_end} aligned up to {alignment}"),
        })?;
        for t in &mut tensors {
            let rel = t.offset;
            t.offset = data_offset
                .checked_add(rel)
                .ok_or_else(|| FormatError::Overflow {
                    loc: Loc::tensor(self.file(), &t.name, "offset"),
                    what: format!("data offset {data_offset} + tensor offset {rel}"),
                })?;
        }
        check_ranges(self.file(), &tensors, data_offset, file_size, "offset")?;

        Ok(GgufHeader {
            version,
            alignment,
            data_offset,
            file_size,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    #[allow(clippy::type_complexity)]
    fn metadata(
        &mut self,
        kv_count: u64,
    ) -> Result<(Vec<(String, MetaValue)>, HashMap<String, usize>), FormatError> {
        let mut metadata = Vec::new();
        let mut index = HashMap::new();
        for i in 0..kv_count {
            let key = self.string(
                self.limits.max_name_len,
                None,
                &format!("metadata[{i}].key"),
            )?;
            if index.contains_key(key) {
                return Err(FormatError::DuplicateName {
                    loc: self.loc(key),
                    name: key.to_owned(),
                });
            }
            let t = self.r.u32(None, key)?;
            self.values = self.values.saturating_add(1);
            let value = self.value(t, key, 0)?;
            if self.r.pos() > self.limits.max_metadata_bytes {
                return Err(FormatError::AbsurdCount {
                    loc: self.loc(key),
                    count: self.r.pos(),
                    limit: self.limits.max_metadata_bytes,
                });
            }
            index.insert(key.to_owned(), metadata.len());
            metadata.push((key.to_owned(), value));
        }
        Ok((metadata, index))
    }

    /// One value of type tag `t` for `key`, inside `depth` enclosing arrays.
    fn value(&mut self, t: u32, key: &str, depth: u32) -> Result<MetaValue, FormatError> {
        let r = &mut self.r;
        Ok(match t {
            tag::U8 => MetaValue::U8(r.u8(None, key)?),
            tag::I8 => MetaValue::I8(r.u8(None, key)? as i8),
            tag::U16 => MetaValue::U16(r.u16(None, key)?),
            tag::I16 => MetaValue::I16(r.u16(None, key)? as i16),
            tag::U32 => MetaValue::U32(r.u32(None, key)?),
            tag::I32 => MetaValue::I32(r.u32(None, key)? as i32),
            tag::F32 => MetaValue::F32(f32::from_bits(r.u32(None, key)?)),
            tag::U64 => MetaValue::U64(r.u64(None, key)?),
            tag::I64 => MetaValue::I64(r.u64(None, key)? as i64),
            tag::F64 => MetaValue::F64(f64::from_bits(r.u64(None, key)?)),
            tag::BOOL => match r.u8(None, key)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(FormatError::InvalidValue {
                        loc: self.loc(key),
                        reason: format!("bool byte {b} is neither 0 nor 1"),
                    })
                }
            },
            tag::STRING => MetaValue::String(self.string(u64::MAX, None, key)?.to_owned()),
            tag::ARRAY => self.array(key, depth)?,
            other => {
                return Err(FormatError::InvalidValue {
                    loc: self.loc(key),
                    reason: format!("unknown metadata value type {other}"),
                })
            }
        })
    }

    fn array(&mut self, key: &str, depth: u32) -> Result<MetaValue, FormatError> {
        Ok(MetaValue::Array(self.array_body(key, depth)?))
    }

    /// An array's element type, count and elements, stored by element type.
    fn array_body(&mut self, key: &str, depth: u32) -> Result<MetaArray, FormatError> {
        if depth >= self.limits.max_array_depth {
            return Err(FormatError::TooDeep {
                loc: self.loc(key),
                limit: self.limits.max_array_depth,
            });
        }
        let elem = self.r.u32(None, key)?;
        let min = min_value_bytes(elem).ok_or_else(|| FormatError::InvalidValue {
            loc: self.loc(key),
            reason: format!("unknown array element type {elem}"),
        })?;
        let count = self.r.u64(None, key)?;
        let values_left = self.limits.max_metadata_values.saturating_sub(self.values);
        self.check_count(count, min, values_left, None, key)?;
        self.values = self.values.saturating_add(count);
        // `count` is now bounded by the bytes left over `min` and by the value limit.
        let n = usize::try_from(count).unwrap_or(0);
        /// Reads `n` fixed-size elements into one `Vec`.
        macro_rules! fixed {
            ($variant:ident, $read:ident, $conv:expr) => {{
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push($conv(self.r.$read(None, key)?));
                }
                MetaArray::$variant(out)
            }};
        }
        Ok(match elem {
            tag::U8 => fixed!(U8, u8, |x| x),
            tag::I8 => fixed!(I8, u8, |x: u8| x as i8),
            tag::U16 => fixed!(U16, u16, |x| x),
            tag::I16 => fixed!(I16, u16, |x: u16| x as i16),
            tag::U32 => fixed!(U32, u32, |x| x),
            tag::I32 => fixed!(I32, u32, |x: u32| x as i32),
            tag::F32 => fixed!(F32, u32, f32::from_bits),
            tag::U64 => fixed!(U64, u64, |x| x),
            tag::I64 => fixed!(I64, u64, |x: u64| x as i64),
            tag::F64 => fixed!(F64, u64, f64::from_bits),
            tag::BOOL => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(match self.r.u8(None, key)? {
                        0 => false,
                        1 => true,
                        b => {
                            return Err(FormatError::InvalidValue {
                                loc: self.loc(key),
                                reason: format!("bool byte {b} is neither 0 nor 1"),
                            })
                        }
                    });
                }
                MetaArray::Bool(out)
            }
            tag::STRING => {
                let mut out = StrArray::with_capacity(n, 0);
                for _ in 0..n {
                    out.push(self.string(u64::MAX, None, key)?);
                }
                out.shrink_to_fit();
                MetaArray::String(out)
            }
            _ => {
                // tag::ARRAY: `min_value_bytes` refused every other tag.
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.array_body(key, depth + 1)?);
                }
                MetaArray::Array(out)
            }
        })
    }

    /// Tensor info `i`, its offset still relative to the data section.
    fn tensor_info(&mut self, i: u64, alignment: u64) -> Result<TensorInfo, FormatError> {
        let name = self
            .string(
                self.limits.max_name_len,
                None,
                &format!("tensor_infos[{i}].name"),
            )?
            .to_owned();
        let tn = Some(name.as_str());
        let n_dims = self.r.u32(tn, "n_dims")?;
        if n_dims > self.limits.max_dims {
            return Err(FormatError::AbsurdCount {
                loc: Loc::tensor(self.file(), &name, "n_dims"),
                count: n_dims.into(),
                limit: self.limits.max_dims.into(),
            });
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = self.r.u64(tn, "shape")?;
            if d > i64::MAX as u64 {
                return Err(FormatError::InvalidValue {
                    loc: Loc::tensor(self.file(), &name, "shape"),
                    reason: format!("dimension {d} is negative as ggml's int64"),
                });
            }
            ne.push(d);
        }
        let type_id = self.r.u32(tn, "dtype")?;
        let rel = self.r.u64(tn, "offset")?;
        let dtype = DType::from_ggml(type_id).ok_or_else(|| FormatError::UnknownDType {
            loc: Loc::tensor(self.file(), &name, "dtype"),
            dtype: format!("ggml type {type_id}"),
        })?;
        let n = checked_elements(&ne).ok_or_else(|| FormatError::Overflow {
            loc: Loc::tensor(self.file(), &name, "shape"),
            what: format!("element count of ne {ne:?}"),
        })?;
        let row = ne.first().copied().unwrap_or(1);
        if row % dtype.block_elems() != 0 {
            return Err(FormatError::InvalidValue {
                loc: Loc::tensor(self.file(), &name, "shape"),
                reason: format!(
                    "row length {row} is not a multiple of the {dtype} block size {}",
                    dtype.block_elems()
                ),
            });
        }
        let nbytes = dtype.bytes_for(n).ok_or_else(|| FormatError::Overflow {
            loc: Loc::tensor(self.file(), &name, "shape"),
            what: format!("byte size of {n} {dtype} elements"),
        })?;
        if rel % alignment != 0 {
            return Err(FormatError::Misaligned {
                loc: Loc::tensor(self.file(), &name, "offset"),
                offset: rel,
                alignment,
            });
        }
        ne.reverse();
        Ok(TensorInfo {
            name,
            dtype,
            shape: ne,
            offset: rel,
            nbytes,
        })
    }
}

/// `general.alignment`, checked: a `u32` that is a nonzero power of two.
fn metadata_alignment(
    file: &Path,
    metadata: &[(String, MetaValue)],
    index: &HashMap<String, usize>,
) -> Result<Option<u64>, FormatError> {
    let Some(&i) = index.get(ALIGNMENT_KEY) else {
        return Ok(None);
    };
    let loc = || Loc::new(file, ALIGNMENT_KEY);
    match metadata[i].1 {
        MetaValue::U32(a) if a != 0 && a.is_power_of_two() => Ok(Some(a.into())),
        MetaValue::U32(a) => Err(FormatError::InvalidValue {
            loc: loc(),
            reason: format!("{a} is not a nonzero power of two"),
        }),
        ref v => Err(FormatError::InvalidValue {
            loc: loc(),
            reason: format!("type {} instead of u32", v.type_name()),
        }),
    }
}

/// `x` rounded up to a multiple of `a` (a power of two), or `None` on overflow.
fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? & !(a - 1))
}

#[path = "gguf_file.rs"]
mod file;
pub use file::GgufFile;

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
