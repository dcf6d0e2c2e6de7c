//! Scheduler behaviour with a fake model (see `common`).

mod common;

use common::*;
use poot_engine::{
    EngineError, FinishReason, RequestId, RequestStatus, Scheduler, SchedulerConfig, StepDims,
    StepOutput,
};

fn ids(plan: &poot_engine::SchedulerOutput) -> Vec<(u64, usize)> {
    plan.seqs
        .iter()
        .map(|s| (s.request_id.0, s.num_tokens()))
        .collect()
}

fn long(id: u64, prompt_ids: Vec<u32>, max_tokens: usize) -> poot_engine::RequestSpec {
    poot_engine::RequestSpec {
        ignore_eos: true,
        ..spec(id, prompt_ids, max_tokens)
    }
}

#[test]
fn config_is_validated() {
    let bad =
        |c: SchedulerConfig| matches!(Scheduler::new(c), Err(EngineError::InvalidConfig { .. }));
    assert!(bad(SchedulerConfig {
        max_num_seqs: 0,
        ..config()
    }));
    assert!(bad(SchedulerConfig {
        max_step_tokens: 0,
        ..config()
    }));
    assert!(bad(SchedulerConfig {
        max_num_seqs: 33,
        ..config()
    })); // > min(64, 32)
    assert!(bad(SchedulerConfig {
        max_model_len: 1,
        ..config()
    }));
    assert!(matches!(
        Scheduler::new(SchedulerConfig {
            num_blocks: 1,
            ..config()
        }),
        Err(EngineError::Kv(poot_kv::KvError::InvalidConfig { .. }))
    ));
}

#[test]
fn requests_are_validated_before_queueing() {
    let mut s = Scheduler::new(SchedulerConfig {
        num_blocks: 5,
        max_model_len: 64,
        ..config()
    })
    .unwrap();
    assert_eq!(
        s.add_request(spec(1, vec![], 4)),
        Err(EngineError::EmptyPrompt(RequestId(1)))
    );
    assert_eq!(
        s.add_request(spec(1, vec![1], 0)),
        Err(EngineError::ZeroMaxTokens(RequestId(1)))
    );
    assert!(matches!(
        s.add_request(spec(1, prompt(0, 64), 4)),
        Err(EngineError::PromptTooLong { .. })
    ));
    // 4 usable blocks of 4 tokens: 10 + 7 tokens need 5.
    assert!(matches!(
        s.add_request(spec(1, prompt(0, 10), 7)),
        Err(EngineError::TooLargeForPool {
            needed: 5,
            usable: 4,
            ..
        })
    ));
    s.add_request(spec(1, prompt(0, 10), 6)).unwrap();
    assert_eq!(
        s.add_request(spec(1, vec![1], 1)),
        Err(EngineError::DuplicateRequest(RequestId(1)))
    );
    assert_eq!(s.waiting().count(), 1);
}

#[test]
fn admission_is_first_come_first_served() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_seqs: 2,
        ..config()
    })
    .unwrap();
    s.add_request(long(1, prompt(1, 5), 1)).unwrap();
    s.add_request(long(2, prompt(2, 5), 3)).unwrap();
    s.add_request(long(3, prompt(3, 5), 3)).unwrap();
    let mut m = FakeModel::new(s.config());
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(1, 5), (2, 5)]); // max_num_seqs holds 3 back
    let ev = s.update(m.run(&p)).unwrap();
    assert_eq!(ev[0].finish, Some(FinishReason::Length));
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(2, 1), (3, 5)]);
    // Under a tight budget the queue head takes a partial chunk and nobody overtakes it.
    let mut s = Scheduler::new(SchedulerConfig {
        max_batched_tokens: 8,
        max_step_tokens: 8,
        ..config()
    })
    .unwrap();
    s.add_request(long(1, prompt(1, 6), 2)).unwrap();
    s.add_request(long(2, prompt(2, 6), 2)).unwrap();
    s.add_request(long(3, prompt(3, 1), 2)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(1, 6), (2, 2)]);
    assert_eq!(s.waiting().collect::<Vec<_>>(), [RequestId(3)]);
}

