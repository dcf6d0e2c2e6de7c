//! Property test: random workloads (arrivals over time, shared prefixes, small pools that force
//! preemption, aborts before and during steps) against the fake model.
//!
//! Every plan respects the budget, row and chunk limits and the scheduler's invariants; every
//! request that was not aborted produces exactly the reference tokens (so preemption, chunking
//! and prefix reuse never change the output); and when the last request ends no block is in
//! use, however the requests ended.

mod common;

use std::collections::HashMap;

use common::*;
use poot_engine::{EngineError, RequestId, RequestSpec, Scheduler, SchedulerConfig};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Req {
    prefix: usize,
    prefix_len: usize,
    tail: Vec<u32>,
    max_tokens: usize,
    ignore_eos: bool,
    arrival: usize,
    /// Abort at this step: before scheduling (false) or while the step is in flight (true).
    abort: Option<(usize, bool)>,
}

fn req() -> impl Strategy<Value = Req> {
    (
        0usize..3,
        0usize..20,
        prop::collection::vec(1u32..VOCAB, 1..20),
        1usize..24,
        any::<bool>(),
        0usize..30,
        prop::option::weighted(0.25, (0usize..40, any::<bool>())),
    )
        .prop_map(
            |(prefix, prefix_len, tail, max_tokens, ignore_eos, arrival, abort)| Req {
                prefix,
                prefix_len,
                tail,
                max_tokens,
                ignore_eos,
                arrival,
                abort,
            },
        )
}

fn cfg() -> impl Strategy<Value = SchedulerConfig> {
    (
        1usize..6,
        1usize..5,
        2usize..24,
        1usize..4,
        12usize..60,
        any::<bool>(),
    )
        .prop_map(
            |(seqs, bs, step, batch_mul, blocks, caching)| SchedulerConfig {
                max_num_seqs: seqs.min(step),
                max_batched_tokens: step * batch_mul,
                max_step_tokens: step,
                max_model_len: 64,
                block_size: bs,
                num_blocks: blocks,
                enable_prefix_caching: caching,
                model_key: 3,
                kv_window: None,
                window_group: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_match_the_reference_and_free_everything(
        c in cfg(),
        reqs in prop::collection::vec(req(), 1..12),
    ) {
        let mut s = Scheduler::new(c.clone()).unwrap();
        let mut model = FakeModel::new(&c);
        let specs: Vec<RequestSpec> = reqs.iter().enumerate().map(|(i, r)| {
            let mut p = prompt(r.prefix as u32, r.prefix_len);
            p.extend(&r.tail);
            RequestSpec { ignore_eos: r.ignore_eos, ..spec(i as u64, p, r.max_tokens) }
        }).collect();
        let mut pending: Vec<usize> = (0..specs.len()).collect();
        let mut live: Vec<usize> = Vec::new();
        let mut aborted: Vec<usize> = Vec::new();
        let mut outs: HashMap<RequestId, Vec<u32>> = HashMap::new();
        let mut done = HashMap::new();
        for step in 0.. {
            prop_assert!(step < 20_000, "no progress");
            // When nothing is live, the next arrival comes now.
            let next = pending.iter().map(|&i| reqs[i].arrival).min().unwrap_or(0);
            let now = if s.has_unfinished_requests() { step } else { step.max(next) };
            for i in std::mem::take(&mut pending) {
                if reqs[i].arrival <= now {
                    match s.add_request(specs[i].clone()) {
                        Ok(()) => live.push(i),
                        Err(EngineError::TooLargeForPool { .. }) => {}
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                } else {
                    pending.push(i);
                }
            }
            let abort_now = |in_flight: bool, live: &mut Vec<usize>, s: &mut Scheduler, aborted: &mut Vec<usize>| {
                live.retain(|&i| {
                    if reqs[i].abort == Some((step, in_flight)) {
                        if s.abort(specs[i].id).unwrap() {
                            aborted.push(i);
                        }
                        return false;
                    }
                    true
                });
            };
            abort_now(false, &mut live, &mut s, &mut aborted);
            if !s.has_unfinished_requests() {
                if pending.is_empty() { break; }
                continue;
            }
            let plan = s.schedule().unwrap();
            check_plan(&s, &plan);
            prop_assert!(!plan.is_empty());
            abort_now(true, &mut live, &mut s, &mut aborted);
            let output = model.run(&plan);
            let output = poot_engine::StepOutput {
                sampled: output.sampled.into_iter().filter(|(id, _)| s.request(*id).is_some()).collect(),
            };
            for ev in s.update(output).unwrap() {
                outs.entry(ev.request_id).or_default().push(ev.token);
                if let Some(f) = ev.finish {
                    done.insert(ev.request_id, (outs.remove(&ev.request_id).unwrap(), f));
                }
            }
            s.check_invariants().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(s.num_used_blocks(), 0, "blocks leaked");
        for (i, sp) in specs.iter().enumerate() {
            if aborted.contains(&i) {
                prop_assert!(!done.contains_key(&sp.id));
            } else if let Some(got) = done.get(&sp.id) {
                prop_assert_eq!(got, &reference(sp, c.max_model_len), "request {}", i);
            }
        }
        let st = s.stats();
        if std::env::var_os("POOT_PROP_STATS").is_some() {
            eprintln!("{st:?} done={} aborted={}", done.len(), aborted.len());
        }
        prop_assert_eq!(st.finished as usize + st.aborted as usize, done.len() + aborted.len());
    }
}
