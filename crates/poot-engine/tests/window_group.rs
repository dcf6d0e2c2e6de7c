//! `window_group`: windowed layers interleaved with global ones (Gemma 2 and 3). The global
//! group keeps every position; the windowed group has its own pool and tables, released
//! behind the window. A fake model with both groups reads the whole sequence through the
//! first table and only the window through the second, so a wrong slot, a released block
//! still read, or a stale prefix-cache hit changes its output.

mod common;

use std::collections::HashMap;

use common::{config, prompt, spec};
use poot_engine::{
    EngineError, RequestId, RequestSpec, Scheduler, SchedulerConfig, SchedulerOutput, StepOutput,
};
use poot_kv::TokenId;

const W: usize = 6;
const VOCAB: u32 = 97;

/// The next token from the whole sequence (the global layers) and its last `W` tokens (the
/// windowed layers).
fn next(full: &[TokenId], window: &[TokenId]) -> TokenId {
    let h = |s: &[TokenId], seed: u32| {
        s.iter()
            .fold(seed, |h, &t| h.wrapping_mul(31).wrapping_add(t))
    };
    1 + (h(full, 7) ^ h(window, 11).rotate_left(7)) % (VOCAB - 1)
}

fn reference(prompt: &[TokenId], max_tokens: usize) -> Vec<TokenId> {
    let mut seq = prompt.to_vec();
    for _ in 0..max_tokens {
        let from = seq.len().saturating_sub(W);
        let t = next(&seq, &seq[from..]);
        seq.push(t);
    }
    seq[prompt.len()..].to_vec()
}

/// A KV cache of `(token, position)` per slot in each group's pool.
struct GroupModel {
    kv: [Vec<Option<(TokenId, i32)>>; 2],
    bs: usize,
}

impl GroupModel {
    fn new(c: &SchedulerConfig) -> Self {
        Self {
            kv: [
                vec![None; c.num_blocks * c.block_size],
                vec![None; c.window_pool_blocks() * c.block_size],
            ],
            bs: c.block_size,
        }
    }

    fn read(&self, g: usize, table: &[i32], p: usize) -> TokenId {
        let block = table[p / self.bs] as usize;
        assert_ne!(block, 0, "group {g}: position {p} is read but was released");
        match self.kv[g][block * self.bs + p % self.bs] {
            Some((t, q)) if q as usize == p => t,
            other => panic!("group {g}: slot of position {p} holds {other:?}"),
        }
    }

    fn run(&mut self, plan: &SchedulerOutput) -> StepOutput {
        for s in &plan.seqs {
            assert_eq!(s.window_block_table.len(), s.block_table.len());
            let groups = [
                (&s.slot_mapping, &s.block_table),
                (&s.window_slot_mapping, &s.window_block_table),
            ];
            for (g, (slots, table)) in groups.into_iter().enumerate() {
                for (i, (&t, &p)) in s.token_ids.iter().zip(&s.positions).enumerate() {
                    let p = p as usize;
                    let want = table[p / self.bs] as usize * self.bs + p % self.bs;
                    assert_eq!(slots[i] as usize, want, "group {g}: slot of position {p}");
                    assert_ne!(want / self.bs, 0, "group {g}: a write to the null block");
                    self.kv[g][want] = Some((t, p as i32));
                }
            }
        }
        let mut out = StepOutput::default();
        for s in plan.seqs.iter().filter(|s| s.sample) {
            let last = *s.positions.last().unwrap() as usize;
            let full: Vec<TokenId> = (0..=last)
                .map(|p| self.read(0, &s.block_table, p))
                .collect();
            let window: Vec<TokenId> = (last.saturating_sub(W - 1)..=last)
                .map(|p| self.read(1, &s.window_block_table, p))
                .collect();
            out.sampled.push((s.request_id, next(&full, &window)));
        }
        out
    }
}

