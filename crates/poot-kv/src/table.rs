//! Per-sequence block tables.
//!
//! A [`BlockTable`] lists a sequence's blocks in order and knows how many of its tokens are
//! committed (their KV computed). Token `p` lives in slot
//! `blocks[p / block_size] * block_size + p % block_size`.
//!
//! Invariants:
//! - `blocks.len() * block_size >= num_tokens` (reserved capacity may run ahead of committed
//!   tokens; uncommitted blocks are never shared);
//! - `block_hashes` holds the chained hash of every full committed block
//!   (`num_tokens / block_size` of them) and `partial` the committed tokens of the last,
//!   partial block, so the next full block can be hashed without the caller's token list;
//! - the table holds one reference on each of its blocks but released ones;
//!   [`BlockTable::free`] drops them all;
//! - the first `released` blocks are [`NULL_BLOCK`]: [`BlockTable::release_below`] gave them
//!   back because no later token reads them (a sliding window), and the table holds no
//!   reference on them; their hashes stay, so later full blocks still chain.
//!
//! A full block is immutable, so forks share full blocks freely. A shared *partial* block is
//! copied on the first write ([`BlockCopy`]): the caller must copy the KV of `src` to `dst`
//! before the step that writes it.
//!
//! Cost: `reserve` and `append_tokens` are O(new blocks + new tokens); `fork` and `free` are
//! O(blocks); `slot` is O(1).

use crate::hash::{hash_full_blocks, BlockHash};
use crate::{BlockId, BlockPool, KvError, TokenId, NULL_BLOCK};

/// A copy-on-write the runtime must perform: KV of block `src` into block `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// The shared block being written.
    pub src: BlockId,
    /// Its private copy, now in the table in `src`'s place.
    pub dst: BlockId,
}

/// What a successful [`BlockTable::reserve`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reserved {
    /// Blocks allocated (the copy's destination included).
    pub new_blocks: usize,
    /// A copy-on-write of the last partial block, when it was shared.
    pub copy: Option<BlockCopy>,
}

/// One sequence's blocks (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockTable {
    block_size: usize,
    blocks: Vec<BlockId>,
    num_tokens: usize,
    block_hashes: Vec<BlockHash>,
    partial: Vec<TokenId>,
    released: usize,
}

