//! KV groups: a model's layers grouped by the positions they read, each group with its own
//! block pool, and each request with one block table per group.
//!
//! - Group 0 holds the layers that read every position (its pool has `num_blocks` blocks);
//!   with `kv_window = Some(W)` every layer is windowed and group 0 is released behind `W`.
//! - Group 1 exists with `window_group = Some(W)`: the windowed layers of a model that
//!   interleaves them with global ones (Gemma 2 and 3). Its pool has
//!   [`SchedulerConfig::window_pool_blocks`] blocks, and after each step a request's blocks
//!   wholly before position `num_tokens + 1 - W` (the first its next token reads) go back to
//!   it, while group 0 keeps every block.
//!
//! Invariants: a request's tables all have the same committed tokens and the same length (a
//! released block is the null block in its place), so one slot per token and group and one
//! table width per step serve every group; a reservation is all or nothing across groups;
//! a request's blocks in every group go back when it ends or is preempted.
//!
//! Prefix reuse: group 0 takes the longest cached full-block prefix. A windowed group reads
//! only its window, so it needs only the cached blocks inside the window behind the prefix's
//! end (`BlockTable::from_cached_window`); a block it released and its pool then evicted
//! (another request took it) shortens the prefix only when it lies in that window. When the
//! windowed group's prefix is shorter, group 0 is cut to it and the rest is recomputed.

use poot_kv::{BlockPool, BlockPoolConfig, BlockTable, KvError, TokenId};

use crate::{EngineError, RequestId, SchedulerConfig};

/// One group: its pool and the window its layers read (None: every position).
#[derive(Debug)]
struct Group {
    pool: BlockPool,
    window: Option<usize>,
}

/// The scheduler's KV groups (see the module docs).
#[derive(Debug)]
pub(crate) struct KvGroups {
    groups: Vec<Group>,
    block_size: usize,
}

impl KvGroups {
    /// Group 0, and group 1 when `config.window_group` is set.
    pub(crate) fn new(config: &SchedulerConfig) -> Result<Self, EngineError> {
        let pool = |num_blocks| {
            BlockPool::new(BlockPoolConfig {
                num_blocks,
                block_size: config.block_size,
                enable_caching: config.enable_prefix_caching,
                model_key: config.model_key,
                layout: None,
            })
        };
        let mut groups = vec![Group {
            pool: pool(config.num_blocks)?,
            window: config.kv_window,
        }];
        if let Some(w) = config.window_group {
            groups.push(Group {
                pool: pool(config.window_pool_blocks())?,
                window: Some(w),
            });
        }
        Ok(Self {
            groups,
            block_size: config.block_size,
        })
    }

