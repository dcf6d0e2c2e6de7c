//! Byte-level BPE merging over a [`Vocab`] and ranked merges.
//!
//! `encode_word` is the merge loop of a `tokenizers` BPE model (`Word::merge_all`) without
//! dropout: every character of the word that is a token starts as one symbol (characters that
//! are not are dropped, as a model without an unknown token does); the pair with the lowest
//! merge rank is merged first, the leftmost on ties; a queued pair is applied only if the two
//! symbols now at its place still merge into the same token. With `ignore_merges`, a word
//! that is itself a token is that token. The merge table holds each pair once, with the rank
//! of its first occurrence in the list (llama.cpp keeps the first too).
//!
//! Cost: O(m log m) for a word of m characters; with a reused [`Scratch`], no allocation per
//! word. Raw words map each byte to its symbol through a 256-entry table (no hashing).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use crate::byte_level::{byte_char, push_byte_level};
use crate::hash::PairHasher;
use crate::vocab::Vocab;
use crate::TokenizeError;

type PairMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

fn pair(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// A vocabulary with merge ranks: `(left id, right id) -> (rank, merged id)`.
#[derive(Clone, Debug)]
pub struct BpeModel {
    vocab: Vocab,
    merges: PairMap,
    ignore_merges: bool,
    /// The id of each byte's byte-level character, when it is a token.
    byte_ids: [Option<u32>; 256],
}

/// One symbol of a word being merged; `len == 0` marks one merged away.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    len: usize,
}

/// No neighbour.
const NONE: usize = usize::MAX;

/// Longer words are merged every time `encode_words` meets them (they rarely repeat).
const MEMO_MAX_LEN: usize = 64;