#[test]
fn decode_rows_come_before_prefill_chunks() {
    let mut s = Scheduler::new(config()).unwrap();
    let mut m = FakeModel::new(s.config());
    s.add_request(long(1, prompt(1, 10), 20)).unwrap();
    s.add_request(long(2, prompt(2, 10), 20)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(1, 10), (2, 10)]);
    s.update(m.run(&p)).unwrap();
    s.add_request(long(3, prompt(3, 100), 2)).unwrap();
    for _ in 0..3 {
        let p = s.schedule().unwrap();
        assert_eq!(ids(&p), [(1, 1), (2, 1), (3, 30)]);
        assert!(p.seqs[0].sample && p.seqs[1].sample && !p.seqs[2].sample);
        s.update(m.run(&p)).unwrap();
    }
    assert_eq!(ids(&s.schedule().unwrap()), [(1, 1), (2, 1), (3, 10)]);
}

#[test]
fn a_long_prompt_runs_as_legal_chunks_and_samples_once() {
    let mut s = Scheduler::new(config()).unwrap(); // budget min(64, 32) = 32
    let mut m = FakeModel::new(s.config());
    s.add_request(long(1, prompt(1, 100), 3)).unwrap();
    let mut chunks = Vec::new();
    while s.has_unfinished_requests() {
        let p = s.schedule().unwrap();
        check_plan(&s, &p);
        let q = &p.seqs[0];
        chunks.push((q.num_tokens(), q.start(), q.sample));
        s.update(m.run(&p)).unwrap();
    }
    let want = [
        (32, 0, false),
        (32, 32, false),
        (32, 64, false),
        (4, 96, true),
        (1, 100, true),
        (1, 101, true),
    ];
    assert_eq!(chunks, want);
    assert_eq!(s.num_used_blocks(), 0);
}

