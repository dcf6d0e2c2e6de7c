//! Stable, chained hashes of full KV blocks.
//!
//! A block's hash covers the model key, its parent's hash (the hash of the block before it in
//! the sequence, or a fixed marker for the first block) and its token ids, so two blocks share
//! a hash only when the whole prefix up to and including them is the same for the same model.
//! The function is FNV-1a 64 over little-endian words followed by the murmur3 `fmix64`
//! finalizer: no random state, the same value on every run and platform, and O(block_size).
//!
//! A 64-bit hash can collide (about n²/2^65 for n cached blocks). The pool therefore also keeps
//! each cached block's tokens and parent hash and compares them on every hit; what remains is
//! a parent-hash collision, which only a deliberate attack on this non-cryptographic function
//! could arrange. Swap [`hash_block`] for a keyed or cryptographic hash if prompts come from
//! mutually untrusted tenants.
//!
//! The prefix-cache map is keyed by these already-mixed values, so it uses
//! [`BlockHashBuildHasher`], which passes the value through instead of rehashing it with a
//! randomly keyed SipHash.

use std::hash::{BuildHasherDefault, Hasher};

use crate::TokenId;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Stands in for the parent of a sequence's first block.
const NO_PARENT: u64 = 0x9e37_79b9_7f4a_7c15;

/// The chained hash of one full block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// FNV-1a 64 over `bytes`, continuing from `state`.
pub fn fnv1a64(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// The murmur3 64-bit finalizer: every input bit affects every output bit.
pub fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The hash of a full block of `tokens` after the block hashed `parent`, for `model_key`.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[TokenId], model_key: u64) -> BlockHash {
    let mut h = fnv1a64(FNV_OFFSET, &model_key.to_le_bytes());
    h = fnv1a64(h, &parent.map_or(NO_PARENT, |p| p.0).to_le_bytes());
    h = fnv1a64(h, &(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h = fnv1a64(h, &t.to_le_bytes());
    }
    BlockHash(fmix64(h))
}

/// The chained hashes of every full block of `tokens` (a trailing partial block has none).
pub fn hash_full_blocks(tokens: &[TokenId], block_size: usize, model_key: u64) -> Vec<BlockHash> {
    let mut parent = None;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|chunk| {
            let h = hash_block(parent, chunk, model_key);
            parent = Some(h);
            h
        })
        .collect()
}

/// A `Hasher` for keys that are already well-mixed `u64`s ([`BlockHash`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u64 keys; fold them in deterministically.
        self.0 = fmix64(fnv1a64(self.0 ^ FNV_OFFSET, bytes));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Builds [`PassThroughHasher`]s: deterministic, no per-process random key.
pub type BlockHashBuildHasher = BuildHasherDefault<PassThroughHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_reference_vectors() {
        assert_eq!(fnv1a64(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hash_is_stable_across_runs() {
        // Pinned: hashes must not depend on the process (no random keys) or drift silently.
        assert_eq!(hash_block(None, &[1, 2, 3, 4], 7).0, 0x30a1_e4ce_3138_6485);
    }

    #[test]
    fn hash_depends_on_parent_tokens_and_model() {
        let base = hash_block(None, &[1, 2, 3, 4], 7);
        assert_ne!(base, hash_block(Some(BlockHash(0)), &[1, 2, 3, 4], 7));
        assert_ne!(base, hash_block(None, &[1, 2, 3, 5], 7));
        assert_ne!(base, hash_block(None, &[2, 1, 3, 4], 7));
        assert_ne!(base, hash_block(None, &[1, 2, 3, 4], 8));
        assert_ne!(base, hash_block(None, &[1, 2, 3], 7));
    }

    #[test]
    fn full_blocks_chain() {
        let tokens: Vec<TokenId> = (0..10).collect();
        let hs = hash_full_blocks(&tokens, 4, 1);
        assert_eq!(hs.len(), 2);
        assert_eq!(hs[0], hash_block(None, &tokens[..4], 1));
        assert_eq!(hs[1], hash_block(Some(hs[0]), &tokens[4..8], 1));
    }
}