impl BpeModel {
    /// Builds a model from token texts in id order and merge rules (`"left right"`, rank =
    /// position in `merges`).
    ///
    /// A rule without a space after its first character, or whose parts or concatenation are
    /// not tokens, is skipped: it could only build a symbol that is spelled out in bytes.
    ///
    /// # Errors
    /// As [`Vocab::new`].
    pub fn new<'a>(
        tokens: impl IntoIterator<Item = &'a str>,
        merges: impl IntoIterator<Item = &'a str>,
        ignore_merges: bool,
    ) -> Result<Self, TokenizeError> {
        let vocab = Vocab::new(tokens)?;
        let merges = merges.into_iter();
        let mut map = PairMap::with_capacity_and_hasher(merges.size_hint().0, Default::default());
        let mut joined = String::new();
        for (rank, rule) in merges.enumerate() {
            let Some(first) = rule.chars().next() else {
                continue;
            };
            let Some(cut) = rule[first.len_utf8()..].find(' ') else {
                continue;
            };
            let cut = cut + first.len_utf8();
            let (left, right) = (&rule[..cut], &rule[cut + 1..]);
            let (Some(l), Some(r)) = (vocab.id(left), vocab.id(right)) else {
                continue;
            };
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let Some(merged) = vocab.id(&joined) else {
                continue;
            };
            let rank = u32::try_from(rank).map_err(|_| TokenizeError::TooLarge {
                what: format!("{rank} merges"),
            })?;
            map.entry(pair(l, r)).or_insert((rank, merged));
        }
        map.shrink_to_fit();
        let mut byte_ids = [None; 256];
        let mut buf = [0u8; 4];
        for (b, id) in (0..=255u8).zip(byte_ids.iter_mut()) {
            *id = vocab.id(byte_char(b).encode_utf8(&mut buf));
        }
        Ok(BpeModel {
            vocab,
            merges: map,
            ignore_merges,
            byte_ids,
        })
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// The number of distinct merges kept.
    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }

    /// Bytes held, approximately: the vocabulary and the merge table.
    pub fn heap_bytes(&self) -> usize {
        // hashbrown: one 16-byte entry and one control byte per bucket.
        self.vocab.heap_bytes() + self.merges.capacity() * 17
    }

    /// Appends the ids of many pre-tokenized words to `out`, in order: raw text when
    /// `byte_level` (see [`encode_bytes_word`](Self::encode_bytes_word)), else words in the
    /// vocabulary's alphabet. A word seen before in the same call is copied, not merged again
    /// (text repeats its words; nothing is kept between calls).
    pub fn encode_words<'a>(
        &self,
        words: impl IntoIterator<Item = &'a str>,
        byte_level: bool,
        out: &mut Vec<u32>,
    ) {
        let mut scratch = Scratch::default();
        let mut seen: HashMap<&str, (usize, usize), BuildHasherDefault<PairHasher>> =
            HashMap::default();
        for w in words {
            if w.len() > MEMO_MAX_LEN {
                self.encode_one(w, byte_level, &mut scratch, out);
                continue;
            }
            if let Some(&(start, end)) = seen.get(w) {
                out.extend_from_within(start..end);
                continue;
            }
            let start = out.len();
            self.encode_one(w, byte_level, &mut scratch, out);
            seen.insert(w, (start, out.len()));
        }
    }

    fn encode_one(&self, word: &str, byte_level: bool, scratch: &mut Scratch, out: &mut Vec<u32>) {
        if byte_level {
            self.encode_bytes_word(word, scratch, out);
        } else {
            self.encode_word(word, scratch, out);
        }
    }

    /// Appends the ids of one pre-tokenized word of raw text to `out`: its bytes are read as
    /// GPT-2's byte-level characters, which is the vocabulary's alphabet.
    pub fn encode_bytes_word(&self, word: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            scratch.text.clear();
            push_byte_level(word, &mut scratch.text);
            if let Some(id) = self.vocab.id(&scratch.text) {
                out.push(id);
                return;
            }
        }
        scratch.syms.clear();
        for &b in word.as_bytes() {
            if let Some(id) = self.byte_ids[usize::from(b)] {
                scratch.push(id, 1);
            }
        }
        self.merge(scratch, out);
    }

    /// Appends the ids of one pre-tokenized word, already in the vocabulary's alphabet, to
    /// `out`.
    pub fn encode_word(&self, word: &str, scratch: &mut Scratch, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(id) = self.vocab.id(word) {
                out.push(id);
                return;
            }
        }
        scratch.syms.clear();
        let mut buf = [0u8; 4];
        for ch in word.chars() {
            if let Some(id) = self.vocab.id(ch.encode_utf8(&mut buf)) {
                scratch.push(id, ch.len_utf8());
            }
        }
        self.merge(scratch, out);
    }

    /// Merges `scratch.syms` to the end and appends the ids left.
    fn merge(&self, scratch: &mut Scratch, out: &mut Vec<u32>) {
        let Scratch { syms, queue, .. } = scratch;
        let Some(last) = syms.last_mut() else {
            return;
        };
        last.next = NONE;
        // Min-heap on (rank, position); the merged id detects stale entries.
        queue.clear();
        for (i, w) in syms.windows(2).enumerate() {
            if let Some(&(rank, id)) = self.merges.get(&pair(w[0].id, w[1].id)) {
                queue.push(Reverse((rank, i, id)));
            }
        }
        while let Some(Reverse((_, pos, new_id))) = queue.pop() {
            let cur = syms[pos];
            if cur.len == 0 || cur.next == NONE {
                continue;
            }
            let right = syms[cur.next];
            match self.merges.get(&pair(cur.id, right.id)) {
                Some(&(_, id)) if id == new_id => {}
                _ => continue,
            }
            syms[pos] = Symbol {
                id: new_id,
                prev: cur.prev,
                next: right.next,
                len: cur.len + right.len,
            };
            syms[cur.next].len = 0;
            if right.next != NONE {
                syms[right.next].prev = pos;
            }
            if cur.prev != NONE {
                let p = syms[cur.prev];
                if let Some(&(rank, id)) = self.merges.get(&pair(p.id, new_id)) {
                    queue.push(Reverse((rank, cur.prev, id)));
                }
            }
            if right.next != NONE {
                let n = syms[right.next];
                if let Some(&(rank, id)) = self.merges.get(&pair(new_id, n.id)) {
                    queue.push(Reverse((rank, pos, id)));
                }
            }
        }
        out.extend(syms.iter().filter(|s| s.len != 0).map(|s| s.id));
    }
}

/// Buffers for encoding many words with one allocation each, not one per word.
#[derive(Debug, Default)]
pub struct Scratch {
    text: String,
    syms: Vec<Symbol>,
    queue: BinaryHeap<Reverse<(u32, usize, u32)>>,
}

