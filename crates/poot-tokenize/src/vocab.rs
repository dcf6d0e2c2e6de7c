//! A vocabulary: token texts by id, and the id of a text.
//!
//! Invariants: texts are unique (a duplicate is an error naming both ids) and non-empty (an
//! empty text is stored as `[EMPTY_<id>]`, as llama.cpp's vocabulary loader does); `id` and
//! `token` are inverse. Cost: the texts once, 4 bytes per id for the end offsets, and an index
//! of `u32` slots at most half full, so a lookup probes about 1.5 slots on average and hashes
//! the text once.

use crate::hash::hash_bytes;
use crate::TokenizeError;

/// An unused index slot.
const EMPTY: u32 = u32::MAX;

/// Token texts by id, with an open-addressing index from text to id.
#[derive(Clone, Debug)]
pub struct Vocab {
    text: String,
    /// `ends[i]` is where token `i`'s text ends in `text`.
    ends: Vec<u32>,
    /// Slot -> id (or `EMPTY`); the length is a power of two, at least twice the token count.
    index: Vec<u32>,
}

impl Vocab {
    /// Builds a vocabulary from token texts in id order.
    ///
    /// # Errors
    /// `DuplicateToken` when two ids have the same text, `TooLarge` when the ids or the text
    /// bytes do not fit `u32`.
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Result<Self, TokenizeError> {
        let mut text = String::new();
        let mut ends: Vec<u32> = Vec::new();
        for (i, t) in tokens.into_iter().enumerate() {
            if t.is_empty() {
                text.push_str(&format!("[EMPTY_{i}]"));
            } else {
                text.push_str(t);
            }
            let end = u32::try_from(text.len()).map_err(|_| TokenizeError::TooLarge {
                what: format!("{} bytes of token text", text.len()),
            })?;
            ends.push(end);
        }
        if ends.len() >= EMPTY as usize {
            return Err(TokenizeError::TooLarge {
                what: format!("{} tokens", ends.len()),
            });
        }
        text.shrink_to_fit();
        ends.shrink_to_fit();
        let slots = (ends.len() * 2).next_power_of_two().max(8);
        let mut vocab = Vocab {
            text,
            ends,
            index: vec![EMPTY; slots],
        };
        for id in 0..vocab.ends.len() as u32 {
            vocab.insert(id)?;
        }
        Ok(vocab)
    }

    fn insert(&mut self, id: u32) -> Result<(), TokenizeError> {
        let t = self.text_of(id);
        let mask = self.index.len() - 1;
        let mut slot = hash_bytes(t.as_bytes()) as usize & mask;
        loop {
            let there = self.index[slot];
            if there == EMPTY {
                self.index[slot] = id;
                return Ok(());
            }
            if self.text_of(there) == t {
                return Err(TokenizeError::DuplicateToken {
                    text: t.to_owned(),
                    first: there,
                    second: id,
                });
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The text of an id known to be in range.
    fn text_of(&self, id: u32) -> &str {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// The number of ids.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The text of `id`, or `None` when out of range.
    pub fn token(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.ends.len()).then(|| self.text_of(id))
    }

    /// The id of `text`, or `None`.
    pub fn id(&self, text: &str) -> Option<u32> {
        let mask = self.index.len() - 1;
        let mut slot = hash_bytes(text.as_bytes()) as usize & mask;
        loop {
            let there = self.index[slot];
            if there == EMPTY {
                return None;
            }
            if self.text_of(there) == text {
                return Some(there);
            }
            slot = (slot + 1) & mask;
        }
    }

    /// Bytes held: texts, offsets and index.
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() + 4 * (self.ends.capacity() + self.index.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_texts_are_inverse() {
        let words: Vec<String> = (0..5000).map(|i| format!("w{i}\u{e9}")).collect();
        let v = Vocab::new(words.iter().map(String::as_str)).unwrap();
        assert_eq!(v.len(), 5000);
        for (i, w) in words.iter().enumerate() {
            assert_eq!(v.id(w), Some(i as u32));
            assert_eq!(v.token(i as u32), Some(w.as_str()));
        }
        assert_eq!(
            (v.id("w5000\u{e9}"), v.id(""), v.token(5000)),
            (None, None, None)
        );
        assert!(v.heap_bytes() < 5000 * 8 + 16384 * 4 + 5000 * 4);
    }

    #[test]
    fn empty_texts_get_a_name_and_duplicates_are_errors() {
        let v = Vocab::new(["a", "", "b"]).unwrap();
        assert_eq!(v.token(1), Some("[EMPTY_1]"));
        assert_eq!(v.id("[EMPTY_1]"), Some(1));
        assert_eq!(
            Vocab::new(["a", "b", "a"]).unwrap_err(),
            TokenizeError::DuplicateToken {
                text: "a".into(),
                first: 0,
                second: 2
            }
        );
        let empty = Vocab::new([]).unwrap();
        assert!(empty.is_empty() && empty.id("a").is_none());
    }
}
