//! Hugging Face checkpoints split over several safetensors files.
//!
//! [`SafetensorsModel::open`] takes a directory (its `model.safetensors.index.json` if present,
//! else every `*.safetensors` in it, sorted by name), an index JSON file, or one safetensors file.
//!
//! Invariants: every tensor name is unique across all files (`DuplicateName` otherwise); with an
//! index, the weight map and the shards agree exactly: each listed tensor is in the shard named,
//! and every tensor of every shard is listed (`ShardMismatch` otherwise). Shard names are plain
//! file names inside the index's directory, never paths. Each file is mapped once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{FormatError, Loc};
use crate::json::{Ctx, IndexSeed};
use crate::safetensors::{parse_json, SafetensorsFile, MAX_HEADER_BYTES};
use crate::tensor::TensorInfo;

/// The index file name a sharded Hugging Face directory carries.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A checkpoint made of one or more safetensors files.
#[derive(Debug)]
pub struct SafetensorsModel {
    index: Option<PathBuf>,
    files: Vec<SafetensorsFile>,
    /// (file index, tensor index) in file order, then header order.
    order: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
}

impl SafetensorsModel {
    /// Opens a directory, an index JSON file, or a single safetensors file.
    pub fn open(dir_or_index_or_file: impl AsRef<Path>) -> Result<Self, FormatError> {
        let p = dir_or_index_or_file.as_ref();
        if p.is_dir() {
            let index = p.join(INDEX_FILE);
            if index.is_file() {
                return Self::from_index(&index);
            }
            return Self::from_files(None, list_safetensors(p)?, &HashMap::new());
        }
        if p.extension().is_some_and(|e| e == "json") {
            return Self::from_index(p);
        }
        Self::from_files(None, vec![p.to_path_buf()], &HashMap::new())
    }

    fn from_index(index: &Path) -> Result<Self, FormatError> {
        let text = read_index(index)?;
        let ctx = Ctx::default();
        let weight_map = parse_json(index, &text, &ctx, "index", IndexSeed(&ctx))?;
        let dir = index.parent().unwrap_or(Path::new(""));
        let mut shard_names: Vec<&str> = Vec::new();
        let mut wanted: HashMap<&str, &str> = HashMap::new();
        for (tensor, shard) in &weight_map {
            if wanted.insert(tensor, shard).is_some() {
                return Err(FormatError::DuplicateName {
                    loc: Loc::tensor(index, tensor, "weight_map"),
                    name: tensor.clone(),
                });
            }
            if !is_plain_file_name(shard) {
                return Err(FormatError::InvalidValue {
                    loc: Loc::tensor(index, tensor, "weight_map"),
                    reason: format!("shard {shard:?} is not a plain file name"),
                });
            }
            if !shard_names.contains(&shard.as_str()) {
                shard_names.push(shard);
            }
        }
        let paths = shard_names.iter().map(|s| dir.join(s)).collect();
        let wanted_paths: HashMap<&str, PathBuf> =
            wanted.iter().map(|(t, s)| (*t, dir.join(s))).collect();
        let model = Self::from_files(Some(index.to_path_buf()), paths, &wanted_paths)?;
        // Every listed tensor must be in the shard named.
        for (tensor, shard_path) in &wanted_paths {
            if !model.by_name.contains_key(*tensor) {
                return Err(FormatError::ShardMismatch {
                    loc: Loc::tensor(shard_path, *tensor, "weight_map"),
                    reason: format!(
                        "the index {} lists it in this shard, but the shard lacks it",
                        index.display()
                    ),
                });
            }
        }
        Ok(model)
    }

