use super::*;

fn pool(num_blocks: usize, block_size: usize, caching: bool) -> BlockPool {
    BlockPool::new(BlockPoolConfig {
        num_blocks,
        block_size,
        enable_caching: caching,
        model_key: 42,
        layout: None,
    })
    .unwrap()
}

fn ids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&i| BlockId(i)).collect()
}

#[test]
fn config_is_checked() {
    let cfg = |num_blocks, block_size| BlockPoolConfig {
        num_blocks,
        block_size,
        enable_caching: true,
        model_key: 0,
        layout: None,
    };
    assert!(matches!(
        BlockPool::new(cfg(1, 16)),
        Err(KvError::InvalidConfig { .. })
    ));
    assert!(matches!(
        BlockPool::new(cfg(4, 0)),
        Err(KvError::InvalidConfig { .. })
    ));
    assert!(matches!(
        BlockPool::new(cfg(1 << 28, 16)),
        Err(KvError::InvalidConfig { .. })
    ));
}

#[test]
fn null_block_is_never_handed_out() {
    let mut p = pool(4, 2, false);
    assert_eq!(p.num_usable_blocks(), 3);
    assert_eq!(p.get_new_blocks(3).unwrap(), ids(&[1, 2, 3]));
    assert_eq!(p.allocate(), None);
    assert_eq!(p.free(NULL_BLOCK), Err(KvError::NullBlock));
    assert_eq!(p.touch(NULL_BLOCK), Err(KvError::NullBlock));
    assert_eq!(p.ref_cnt(NULL_BLOCK), 0);
    p.check_invariants().unwrap();
}

#[test]
fn get_new_blocks_is_all_or_nothing() {
    let mut p = pool(4, 2, false);
    assert_eq!(p.get_new_blocks(4), None);
    assert_eq!(p.num_free_blocks(), 3);
    assert_eq!(p.get_new_blocks(0), Some(vec![]));
}

#[test]
fn double_free_is_refused_and_changes_nothing() {
    let mut p = pool(4, 2, false);
    let b = p.allocate().unwrap();
    p.free(b).unwrap();
    assert_eq!(p.free(b), Err(KvError::DoubleFree { block: b.0 }));
    assert_eq!(
        p.free(BlockId(9)),
        Err(KvError::UnknownBlock {
            block: 9,
            num_blocks: 4
        })
    );
    p.check_invariants().unwrap();
    assert_eq!(p.num_free_blocks(), 3);
}

#[test]
fn ref_counts_follow_touch_and_free() {
    let mut p = pool(4, 2, false);
    let b = p.allocate().unwrap();
    p.touch(b).unwrap();
    assert_eq!(p.ref_cnt(b), 2);
    p.free(b).unwrap();
    assert_eq!((p.ref_cnt(b), p.num_used_blocks()), (1, 1));
    p.free(b).unwrap();
    assert_eq!((p.ref_cnt(b), p.num_used_blocks()), (0, 0));
}

#[test]
fn freed_cached_blocks_are_evicted_least_recently_freed_first() {
    let mut p = pool(5, 2, true);
    let (mut a, mut b) = (BlockTable::new(2), BlockTable::new(2));
    a.append_tokens(&mut p, &[1, 2, 3, 4]).unwrap();
    b.append_tokens(&mut p, &[5, 6, 7]).unwrap();
    assert_eq!(p.num_cached_blocks(), 3);
    a.free(&mut p).unwrap(); // blocks 1 (head) and 2 (tail), both cached
    b.free(&mut p).unwrap(); // block 4 partial (uncached, to the head), block 3 cached
    assert_eq!(p.free_blocks_in_eviction_order(), ids(&[4, 2, 1, 3]));
    // The uncached block goes first; then the tail of the older sequence.
    assert_eq!(p.allocate(), Some(BlockId(4)));
    assert_eq!(p.num_cached_blocks(), 3);
    assert_eq!(p.allocate(), Some(BlockId(2)));
    assert_eq!(p.num_cached_blocks(), 2);
    p.check_invariants().unwrap();
}

