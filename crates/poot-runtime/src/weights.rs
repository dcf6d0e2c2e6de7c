//! Weight stores: stored tensors by name, as views into the mapped checkpoint.
//!
//! Invariant: `bytes` returns the tensor exactly as stored (packed blocks, F16/BF16 words);
//! the store keeps the mapping alive for as long as any plan holds it.

use std::collections::HashMap;
use std::sync::Arc;

use poot_core::DType;
use poot_formats::{GgufFile, SafetensorsModel};
use poot_graph::WeightCatalog;

/// Stored tensors by name: type (through `WeightCatalog`) and bytes.
pub trait WeightStore: WeightCatalog {
    /// The tensor's stored bytes, or `None` when there is no such tensor.
    fn bytes(&self, name: &str) -> Option<&[u8]>;
    /// Total bytes of all stored tensors (what "packed stays packed" is measured against).
    fn total_bytes(&self) -> u64;
    /// A hint that a runtime now holds its own copy of `name` (a re-laid layout) and will not
    /// read the stored bytes for a while: a file-mapped store drops their pages from the
    /// resident set, so the copy does not count twice. `bytes` still works afterwards (the
    /// pages come back from the file). The default does nothing, which is always correct.
    fn release(&self, _name: &str) {}
}

fn shape_usize(shape: &[u64]) -> Option<Vec<usize>> {
    shape.iter().map(|&d| usize::try_from(d).ok()).collect()
}

/// The tensors of one GGUF file.
#[derive(Debug, Clone)]
pub struct GgufWeights {
    file: Arc<GgufFile>,
    index: Arc<HashMap<String, usize>>,
}

impl GgufWeights {
    pub fn new(file: Arc<GgufFile>) -> Self {
        let index = file
            .tensors()
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Self {
            file,
            index: Arc::new(index),
        }
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }
}

impl WeightCatalog for GgufWeights {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let t = &self.file.tensors()[*self.index.get(name)?];
        Some((t.dtype, shape_usize(&t.shape)?))
    }
}

impl WeightStore for GgufWeights {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        let t = &self.file.tensors()[*self.index.get(name)?];
        Some(self.file.tensor_bytes(t))
    }

    fn total_bytes(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.nbytes).sum()
    }

    fn release(&self, name: &str) {
        if let Some(&i) = self.index.get(name) {
            self.file.release_tensor(&self.file.tensors()[i]);
        }
    }
}

/// The tensors of a (possibly sharded) safetensors checkpoint.
#[derive(Debug, Clone)]
pub struct SafetensorsWeights {
    model: Arc<SafetensorsModel>,
}

impl SafetensorsWeights {
    pub fn new(model: Arc<SafetensorsModel>) -> Self {
        Self { model }
    }
}

impl WeightCatalog for SafetensorsWeights {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let (_, t) = self.model.tensor(name)?;
        Some((t.dtype, shape_usize(&t.shape)?))
    }
}

impl WeightStore for SafetensorsWeights {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        let (file, t) = self.model.tensor(name)?;
        Some(file.tensor_bytes(t))
    }

    fn total_bytes(&self) -> u64 {
        self.model.tensors().map(|(_, t)| t.nbytes).sum()
    }
}