    /// Opens `paths`; with an index, each tensor must be listed in `wanted` for its own file.
    fn from_files(
        index: Option<PathBuf>,
        paths: Vec<PathBuf>,
        wanted: &HashMap<&str, PathBuf>,
    ) -> Result<Self, FormatError> {
        let files = paths
            .into_iter()
            .map(SafetensorsFile::open)
            .collect::<Result<Vec<_>, _>>()?;
        let mut order = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        // Duplicates first: a tensor in two files is a duplicate whatever the index says.
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors().iter().enumerate() {
                if by_name.contains_key(&t.name) {
                    return Err(FormatError::DuplicateName {
                        loc: Loc::tensor(f.path(), &t.name, "name"),
                        name: t.name.clone(),
                    });
                }
                by_name.insert(t.name.clone(), order.len());
                order.push((fi, ti));
            }
        }
        if let Some(idx) = &index {
            for f in &files {
                for t in f.tensors() {
                    let loc = || Loc::tensor(f.path(), &t.name, "weight_map");
                    match wanted.get(t.name.as_str()) {
                        Some(p) if p == f.path() => {}
                        Some(p) => {
                            let reason =
                                format!("the index {} places it in {}", idx.display(), p.display());
                            return Err(FormatError::ShardMismatch { loc: loc(), reason });
                        }
                        None => {
                            let reason = format!("the index {} does not list it", idx.display());
                            return Err(FormatError::ShardMismatch { loc: loc(), reason });
                        }
                    }
                }
            }
        }
        Ok(SafetensorsModel {
            index,
            files,
            order,
            by_name,
        })
    }

    /// The index file, when the model was opened through one.
    pub fn index_path(&self) -> Option<&Path> {
        self.index.as_deref()
    }

    /// The files, in shard order.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// Every tensor with its file, in file order then header order.
    pub fn tensors(&self) -> impl Iterator<Item = (&SafetensorsFile, &TensorInfo)> {
        self.order
            .iter()
            .map(|&(f, t)| (&self.files[f], &self.files[f].tensors()[t]))
    }

    /// The tensor named `name` with its file.
    pub fn tensor(&self, name: &str) -> Option<(&SafetensorsFile, &TensorInfo)> {
        let &(f, t) = self.order.get(*self.by_name.get(name)?)?;
        Some((&self.files[f], &self.files[f].tensors()[t]))
    }

    /// `__metadata__` of all files merged in file order; the first file to set a key wins.
    pub fn metadata(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for f in &self.files {
            for (k, v) in f.metadata() {
                if seen.insert(k.as_str()) {
                    out.push((k.clone(), v.clone()));
                }
            }
        }
        out
    }
}

/// True for a name that stays inside its directory: no separators, not `.`/`..`, not empty.
fn is_plain_file_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\', '\0']) && !s.contains(':')
}

fn read_index(index: &Path) -> Result<String, FormatError> {
    let len = std::fs::metadata(index)
        .map_err(|e| FormatError::io(index, e))?
        .len();
    if len > MAX_HEADER_BYTES {
        return Err(FormatError::AbsurdCount {
            loc: Loc::new(index, "index"),
            count: len,
            limit: MAX_HEADER_BYTES,
        });
    }
    let bytes = std::fs::read(index).map_err(|e| FormatError::io(index, e))?;
    String::from_utf8(bytes).map_err(|e| FormatError::BadUtf8 {
        loc: Loc::new(index, "index"),
        offset: e.utf8_error().valid_up_to() as u64,
    })
}