#[test]
fn every_plan_respects_the_budget_and_outputs_match_the_reference() {
    let c = SchedulerConfig {
        max_num_seqs: 8,
        max_batched_tokens: 24,
        max_step_tokens: 16,
        ..config()
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let specs: Vec<_> = (0..12)
        .map(|i| spec(i, prompt(i as u32, 3 + 7 * i as usize % 40), 12))
        .collect();
    for sp in &specs {
        s.add_request(sp.clone()).unwrap();
    }
    let run = drive(&mut s, |_, _| {});
    assert!(run.plans.iter().all(|p| p.num_tokens <= 16));
    for sp in &specs {
        assert_eq!(
            run.outputs[&sp.id],
            reference(sp, c.max_model_len),
            "request {}",
            sp.id
        );
    }
}

#[test]
fn preempted_requests_resume_with_identical_tokens() {
    for caching in [true, false] {
        // 16 usable blocks of 4 tokens; four requests needing up to 11 blocks each.
        let c = SchedulerConfig {
            num_blocks: 17,
            enable_prefix_caching: caching,
            ..config()
        };
        let mut s = Scheduler::new(c.clone()).unwrap();
        let specs: Vec<_> = (0..4).map(|i| long(i, prompt(i as u32, 12), 30)).collect();
        for sp in &specs {
            s.add_request(sp.clone()).unwrap();
        }
        let run = drive(&mut s, |_, _| {});
        assert!(s.stats().preemptions > 0, "the pool was meant to run out");
        assert!(run.plans.iter().any(|p| !p.preempted.is_empty()));
        for sp in &specs {
            assert_eq!(
                run.outputs[&sp.id],
                reference(sp, c.max_model_len),
                "request {} (caching {caching})",
                sp.id
            );
        }
    }
}

#[test]
fn preemption_takes_the_most_recently_started_and_requeues_it_first() {
    let c = SchedulerConfig {
        num_blocks: 7,
        max_num_seqs: 3,
        ..config()
    }; // 6 usable blocks
    let mut s = Scheduler::new(c).unwrap();
    let mut m = FakeModel::new(s.config());
    for i in 0..3 {
        s.add_request(long(i, prompt(i as u32, 8), 16)).unwrap(); // 2 blocks each, full
    }
    let p = s.schedule().unwrap();
    assert_eq!(p.seqs.len(), 3);
    s.update(m.run(&p)).unwrap();
    // Every decode row needs a third block; only the oldest gets one by preempting the newest.
    let p = s.schedule().unwrap();
    assert_eq!(p.preempted, [RequestId(2)]);
    assert_eq!(ids(&p), [(0, 1), (1, 1)]);
    let r2 = s.request(RequestId(2)).unwrap();
    assert_eq!(
        (r2.status, r2.num_computed_tokens, r2.output_ids.len()),
        (RequestStatus::Waiting, 0, 1)
    );
    assert_eq!(s.waiting().next(), Some(RequestId(2)));
}

#[test]
fn abort_anywhere_frees_every_block() {
    let c = config();
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut m = FakeModel::new(s.config());
    let keep = long(9, prompt(9, 20), 10);
    s.add_request(long(1, prompt(1, 10), 50)).unwrap(); // aborted while waiting
    assert!(s.abort(RequestId(1)).unwrap());
    assert!(!s.abort(RequestId(1)).unwrap());
    s.add_request(long(2, prompt(2, 100), 50)).unwrap(); // aborted mid-prefill
    s.add_request(long(3, prompt(3, 10), 50)).unwrap(); // aborted mid-decode
    s.add_request(keep.clone()).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(2, 32)]);
    s.update(m.run(&p)).unwrap();
    assert!(s.num_used_blocks() > 0);
    assert!(s.abort(RequestId(2)).unwrap());
    for _ in 0..3 {
        let p = s.schedule().unwrap();
        s.update(m.run(&p)).unwrap();
    }
    assert!(!s.request(RequestId(3)).unwrap().output_ids.is_empty());
    assert!(s.abort(RequestId(3)).unwrap());
    // Aborted while its step is in flight: its row is ignored, even if its token comes back.
    s.add_request(long(4, prompt(4, 10), 50)).unwrap();
    let p = s.schedule().unwrap();
    assert!(p.seqs.iter().any(|q| q.request_id == RequestId(4)));
    assert!(s.abort(RequestId(4)).unwrap());
    // A new request reusing the id must not inherit the in-flight row.
    s.add_request(long(4, prompt(5, 3), 2)).unwrap();
    let ev = s.update(m.run(&p)).unwrap();
    assert!(ev.iter().all(|e| e.request_id == RequestId(9)));
    s.check_invariants().unwrap();
    let run = drive_with(&mut s, &mut m, |_, _| {});
    assert_eq!(run.outputs[&keep.id].1, FinishReason::Length);
    assert_eq!(s.num_used_blocks(), 0);
    assert_eq!(s.stats().aborted, 4);
}

#[test]
fn prefix_reuse_skips_exactly_the_shared_full_blocks() {
    let shared = prompt(1, 40);
    let a: Vec<u32> = shared.iter().copied().chain(prompt(2, 10)).collect();
    let b: Vec<u32> = shared.iter().copied().chain(prompt(3, 7)).collect();
    let mut computed = Vec::new();
    for caching in [false, true] {
        let c = SchedulerConfig {
            block_size: 16,
            enable_prefix_caching: caching,
            max_step_tokens: 64,
            ..config()
        };
        let mut s = Scheduler::new(c.clone()).unwrap();
        let (sa, sb) = (spec(1, a.clone(), 5), spec(2, b.clone(), 5));
        let mut m = FakeModel::new(&c);
        s.add_request(sa.clone()).unwrap();
        let run_a = drive_with(&mut s, &mut m, |_, _| {});
        s.add_request(sb.clone()).unwrap();
        let run_b = drive_with(&mut s, &mut m, |_, _| {});
        assert_eq!(run_a.outputs[&sa.id], reference(&sa, c.max_model_len));
        assert_eq!(run_b.outputs[&sb.id], reference(&sb, c.max_model_len));
        let first = &run_b.plans[0].seqs[0];
        assert_eq!(first.num_cached_tokens, if caching { 32 } else { 0 });
        assert_eq!(first.start(), first.num_cached_tokens);
        computed.push(s.stats().computed_tokens);
    }
    assert_eq!(
        computed[0] - computed[1],
        32,
        "two shared full blocks of 16"
    );
}

