//! poot-tokenize: the parts of tokenization that are tables and loops, without Python.
//!
//! [`Vocab`] holds a vocabulary's token texts in one buffer with an open-addressing index from
//! text to id; [`BpeModel`] adds merge ranks and merges a pre-tokenized word exactly as a
//! `tokenizers` BPE model without dropout, prefixes or an unknown token does (and so as
//! llama.cpp's byte-level BPE session does); [`byte_level`] is GPT-2's byte-to-character map.
//! Pre-tokenization (the regex splits) stays with the caller.
//!
//! Memory is the point: a 50k-token vocabulary with 50k merges takes about 2 MiB here (the
//! texts once, 4 bytes per id, 4 per index slot, a merge table of 16-byte entries), against
//! 8 MiB for a `tokenizers` BPE model, which keeps every text twice in hash maps.

mod bpe;
pub mod byte_level;
mod hash;
mod vocab;

pub use bpe::{BpeModel, Scratch};
pub use vocab::Vocab;

/// Why a vocabulary or merge list cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenizeError {
    /// Two ids have the same text.
    #[error("duplicate token in vocabulary: {text:?} has ids {first} and {second}")]
    DuplicateToken {
        /// The text both ids have.
        text: String,
        /// The first id with it.
        first: u32,
        /// The second id with it.
        second: u32,
    },
    /// The vocabulary does not fit 32-bit ids or offsets.
    #[error("vocabulary too large: {what}")]
    TooLarge {
        /// What overflowed.
        what: String,
    },
}
