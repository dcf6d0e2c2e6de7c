//! The pool's blocks and the free list that orders them for eviction.
//!
//! `FreeKVCacheBlockQueue` is an intrusive doubly linked list: its links (`prev_free`,
//! `next_free`) live inside each [`KVCacheBlock`], so the queue itself is three words and no
//! operation allocates. The head is the next block handed out (the least recently freed cached
//! block, or an uncached block, which has nothing worth keeping); the tail is the most recently
//! freed.
//!
//! Invariants (checked by `BlockPool::check_invariants`):
//! - a block is linked iff its `ref_cnt` is 0 and it is not the null block;
//! - `len` equals the number of linked blocks, and walking `next_free` from `head` reaches
//!   `tail` after exactly `len` steps, with `prev_free` mirroring it.
//!
//! Cost: `popleft`, `remove`, `append` and `appendleft` are O(1); `iter` is O(len).

use crate::hash::BlockHash;
use crate::BlockId;

/// The "no block" link.
pub(crate) const NIL: u32 = u32::MAX;

/// One block's bookkeeping (the KV data lives in the runtime, addressed by block id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KVCacheBlock {
    /// Sequences (block tables) holding this block; 0 means it is on the free list.
    pub(crate) ref_cnt: u32,
    /// The chained hash of the block's tokens, set once the block is full and registered in
    /// the prefix cache; cleared when the block is evicted.
    pub(crate) block_hash: Option<BlockHash>,
    /// The hash this block's hash was chained over (None for a sequence's first block).
    pub(crate) parent_hash: Option<BlockHash>,
    pub(crate) prev_free: u32,
    pub(crate) next_free: u32,
}

impl KVCacheBlock {
    pub(crate) const fn new() -> Self {
        Self {
            ref_cnt: 0,
            block_hash: None,
            parent_hash: None,
            prev_free: NIL,
            next_free: NIL,
        }
    }
}

/// The free list: blocks with no holder, in eviction order (head first).
#[derive(Debug, Clone)]
pub struct FreeKVCacheBlockQueue {
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeKVCacheBlockQueue {
    /// Links `ids` in order (the first is the head).
    pub(crate) fn new(blocks: &mut [KVCacheBlock], ids: impl IntoIterator<Item = u32>) -> Self {
        let mut q = Self {
            head: NIL,
            tail: NIL,
            len: 0,
        };
        for id in ids {
            q.append(blocks, BlockId(id));
        }
        q
    }

    /// Blocks on the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The head (the next block `popleft` returns), if any.
    pub(crate) fn peek(&self) -> Option<BlockId> {
        (self.head != NIL).then_some(BlockId(self.head))
    }

    /// Unlinks and returns the head.
    pub(crate) fn popleft(&mut self, blocks: &mut [KVCacheBlock]) -> Option<BlockId> {
        let id = self.peek()?;
        self.remove(blocks, id);
        Some(id)
    }

    /// Unlinks `id`, which must be linked.
    pub(crate) fn remove(&mut self, blocks: &mut [KVCacheBlock], id: BlockId) {
        let i = id.index();
        let (prev, next) = (blocks[i].prev_free, blocks[i].next_free);
        debug_assert!(prev != NIL || self.head == id.0, "block {id} is not linked");
        if prev == NIL {
            self.head = next;
        } else {
            blocks[prev as usize].next_free = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            blocks[next as usize].prev_free = prev;
        }
        blocks[i].prev_free = NIL;
        blocks[i].next_free = NIL;
        self.len -= 1;
    }

    /// Links `id` at the tail (evicted last).
    pub(crate) fn append(&mut self, blocks: &mut [KVCacheBlock], id: BlockId) {
        let i = id.index();
        blocks[i].prev_free = self.tail;
        blocks[i].next_free = NIL;
        if self.tail == NIL {
            self.head = id.0;
        } else {
            blocks[self.tail as usize].next_free = id.0;
        }
        self.tail = id.0;
        self.len += 1;
    }

    /// Links `id` at the head (handed out next).
    pub(crate) fn appendleft(&mut self, blocks: &mut [KVCacheBlock], id: BlockId) {
        let i = id.index();
        blocks[i].prev_free = NIL;
        blocks[i].next_free = self.head;
        if self.head == NIL {
            self.tail = id.0;
        } else {
            blocks[self.head as usize].prev_free = id.0;
        }
        self.head = id.0;
        self.len += 1;
    }

    /// The linked blocks, head first. Stops after `len` steps even if the links were corrupt.
    pub(crate) fn iter<'a>(
        &self,
        blocks: &'a [KVCacheBlock],
    ) -> impl Iterator<Item = BlockId> + 'a {
        let mut cur = self.head;
        let mut left = self.len;
        std::iter::from_fn(move || {
            if cur == NIL || left == 0 {
                return None;
            }
            let id = cur;
            cur = blocks.get(id as usize).map_or(NIL, |b| b.next_free);
            left -= 1;
            Some(BlockId(id))
        })
    }

    /// Checks the links against `len` (O(len)).
    pub(crate) fn check(&self, blocks: &[KVCacheBlock]) -> Result<(), String> {
        let mut prev = NIL;
        let mut cur = self.head;
        let mut n = 0usize;
        while cur != NIL {
            let b = blocks
                .get(cur as usize)
                .ok_or(format!("free list links to {cur}"))?;
            if b.prev_free != prev {
                return Err(format!("block {cur}: prev_free {} != {prev}", b.prev_free));
            }
            n += 1;
            if n > self.len {
                return Err(format!("free list longer than its len {}", self.len));
            }
            prev = cur;
            cur = b.next_free;
        }
        if prev != self.tail {
            return Err(format!("free list ends at {prev}, tail is {}", self.tail));
        }
        if n != self.len {
            return Err(format!("free list has {n} blocks, len says {}", self.len));
        }
        Ok(())
    }
}