#[test]
fn prefix_hits_touch_and_stop_at_first_miss() {
    let mut p = pool(8, 2, true);
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
    let hashes = a.block_hashes().to_vec();
    assert_eq!(hashes, hash_full_blocks(&[1, 2, 3, 4, 5, 6], 2, 42));
    a.free(&mut p).unwrap();
    let used = p.num_used_blocks();
    let t = BlockTable::from_cached_prefix(&mut p, &[1, 2, 3, 4, 9, 9, 7]);
    assert_eq!(t.blocks(), &a_blocks(&hashes[..2], &p)[..]);
    assert_eq!(t.num_tokens(), 4);
    assert_eq!(p.num_used_blocks(), used + 2);
    // A different model key finds nothing.
    let mut other = BlockPool::new(BlockPoolConfig {
        model_key: 43,
        ..p.config().clone()
    })
    .unwrap();
    assert!(other.find_cached_prefix(&[1, 2, 3, 4]).is_empty());
    p.check_invariants().unwrap();
}

fn a_blocks(hashes: &[BlockHash], p: &BlockPool) -> Vec<BlockId> {
    (1..p.num_blocks() as u32)
        .map(BlockId)
        .filter(|&b| p.block_hash(b).is_some_and(|h| hashes.contains(&h)))
        .collect()
}

#[test]
fn a_hit_needs_matching_tokens_not_just_the_hash() {
    let mut p = pool(4, 2, true);
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &[1, 2]).unwrap();
    let h = a.block_hashes()[0];
    assert_eq!(p.get_cached_block(h, None, &[1, 2]), Some(a.blocks()[0]));
    assert_eq!(p.get_cached_block(h, None, &[1, 3]), None);
    assert_eq!(p.get_cached_block(h, Some(BlockHash(1)), &[1, 2]), None);
}

#[test]
fn caching_off_finds_nothing_and_frees_to_the_head() {
    let mut p = pool(4, 2, false);
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &[1, 2, 3, 4]).unwrap();
    assert_eq!(a.block_hashes().len(), 2);
    assert_eq!(p.num_cached_blocks(), 0);
    a.free(&mut p).unwrap();
    assert!(p.find_cached_prefix(&[1, 2, 3, 4]).is_empty());
    assert_eq!(p.num_used_blocks(), 0);
}

#[test]
fn duplicate_content_keeps_the_first_block() {
    let mut p = pool(6, 2, true);
    let (mut a, mut b) = (BlockTable::new(2), BlockTable::new(2));
    a.append_tokens(&mut p, &[1, 2]).unwrap();
    b.append_tokens(&mut p, &[1, 2]).unwrap();
    assert_eq!(a.block_hashes(), b.block_hashes());
    assert_eq!(p.block_hash(b.blocks()[0]), None);
    assert_eq!(p.num_cached_blocks(), 1);
    p.check_invariants().unwrap();
}

#[test]
fn slots_follow_the_table() {
    let mut p = pool(8, 4, false);
    p.allocate().unwrap(); // so the table does not start at block 1
    let mut t = BlockTable::new(4);
    t.reserve(&mut p, 6).unwrap();
    assert_eq!(t.blocks(), &ids(&[2, 3])[..]);
    assert_eq!(t.slot(0), Some(8));
    assert_eq!(t.slot(5), Some(13));
    assert_eq!(t.slot(8), None);
    assert_eq!(t.num_tokens(), 0);
    assert_eq!(t.capacity(), 8);
}

#[test]
fn fork_shares_full_blocks_and_copies_a_shared_partial_block_on_write() {
    let mut p = pool(8, 2, true);
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &[1, 2, 3]).unwrap();
    a.reserve(&mut p, 8).unwrap(); // reserved, uncommitted blocks are not shared
    let mut b = a.fork(&mut p).unwrap();
    assert_eq!(b.blocks(), &a.blocks()[..2]);
    assert_eq!(p.ref_cnt(a.blocks()[0]), 2);
    assert_eq!(p.ref_cnt(a.blocks()[2]), 1);
    let src = b.blocks()[1];
    let copy = b.append_tokens(&mut p, &[9]).unwrap().unwrap();
    assert_eq!(copy.src, src);
    assert_eq!(b.blocks()[1], copy.dst);
    assert_eq!((p.ref_cnt(src), p.ref_cnt(copy.dst)), (1, 1));
    // a still owns src alone and writes in place.
    assert_eq!(a.append_tokens(&mut p, &[4]).unwrap(), None);
    assert_ne!(a.block_hashes()[1], b.block_hashes()[1]);
    a.free(&mut p).unwrap();
    b.free(&mut p).unwrap();
    assert_eq!(p.num_used_blocks(), 0);
    p.check_invariants().unwrap();
}