#[test]
fn a_request_that_skips_the_cache_computes_its_whole_prompt() {
    // A request asking for every prompt position's logits reads no cached block, even the
    // whole prompt's; its own full blocks still serve the next request.
    let c = SchedulerConfig {
        block_size: 16,
        max_step_tokens: 64,
        ..config()
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut m = FakeModel::new(&c);
    let p = prompt(5, 40);
    s.add_request(spec(1, p.clone(), 3)).unwrap();
    drive_with(&mut s, &mut m, |_, _| {});
    let own = poot_engine::RequestSpec {
        skip_prefix_cache: true,
        ..spec(2, p.clone(), 3)
    };
    s.add_request(own.clone()).unwrap();
    let run = drive_with(&mut s, &mut m, |_, _| {});
    let first = &run.plans[0].seqs[0];
    assert_eq!((first.num_cached_tokens, first.start()), (0, 0));
    assert_eq!(run.outputs[&own.id], reference(&own, c.max_model_len));
    s.add_request(spec(3, p, 3)).unwrap();
    let run = drive_with(&mut s, &mut m, |_, _| {});
    assert_eq!(run.plans[0].seqs[0].num_cached_tokens, 32);
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_block() {
    let c = SchedulerConfig {
        block_size: 16,
        ..config()
    };
    let mut s = Scheduler::new(c.clone()).unwrap();
    let mut m = FakeModel::new(&c);
    let sp = spec(1, prompt(1, 32), 3);
    s.add_request(sp.clone()).unwrap();
    drive_with(&mut s, &mut m, |_, _| {});
    let again = spec(2, sp.prompt_ids.clone(), 3);
    s.add_request(again.clone()).unwrap();
    let run = drive_with(&mut s, &mut m, |_, _| {});
    assert_eq!(run.plans[0].seqs[0].num_cached_tokens, 16);
    assert_eq!(run.plans[0].seqs[0].num_tokens(), 16);
    assert_eq!(run.outputs[&again.id], reference(&again, c.max_model_len));
}

#[test]
fn stop_eos_and_length_finish_as_asked() {
    let c = SchedulerConfig {
        max_model_len: 40,
        ..config()
    };
    let free = long(1, prompt(1, 10), 20);
    let (out, _) = reference(
        &poot_engine::RequestSpec {
            eos_ids: vec![],
            ..free.clone()
        },
        100,
    );
    let t = out[3];
    let first = out.iter().position(|&x| x == t).unwrap();
    let mut s = Scheduler::new(c.clone()).unwrap();
    s.add_request(poot_engine::RequestSpec {
        id: RequestId(1),
        eos_ids: vec![t],
        ..free.clone()
    })
    .unwrap();
    s.add_request(poot_engine::RequestSpec {
        id: RequestId(2),
        stop_ids: vec![t],
        ..free.clone()
    })
    .unwrap();
    s.add_request(poot_engine::RequestSpec {
        id: RequestId(3),
        ignore_eos: false,
        eos_ids: vec![t],
        ..free.clone()
    })
    .unwrap();
    s.add_request(long(4, prompt(4, 35), 100)).unwrap(); // capped by max_model_len
    let run = drive(&mut s, |_, _| {});
    assert_eq!(
        run.outputs[&RequestId(1)],
        (out.clone(), FinishReason::Length)
    );
    assert_eq!(
        run.outputs[&RequestId(2)],
        (out[..=first].to_vec(), FinishReason::Stop)
    );
    assert_eq!(
        run.outputs[&RequestId(3)],
        (out[..=first].to_vec(), FinishReason::Stop)
    );
    assert_eq!(run.outputs[&RequestId(4)].0.len(), 5);
    assert_eq!(run.outputs[&RequestId(4)].1, FinishReason::Length);
}

#[test]
fn the_step_protocol_is_enforced() {
    let mut s = Scheduler::new(config()).unwrap();
    let mut m = FakeModel::new(s.config());
    assert_eq!(
        s.update(StepOutput::default()),
        Err(EngineError::NoStepInFlight)
    );
    assert!(s.schedule().unwrap().is_empty());
    assert!(!s.step_in_flight());
    s.add_request(long(1, prompt(1, 40), 4)).unwrap();
    s.add_request(long(2, prompt(2, 3), 4)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(1, 32)]);
    assert_eq!(s.schedule(), Err(EngineError::StepInFlight));
    let bad = |sampled: Vec<(u64, u32)>| StepOutput {
        sampled: sampled
            .into_iter()
            .map(|(i, t)| (RequestId(i), t))
            .collect(),
    };
    let mismatch = |r: Result<_, _>| matches!(r, Err(EngineError::OutputMismatch { .. }));
    assert!(mismatch(s.update(bad(vec![(1, 5)])))); // row 1 does not sample yet
    assert!(mismatch(s.update(bad(vec![(7, 5)]))));
    s.update(m.run(&p)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(ids(&p), [(1, 8), (2, 3)]);
    assert!(mismatch(s.update(bad(vec![(1, 5)])))); // row 2's token is missing
    assert!(mismatch(s.update(bad(vec![(1, 5), (2, 5), (2, 6)]))));
    assert!(s.step_in_flight(), "a refused output changes nothing");
    assert_eq!(s.update(m.run(&p)).unwrap().len(), 2);
}

#[test]
fn flatten_lays_out_the_runner_inputs() {
    let mut s = Scheduler::new(SchedulerConfig {
        block_size: 4,
        ..config()
    })
    .unwrap();
    let mut m = FakeModel::new(s.config());
    s.add_request(long(1, prompt(1, 5), 4)).unwrap();
    let p = s.schedule().unwrap();
    s.update(m.run(&p)).unwrap();
    s.add_request(long(2, prompt(2, 3), 4)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(
        p.dims(),
        StepDims {
            tokens: 4,
            seqs: 2,
            max_blocks: 2
        }
    );
    let f = p
        .flatten(StepDims {
            tokens: 8,
            seqs: 4,
            max_blocks: 4,
        })
        .unwrap();
    let (r1, r2) = (&p.seqs[0], &p.seqs[1]);
    assert_eq!(f.positions, [5, 0, 1, 2, 0, 0, 0, 0]);
    assert_eq!(f.token_seq, [0, 1, 1, 1, 0, 0, 0, 0]);
    assert_eq!(f.last_rows, [0, 3, 0, 0]);
    assert_eq!(
        &f.slot_mapping[..4],
        [
            r1.slot_mapping[0],
            r2.slot_mapping[0],
            r2.slot_mapping[1],
            r2.slot_mapping[2]
        ]
    );
    assert_eq!(&f.slot_mapping[4..], [-1; 4]);
    assert_eq!(&f.block_tables[..2], &r1.block_table[..]);
    assert_eq!(&f.block_tables[2..4], [0, 0]);
    assert_eq!(&f.block_tables[4..5], &r2.block_table[..]);
    assert_eq!(f.ids[0], r1.token_ids[0] as i32);
    assert!(matches!(
        p.flatten(StepDims {
            tokens: 3,
            seqs: 2,
            max_blocks: 2
        }),
        Err(EngineError::DimsTooSmall { what: "tokens", .. })
    ));
}