impl Scratch {
    fn push(&mut self, id: u32, len: usize) {
        let i = self.syms.len();
        self.syms.push(Symbol {
            id,
            prev: if i == 0 { NONE } else { i - 1 },
            next: i + 1,
            len,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[&str], merges: &[&str], ignore_merges: bool) -> BpeModel {
        BpeModel::new(
            tokens.iter().copied(),
            merges.iter().copied(),
            ignore_merges,
        )
        .unwrap()
    }

    fn encode(m: &BpeModel, word: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode_word(word, &mut Scratch::default(), &mut out);
        out
    }

    #[test]
    fn merges_lowest_rank_first_then_leftmost() {
        //            0    1    2    3     4     5      6
        let tokens = ["a", "b", "c", "ab", "bc", "abc", "aa"];
        // "b c" outranks "a b": "abc" -> a + bc (no "a bc" merge) -> [a, bc].
        let m = model(&tokens, &["b c", "a b", "ab c"], false);
        assert_eq!(encode(&m, "abc"), [0, 4]);
        // "a b" first: ab + c -> abc.
        let m = model(&tokens, &["a b", "b c", "ab c"], false);
        assert_eq!(encode(&m, "abc"), [5]);
        // Ties go left: "aaa" -> aa + a.
        let m = model(&tokens, &["a a"], false);
        assert_eq!(encode(&m, "aaa"), [6, 0]);
        assert_eq!(encode(&m, "aaaa"), [6, 6]);
        assert_eq!(encode(&m, ""), Vec::<u32>::new());
    }

    #[test]
    fn unknown_characters_are_dropped_and_bad_rules_skipped() {
        let m = model(
            &["a", "b", "ab"],
            &["a b", "a b", "a x", "ab", "", "x y", "a  b"],
            false,
        );
        assert_eq!(m.n_merges(), 1);
        assert_eq!(encode(&m, "axb"), [2]);
        assert_eq!(encode(&m, "xy"), Vec::<u32>::new());
    }

    #[test]
    fn ignore_merges_takes_whole_words() {
        // "abc" is a token but no merge builds it.
        let tokens = ["a", "b", "c", "ab", "abc"];
        assert_eq!(encode(&model(&tokens, &["a b"], false), "abc"), [3, 2]);
        assert_eq!(encode(&model(&tokens, &["a b"], true), "abc"), [4]);
    }

    #[test]
    fn first_occurrence_of_a_pair_keeps_its_rank() {
        let tokens = ["a", "b", "c", "ab", "bc"];
        // "a b" appears at ranks 0 and 2; "b c" at 1: "a b" wins.
        let m = model(&tokens, &["a b", "b c", "a b"], false);
        assert_eq!(encode(&m, "abc"), [3, 2]);
    }

    #[test]
    fn raw_words_are_mapped_to_the_byte_level_alphabet() {
        // "\u{120}" is the space byte, "\u{c3}\u{a9}" the two bytes of e-acute.
        let tokens = [
            "\u{120}",
            "a",
            "\u{c3}",
            "\u{a9}",
            "\u{120}a",
            "\u{c3}\u{a9}",
        ];
        let m = model(&tokens, &["\u{120} a", "\u{c3} \u{a9}"], false);
        let (mut scratch, mut out) = (Scratch::default(), Vec::new());
        m.encode_bytes_word(" a\u{e9}", &mut scratch, &mut out);
        m.encode_bytes_word("", &mut scratch, &mut out);
        m.encode_bytes_word("a\u{e9} ", &mut scratch, &mut out);
        assert_eq!(out, [4, 5, 1, 5, 0]);
        // With ignore_merges a whole mapped word that is a token wins.
        let m = model(&tokens, &["\u{c3} \u{a9}"], true);
        out.clear();
        m.encode_bytes_word(" a", &mut scratch, &mut out);
        assert_eq!(out, [4]);
    }

    #[test]
    fn many_words_equal_one_at_a_time() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let m = model(&tokens, &["b c", "a b", "a bc"], false);
        let long = "ab".repeat(40);
        let words = ["abc", "ab", "abc", "", "ca", &long, "ab", &long];
        let mut many = Vec::new();
        m.encode_words(words.iter().copied(), false, &mut many);
        let one: Vec<u32> = words.iter().flat_map(|w| encode(&m, w)).collect();
        assert_eq!(many, one);
    }

    #[test]
    fn a_stale_pair_is_not_applied() {
        // After "b c" merges, the queued "a b" no longer matches its place.
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let m = model(&tokens, &["b c", "a b", "a bc"], false);
        assert_eq!(encode(&m, "abc"), [5]);
        assert_eq!(encode(&m, "ab"), [3]);
    }
}