    /// Groups (1 or 2).
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }

    /// Group `g`'s pool.
    pub(crate) fn pool(&self, g: usize) -> Option<&BlockPool> {
        self.groups.get(g).map(|g| &g.pool)
    }

    /// One empty table per group.
    pub(crate) fn empty_tables(&self) -> Vec<BlockTable> {
        vec![BlockTable::new(self.block_size); self.groups.len()]
    }

    /// Refuses a request whose `longest` tokens could not fit some group's pool alone: a
    /// group with a window holds at most the window behind a step, the step's `budget`
    /// tokens and a block of rounding at each end.
    pub(crate) fn check_fits(
        &self,
        id: RequestId,
        longest: usize,
        budget: usize,
    ) -> Result<(), EngineError> {
        for g in &self.groups {
            let mut needed = longest.div_ceil(self.block_size);
            if let Some(w) = g.window {
                needed = needed.min(window_span_blocks(w, budget, self.block_size));
            }
            let usable = g.pool.num_usable_blocks();
            if needed > usable {
                return Err(EngineError::TooLargeForPool { id, needed, usable });
            }
        }
        Ok(())
    }

    /// Grows every table to hold `total` tokens, or none of them (false: some pool has too
    /// few free blocks).
    pub(crate) fn reserve(&mut self, tables: &mut [BlockTable], total: usize) -> bool {
        let fits = self
            .groups
            .iter()
            .zip(tables.iter())
            .all(|(g, t)| t.num_blocks_needed(&g.pool, total) <= g.pool.num_free_blocks());
        if !fits {
            return false;
        }
        for (g, t) in self.groups.iter_mut().zip(tables.iter_mut()) {
            let r = t.reserve(&mut g.pool, total);
            debug_assert!(
                r.is_some_and(|r| r.copy.is_none()),
                "the scheduler never forks"
            );
        }
        true
    }

    /// Drops every table's blocks; the first error is returned after all are freed.
    pub(crate) fn free(&mut self, tables: &mut [BlockTable]) -> Result<(), KvError> {
        let mut first = Ok(());
        for (g, t) in self.groups.iter_mut().zip(tables.iter_mut()) {
            first = first.and(t.free(&mut g.pool));
        }
        first
    }

    /// Tables over the longest cached prefix of `lookup` every group can use (see the module
    /// docs), windowed groups released behind their window.
    pub(crate) fn lookup_prefix(&mut self, lookup: &[TokenId]) -> Result<Vec<BlockTable>, KvError> {
        let head = self.prefix_of(0, lookup)?;
        let mut tables = vec![head];
        for g in 1..self.groups.len() {
            let group = &mut self.groups[g];
            let w = group.window.unwrap_or(usize::MAX);
            let max_blocks = tables[0].blocks().len();
            tables.push(BlockTable::from_cached_window(
                &mut group.pool,
                lookup,
                max_blocks,
                w,
            ));
        }
        let shortest = tables.iter().map(BlockTable::num_tokens).min().unwrap_or(0);
        if tables[0].num_tokens() > shortest {
            // Cut group 0 to what the windowed group can serve: free and look up again.
            tables[0].free(&mut self.groups[0].pool)?;
            tables[0] = self.prefix_of(0, &lookup[..shortest])?;
        }
        debug_assert!(tables.iter().all(|t| t.num_tokens() == shortest));
        Ok(tables)
    }

    fn prefix_of(&mut self, g: usize, lookup: &[TokenId]) -> Result<BlockTable, KvError> {
        let group = &mut self.groups[g];
        let mut t = BlockTable::from_cached_prefix(&mut group.pool, lookup);
        if let Some(w) = group.window {
            let first_read = (t.num_tokens() + 1).saturating_sub(w);
            t.release_below(&mut group.pool, first_read)?;
        }
        Ok(t)
    }

    /// Commits `tokens` to every table, then gives back each windowed table's blocks wholly
    /// before the first position its next token reads.
    pub(crate) fn commit(
        &mut self,
        tables: &mut [BlockTable],
        tokens: &[TokenId],
    ) -> Result<(), KvError> {
        for (g, t) in self.groups.iter_mut().zip(tables.iter_mut()) {
            t.append_tokens(&mut g.pool, tokens)?;
            if let Some(w) = g.window {
                // The next token (at position num_tokens) reads num_tokens + 1 - w onwards.
                let first_read = (t.num_tokens() + 1).saturating_sub(w);
                t.release_below(&mut g.pool, first_read)?;
            }
        }
        Ok(())
    }

    /// Checks each pool's invariants and that its blocks in use are exactly those the
    /// `tables` (group `g` of each request's) hold, with matching ref counts.
    pub(crate) fn check_holders<'a>(
        &self,
        tables: impl Iterator<Item = &'a [BlockTable]> + Clone,
    ) -> Result<(), String> {
        for (g, group) in self.groups.iter().enumerate() {
            group.pool.check_invariants()?;
            let mut holders: std::collections::HashMap<poot_kv::BlockId, u32> =
                std::collections::HashMap::new();
            for ts in tables.clone() {
                let t = ts
                    .get(g)
                    .ok_or_else(|| format!("a request has no table of group {g}"))?;
                for &b in &t.blocks()[t.num_released()..] {
                    *holders.entry(b).or_default() += 1;
                }
            }
            // Shared prefixes count once per sharer.
            if holders.len() != group.pool.num_used_blocks() {
                return Err(format!(
                    "group {g}: {} blocks in tables, {} in use",
                    holders.len(),
                    group.pool.num_used_blocks()
                ));
            }
            if let Some((b, n)) = holders.iter().find(|(b, n)| group.pool.ref_cnt(**b) != **n) {
                return Err(format!(
                    "group {g} block {b}: {n} holders, ref_cnt {}",
                    group.pool.ref_cnt(*b)
                ));
            }
        }
        Ok(())
    }
}

/// Most blocks a request holds at once in a group that reads a window of `w` positions: the
/// window behind the step's first token (`w - 1`), the step's `budget` tokens, and a block of
/// rounding at each end.
pub(crate) fn window_span_blocks(w: usize, budget: usize, block_size: usize) -> usize {
    (w - 1).saturating_add(budget).div_ceil(block_size) + 1
}
