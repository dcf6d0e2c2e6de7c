//! The block pool: every KV block, its ref count and hash, the free list and the prefix cache.
//!
//! Shape (the field's, after vllm's `block_pool.py` and mistral.rs's `block_pool.rs`):
//! - `blocks`: a flat `Vec<KVCacheBlock>` indexed by [`BlockId`];
//! - block 0 is the null block: never handed out, freed or cached, so a zero in a padded block
//!   table row points at a block no sequence owns;
//! - `free_block_queue`: every block with `ref_cnt == 0`, in eviction order. Freed blocks that
//!   hold a hash go to the tail (least recently used first out); freed blocks without one go to
//!   the head, since nothing is lost by reusing them first;
//! - `cached_block_hash_to_block`: hash -> the one block registered under it. A freed full
//!   block keeps its hash and stays findable until `allocate` hands it out again (eviction).
//!
//! Invariants (all checked by [`BlockPool::check_invariants`]):
//! - a non-null block is on the free list iff its `ref_cnt` is 0;
//! - `block.block_hash == Some(h)` iff `cached_block_hash_to_block[h] == block`;
//! - the null block has `ref_cnt` 0, no hash and is never linked.
//!
//! Cost: [`allocate`](BlockPool::allocate), [`free`](BlockPool::free) and
//! [`touch`](BlockPool::touch) are O(1) (one unlink or link, one expected-O(1) map removal on
//! eviction); [`get_new_blocks`](BlockPool::get_new_blocks) is O(n);
//! [`cache_full_block`](BlockPool::cache_full_block) and a lookup are O(block_size);
//! [`find_cached_prefix`](BlockPool::find_cached_prefix) is O(prefix tokens). Nothing but
//! `get_new_blocks`, `find_cached_prefix` (their result vectors) and the map allocate after
//! construction.

use std::collections::HashMap;

use crate::free_queue::{FreeKVCacheBlockQueue, KVCacheBlock};
use crate::hash::{hash_block, BlockHash, BlockHashBuildHasher};
use crate::{BlockId, KvError, KvLayout, TokenId};

/// The reserved block every pool starts with.
pub const NULL_BLOCK: BlockId = BlockId(0);

/// What a pool holds and how it is keyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPoolConfig {
    /// Blocks in the pool, the null block included (so `num_blocks - 1` are usable).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Keep freed full blocks findable by hash (prefix caching).
    pub enable_caching: bool,
    /// Mixed into every block hash, so two models never share cached blocks.
    pub model_key: u64,
    /// How the KV heads are divided across devices; None for an undivided pool.
    pub layout: Option<KvLayout>,
}

/// The KV block pool (see the module docs).
#[derive(Debug, Clone)]
pub struct BlockPool {
    config: BlockPoolConfig,
    blocks: Vec<KVCacheBlock>,
    free_block_queue: FreeKVCacheBlockQueue,
    cached_block_hash_to_block: HashMap<BlockHash, BlockId, BlockHashBuildHasher>,
    /// Each cached block's tokens (`block_size` per block), compared on every hit.
    block_tokens: Vec<TokenId>,
}

impl BlockPool {
    /// A pool with every block but the null block free, in id order.
    ///
    /// # Errors
    /// [`KvError::InvalidConfig`] for fewer than 2 blocks, a zero block size, or a slot space
    /// (`num_blocks * block_size`) past `i32::MAX`, the width of the runtime's slot mapping.
    pub fn new(config: BlockPoolConfig) -> Result<Self, KvError> {
        let bad = |what, value, why| Err(KvError::InvalidConfig { what, value, why });
        if config.num_blocks < 2 {
            return bad(
                "num_blocks",
                config.num_blocks,
                "the null block needs a second block",
            );
        }
        if config.block_size == 0 {
            return bad("block_size", 0, "a block holds at least one token");
        }
        if config.num_blocks.saturating_mul(config.block_size) > i32::MAX as usize {
            return bad("num_blocks", config.num_blocks, "slots must fit an i32");
        }
        let mut blocks = vec![KVCacheBlock::new(); config.num_blocks];
        let free_block_queue = FreeKVCacheBlockQueue::new(&mut blocks, 1..config.num_blocks as u32);
        let block_tokens = if config.enable_caching {
            vec![0; config.num_blocks * config.block_size]
        } else {
            Vec::new()
        };
        Ok(Self {
            config,
            blocks,
            free_block_queue,
            cached_block_hash_to_block: HashMap::default(),
            block_tokens,
        })
    }

    /// The pool's settings.
    pub fn config(&self) -> &BlockPoolConfig {
        &self.config
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Blocks in the pool, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.config.num_blocks
    }

