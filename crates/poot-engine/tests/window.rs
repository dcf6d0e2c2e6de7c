//! `kv_window`: blocks wholly outside every layer's sliding window go back to the pool, and
//! a fake model that reads only the window sees the right tokens in every slot it reads.

mod common;

use std::collections::HashMap;

use common::{config, prompt, spec};
use poot_engine::{RequestId, Scheduler, SchedulerConfig, SchedulerOutput, StepOutput};
use poot_kv::TokenId;

const W: usize = 6;
const VOCAB: u32 = 97;

/// The next token from the last `W` tokens only (what a fully windowed model sees).
fn next_windowed(seq: &[TokenId]) -> TokenId {
    let from = seq.len().saturating_sub(W);
    let h = seq[from..]
        .iter()
        .fold(7u32, |h, &t| h.wrapping_mul(31).wrapping_add(t));
    1 + h % (VOCAB - 1)
}

/// A KV cache of `(token, position)` per slot that reads only each token's window.
struct WindowModel {
    kv: Vec<Option<(TokenId, i32)>>,
    bs: usize,
}

impl WindowModel {
    fn run(&mut self, plan: &SchedulerOutput) -> StepOutput {
        for s in &plan.seqs {
            for (&t, (&p, &slot)) in s
                .token_ids
                .iter()
                .zip(s.positions.iter().zip(&s.slot_mapping))
            {
                assert_ne!(
                    slot as usize / self.bs,
                    0,
                    "a token was written to the null block"
                );
                self.kv[slot as usize] = Some((t, p));
            }
        }
        let mut out = StepOutput::default();
        for s in plan.seqs.iter().filter(|s| s.sample) {
            let last = *s.positions.last().unwrap() as usize;
            let seq: Vec<TokenId> = (last.saturating_sub(W - 1)..=last)
                .map(|p| {
                    let block = s.block_table[p / self.bs] as usize;
                    assert_ne!(block, 0, "position {p} is in the window but was released");
                    match self.kv[block * self.bs + p % self.bs] {
                        Some((t, q)) if q as usize == p => t,
                        other => panic!("slot of position {p} holds {other:?}"),
                    }
                })
                .collect();
            out.sampled.push((s.request_id, next_windowed(&seq)));
        }
        out
    }
}

fn reference(prompt: &[TokenId], max_tokens: usize) -> Vec<TokenId> {
    let mut seq = prompt.to_vec();
    for _ in 0..max_tokens {
        seq.push(next_windowed(&seq));
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn windowed_requests_hold_a_bounded_number_of_blocks() {
    // 12 usable blocks of 4 tokens: 48 slots, while each request runs to 120 tokens.
    let c = SchedulerConfig {
        num_blocks: 13,
        max_model_len: 512,
        max_step_tokens: 8,
        max_batched_tokens: 8,
        max_num_seqs: 2,
        kv_window: Some(W),
        ..config()
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = WindowModel {
        kv: vec![None; c.num_blocks * c.block_size],
        bs: c.block_size,
    };
    let prompts: Vec<Vec<TokenId>> = (0..2).map(|i| prompt(i, 20)).collect();
    for (i, p) in prompts.iter().enumerate() {
        let sp = poot_engine::RequestSpec {
            ignore_eos: true,
            ..spec(i as u64, p.clone(), 100)
        };
        s.add_request(sp).unwrap();
    }
    let mut outs: HashMap<RequestId, Vec<TokenId>> = HashMap::new();
    let mut most_used = 0;
    while s.has_unfinished_requests() {
        let plan = s.schedule().unwrap();
        most_used = most_used.max(s.num_used_blocks());
        let out = model.run(&plan);
        for ev in s.update(out).unwrap() {
            outs.entry(ev.request_id).or_default().push(ev.token);
        }
        s.check_invariants().unwrap();
    }
    assert_eq!(s.stats().preemptions, 0);
    // Per request: the window behind the step (W - 1), the step's tokens, rounding.
    let bound = 2 * ((W - 1 + 8).div_ceil(c.block_size) + 1);
    assert!(most_used <= bound, "{most_used} blocks in use > {bound}");
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(outs[&RequestId(i as u64)], reference(p, 100), "request {i}");
    }
    assert_eq!(s.num_used_blocks(), 0);
}

#[test]
fn without_a_window_the_same_run_does_not_fit() {
    let c = SchedulerConfig {
        num_blocks: 13,
        max_model_len: 512,
        kv_window: None,
        ..config()
    };
    let mut s = Scheduler::new(c).unwrap();
    let sp = poot_engine::RequestSpec {
        ignore_eos: true,
        ..spec(0, prompt(0, 20), 100)
    };
    assert!(matches!(
        s.add_request(sp),
        Err(poot_engine::EngineError::TooLargeForPool { .. })
    ));
}

#[test]
fn a_cached_prefix_longer_than_the_window_is_released_at_admission() {
    let c = SchedulerConfig {
        num_blocks: 64,
        max_step_tokens: 8,
        max_batched_tokens: 8,
        kv_window: Some(W),
        ..config()
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut model = WindowModel {
        kv: vec![None; c.num_blocks * c.block_size],
        bs: c.block_size,
    };
    let p = prompt(3, 40);
    let mut run = |s: &mut Scheduler, id: u64| -> Vec<TokenId> {
        let sp = poot_engine::RequestSpec {
            ignore_eos: true,
            ..spec(id, p.clone(), 4)
        };
        s.add_request(sp).unwrap();
        let mut got = Vec::new();
        while s.has_unfinished_requests() {
            let plan = s.schedule().unwrap();
            // Never more than the window's blocks plus the step's, even on the cached prefix.
            assert!(s.num_used_blocks() <= (W - 1 + 8).div_ceil(c.block_size) + 1);
            for ev in s.update(model.run(&plan)).unwrap() {
                got.push(ev.token);
            }
            s.check_invariants().unwrap();
        }
        got
    };
    let first = run(&mut s, 0);
    let second = run(&mut s, 1);
    assert!(
        s.stats().cached_tokens > 0,
        "the second request was meant to reuse the prefix"
    );
    assert_eq!(first, reference(&p, 4));
    assert_eq!(second, first);
}

#[test]
fn a_zero_window_is_refused() {
    let c = SchedulerConfig {
        kv_window: Some(0),
        ..config()
    };
    assert!(matches!(
        Scheduler::new(c),
        Err(poot_engine::EngineError::InvalidConfig { .. })
    ));
}
