//! Property tests: random interleavings of allocate, append, fork, free and evict against a
//! reference model of who holds which block.
//!
//! After every operation: the pool's own invariants hold (free list iff ref_cnt 0, hash map and
//! block hashes agree, null block untouched), every ref count equals the number of holders the
//! model counts, no table or raw holder ever has the null block, a double free is refused
//! without changing anything, and every hash a table or block carries is the chained hash of
//! the tokens that table committed. At the end everything is freed and nothing leaks.

use std::collections::HashMap;

use poot_kv::{
    hash_full_blocks, BlockId, BlockPool, BlockPoolConfig, BlockTable, KvError, TokenId, NULL_BLOCK,
};
use proptest::prelude::*;

const MODEL_KEY: u64 = 5;

#[derive(Debug, Clone)]
enum Op {
    /// A new sequence: reuse the cached prefix of `tokens`, then append the rest.
    NewSeq(Vec<TokenId>),
    Append(usize, Vec<TokenId>),
    Reserve(usize, usize),
    Fork(usize),
    FreeSeq(usize),
    Allocate,
    FreeRaw(usize),
    DoubleFree(u32),
    Evict(u32),
}

fn tokens() -> impl Strategy<Value = Vec<TokenId>> {
    // A tiny alphabet so prompts share prefixes and blocks often.
    prop::collection::vec(0u32..3, 0..12)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => tokens().prop_map(Op::NewSeq),
        3 => (any::<usize>(), tokens()).prop_map(|(i, t)| Op::Append(i, t)),
        1 => (any::<usize>(), 0usize..8).prop_map(|(i, n)| Op::Reserve(i, n)),
        2 => any::<usize>().prop_map(Op::Fork),
        2 => any::<usize>().prop_map(Op::FreeSeq),
        1 => Just(Op::Allocate),
        1 => any::<usize>().prop_map(Op::FreeRaw),
        1 => (0u32..32).prop_map(Op::DoubleFree),
        1 => (0u32..32).prop_map(Op::Evict),
    ]
}

/// A live sequence and the tokens it committed.
struct Seq {
    table: BlockTable,
    tokens: Vec<TokenId>,
}

struct World {
    pool: BlockPool,
    seqs: Vec<Seq>,
    raw: Vec<BlockId>,
}

impl World {
    fn holders(&self) -> HashMap<BlockId, u32> {
        let mut h = HashMap::new();
        for b in self
            .seqs
            .iter()
            .flat_map(|s| s.table.blocks())
            .chain(&self.raw)
        {
            *h.entry(*b).or_insert(0) += 1;
        }
        h
    }

