//! poot-kv: the paged KV cache's bookkeeping. No KV data lives here; the runtime owns the
//! buffers and this crate decides which block each token's K and V go to.
//!
//! - [`BlockPool`] (`pool`): a flat vector of blocks, a reserved null block (id 0), ref counts,
//!   a free list in eviction order and a prefix cache of full blocks by chained hash.
//!   `allocate() -> Option<BlockId>`: None means the caller must preempt.
//! - [`BlockTable`] (`table`): one sequence's blocks; reserve, append (committing and hashing
//!   full blocks), fork (sharing blocks, copy-on-write of a shared partial block), free.
//! - [`hash_block`] (`hash`): the stable chained hash (model key, parent hash, token ids).
//! - [`KvLayout`] (`layout`): how the pool's KV heads divide across a tensor group.
//!
//! Guarantees: allocate, free and touch are O(1) (an intrusive doubly linked free list over
//! block indices, `free_queue`); the null block is never handed out; a block is on the free
//! list iff nobody holds it; a freed full block keeps its hash and can be found again until
//! `allocate` evicts it, least recently freed first. `BlockPool::check_invariants` verifies
//! all of it in O(blocks) and the property tests call it after every operation.

mod error;
mod free_queue;
pub mod hash;
mod layout;
mod pool;
mod table;

pub use error::KvError;
pub use free_queue::{FreeKVCacheBlockQueue, KVCacheBlock};
pub use hash::{hash_block, hash_full_blocks, BlockHash};
pub use layout::KvLayout;
pub use pool::{BlockPool, BlockPoolConfig, NULL_BLOCK};
pub use table::{BlockCopy, BlockTable, Reserved};

/// A token id.
pub type TokenId = u32;

/// A block's index in the pool (0 is the null block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The index into the pool's blocks.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests;