fn list_safetensors(dir: &Path) -> Result<Vec<PathBuf>, FormatError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))? {
        let p = entry.map_err(|e| FormatError::io(dir, e))?.path();
        if p.extension().is_some_and(|e| e == "safetensors") && p.is_file() {
            out.push(p);
        }
    }
    if out.is_empty() {
        let e = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no *.safetensors files or index in this directory",
        );
        return Err(FormatError::io(dir, e));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{safetensors, TempDir};

    fn shard(names: &[&str]) -> Vec<u8> {
        let entries: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    r#""{n}":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}"#,
                    4 * i,
                    4 * i + 4
                )
            })
            .collect();
        safetensors(
            &format!(
                r#"{{"__metadata__":{{"format":"pt"}},{}}}"#,
                entries.join(",")
            ),
            4 * names.len(),
        )
    }

    fn index(map: &[(&str, &str)]) -> Vec<u8> {
        let entries: Vec<String> = map.iter().map(|(t, s)| format!(r#""{t}":"{s}""#)).collect();
        format!(
            r#"{{"metadata":{{"total_size":16}},"weight_map":{{{}}}}}"#,
            entries.join(",")
        )
        .into_bytes()
    }

    fn two_shards(dir: &TempDir) {
        dir.write("m-1.safetensors", &shard(&["a", "b"]));
        dir.write("m-2.safetensors", &shard(&["c"]));
    }

    #[track_caller]
    fn expect(
        r: Result<SafetensorsModel, FormatError>,
        kind: &str,
        file: &Path,
        tensor: Option<&str>,
        field: &str,
    ) {
        let e = r.expect_err("expected an error");
        assert_eq!(
            (e.kind(), e.file(), e.tensor(), e.field()),
            (kind, file, tensor, Some(field)),
            "{e}"
        );
    }

    #[test]
    fn opens_index_dir_file_and_plain_dir() {
        let dir = TempDir::new("sharded-ok");
        two_shards(&dir);
        let idx = dir.write(
            INDEX_FILE,
            &index(&[
                ("c", "m-2.safetensors"),
                ("a", "m-1.safetensors"),
                ("b", "m-1.safetensors"),
            ]),
        );
        for m in [
            SafetensorsModel::open(&dir.0).unwrap(),
            SafetensorsModel::open(&idx).unwrap(),
        ] {
            assert_eq!(m.index_path(), Some(idx.as_path()));
            assert_eq!(m.files().len(), 2);
            assert_eq!(
                m.files()[0].path(),
                dir.0.join("m-2.safetensors"),
                "shards in index order"
            );
            let names: Vec<_> = m.tensors().map(|(_, t)| t.name.as_str()).collect();
            assert_eq!(names, ["c", "a", "b"]);
            let (f, t) = m.tensor("b").unwrap();
            assert_eq!(
                (f.path(), f.tensor_bytes(t)),
                (dir.0.join("m-1.safetensors").as_path(), &[4u8, 5, 6, 7][..])
            );
            assert_eq!(m.metadata(), [("format".to_owned(), "pt".to_owned())]);
        }
        std::fs::remove_file(&idx).unwrap();
        let m = SafetensorsModel::open(&dir.0).unwrap();
        assert_eq!(
            (m.index_path(), m.files().len(), m.tensors().count()),
            (None, 2, 3)
        );
        let one = SafetensorsModel::open(dir.0.join("m-2.safetensors")).unwrap();
        assert_eq!(one.tensors().count(), 1);
    }

    #[test]
    fn index_and_shards_must_agree() {
        let dir = TempDir::new("sharded-bad");
        two_shards(&dir);
        let s1 = dir.0.join("m-1.safetensors");
        let s2 = dir.0.join("m-2.safetensors");
        let idx = dir.0.join(INDEX_FILE);
        let open = |map: &[(&str, &str)]| {
            dir.write(INDEX_FILE, &index(map));
            SafetensorsModel::open(&dir.0)
        };
        // Listed in a shard that lacks it.
        let r = open(&[
            ("a", "m-1.safetensors"),
            ("b", "m-1.safetensors"),
            ("c", "m-2.safetensors"),
            ("z", "m-2.safetensors"),
        ]);
        expect(r, "shard_mismatch", &s2, Some("z"), "weight_map");
        // Present in a shard but not listed.
        let r = open(&[("a", "m-1.safetensors"), ("c", "m-2.safetensors")]);
        expect(r, "shard_mismatch", &s1, Some("b"), "weight_map");
        // Listed in the wrong shard.
        let r = open(&[
            ("a", "m-1.safetensors"),
            ("b", "m-2.safetensors"),
            ("c", "m-2.safetensors"),
        ]);
        expect(r, "shard_mismatch", &s1, Some("b"), "weight_map");
        // A path instead of a file name.
        let r = open(&[("a", "../m-1.safetensors")]);
        expect(r, "invalid_value", &idx, Some("a"), "weight_map");
        // The same tensor listed twice.
        let r = open(&[("a", "m-1.safetensors"), ("a", "m-2.safetensors")]);
        expect(r, "duplicate_name", &idx, Some("a"), "weight_map");
        // A missing shard file.
        let e = open(&[("a", "m-9.safetensors")]).unwrap_err();
        assert!(
            matches!(&e, FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{e}"
        );
        // No weight_map, bad JSON, bad UTF-8.
        dir.write(INDEX_FILE, br#"{"metadata":{}}"#);
        expect(
            SafetensorsModel::open(&dir.0),
            "bad_json",
            &idx,
            None,
            "weight_map",
        );
        dir.write(INDEX_FILE, br#"{"weight_map":{"a":1}}"#);
        expect(
            SafetensorsModel::open(&dir.0),
            "bad_json",
            &idx,
            None,
            "weight_map",
        );
        dir.write(INDEX_FILE, b"[]");
        expect(
            SafetensorsModel::open(&dir.0),
            "bad_json",
            &idx,
            None,
            "index",
        );
        dir.write(INDEX_FILE, b"{\xff}");
        expect(
            SafetensorsModel::open(&dir.0),
            "bad_utf8",
            &idx,
            None,
            "index",
        );
    }

    #[test]
    fn a_tensor_in_two_shards_is_a_duplicate() {
        let dir = TempDir::new("sharded-dup");
        dir.write("m-1.safetensors", &shard(&["a", "b"]));
        let s2 = dir.write("m-2.safetensors", &shard(&["b"]));
        expect(
            SafetensorsModel::open(&dir.0),
            "duplicate_name",
            &s2,
            Some("b"),
            "name",
        );
        dir.write(
            INDEX_FILE,
            &index(&[
                ("a", "m-1.safetensors"),
                ("b", "m-1.safetensors"),
                ("c", "m-2.safetensors"),
            ]),
        );
        expect(
            SafetensorsModel::open(&dir.0),
            "duplicate_name",
            &s2,
            Some("b"),
            "name",
        );
    }

    #[test]
    fn empty_directory_is_not_found() {
        let dir = TempDir::new("sharded-empty");
        let e = SafetensorsModel::open(&dir.0).unwrap_err();
        assert!(
            matches!(&e, FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{e}"
        );
    }
}