fn grouped(num_blocks: usize, max_num_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks,
        max_model_len: 512,
        max_step_tokens: 8,
        max_batched_tokens: 8,
        max_num_seqs,
        window_group: Some(W),
        ..config()
    }
}

fn ignoring_eos(id: u64, p: Vec<TokenId>, n: usize) -> RequestSpec {
    RequestSpec {
        ignore_eos: true,
        ..spec(id, p, n)
    }
}

/// Runs until no request is live; returns each request's tokens and the most blocks held in
/// each group at once.
fn drive(
    s: &mut Scheduler,
    model: &mut GroupModel,
) -> (HashMap<RequestId, Vec<TokenId>>, [usize; 2]) {
    let mut outs: HashMap<RequestId, Vec<TokenId>> = HashMap::new();
    let mut most = [0, 0];
    while s.has_unfinished_requests() {
        let plan = s.schedule().unwrap();
        most[0] = most[0].max(s.num_used_blocks());
        most[1] = most[1].max(s.num_used_window_blocks());
        for ev in s.update(model.run(&plan)).unwrap() {
            outs.entry(ev.request_id).or_default().push(ev.token);
        }
        s.check_invariants().unwrap();
    }
    assert_eq!((s.num_used_blocks(), s.num_used_window_blocks()), (0, 0));
    (outs, most)
}

#[test]
fn the_global_group_keeps_every_block_and_the_windowed_group_its_window() {
    let c = grouped(64, 2);
    // Per request: the window behind the step (W - 1), the step's tokens, rounding.
    let per_seq = (W - 1 + 8).div_ceil(c.block_size) + 1;
    assert_eq!(c.window_pool_blocks(), 2 * per_seq + 1);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = GroupModel::new(&c);
    let prompts: Vec<Vec<TokenId>> = (0..2).map(|i| prompt(i, 20)).collect();
    for (i, p) in prompts.iter().enumerate() {
        s.add_request(ignoring_eos(i as u64, p.clone(), 100))
            .unwrap();
    }
    let (outs, most) = drive(&mut s, &mut model);
    assert_eq!(s.stats().preemptions, 0);
    // The global group held both sequences whole (up to 119 positions each) near the end:
    // the second request, admitted a step later, may be one block behind.
    let whole = 119usize.div_ceil(c.block_size);
    assert!(
        most[0] >= 2 * whole - 1 && most[0] <= 2 * whole,
        "{} global blocks",
        most[0]
    );
    assert!(
        most[1] <= 2 * per_seq,
        "{} windowed blocks > {}",
        most[1],
        2 * per_seq
    );
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(outs[&RequestId(i as u64)], reference(p, 100), "request {i}");
    }
}

#[test]
fn preemption_frees_both_groups_and_recomputes() {
    // 4 requests of 20 + 30 tokens need 13 global blocks each; 30 usable blocks preempt.
    let c = grouped(31, 4);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = GroupModel::new(&c);
    let prompts: Vec<Vec<TokenId>> = (0..4).map(|i| prompt(10 + i, 20)).collect();
    for (i, p) in prompts.iter().enumerate() {
        s.add_request(ignoring_eos(i as u64, p.clone(), 30))
            .unwrap();
    }
    let (outs, _) = drive(&mut s, &mut model);
    assert!(s.stats().preemptions > 0, "the pool was meant to preempt");
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(outs[&RequestId(i as u64)], reference(p, 30), "request {i}");
    }
}

