//! Weight stores: stored tensors by name, as views into the mapped checkpoint.
//!
//! Invariant: `bytes` returns the tensor exactly as stored (packed blocks, F16/BF16 words);
//! the store keeps the mapping alive for as long as any plan holds it.
//!
//! Expert stacks: a safetensors checkpoint stores a MoE layer's experts one tensor each
//! (`{p}.experts.{j}.{rest}`). `SafetensorsWeights` also describes each complete set of them
//! (ids `0..E`, one dtype and shape `S`) as a virtual tensor `{p}.experts.{rest}` of shape
//! `[E, ..S]`, whose `pieces` are the E mapped slices in expert order, borrowed, never copied;
//! it has no contiguous `bytes`. Only readers that take `pieces` (the MoE matmuls) read it.

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
    /// pages come back from the file), but a store whose copy is on the heap rebuilds it then
    /// (`released_copy`), so a runtime must not ask for a released tensor's bytes it does not
    /// read. The default does nothing, which is always correct.
    fn release(&self, _name: &str) {}
    /// [`WeightStore::release`] for the bytes `range` of `name` only (clamped to the tensor):
    /// a runtime copying a large tensor span by span releases each span once copied, so the
    /// file's pages and the copy never both hold the whole tensor (the loading peak). A store
    /// whose bytes are its own memory ignores it (a partly released copy could not be read
    /// back); so does the default.
    fn release_range(&self, _name: &str, _range: std::ops::Range<usize>) {}
    /// Drops the mapped pages of stored tensors the store never serves (the sources of a
    /// load-time re-lay), which reads of their neighbours fault back in: for a runtime that
    /// has made its copies and released what it copied. The default does nothing.
    fn release_unserved(&self) {}
    /// Whether `name`'s bytes may live in a file's mapped pages (which `release` drops and a
    /// read faults back in). A runtime copies a small tensor of that kind before releasing its
    /// neighbours; one the store holds in its own memory (a load-time re-lay) is read where it
    /// is, since a copy would hold it twice. The default, true, is always correct.
    fn mapped(&self, _name: &str) -> bool {
        true
    }
    /// The tensor's bytes as consecutive pieces in order: one piece for a stored tensor, one
    /// per expert for a virtual expert stack (see the module docs).
    fn pieces(&self, name: &str) -> Option<Vec<&[u8]>> {
        self.bytes(name).map(|b| vec![b])
    }
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

    fn release_range(&self, name: &str, range: std::ops::Range<usize>) {
        if let Some(&i) = self.index.get(name) {
            self.file
                .release_tensor_range(&self.file.tensors()[i], range);
        }
    }
}

/// The tensors of a (possibly sharded) safetensors checkpoint, and its expert stacks.
#[derive(Debug, Clone)]
pub struct SafetensorsWeights {
    model: Arc<SafetensorsModel>,
    /// Virtual name -> (dtype, [E, ..S], the experts' tensor names in expert order).
    stacks: Arc<HashMap<String, Stack>>,
}

/// An expert stack: (dtype, `[E, ..S]`, the experts' tensor names in expert order).
pub(crate) type Stack = (DType, Vec<usize>, Vec<String>);
/// One expert tensor of a stack: (expert id, stored name, dtype, shape).
type Member = (usize, String, DType, Vec<usize>);

/// `{p}.experts.{j}.{rest}` -> (`{p}.experts.{rest}`, j).
pub(crate) fn expert_of(name: &str) -> Option<(String, usize)> {
    let at = name.find(".experts.")? + ".experts.".len();
    let (id, rest) = name[at..].split_once('.')?;
    let j: usize = id.parse().ok()?;
    Some((format!("{}{rest}", &name[..at]), j))
}

/// The complete expert stacks among `tensors` (name, dtype, shape), see the module docs; an
/// incomplete or mixed set is left out, so asking for it is a missing weight.
pub(crate) fn stacks_of(
    tensors: impl Iterator<Item = (String, DType, Vec<usize>)>,
) -> HashMap<String, Stack> {
    let mut found: HashMap<String, Vec<Member>> = HashMap::new();
    for (name, dtype, shape) in tensors {
        if let Some((stack, j)) = expert_of(&name) {
            found
                .entry(stack)
                .or_default()
                .push((j, name, dtype, shape));
        }
    }
    let mut out = HashMap::new();
    for (stack, mut experts) in found {
        experts.sort_by_key(|e| e.0);
        let (_, _, dtype, shape) = experts[0].clone();
        let complete = experts
            .iter()
            .enumerate()
            .all(|(i, (j, _, d, s))| *j == i && *d == dtype && *s == shape);
        if !complete {
            continue;
        }
        let dims = [vec![experts.len()], shape].concat();
        let names = experts.into_iter().map(|e| e.1).collect();
        out.insert(stack, (dtype, dims, names));
    }
    out
}

/// The complete expert stacks of `model`'s stored tensors.
fn expert_stacks(model: &SafetensorsModel) -> HashMap<String, Stack> {
    stacks_of(
        model
            .tensors()
            .filter_map(|(_, t)| Some((t.name.clone(), t.dtype, shape_usize(&t.shape)?))),
    )
}

impl SafetensorsWeights {
    pub fn new(model: Arc<SafetensorsModel>) -> Self {
        let stacks = Arc::new(expert_stacks(&model));
        Self { model, stacks }
    }
}

impl WeightCatalog for SafetensorsWeights {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        if let Some((dtype, shape, _)) = self.stacks.get(name) {
            return Some((*dtype, shape.clone()));
        }
        let (_, t) = self.model.tensor(name)?;
        Some((t.dtype, shape_usize(&t.shape)?))
    }
}

