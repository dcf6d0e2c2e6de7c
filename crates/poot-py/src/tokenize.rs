//! `poot._native.BpeModel`: poot-tokenize's byte-level BPE model for Python.
//!
//! Invariants: a model built `from_gguf` reads the token texts and merges straight from the
//! opened file's parsed metadata, so no Python object is made per token or per merge; the model
//! is immutable, and building it, and encoding more than a prompt's worth of words, run with
//! the GIL released; words are read in place (no copy of a word's UTF-8).

use poot_formats::{MetaArray, MetaValue, StrArray};
use poot_tokenize::BpeModel;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;

use crate::errors::{tokenize_error, tokenizer_error};
use crate::formats::PyGgufFile;
use crate::gil::without_gil;

/// Words from which `encode` releases the GIL.
const GIL_FREE_WORDS: usize = 256;

/// Registers the classes of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBpeModel>()?;
    Ok(())
}

/// A byte-level BPE vocabulary with merge ranks; merges pre-tokenized words.
#[pyclass(name = "BpeModel", module = "poot._native", frozen)]
#[derive(Debug)]
pub struct PyBpeModel {
    inner: BpeModel,
}

/// The strings under `key`, or an error naming the key.
fn strings<'a>(
    py: Python<'_>,
    value: Option<&'a MetaValue>,
    key: &str,
) -> PyResult<Option<&'a StrArray>> {
    match value {
        None => Ok(None),
        Some(MetaValue::Array(MetaArray::String(s))) => Ok(Some(s)),
        Some(MetaValue::Array(a)) if a.is_empty() => Ok(None),
        Some(_) => Err(tokenizer_error(
            py,
            format!("GGUF metadata {key} is not an array of strings"),
        )),
    }
}

#[pymethods]
impl PyBpeModel {
    #[new]
    #[pyo3(signature = (tokens, merges, *, ignore_merges = false))]
    fn py_new(
        py: Python<'_>,
        tokens: Vec<String>,
        merges: Vec<String>,
        ignore_merges: bool,
    ) -> PyResult<Self> {
        let built = without_gil(py, || {
            BpeModel::new(
                tokens.iter().map(String::as_str),
                merges.iter().map(String::as_str),
                ignore_merges,
            )
        })?;
        let inner = built.map_err(|e| tokenize_error(py, e))?;
        Ok(PyBpeModel { inner })
    }

    /// The model of a GGUF file's `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`.
    #[staticmethod]
    #[pyo3(signature = (file, *, ignore_merges = false))]
    fn from_gguf(py: Python<'_>, file: &PyGgufFile, ignore_merges: bool) -> PyResult<Self> {
        let gguf = file.shared();
        let tokens_key = "tokenizer.ggml.tokens";
        let merges_key = "tokenizer.ggml.merges";
        let Some(tokens) = strings(py, gguf.get(tokens_key), tokens_key)? else {
            return Err(tokenizer_error(
                py,
                format!("GGUF metadata has no {tokens_key} list"),
            ));
        };
        let merges = strings(py, gguf.get(merges_key), merges_key)?;
        let built = without_gil(py, || {
            BpeModel::new(
                tokens.iter(),
                merges.into_iter().flat_map(StrArray::iter),
                ignore_merges,
            )
        })?;
        let inner = built.map_err(|e| tokenize_error(py, e))?;
        Ok(PyBpeModel { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.vocab().len()
    }

    /// Distinct merges kept (rules naming unknown tokens are dropped).
    #[getter]
    fn n_merges(&self) -> usize {
        self.inner.n_merges()
    }

    /// Bytes the model holds, approximately.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.heap_bytes()
    }

    /// The text of a token id, or None when out of range.
    fn id_to_token(&self, token_id: i64) -> Option<&str> {
        u32::try_from(token_id)
            .ok()
            .and_then(|id| self.inner.vocab().token(id))
    }

    /// The id of a token's text, or None.
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.vocab().id(token)
    }

    /// The ids of pre-tokenized words, in order. With `byte_level`, the words are raw text
    /// and their bytes are first written in GPT-2's byte-level alphabet; without, they are
    /// already in the vocabulary's alphabet.
    #[pyo3(signature = (words, *, byte_level = false))]
    fn encode(
        &self,
        py: Python<'_>,
        words: Vec<PyBackedStr>,
        byte_level: bool,
    ) -> PyResult<Vec<u32>> {
        let run = || {
            let mut out = Vec::with_capacity(words.len() * 2);
            self.inner
                .encode_words(words.iter().map(|w| &**w), byte_level, &mut out);
            out
        };
        // Releasing the GIL costs more than merging a prompt's few words.
        if words.len() < GIL_FREE_WORDS {
            Ok(run())
        } else {
            without_gil(py, run)
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "BpeModel(tokens={}, merges={})",
            self.inner.vocab().len(),
            self.inner.n_merges()
        )
    }
}