    fn check(&self) -> Result<(), TestCaseError> {
        self.pool.check_invariants().map_err(TestCaseError::fail)?;
        let holders = self.holders();
        prop_assert!(
            !holders.contains_key(&NULL_BLOCK),
            "the null block was handed out"
        );
        for i in 0..self.pool.num_blocks() as u32 {
            let b = BlockId(i);
            let want = holders.get(&b).copied().unwrap_or(0);
            prop_assert_eq!(self.pool.ref_cnt(b), want, "ref count of block {}", i);
        }
        prop_assert_eq!(self.pool.num_used_blocks(), holders.len());
        let bs = self.pool.block_size();
        for s in &self.seqs {
            let want = hash_full_blocks(&s.tokens, bs, MODEL_KEY);
            prop_assert_eq!(s.table.block_hashes(), &want[..]);
            prop_assert_eq!(s.table.num_tokens(), s.tokens.len());
            prop_assert!(s.table.capacity() >= s.tokens.len());
            for (b, h) in s.table.blocks().iter().zip(&want) {
                // A full block is either registered under its own chain hash or not at all.
                if let Some(got) = self.pool.block_hash(*b) {
                    prop_assert_eq!(got, *h, "block {} carries a foreign hash", b);
                }
            }
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        let n = self.seqs.len();
        match op {
            Op::NewSeq(tokens) => {
                let mut table = BlockTable::from_cached_prefix(&mut self.pool, &tokens);
                let hit = table.num_tokens();
                prop_assert_eq!(hit % self.pool.block_size(), 0);
                let want = hash_full_blocks(&tokens[..hit], self.pool.block_size(), MODEL_KEY);
                prop_assert_eq!(
                    table.block_hashes(),
                    &want[..],
                    "a hit with the wrong content"
                );
                match table.append_tokens(&mut self.pool, &tokens[hit..]) {
                    Ok(copy) => {
                        prop_assert_eq!(copy, None);
                        self.seqs.push(Seq { table, tokens });
                    }
                    Err(KvError::OutOfBlocks { .. }) => table
                        .free(&mut self.pool)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Append(i, tokens) if n > 0 => {
                let s = &mut self.seqs[i % n];
                let before = s.table.clone();
                match s.table.append_tokens(&mut self.pool, &tokens) {
                    Ok(_) => s.tokens.extend(&tokens),
                    Err(KvError::OutOfBlocks { .. }) => prop_assert_eq!(&s.table, &before),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Reserve(i, extra) if n > 0 => {
                let s = &mut self.seqs[i % n];
                let free = self.pool.num_free_blocks();
                let need = s
                    .table
                    .num_blocks_needed(&self.pool, s.tokens.len() + extra);
                let got = s.table.reserve(&mut self.pool, s.tokens.len() + extra);
                prop_assert_eq!(got.is_some(), need <= free);
                if got.is_none() {
                    prop_assert_eq!(self.pool.num_free_blocks(), free);
                }
            }
            Op::Fork(i) if n > 0 => {
                let s = &self.seqs[i % n];
                let table = s
                    .table
                    .fork(&mut self.pool)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let tokens = s.tokens.clone();
                self.seqs.push(Seq { table, tokens });
            }
            Op::FreeSeq(i) if n > 0 => {
                let mut s = self.seqs.swap_remove(i % n);
                s.table
                    .free(&mut self.pool)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Allocate => {
                let free = self.pool.num_free_blocks();
                match self.pool.allocate() {
                    Some(b) => self.raw.push(b),
                    None => prop_assert_eq!(free, 0),
                }
            }
            Op::FreeRaw(i) if !self.raw.is_empty() => {
                let b = self.raw.swap_remove(i % self.raw.len());
                self.pool
                    .free(b)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::DoubleFree(i) => {
                let b = BlockId(i % self.pool.num_blocks() as u32);
                if self.pool.ref_cnt(b) == 0 {
                    let free = self.pool.free_blocks_in_eviction_order();
                    prop_assert!(
                        self.pool.free(b).is_err(),
                        "freeing unheld block {} passed",
                        b
                    );
                    prop_assert_eq!(self.pool.free_blocks_in_eviction_order(), free);
                }
            }
            Op::Evict(i) => {
                let b = BlockId(i % self.pool.num_blocks() as u32);
                let could = self.pool.ref_cnt(b) == 0 && self.pool.block_hash(b).is_some();
                prop_assert_eq!(self.pool.evict_cached_block(b), could);
                if could {
                    prop_assert_eq!(self.pool.block_hash(b), None);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_the_pool_consistent(
        num_blocks in 2usize..24,
        block_size in 1usize..5,
        caching in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let pool = BlockPool::new(BlockPoolConfig {
            num_blocks,
            block_size,
            enable_caching: caching,
            model_key: MODEL_KEY,
            layout: None,
        }).unwrap();
        let mut w = World { pool, seqs: Vec::new(), raw: Vec::new() };
        for op in ops {
            w.apply(op)?;
            w.check()?;
        }
        for mut s in std::mem::take(&mut w.seqs) {
            s.table.free(&mut w.pool).unwrap();
        }
        for b in std::mem::take(&mut w.raw) {
            w.pool.free(b).unwrap();
        }
        w.check()?;
        prop_assert_eq!(w.pool.num_used_blocks(), 0, "leak");
        prop_assert_eq!(w.pool.num_free_blocks(), num_blocks - 1);
    }

    /// A sequence freed and looked up again finds exactly its full blocks while nothing else
    /// ran in between (nothing evicted them).
    #[test]
    fn a_freed_sequence_is_found_again_in_full(
        tokens in prop::collection::vec(0u32..50, 0..40),
        block_size in 1usize..6,
    ) {
        let mut pool = BlockPool::new(BlockPoolConfig {
            num_blocks: 64,
            block_size,
            enable_caching: true,
            model_key: MODEL_KEY,
            layout: None,
        }).unwrap();
        let mut t = BlockTable::new(block_size);
        t.append_tokens(&mut pool, &tokens).unwrap();
        let full = tokens.len() / block_size;
        let blocks = t.blocks()[..full].to_vec();
        t.free(&mut pool).unwrap();
        let again = BlockTable::from_cached_prefix(&mut pool, &tokens);
        prop_assert_eq!(again.blocks(), &blocks[..]);
        prop_assert_eq!(again.num_tokens(), full * block_size);
    }
}