#[test]
fn a_cached_prefix_needs_only_the_windowed_blocks_inside_the_window() {
    // One request at a time: the windowed pool holds 5 usable blocks, so a 44-token request
    // cycles through it and evicts the blocks it released behind the window.
    let c = grouped(64, 1);
    assert_eq!(c.window_pool_blocks(), 6);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = GroupModel::new(&c);
    let p = prompt(3, 40);
    s.add_request(ignoring_eos(0, p.clone(), 4)).unwrap();
    let first = drive(&mut s, &mut model).0[&RequestId(0)].clone();
    assert_eq!(first, reference(&p, 4));
    // The windowed group no longer caches the prompt's early blocks...
    assert!(s.window_pool().unwrap().num_cached_blocks() < 9);
    // ...but the prefix (9 full blocks of the 39 tokens looked up) needs only blocks 7 and 8
    // there, which are cached, so the second request computes only its last prompt token.
    let before = s.stats().cached_tokens;
    s.add_request(ignoring_eos(1, p.clone(), 4)).unwrap();
    let second = drive(&mut s, &mut model).0[&RequestId(1)].clone();
    assert_eq!(s.stats().cached_tokens - before, 36);
    assert_eq!(second, first);
}

#[test]
fn a_windowed_group_recomputes_the_window_it_evicted() {
    let c = grouped(64, 1);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = GroupModel::new(&c);
    let p = prompt(3, 40);
    s.add_request(ignoring_eos(0, p.clone(), 4)).unwrap();
    let first = drive(&mut s, &mut model).0[&RequestId(0)].clone();
    // Another prompt churns the windowed pool: every block of the first request is evicted
    // there, while the global group (64 blocks) still caches its 10 full blocks.
    s.add_request(ignoring_eos(1, prompt(4, 40), 4)).unwrap();
    drive(&mut s, &mut model);
    assert!(s.pool().num_cached_blocks() >= 20);
    // The windowed group cannot serve any prefix of the first prompt: its window behind
    // every block boundary is gone. The request recomputes the prompt in both groups (the
    // global group's cached blocks are not reused: the recomputed positions need blocks in
    // both groups), and its tokens are unchanged.
    let before = s.stats().cached_tokens;
    s.add_request(ignoring_eos(2, p.clone(), 4)).unwrap();
    let third = drive(&mut s, &mut model).0[&RequestId(2)].clone();
    assert_eq!(s.stats().cached_tokens - before, 0);
    assert_eq!(third, first);
}

#[test]
fn a_request_that_skips_the_cache_computes_its_window_in_both_groups() {
    let c = grouped(64, 1);
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = GroupModel::new(&c);
    let p = prompt(3, 40);
    s.add_request(ignoring_eos(0, p.clone(), 4)).unwrap();
    let first = drive(&mut s, &mut model).0[&RequestId(0)].clone();
    let before = s.stats().cached_tokens;
    let own = RequestSpec {
        skip_prefix_cache: true,
        ..ignoring_eos(1, p.clone(), 4)
    };
    s.add_request(own).unwrap();
    let second = drive(&mut s, &mut model).0[&RequestId(1)].clone();
    assert_eq!(s.stats().cached_tokens - before, 0);
    assert_eq!(second, first);
}

#[test]
fn admission_checks_both_groups() {
    // 200 + 100 tokens need 75 global blocks; the windowed group needs only its window.
    let mut s = Scheduler::new(grouped(64, 1)).unwrap();
    let err = s
        .add_request(ignoring_eos(0, prompt(0, 200), 100))
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::TooLargeForPool {
            needed: 75,
            usable: 63,
            ..
        }
    ));
    // The windowed pool is sized so that whatever fits the global pool fits it too: a
    // request needs there at most min(its blocks, its window span) <= both pools' sizes.
    let c = grouped(4, 1);
    assert_eq!(c.window_pool_blocks(), 4);
    let mut s = Scheduler::new(c).unwrap();
    s.add_request(ignoring_eos(1, prompt(1, 4), 8)).unwrap();
}

#[test]
fn bad_window_groups_are_refused() {
    for c in [
        SchedulerConfig {
            window_group: Some(0),
            ..config()
        },
        SchedulerConfig {
            window_group: Some(W),
            kv_window: Some(W),
            ..config()
        },
    ] {
        assert!(matches!(
            Scheduler::new(c),
            Err(EngineError::InvalidConfig {
                what: "window_group",
                ..
            })
        ));
    }
}
