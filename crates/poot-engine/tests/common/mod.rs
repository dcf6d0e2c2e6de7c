//! A fake model with a fake paged KV cache, and a driver loop, for scheduler tests.
//!
//! The fake model writes `(token, position)` into the slot each plan row names and, for a
//! sampled row, reads the whole sequence back through the row's block table. The next token is
//! a deterministic function of that sequence, so a wrong slot, a stale or overwritten block, a
//! bad prefix-cache hit or a lost token after preemption changes the output, and comparing with
//! [`reference`] (plain generation, no scheduler) catches it.

#![allow(dead_code)]

use std::collections::HashMap;

use poot_engine::{
    FinishReason, RequestId, RequestSpec, Scheduler, SchedulerConfig, SchedulerOutput, StepOutput,
    TokenId,
};

pub const VOCAB: u32 = 64;
pub const EOS: TokenId = 0;

/// The fake model: a deterministic function of the whole sequence.
pub fn next_token(seq: &[TokenId]) -> TokenId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in seq {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    ((h >> 17) % u64::from(VOCAB)) as TokenId
}

/// Plain generation, no scheduler: what every scheduled run must reproduce.
pub fn reference(spec: &RequestSpec, max_model_len: usize) -> (Vec<TokenId>, FinishReason) {
    let mut seq = spec.prompt_ids.clone();
    let mut out = Vec::new();
    loop {
        let t = next_token(&seq);
        seq.push(t);
        out.push(t);
        if (!spec.ignore_eos && spec.eos_ids.contains(&t)) || spec.stop_ids.contains(&t) {
            return (out, FinishReason::Stop);
        }
        if out.len() >= spec.max_tokens || seq.len() >= max_model_len {
            return (out, FinishReason::Length);
        }
    }
}

/// A fake KV cache: `(token, position)` per slot.
pub struct FakeModel {
    kv: Vec<Option<(TokenId, i32)>>,
    block_size: usize,
    pub computed_tokens: usize,
}

impl FakeModel {
    pub fn new(config: &SchedulerConfig) -> Self {
        Self {
            kv: vec![None; config.num_blocks * config.block_size],
            block_size: config.block_size,
            computed_tokens: 0,
        }
    }

    /// Runs a step: writes every row's KV, then samples the rows that sample.
    pub fn run(&mut self, plan: &SchedulerOutput) -> StepOutput {
        for s in &plan.seqs {
            assert_eq!(s.token_ids.len(), s.positions.len());
            assert_eq!(s.token_ids.len(), s.slot_mapping.len());
            for ((&t, &p), &slot) in s.token_ids.iter().zip(&s.positions).zip(&s.slot_mapping) {
                let bs = self.block_size;
                let want = s.block_table[p as usize / bs] as usize * bs + p as usize % bs;
                assert_eq!(
                    slot as usize, want,
                    "slot of position {p} disagrees with the table"
                );
                assert_ne!(
                    slot as usize / bs,
                    0,
                    "a token was written to the null block"
                );
                self.kv[slot as usize] = Some((t, p));
            }
            self.computed_tokens += s.token_ids.len();
        }
        let mut out = StepOutput::default();
        for s in plan.seqs.iter().filter(|s| s.sample) {
            let last = *s.positions.last().unwrap();
            let seq: Vec<TokenId> = (0..=last)
                .map(|p| {
                    let bs = self.block_size;
                    let slot = s.block_table[p as usize / bs] as usize * bs + p as usize % bs;
                    match self.kv[slot] {
                        Some((t, q)) if q == p => t,
                        other => panic!(
                            "request {}: slot {slot} holds {other:?}, not position {p}",
                            s.request_id
                        ),
                    }
                })
                .collect();
            out.sampled.push((s.request_id, next_token(&seq)));
        }
        out
    }
}

/// Checks what every plan must satisfy.
pub fn check_plan(s: &Scheduler, plan: &SchedulerOutput) {
    let c = s.config();
    assert!(
        plan.num_tokens <= c.token_budget(),
        "{} tokens > budget",
        plan.num_tokens
    );
    assert!(plan.seqs.len() <= c.max_num_seqs);
    assert_eq!(
        plan.num_tokens,
        plan.seqs.iter().map(|q| q.num_tokens()).sum::<usize>()
    );
    let mut seen = std::collections::HashSet::new();
    for q in &plan.seqs {
        assert!(
            seen.insert(q.request_id),
            "request {} scheduled twice",
            q.request_id
        );
        assert!(q.num_tokens() >= 1 && q.num_tokens() <= c.max_step_tokens);
        for w in q.positions.windows(2) {
            assert_eq!(w[1], w[0] + 1);
        }
    }
    s.check_invariants().unwrap();
}

/// Outcome of a driven run.
#[derive(Debug, Default)]
pub struct Run {
    pub outputs: HashMap<RequestId, (Vec<TokenId>, FinishReason)>,
    pub plans: Vec<SchedulerOutput>,
}

/// Drives the scheduler with a fresh fake model until no request is live.
pub fn drive(s: &mut Scheduler, before_step: impl FnMut(usize, &mut Scheduler)) -> Run {
    let mut model = FakeModel::new(s.config());
    drive_with(s, &mut model, before_step)
}

/// Drives the scheduler with `model` (whose KV persists across calls) until no request is
/// live. `before_step(step, s)` may add or abort requests.
pub fn drive_with(
    s: &mut Scheduler,
    model: &mut FakeModel,
    mut before_step: impl FnMut(usize, &mut Scheduler),
) -> Run {
    let mut run = Run::default();
    let mut outs: HashMap<RequestId, Vec<TokenId>> = HashMap::new();
    for step in 0.. {
        before_step(step, s);
        if !s.has_unfinished_requests() {
            break;
        }
        assert!(step < 100_000, "no progress");
        let plan = s.schedule().unwrap();
        check_plan(s, &plan);
        assert!(!plan.is_empty(), "live requests but an empty plan");
        let output = model.run(&plan);
        for ev in s.update(output).unwrap() {
            outs.entry(ev.request_id).or_default().push(ev.token);
            if let Some(f) = ev.finish {
                let toks = outs.remove(&ev.request_id).unwrap();
                run.outputs.insert(ev.request_id, (toks, f));
            }
        }
        s.check_invariants().unwrap();
        run.plans.push(plan);
    }
    assert_eq!(s.num_used_blocks(), 0, "blocks leaked");
    run
}

pub fn config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 4,
        max_batched_tokens: 64,
        max_step_tokens: 32,
        max_model_len: 512,
        block_size: 4,
        num_blocks: 256,
        enable_prefix_caching: true,
        model_key: 7,
        kv_window: None,
        window_group: None,
    }
}

pub fn spec(id: u64, prompt: Vec<TokenId>, max_tokens: usize) -> RequestSpec {
    RequestSpec {
        id: RequestId(id),
        prompt_ids: prompt,
        max_tokens,
        eos_ids: vec![EOS],
        stop_ids: vec![],
        ignore_eos: false,
        skip_prefix_cache: false,
    }
}

/// A prompt of `n` tokens in 1..VOCAB (never EOS), varied by `seed`.
pub fn prompt(seed: u32, n: usize) -> Vec<TokenId> {
    (0..n as u32)
        .map(|i| 1 + (i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(17))) % (VOCAB - 1))
        .collect()
}
