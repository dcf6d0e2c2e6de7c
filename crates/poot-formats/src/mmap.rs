//! Read-only memory maps of checkpoint files.
//!
//! Invariants: a [`Mapped`] is the whole file as it was when mapped, read-only; an empty file is
//! an empty slice (no mapping is made). Mapping costs address space, not memory: pages are read
//! on first touch, so parsing a header touches only the header's pages.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::error::FormatError;

/// A read-only view of a whole file.
#[derive(Debug)]
pub struct Mapped {
    map: Option<Mmap>,
}

impl Mapped {
    /// Maps `path` read-only. Missing files and directories are `FormatError::Io`.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        let meta = file.metadata().map_err(|e| FormatError::io(path, e))?;
        if !meta.is_file() {
            return Err(FormatError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        if meta.len() == 0 {
            return Ok(Mapped { map: None });
        }
        // SAFETY: the map is read-only and private to this process. The one hazard of a file
        // map, another process truncating or rewriting the file while it is mapped, is outside
        // what Rust can guard; checkpoints are treated as immutable while open, as every mmap
        // loader (llama.cpp, safetensors) does. Bounds are checked against the mapped length.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        Ok(Mapped { map: Some(map) })
    }
}

impl Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
