//! Builders for small GGUF and safetensors byte buffers, and a scratch directory (tests only).

use std::path::{Path, PathBuf};

/// The file name the unit tests report errors against.
pub const FILE: &str = "test.gguf";

pub fn file() -> &'static Path {
    Path::new(FILE)
}

/// A GGUF file under construction: metadata and tensor infos as raw bytes.
pub struct Gguf {
    pub version: u32,
    pub n_kv: u64,
    pub kvs: Vec<u8>,
    pub n_tensors: u64,
    pub infos: Vec<u8>,
    pub alignment: u64,
    pub data_len: u64,
}

pub fn gstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

impl Gguf {
    pub fn new() -> Self {
        Gguf {
            version: 3,
            n_kv: 0,
            kvs: Vec::new(),
            n_tensors: 0,
            infos: Vec::new(),
            alignment: 32,
            data_len: 0,
        }
    }

    /// A key with a raw type tag and value bytes.
    pub fn kv(mut self, key: &str, tag: u32, value: &[u8]) -> Self {
        gstr(&mut self.kvs, key.as_bytes());
        self.kvs.extend_from_slice(&tag.to_le_bytes());
        self.kvs.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv(key, 4, &v.to_le_bytes())
    }

    pub fn kv_str(self, key: &str, v: &str) -> Self {
        let mut b = Vec::new();
        gstr(&mut b, v.as_bytes());
        self.kv(key, 8, &b)
    }

    /// A tensor info with a raw type id and offset relative to the data section.
    pub fn tensor(mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Self {
        gstr(&mut self.infos, name.as_bytes());
        self.infos
            .extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&ty.to_le_bytes());
        self.infos.extend_from_slice(&offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    pub fn data(mut self, len: u64) -> Self {
        self.data_len = len;
        self
    }

    /// The header bytes only (no padding, no data).
    pub fn header(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kvs);
        out.extend_from_slice(&self.infos);
        out
    }

    /// Header, padding to the alignment, then `data_len` bytes (0, 1, 2, ...).
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header();
        while !(out.len() as u64).is_multiple_of(self.alignment) {
            out.push(0);
        }
        out.extend((0..self.data_len).map(|i| i as u8));
        out
    }
}

/// A safetensors file from a JSON header and `data_len` data bytes (0, 1, 2, ...).
pub fn safetensors(json: &str, data_len: usize) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend((0..data_len).map(|i| i as u8));
    out
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("poot-formats-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