    /// Blocks that can ever be handed out (all but the null block).
    pub fn num_usable_blocks(&self) -> usize {
        self.config.num_blocks - 1
    }

    /// Blocks `allocate` can hand out now (free ones, cached or not).
    pub fn num_free_blocks(&self) -> usize {
        self.free_block_queue.len()
    }

    /// Blocks held by at least one sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.num_usable_blocks() - self.num_free_blocks()
    }

    /// Blocks registered in the prefix cache (held or free).
    pub fn num_cached_blocks(&self) -> usize {
        self.cached_block_hash_to_block.len()
    }

    /// Fraction of usable blocks in use.
    pub fn usage(&self) -> f64 {
        self.num_used_blocks() as f64 / self.num_usable_blocks() as f64
    }

    fn block(&self, id: BlockId) -> Result<&KVCacheBlock, KvError> {
        if id == NULL_BLOCK {
            return Err(KvError::NullBlock);
        }
        self.blocks.get(id.index()).ok_or(KvError::UnknownBlock {
            block: id.0,
            num_blocks: self.config.num_blocks,
        })
    }

    /// Sequences holding `id` (0 for a free block, the null block or an unknown id).
    pub fn ref_cnt(&self, id: BlockId) -> u32 {
        self.block(id).map_or(0, |b| b.ref_cnt)
    }

    /// The hash `id` is registered under in the prefix cache, if any.
    pub fn block_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.block(id).ok().and_then(|b| b.block_hash)
    }

    /// Hands out the head of the free list with `ref_cnt` 1, evicting its cached hash; None
    /// when every block is held (the caller must preempt). O(1).
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.free_block_queue.popleft(&mut self.blocks)?;
        self.evict(id);
        self.blocks[id.index()].ref_cnt = 1;
        Some(id)
    }

    /// `n` blocks, or None (and nothing taken) when fewer are free. O(n).
    pub fn get_new_blocks(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free_blocks() {
            return None;
        }
        Some((0..n).filter_map(|_| self.allocate()).collect())
    }

    /// Adds a holder to `id`; a free block leaves the free list (a prefix-cache hit). O(1).
    ///
    /// # Errors
    /// [`KvError::NullBlock`], [`KvError::UnknownBlock`].
    pub fn touch(&mut self, id: BlockId) -> Result<(), KvError> {
        if self.block(id)?.ref_cnt == 0 {
            self.free_block_queue.remove(&mut self.blocks, id);
        }
        self.blocks[id.index()].ref_cnt += 1;
        Ok(())
    }

    /// Drops a holder from `id`; at zero the block joins the free list: at the tail when it
    /// holds a hash (reusable until evicted), at the head otherwise. O(1).
    ///
    /// # Errors
    /// [`KvError::DoubleFree`] when nobody holds it; [`KvError::NullBlock`],
    /// [`KvError::UnknownBlock`]. Nothing changes on error.
    pub fn free(&mut self, id: BlockId) -> Result<(), KvError> {
        let b = self.block(id)?;
        if b.ref_cnt == 0 {
            return Err(KvError::DoubleFree { block: id.0 });
        }
        let cached = b.block_hash.is_some();
        let b = &mut self.blocks[id.index()];
        b.ref_cnt -= 1;
        if b.ref_cnt == 0 {
            if cached {
                self.free_block_queue.append(&mut self.blocks, id);
            } else {
                self.free_block_queue.appendleft(&mut self.blocks, id);
            }
        }
        Ok(())
    }

    /// Removes `id`'s hash from the prefix cache. O(1).
    fn evict(&mut self, id: BlockId) -> bool {
        let Some(h) = self.blocks[id.index()].block_hash.take() else {
            return false;
        };
        self.blocks[id.index()].parent_hash = None;
        self.cached_block_hash_to_block.remove(&h);
        true
    }

    /// Drops a free block's hash so it can no longer be found (it stays free, moved to the
    /// head). Returns whether a hash was dropped; a held block is left alone. O(1).
    pub fn evict_cached_block(&mut self, id: BlockId) -> bool {
        match self.block(id) {
            Ok(b) if b.ref_cnt == 0 && b.block_hash.is_some() => {
                self.evict(id);
                self.free_block_queue.remove(&mut self.blocks, id);
                self.free_block_queue.appendleft(&mut self.blocks, id);
                true
            }
            _ => false,
        }
    }

    /// Drops every free block's hash (held blocks keep theirs). Returns how many. O(blocks).
    pub fn reset_prefix_cache(&mut self) -> usize {
        let free: Vec<BlockId> = self.free_block_queue.iter(&self.blocks).collect();
        free.into_iter()
            .filter(|&id| self.evict_cached_block(id))
            .count()
    }

    /// Registers the held, full block `id` (holding `tokens`, after the block hashed
    /// `parent`) in the prefix cache, and returns its hash for chaining the next block. A hash
    /// already registered to another block keeps that block; with caching off only the hash
    /// is computed. O(block_size).
    ///
    /// # Errors
    /// [`KvError::NotFull`], [`KvError::NotInUse`], [`KvError::HashConflict`] (the block holds
    /// another hash), [`KvError::NullBlock`], [`KvError::UnknownBlock`].
    pub fn cache_full_block(
        &mut self,
        id: BlockId,
        parent: Option<BlockHash>,
        tokens: &[TokenId],
    ) -> Result<BlockHash, KvError> {
        let bs = self.config.block_size;
        if tokens.len() != bs {
            return Err(KvError::NotFull {
                block_size: bs,
                got: tokens.len(),
            });
        }
        let b = self.block(id)?;
        if b.ref_cnt == 0 {
            return Err(KvError::NotInUse { block: id.0 });
        }
        let h = hash_block(parent, tokens, self.config.model_key);
        match b.block_hash {
            Some(old) if old == h => return Ok(h),
            Some(_) => return Err(KvError::HashConflict { block: id.0 }),
            None => {}
        }
        if !self.config.enable_caching || self.cached_block_hash_to_block.contains_key(&h) {
            return Ok(h);
        }
        self.cached_block_hash_to_block.insert(h, id);
        let b = &mut self.blocks[id.index()];
        b.block_hash = Some(h);
        b.parent_hash = parent;
        self.block_tokens[id.index() * bs..(id.index() + 1) * bs].copy_from_slice(tokens);
        Ok(h)
    }

    /// The cached block registered under `hash` whose parent and tokens match, if any. Does
    /// not touch it. O(block_size).
    pub fn get_cached_block(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[TokenId],
    ) -> Option<BlockId> {
        let &id = self.cached_block_hash_to_block.get(&hash)?;
        let bs = self.config.block_size;
        let same = self.blocks[id.index()].parent_hash == parent
            && self.block_tokens[id.index() * bs..(id.index() + 1) * bs] == *tokens;
        same.then_some(id)
    }

    /// The longest run of cached blocks matching the full blocks of `tokens` from the start,
    /// each touched (held once more; a free one leaves the free list). A trailing partial block
    /// never matches. O(prefix tokens).
    pub fn find_cached_prefix(&mut self, tokens: &[TokenId]) -> Vec<BlockId> {
        let mut hits = Vec::new();
        if !self.config.enable_caching {
            return hits;
        }
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.config.block_size) {
            let h = hash_block(parent, chunk, self.config.model_key);
            let Some(id) = self.get_cached_block(h, parent, chunk) else {
                break;
            };
            if self.touch(id).is_err() {
                break;
            }
            hits.push(id);
            parent = Some(h);
        }
        hits
    }

    /// The free list, next to be handed out first (O(free blocks); for tests and metrics).
    pub fn free_blocks_in_eviction_order(&self) -> Vec<BlockId> {
        self.free_block_queue.iter(&self.blocks).collect()
    }

    /// Checks every invariant in the module docs. O(blocks).
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.free_block_queue.check(&self.blocks)?;
        let null = &self.blocks[0];
        if null.ref_cnt != 0 || null.block_hash.is_some() {
            return Err("the null block is held or cached".into());
        }
        let mut linked = vec![false; self.blocks.len()];
        for id in self.free_block_queue.iter(&self.blocks) {
            if id == NULL_BLOCK {
                return Err("the null block is on the free list".into());
            }
            if std::mem::replace(&mut linked[id.index()], true) {
                return Err(format!("block {id} is on the free list twice"));
            }
        }
        for (i, b) in self.blocks.iter().enumerate().skip(1) {
            if (b.ref_cnt == 0) != linked[i] {
                return Err(format!(
                    "block {i}: ref_cnt {} but linked = {}",
                    b.ref_cnt, linked[i]
                ));
            }
            if let Some(h) = b.block_hash {
                if self.cached_block_hash_to_block.get(&h) != Some(&BlockId(i as u32)) {
                    return Err(format!("block {i} holds a hash the cache maps elsewhere"));
                }
            }
        }
        for (h, id) in &self.cached_block_hash_to_block {
            if self.blocks.get(id.index()).and_then(|b| b.block_hash) != Some(*h) {
                return Err(format!(
                    "the cache maps a hash to block {id}, which lacks it"
                ));
            }
        }
        Ok(())
    }
}