#[test]
fn append_without_blocks_changes_nothing() {
    let mut p = pool(3, 2, false);
    let mut t = BlockTable::new(2);
    t.append_tokens(&mut p, &[1, 2, 3]).unwrap();
    let before = t.clone();
    assert_eq!(
        t.append_tokens(&mut p, &[4, 5]),
        Err(KvError::OutOfBlocks { needed: 1, free: 0 })
    );
    assert_eq!(t, before);
    assert_eq!(t.reserve(&mut p, 5), None);
}

#[test]
fn eviction_by_hand_and_reset() {
    let mut p = pool(6, 2, true);
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &[1, 2, 3, 4, 5, 6]).unwrap();
    let held = a.blocks()[0];
    assert!(!p.evict_cached_block(held));
    a.free(&mut p).unwrap();
    assert!(p.evict_cached_block(held));
    assert_eq!(p.free_blocks_in_eviction_order()[0], held);
    assert_eq!(p.reset_prefix_cache(), 2);
    assert_eq!(p.num_cached_blocks(), 0);
    p.check_invariants().unwrap();
}

#[test]
fn a_windowed_prefix_needs_only_the_blocks_inside_its_window() {
    // Blocks of 2, a window of 3: the next token after n * 2 cached tokens reads the two
    // positions before it, so only block n - 1 (and block n - 2 when the window reaches it)
    // must still be cached.
    let mut p = pool(8, 2, true);
    let toks = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &toks[..8]).unwrap();
    let held = a.blocks().to_vec();
    a.release_below(&mut p, 6).unwrap(); // blocks 0..3 back, still cached
    assert_eq!(a.num_released(), 3);
    // Evict block 0, which the group released: it lies outside every window, so the whole
    // prefix of 4 blocks is still usable.
    assert!(p.evict_cached_block(held[0]));
    let b = BlockTable::from_cached_window(&mut p, &toks, 4, 3);
    assert_eq!(b.num_tokens(), 8);
    assert_eq!(b.num_released(), 3);
    assert_eq!(&b.blocks()[..3], &[NULL_BLOCK; 3]);
    assert_eq!(b.blocks()[3], held[3]);
    assert_eq!(b.block_hashes(), a.block_hashes());
    assert_eq!(p.ref_cnt(held[3]), 2);
    p.check_invariants().unwrap();
    // Capped at 3 blocks: the window behind position 6 is block 2 (positions 4 and 5),
    // released by `a` but still cached.
    let mut c = BlockTable::from_cached_window(&mut p, &toks, 3, 3);
    assert_eq!((c.num_tokens(), c.num_released()), (6, 2));
    assert_eq!(c.blocks()[2], held[2]);
    c.free(&mut p).unwrap();
    // Evict block 2 too: 3 blocks would need it, so the prefix is 2 blocks (window in block 1).
    assert!(p.evict_cached_block(held[2]));
    let mut d = BlockTable::from_cached_window(&mut p, &toks, 3, 3);
    assert_eq!((d.num_tokens(), d.num_released()), (4, 1));
    assert_eq!(d.blocks()[1], held[1]);
    for t in [&mut a, &mut d] {
        t.free(&mut p).unwrap();
    }
    let mut b = b;
    b.free(&mut p).unwrap();
    assert_eq!(p.num_used_blocks(), 0);
    p.check_invariants().unwrap();
}

#[test]
fn a_windowed_prefix_is_empty_without_caching() {
    let mut p = pool(8, 2, false);
    let mut a = BlockTable::new(2);
    a.append_tokens(&mut p, &[1, 2, 3, 4]).unwrap();
    let b = BlockTable::from_cached_window(&mut p, &[1, 2, 3, 4, 5], 2, 3);
    assert_eq!((b.num_tokens(), b.blocks().len()), (0, 0));
}