impl BlockTable {
    /// An empty table for blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            blocks: Vec::new(),
            num_tokens: 0,
            block_hashes: Vec::new(),
            partial: Vec::new(),
            released: 0,
        }
    }

    /// A table starting with the cached blocks matching the longest full-block prefix of
    /// `tokens` (each touched; see [`BlockPool::find_cached_prefix`]). Its `num_tokens` is the
    /// number of prompt tokens whose KV need not be computed.
    pub fn from_cached_prefix(pool: &mut BlockPool, tokens: &[TokenId]) -> Self {
        let mut t = Self::new(pool.block_size());
        t.blocks = pool.find_cached_prefix(tokens);
        t.block_hashes = t
            .blocks
            .iter()
            .filter_map(|&b| pool.block_hash(b))
            .collect();
        debug_assert_eq!(t.block_hashes.len(), t.blocks.len());
        t.num_tokens = t.blocks.len() * t.block_size;
        t
    }

    /// A table for a group of layers that attend to a sliding window of `window` positions,
    /// over the cached prefix of `tokens` (at most `max_blocks` full blocks): the longest
    /// prefix of `n` blocks whose window behind position `n * block_size` (blocks from
    /// `(n * block_size + 1 - window) / block_size` to `n - 1`, what the next token reads) is
    /// cached. Those blocks are touched; the ones before them are [`NULL_BLOCK`] (released:
    /// the group never reads them), so a block this group released and the pool then evicted
    /// does not shorten the prefix unless it lies inside that window. The hashes of all `n`
    /// blocks are kept, so later full blocks still chain. O(prefix tokens).
    pub fn from_cached_window(
        pool: &mut BlockPool,
        tokens: &[TokenId],
        max_blocks: usize,
        window: usize,
    ) -> Self {
        let mut t = Self::new(pool.block_size());
        if !pool.config().enable_caching {
            return t;
        }
        let bs = t.block_size;
        let upto = (tokens.len() / bs).min(max_blocks);
        let hashes = hash_full_blocks(&tokens[..upto * bs], bs, pool.config().model_key);
        // found[i]: block i is cached; run[i]: cached blocks ending at i, consecutively.
        let mut found = Vec::with_capacity(upto);
        let mut run = Vec::with_capacity(upto);
        for (i, chunk) in tokens[..upto * bs].chunks_exact(bs).enumerate() {
            let parent = i.checked_sub(1).map(|p| hashes[p]);
            let id = pool.get_cached_block(hashes[i], parent, chunk);
            let before = if i == 0 { 0 } else { run[i - 1] };
            run.push(if id.is_some() { before + 1 } else { 0 });
            found.push(id);
        }
        let first_of = |n: usize| (n * bs + 1).saturating_sub(window) / bs;
        let Some(n) = (1..=upto).rev().find(|&n| run[n - 1] >= n - first_of(n)) else {
            return t;
        };
        let first = first_of(n);
        t.blocks = vec![NULL_BLOCK; first];
        t.released = first;
        for id in found[first..n].iter().flatten() {
            if pool.touch(*id).is_err() {
                // A cached block is never held behind the table's back; drop what we took.
                t.free(pool).ok();
                return Self::new(bs);
            }
            t.blocks.push(*id);
        }
        t.block_hashes = hashes[..n].to_vec();
        t.num_tokens = n * bs;
        t
    }

    /// The blocks, in sequence order ([`NULL_BLOCK`] for released ones).
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Leading blocks given back by [`BlockTable::release_below`].
    pub fn num_released(&self) -> usize {
        self.released
    }

    /// Gives back every block wholly below token position `pos` (block `i` when
    /// `(i + 1) * block_size <= pos`), putting [`NULL_BLOCK`] in its place: for a model whose
    /// every layer attends to a sliding window, no later token reads those positions. Only
    /// committed blocks are released. Cached full blocks stay findable until evicted. Returns
    /// how many blocks it released.
    ///
    /// # Errors
    /// The first [`BlockPool::free`] error (a block freed behind the table's back); the
    /// blocks before it are released.
    pub fn release_below(&mut self, pool: &mut BlockPool, pos: usize) -> Result<usize, KvError> {
        let upto = (pos.min(self.num_tokens) / self.block_size).min(self.blocks.len());
        let from = self.released;
        while self.released < upto {
            let b = std::mem::replace(&mut self.blocks[self.released], NULL_BLOCK);
            self.released += 1;
            pool.free(b)?;
        }
        Ok(upto.saturating_sub(from))
    }

    /// Committed tokens (KV computed).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Tokens the blocks can hold.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    /// Chained hashes of the full committed blocks.
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }

    /// The flat KV slot of position `pos`, if the table reaches it.
    pub fn slot(&self, pos: usize) -> Option<usize> {
        let b = self.blocks.get(pos / self.block_size)?;
        Some(b.index() * self.block_size + pos % self.block_size)
    }

    fn shared_partial(&self, pool: &BlockPool, total_tokens: usize) -> Option<usize> {
        let i = self.num_tokens / self.block_size;
        let writes_partial =
            total_tokens > self.num_tokens && !self.num_tokens.is_multiple_of(self.block_size);
        (writes_partial && pool.ref_cnt(self.blocks[i]) > 1).then_some(i)
    }

    /// Blocks `reserve(pool, total_tokens)` would allocate.
    pub fn num_blocks_needed(&self, pool: &BlockPool, total_tokens: usize) -> usize {
        let grow = total_tokens
            .div_ceil(self.block_size)
            .saturating_sub(self.blocks.len());
        grow + usize::from(self.shared_partial(pool, total_tokens).is_some())
    }

    /// Grows the table to hold `total_tokens`, copying a shared partial block first. All or
    /// nothing: None (nothing changed) when the pool has too few free blocks.
    pub fn reserve(&mut self, pool: &mut BlockPool, total_tokens: usize) -> Option<Reserved> {
        let needed = self.num_blocks_needed(pool, total_tokens);
        if needed > pool.num_free_blocks() {
            return None;
        }
        let mut copy = None;
        if let Some(i) = self.shared_partial(pool, total_tokens) {
            let dst = pool.allocate()?;
            let src = std::mem::replace(&mut self.blocks[i], dst);
            // Shared, so this only drops our reference.
            pool.free(src).ok()?;
            copy = Some(BlockCopy { src, dst });
        }
        while self.capacity() < total_tokens {
            self.blocks.push(pool.allocate()?);
        }
        Some(Reserved {
            new_blocks: needed,
            copy,
        })
    }

    /// Commits `tokens` (their KV is computed), growing the table first if needed, and
    /// registers every block they complete in the prefix cache.
    ///
    /// # Errors
    /// [`KvError::OutOfBlocks`] (nothing changed); any [`BlockPool::cache_full_block`] error,
    /// which means a block was freed behind the table's back.
    pub fn append_tokens(
        &mut self,
        pool: &mut BlockPool,
        tokens: &[TokenId],
    ) -> Result<Option<BlockCopy>, KvError> {
        let total = self.num_tokens + tokens.len();
        let needed = self.num_blocks_needed(pool, total);
        let reserved = self.reserve(pool, total).ok_or(KvError::OutOfBlocks {
            needed,
            free: pool.num_free_blocks(),
        })?;
        for &t in tokens {
            self.partial.push(t);
            self.num_tokens += 1;
            if self.partial.len() == self.block_size {
                let block = self.blocks[self.num_tokens / self.block_size - 1];
                let h =
                    pool.cache_full_block(block, self.block_hashes.last().copied(), &self.partial)?;
                self.block_hashes.push(h);
                self.partial.clear();
            }
        }
        Ok(reserved.copy)
    }

    /// A second table sharing this one's committed blocks (each touched). Reserved blocks past
    /// the committed tokens are not shared.
    ///
    /// # Errors
    /// Any [`BlockPool::touch`] error (a block freed behind the table's back); nothing is held
    /// by the fork then.
    pub fn fork(&self, pool: &mut BlockPool) -> Result<Self, KvError> {
        let used = self.num_tokens.div_ceil(self.block_size);
        let mut child = Self {
            blocks: Vec::with_capacity(used),
            ..self.clone()
        };
        for &b in &self.blocks[..used] {
            if b == NULL_BLOCK {
                child.blocks.push(b);
                continue;
            }
            if let Err(e) = pool.touch(b) {
                child.free(pool).ok();
                return Err(e);
            }
            child.blocks.push(b);
        }
        Ok(child)
    }

    /// Drops the table's reference on every block, last block first (so a sequence's tail is
    /// evicted before its more shareable head), and empties it. Cached full blocks stay
    /// findable until evicted.
    ///
    /// # Errors
    /// The first [`BlockPool::free`] error; every other block is still freed.
    pub fn free(&mut self, pool: &mut BlockPool) -> Result<(), KvError> {
        let mut first = Ok(());
        for &b in self.blocks[self.released..].iter().rev() {
            if let Err(e) = pool.free(b) {
                first = first.and(Err(e));
            }
        }
        self.blocks.clear();
        self.block_hashes.clear();
        self.partial.clear();
        self.num_tokens = 0;
        self.released = 0;
        first
    }
}
