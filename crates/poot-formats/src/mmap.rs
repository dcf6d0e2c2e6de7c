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

impl Mapped {
    /// Drops the pages of `bytes` (a sub-slice of this map) from the process's resident set.
    /// The map stays valid: the next read of those bytes faults them back in from the file
    /// (or the page cache), so this changes memory use, never contents. Slices that are not
    /// inside the map are ignored, and so is a refusal by the kernel (it is only a hint).
    pub fn release(&self, bytes: &[u8]) {
        let Some(map) = &self.map else { return };
        let base = map.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        if bytes.is_empty() || start < base || start + bytes.len() > base + map.len() {
            return;
        }
        // SAFETY: `MADV_DONTNEED` on a private, read-only file map discards no data: nothing was
        // ever written to it, so a later read sees the file's bytes again, and every `&[u8]`
        // into the map stays valid (same mapping, same contents). memmap2 rounds the range out
        // to whole pages, which only widens what is dropped, never what is read.
        let _ = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start - base,
                bytes.len(),
            )
        };
    }
}

impl Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `bytes` that are present in this process's page tables (Linux pagemap).
    fn present_pages(bytes: &[u8]) -> Option<usize> {
        use std::io::{Read, Seek, SeekFrom};
        let page = 4096;
        let first = bytes.as_ptr() as usize / page;
        let last = (bytes.as_ptr() as usize + bytes.len() - 1) / page;
        let mut f = File::open("/proc/self/pagemap").ok()?;
        f.seek(SeekFrom::Start(first as u64 * 8)).ok()?;
        let mut buf = vec![0u8; (last - first + 1) * 8];
        f.read_exact(&mut buf).ok()?;
        Some(
            buf.chunks_exact(8)
                .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1)
                .count(),
        )
    }

    #[test]
    fn release_drops_pages_and_keeps_contents() {
        let path = std::env::temp_dir().join(format!("poot-mmap-{}.bin", std::process::id()));
        let data: Vec<u8> = (0..64 * 4096).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let m = Mapped::open(&path).unwrap();
        let sum: u64 = m.iter().map(|&b| u64::from(b)).sum();
        let inner = &m[8 * 4096..56 * 4096];
        let Some(before) = present_pages(inner) else {
            std::fs::remove_file(&path).unwrap();
            return; // no pagemap (not Linux): nothing to observe
        };
        assert_eq!(before, 48, "every page was touched");
        m.release(inner);
        assert_eq!(
            present_pages(inner),
            Some(0),
            "released pages left the resident set"
        );
        assert_eq!(m[..], data[..], "contents come back from the file");
        assert_eq!(sum, m.iter().map(|&b| u64::from(b)).sum::<u64>());
        // A slice from elsewhere is ignored, not an error.
        m.release(&data[..4096]);
        std::fs::remove_file(&path).unwrap();
    }
}
