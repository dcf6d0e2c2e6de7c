//! A bounds-checked little-endian cursor over a byte slice.
//!
//! Invariants: no method reads past the end of the slice or panics; every read either advances
//! the position by exactly the bytes it consumed or returns [`FormatError::Truncated`] and
//! leaves the position unchanged. Lengths are `u64` as stored and are compared against the bytes
//! left before any conversion to `usize`, so a huge length is an error, never an allocation.
//! Errors name the file and the field the caller passes; the field string is only turned into
//! an owned `String` on the error path.

use std::path::Path;

use crate::error::{FormatError, Loc};

/// A cursor over `bytes`, reporting errors against `file`.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    file: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at offset 0.
    pub fn new(file: &'a Path, bytes: &'a [u8]) -> Self {
        Reader {
            file,
            bytes,
            pos: 0,
        }
    }

    /// The file errors are reported against.
    pub fn file(&self) -> &'a Path {
        self.file
    }

    /// Current offset from the start of the slice.
    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the current offset.
    pub fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// A `Truncated` error for `needed` bytes at the current offset.
    pub fn truncated(&self, needed: u64, tensor: Option<&str>, field: &str) -> FormatError {
        FormatError::Truncated {
            loc: Loc::at(self.file, tensor, field),
            offset: self.pos(),
            needed,
            available: self.remaining(),
        }
    }

    /// The next `n` bytes.
    pub fn bytes(
        &mut self,
        n: u64,
        tensor: Option<&str>,
        field: &str,
    ) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(self.truncated(n, tensor, field));
        }
        // `n <= remaining <= usize::MAX`, so the cast is lossless and the slice is in bounds.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(
        &mut self,
        tensor: Option<&str>,
        field: &str,
    ) -> Result<[u8; N], FormatError> {
        let b = self.bytes(N as u64, tensor, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    /// A little-endian `u8`.
    pub fn u8(&mut self, tensor: Option<&str>, field: &str) -> Result<u8, FormatError> {
        Ok(self.array::<1>(tensor, field)?[0])
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self, tensor: Option<&str>, field: &str) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array(tensor, field)?))
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, tensor: Option<&str>, field: &str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(tensor, field)?))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, tensor: Option<&str>, field: &str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(tensor, field)?))
    }

    /// A UTF-8 string of `len` bytes at the cursor, borrowed from the slice.
    pub fn str(
        &mut self,
        len: u64,
        tensor: Option<&str>,
        field: &str,
    ) -> Result<&'a str, FormatError> {
        let start = self.pos();
        let b = self.bytes(len, tensor, field)?;
        std::str::from_utf8(b).map_err(|e| FormatError::BadUtf8 {
            loc: Loc::at(self.file, tensor, field),
            offset: start.saturating_add(e.valid_up_to() as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_refuses_past_end() {
        let data = [1u8, 0, 0, 0, 2, 0];
        let mut r = Reader::new(Path::new("f"), &data);
        assert_eq!(r.u32(None, "a").unwrap(), 1);
        let e = r.u32(Some("t"), "b").unwrap_err();
        assert_eq!(e.kind(), "truncated");
        assert_eq!(e.tensor(), Some("t"));
        assert_eq!(e.field(), Some("b"));
        assert_eq!(r.pos(), 4, "a failed read leaves the position unchanged");
        assert_eq!(r.u16(None, "c").unwrap(), 2);
        assert!(r.bytes(u64::MAX, None, "d").is_err());
    }

    #[test]
    fn bad_utf8_names_offset() {
        let data = [b'a', 0xff];
        let mut r = Reader::new(Path::new("f"), &data);
        match r.str(2, None, "k").unwrap_err() {
            FormatError::BadUtf8 { offset, loc } => {
                assert_eq!(offset, 1);
                assert_eq!(loc.field, "k");
            }
            e => panic!("unexpected {e}"),
        }
    }
}