impl WeightStore for SafetensorsWeights {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        let (file, t) = self.model.tensor(name)?;
        Some(file.tensor_bytes(t))
    }

    fn pieces(&self, name: &str) -> Option<Vec<&[u8]>> {
        match self.stacks.get(name) {
            Some((_, _, names)) => names.iter().map(|n| self.bytes(n)).collect(),
            None => self.bytes(name).map(|b| vec![b]),
        }
    }

    fn total_bytes(&self) -> u64 {
        self.model.tensors().map(|(_, t)| t.nbytes).sum()
    }

    /// As the GGUF store does: a runtime that copied `name` (a float matrix moved to huge
    /// pages, a re-laid layout) no longer keeps the file's pages resident beside its copy; an
    /// expert stack releases each of its experts.
    fn release(&self, name: &str) {
        let names = match self.stacks.get(name) {
            Some((_, _, names)) => names.clone(),
            None => vec![name.to_string()],
        };
        for n in &names {
            if let Some((file, t)) = self.model.tensor(n) {
                file.release_tensor(t);
            }
        }
    }

    /// A stored tensor's range; for an expert stack the range counts its experts' bytes one
    /// after another (as `pieces` lists them), and each expert wholly inside it is released
    /// (a runtime re-laying the stack expert by expert releases each as it goes).
    fn release_range(&self, name: &str, range: std::ops::Range<usize>) {
        if let Some((_, _, names)) = self.stacks.get(name) {
            let mut at = 0;
            for n in names {
                let Some((file, t)) = self.model.tensor(n) else {
                    continue;
                };
                let len = t.nbytes as usize;
                if range.start <= at && at + len <= range.end {
                    file.release_tensor(t);
                }
                at += len;
            }
            return;
        }
        if let Some((file, t)) = self.model.tensor(name) {
            file.release_tensor_range(t, range);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of F32 tensors, each `[2, 2]`, holding its index in every element.
    fn write(path: &std::path::Path, names: &[&str]) {
        let mut header = String::from("{");
        for (i, n) in names.iter().enumerate() {
            let (a, b) = (i * 16, i * 16 + 16);
            let sep = if i == 0 { "" } else { "," };
            header +=
                &format!(r#"{sep}"{n}":{{"dtype":"F32","shape":[2,2],"data_offsets":[{a},{b}]}}"#);
        }
        header += "}";
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        for i in 0..names.len() {
            for _ in 0..4 {
                out.extend_from_slice(&(i as f32).to_le_bytes());
            }
        }
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn complete_expert_sets_are_virtual_stacks_of_their_mapped_pieces() {
        let dir = std::env::temp_dir().join(format!("poot-stacks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        // Layer 0: experts 0..3 stored out of order;
        // layer 1: expert 1 missing, so no stack.
        let names = [
            "l.0.mlp.experts.2.up.weight",
            "l.0.mlp.experts.0.up.weight",
            "l.0.mlp.experts.1.up.weight",
            "l.1.mlp.experts.0.up.weight",
            "l.1.mlp.experts.2.up.weight",
            "l.0.mlp.shared_expert.up.weight",
        ];
        write(&path, &names);
        let w = SafetensorsWeights::new(Arc::new(SafetensorsModel::open(&path).unwrap()));
        let stack = "l.0.mlp.experts.up.weight";
        assert_eq!(w.describe(stack), Some((DType::F32, vec![3, 2, 2])));
        assert!(w.bytes(stack).is_none(), "a stack has no contiguous bytes");
        let pieces = w.pieces(stack).unwrap();
        // Expert e's piece is the stored tensor of expert e (file index 1, 2, 0), in place.
        let first = |p: &[u8]| f32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        let got: Vec<f32> = pieces.iter().map(|p| first(p)).collect();
        assert_eq!(got, vec![1.0, 2.0, 0.0]);
        let stored = w.bytes("l.0.mlp.experts.0.up.weight").unwrap();
        assert_eq!(
            pieces[0].as_ptr(),
            stored.as_ptr(),
            "borrowed from the map, not copied"
        );
        assert_eq!(w.describe("l.1.mlp.experts.up.weight"), None);
        assert_eq!(
            w.pieces("l.0.mlp.shared_expert.up.weight").unwrap().len(),
            1
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn released_tensors_still_read_their_stored_bytes() {
        // Releasing drops pages only: a tensor, an expert stack and an unknown name (a no-op)
        // all read back the same bytes afterwards.
        let dir = std::env::temp_dir().join(format!("poot-release-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let names = ["a.weight", "l.0.experts.0.w", "l.0.experts.1.w"];
        write(&path, &names);
        let w = SafetensorsWeights::new(Arc::new(SafetensorsModel::open(&path).unwrap()));
        let before: Vec<Vec<u8>> = names.iter().map(|n| w.bytes(n).unwrap().to_vec()).collect();
        for n in ["a.weight", "l.0.experts.w", "no.such.tensor"] {
            w.release(n);
        }
        // A range of a tensor, one past its end (clamped), an expert stack's first expert (the
        // range in its experts' bytes one after another) and the unserved tensors (none here)
        // release pages only as well.
        w.release_range("a.weight", 4..12);
        w.release_range("a.weight", 8..4096);
        w.release_range("l.0.experts.w", 0..16);
        w.release_unserved();
        for (n, b) in names.iter().zip(&before) {
            assert_eq!(w.bytes(n).unwrap(), &b[..], "{n}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
