//! Stored weights on the device: the checkpoint's bytes as they are (packed blocks, F16/BF16
//! words), split by whole rows across several buffers where one binding cannot hold them.
//!
//! Invariants: a part holds rows `[row0, row0 + rows)` of the tensor and at most
//! `max_binding` bytes (the adapter's `max_storage_buffer_binding_size`, or the smaller bound a
//! test sets), so every kernel binds one part at a time and reads rows from byte 0 of it; the
//! bytes are never decoded on the host. A weight is uploaded once per runtime and store (the
//! cache holds a `Weak` of the store to tell a new store at a reused address from the old one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use poot_core::DType;
use poot_graph::CompileError;
use poot_runtime::{RuntimeError, WeightStore};

use crate::gpu::{Buffer, Device};

/// Rows of a stored tensor in one buffer.
#[derive(Debug)]
pub(crate) struct Part {
    pub buffer: Arc<Buffer>,
    pub row0: usize,
    pub rows: usize,
}

/// A stored tensor on the device, viewed as `rows` rows of `k` elements.
#[derive(Debug)]
pub(crate) struct GpuWeight {
    pub dtype: DType,
    pub k: usize,
    pub row_bytes: usize,
    pub parts: Vec<Part>,
    pub bytes: u64,
}

/// Bytes of one row of `k` elements of `dtype`, or an error when `k` splits a block.
pub(crate) fn row_bytes(dtype: DType, k: usize) -> Result<usize, CompileError> {
    let elems = dtype.block_elems() as usize;
    if elems == 0 || !k.is_multiple_of(elems) {
        return Err(CompileError::Invalid(format!(
            "wgpu: a row of {k} values is not whole {dtype} blocks of {elems}"
        )));
    }
    Ok(k / elems * dtype.block_bytes() as usize)
}

type Key = (usize, String);
type Entry = (Weak<dyn WeightStore>, Arc<GpuWeight>);

/// Uploaded weights by (store address, name).
#[derive(Default)]
pub(crate) struct WeightCache {
    map: Mutex<HashMap<Key, Entry>>,
}

impl std::fmt::Debug for WeightCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightCache")
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl WeightCache {
    /// Device bytes of the live cached weights.
    pub fn bytes(&self) -> u64 {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values()
            .filter(|(w, _)| w.strong_count() > 0)
            .map(|(_, g)| g.bytes)
            .sum()
    }

    /// The device copy of `name` from `store`, uploading it on first use.
    pub fn get(
        &self,
        device: &Device,
        store: &Arc<dyn WeightStore>,
        name: &str,
        max_binding: u64,
    ) -> Result<Arc<GpuWeight>, RuntimeError> {
        let key = (Arc::as_ptr(store) as *const u8 as usize, name.to_owned());
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (w, _)| w.strong_count() > 0);
        if let Some((w, g)) = map.get(&key) {
            if w.upgrade().is_some_and(|s| Arc::ptr_eq(&s, store)) {
                return Ok(g.clone());
            }
        }
        let g = Arc::new(upload(device, store.as_ref(), name, max_binding)?);
        map.insert(key, (Arc::downgrade(store), g.clone()));
        Ok(g)
    }
}

fn upload(
    device: &Device,
    store: &dyn WeightStore,
    name: &str,
    max_binding: u64,
) -> Result<GpuWeight, RuntimeError> {
    let missing = || RuntimeError::MissingWeight {
        name: name.to_owned(),
    };
    let (dtype, shape) = store.describe(name).ok_or_else(missing)?;
    // A safetensors expert stack has no contiguous bytes: its pieces are gathered into the
    // upload (the device holds its own copy of every weight anyway).
    let gathered;
    let bytes = match store.bytes(name) {
        Some(b) => b,
        None => {
            gathered = store.pieces(name).ok_or_else(missing)?.concat();
            &gathered[..]
        }
    };
    let k = shape.last().copied().unwrap_or(1).max(1);
    let rows: usize = shape.iter().rev().skip(1).product();
    let rb = row_bytes(dtype, k)?;
    if rb.checked_mul(rows) != Some(bytes.len()) {
        return Err(CompileError::Invalid(format!(
            "weight '{name}': {} bytes stored, {rows} rows of {rb} expected",
            bytes.len()
        ))
        .into());
    }
    // Buffers are bound whole and read as u32 words, so each part is padded to 4 bytes.
    let per_part = (max_binding.saturating_sub(4) / rb.max(1) as u64) as usize;
    if per_part == 0 {
        return Err(RuntimeError::OutOfMemory {
            what: "one weight row in a storage binding",
            requested: rb as u64,
            limit: max_binding,
        });
    }
    let mut parts = Vec::new();
    let mut row0 = 0;
    while row0 < rows.max(1) {
        let n = per_part.min(rows.max(1) - row0);
        let chunk = &bytes[row0 * rb..((row0 + n) * rb).min(bytes.len())];
        let size = (chunk.len() as u64).div_ceil(4).max(1) * 4;
        let buffer = device.resident(size, Some(name))?;
        let whole = chunk.len() / 4 * 4;
        if whole > 0 {
            device.write(&buffer, 0, &chunk[..whole])?;
        }
        if whole < chunk.len() {
            let mut tail = [0u8; 4];
            tail[..chunk.len() - whole].copy_from_slice(&chunk[whole..]);
            device.write(&buffer, whole as u64, &tail)?;
        }
        parts.push(Part {
            buffer: Arc::new(buffer),
            row0,
            rows: n,
        });
        row0 += n;
    }
    Ok(GpuWeight {
        dtype,
        k,
        row_bytes: rb,
        parts,
        bytes: bytes.len() as u64,
    })
}
