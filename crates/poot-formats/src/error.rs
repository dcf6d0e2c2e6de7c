//! The one error type of this crate.
//!
//! Invariants: every [`FormatError`] names the file it concerns; every variant except
//! [`FormatError::Io`] also carries a [`Loc`] with the header field at fault and, where one is
//! concerned, the tensor. [`FormatError::kind`] is a stable snake_case tag that the Python
//! binding exposes as `CheckpointFormatError.kind`. Building an error never reads the file again.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in a checkpoint an error was found: the file, the tensor (if any) and the header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    /// The file's path, as the caller gave it.
    pub file: PathBuf,
    /// The tensor concerned, if any.
    pub tensor: Option<String>,
    /// The header field concerned, e.g. `"tensor_count"`, `"shape"`, `"general.alignment"`.
    pub field: String,
}

/// Constructors return `Box<Loc>`, the form the error variants hold: boxing keeps
/// `FormatError` (and every `Result` the parsers return) small on the success path.
impl Loc {
    /// A location with no tensor.
    pub fn new(file: &Path, field: impl Into<String>) -> Box<Self> {
        Box::new(Loc {
            file: file.to_path_buf(),
            tensor: None,
            field: field.into(),
        })
    }

    /// A location naming a tensor.
    pub fn tensor(file: &Path, tensor: impl Into<String>, field: impl Into<String>) -> Box<Self> {
        Box::new(Loc {
            file: file.to_path_buf(),
            tensor: Some(tensor.into()),
            field: field.into(),
        })
    }

    /// A location naming a tensor if `tensor` is `Some`.
    pub fn at(file: &Path, tensor: Option<&str>, field: &str) -> Box<Self> {
        Box::new(Loc {
            file: file.to_path_buf(),
            tensor: tensor.map(str::to_owned),
            field: field.to_owned(),
        })
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(t) = &self.tensor {
            write!(f, ": tensor '{t}'")?;
        }
        write!(f, ": field '{}'", self.field)
    }
}

/// Everything that can be wrong with a GGUF or safetensors checkpoint, or with reading it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file could not be opened, read or mapped.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the format's magic bytes.
    #[error("{loc}: bad magic b\"{}\", expected b\"{}\"", found.escape_ascii(), expected.escape_ascii())]
    BadMagic {
        loc: Box<Loc>,
        found: Vec<u8>,
        expected: Vec<u8>,
    },
    /// A format version this crate does not read.
    #[error("{loc}: unsupported version {version} (supported: {supported})")]
    UnsupportedVersion {
        loc: Box<Loc>,
        version: u64,
        supported: &'static str,
    },
    /// The file ends before a field it declares.
    #[error("{loc}: truncated: need {needed} bytes at offset {offset}, only {available} left")]
    Truncated {
        loc: Box<Loc>,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// A tensor dtype poot does not know.
    #[error("{loc}: unknown dtype {dtype}")]
    UnknownDType { loc: Box<Loc>, dtype: String },
    /// A tensor's data does not start on the file's alignment.
    #[error("{loc}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        loc: Box<Loc>,
        offset: u64,
        alignment: u64,
    },
    /// Two tensors (or two metadata keys) share a name.
    #[error("{loc}: duplicate name '{name}'")]
    DuplicateName { loc: Box<Loc>, name: String },
    /// A count or length above a fixed limit (or one whose byte size overflows); rejected
    /// before anything is allocated for it. A count within the limits that the bytes left
    /// cannot hold is `Truncated`, also before any allocation.
    #[error("{loc}: count {count} exceeds the limit {limit}")]
    AbsurdCount {
        loc: Box<Loc>,
        count: u64,
        limit: u64,
    },
    /// Arithmetic on header values overflows `u64` (or the address space).
    #[error("{loc}: arithmetic overflow ({what})")]
    Overflow { loc: Box<Loc>, what: String },
    /// A tensor's byte range lies (partly) outside the file's data.
    #[error(
        "{loc}: byte range {start}..{end} is outside the data region {region_start}..{region_end}"
    )]
    OutOfBounds {
        loc: Box<Loc>,
        start: u64,
        end: u64,
        region_start: u64,
        region_end: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error(
        "{loc}: byte range {start}..{end} overlaps tensor '{other}' at {other_start}..{other_end}"
    )]
    Overlap {
        loc: Box<Loc>,
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
    /// A tensor's stored size does not match its shape and dtype.
    #[error("{loc}: {actual} bytes stored, but shape and dtype need {expected}")]
    SizeMismatch {
        loc: Box<Loc>,
        expected: u64,
        actual: u64,
    },
    /// A string that is not valid UTF-8.
    #[error("{loc}: invalid UTF-8 at offset {offset}")]
    BadUtf8 { loc: Box<Loc>, offset: u64 },
    /// A JSON header or index that does not parse, or has the wrong shape.
    #[error("{loc}: bad JSON: {message}")]
    BadJson { loc: Box<Loc>, message: String },
    /// Metadata arrays nested deeper than the limit.
    #[error("{loc}: arrays nested deeper than {limit}")]
    TooDeep { loc: Box<Loc>, limit: u32 },
    /// A header field with a value the format does not allow.
    #[error("{loc}: invalid value: {reason}")]
    InvalidValue { loc: Box<Loc>, reason: String },
    /// A sharded checkpoint whose index disagrees with its shards.
    #[error("{loc}: index and shards disagree: {reason}")]
    ShardMismatch { loc: Box<Loc>, reason: String },
}

impl FormatError {
    /// The `Io` variant, for a failure on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A stable snake_case tag for the variant (`"truncated"`, `"misaligned"`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            FormatError::Io { .. } => "io",
            FormatError::BadMagic { .. } => "bad_magic",
            FormatError::UnsupportedVersion { .. } => "unsupported_version",
            FormatError::Truncated { .. } => "truncated",
            FormatError::UnknownDType { .. } => "unknown_dtype",
            FormatError::Misaligned { .. } => "misaligned",
            FormatError::DuplicateName { .. } => "duplicate_name",
            FormatError::AbsurdCount { .. } => "absurd_count",
            FormatError::Overflow { .. } => "overflow",
            FormatError::OutOfBounds { .. } => "out_of_bounds",
            FormatError::Overlap { .. } => "overlap",
            FormatError::SizeMismatch { .. } => "size_mismatch",
            FormatError::BadUtf8 { .. } => "bad_utf8",
            FormatError::BadJson { .. } => "bad_json",
            FormatError::TooDeep { .. } => "too_deep",
            FormatError::InvalidValue { .. } => "invalid_value",
            FormatError::ShardMismatch { .. } => "shard_mismatch",
        }
    }

    /// The location, for every variant but `Io`.
    pub fn loc(&self) -> Option<&Loc> {
        let loc = match self {
            FormatError::Io { .. } => return None,
            FormatError::BadMagic { loc, .. }
            | FormatError::UnsupportedVersion { loc, .. }
            | FormatError::Truncated { loc, .. }
            | FormatError::UnknownDType { loc, .. }
            | FormatError::Misaligned { loc, .. }
            | FormatError::DuplicateName { loc, .. }
            | FormatError::AbsurdCount { loc, .. }
            | FormatError::Overflow { loc, .. }
            | FormatError::OutOfBounds { loc, .. }
            | FormatError::Overlap { loc, .. }
            | FormatError::SizeMismatch { loc, .. }
            | FormatError::BadUtf8 { loc, .. }
            | FormatError::BadJson { loc, .. }
            | FormatError::TooDeep { loc, .. }
            | FormatError::InvalidValue { loc, .. }
            | FormatError::ShardMismatch { loc, .. } => loc,
        };
        Some(loc)
    }

    /// The file the error concerns.
    pub fn file(&self) -> &Path {
        if let FormatError::Io { path, .. } = self {
            return path;
        }
        self.loc().map_or(Path::new(""), |l| l.file.as_path())
    }

    /// The tensor the error concerns, if any.
    pub fn tensor(&self) -> Option<&str> {
        self.loc().and_then(|l| l.tensor.as_deref())
    }

    /// The header field the error concerns (`None` only for `Io`).
    pub fn field(&self) -> Option<&str> {
        self.loc().map(|l| l.field.as_str())
    }
}
