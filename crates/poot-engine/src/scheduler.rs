//! The scheduler: a pure state machine over requests and the KV block pool.
//!
//! The driver alternates [`Scheduler::schedule`] (what runs next, with blocks reserved) and
//! [`Scheduler::update`] (what the step sampled). Nothing here touches a device, so tests feed
//! it fake outputs.
//!
//! Policy, per step, under a token budget of `min(max_batched_tokens, max_step_tokens)`:
//! 1. decode rows (running requests with one token left to compute), oldest first;
//! 2. prefill chunks of running requests that are part way through their prompt, oldest first;
//! 3. waiting requests, first come first served, while fewer than `max_num_seqs` run: each
//!    first takes the longest cached prefix of full blocks (never its last token, whose logits
//!    are needed; none with `RequestSpec::skip_prefix_cache`), then a chunk of the rest.
//!
//! Chunked prefill is the only prefill path: a row computes `min(tokens left, budget left)`
//! tokens, so no row and no step exceeds `max_step_tokens`. A row samples only when its chunk
//! reaches the end of the tokens known for the request.
//!
//! When a running row cannot get the blocks it needs, the most recently started running
//! request not yet scheduled this step is preempted by recompute: its blocks are freed (full
//! ones stay in the prefix cache), it goes back to the front of the waiting queue with every
//! token it generated, and later prefills prompt + generated tokens again. The oldest running
//! request therefore always progresses, and a request is refused at `add_request` if it could
//! not fit the pool alone. No waiting request is admitted in a step that preempted.
//!
//! With `kv_window = Some(W)` (every layer windowed), `update` gives back each running
//! request's blocks wholly before position `num_tokens + 1 - W` (the first its next token
//! reads); the block table shows the null block there. A request's blocks in use then stay
//! at about `W / block_size + 1` however long it runs.
//!
//! With `window_group = Some(W)` (windowed layers interleaved with global ones), each request
//! has a second block table in a second pool for the windowed layers, released the same way,
//! while the first keeps every position (`groups`): admission checks both pools, a row is
//! reserved in both or preempts, and a cached prefix is the longest both groups can serve.
//!
//! Invariants (checked by [`Scheduler::check_invariants`]): waiting requests hold no blocks;
//! every block in use belongs to a running request; at most `max_num_seqs` run; when no request
//! is live, no block is in use.
//!
//! Cost: `schedule` is O(running + admitted + tokens scheduled + prefix tokens looked up);
//! `update` is O(rows + tokens committed); `abort` is O(queue length).

use std::collections::{HashMap, HashSet, VecDeque};

use poot_kv::{BlockPool, TokenId};

use crate::groups::KvGroups;
use crate::plan::{RequestEvent, ScheduledSeq, SchedulerOutput, StepOutput};
use crate::request::{Request, RequestState, RequestStatus};
use crate::{EngineError, RequestId, RequestSpec, SchedulerConfig};

/// Counters over the scheduler's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Non-empty steps planned.
    pub steps: u64,
    /// Tokens computed across all steps (prefill chunks and decode rows).
    pub computed_tokens: u64,
    /// Tokens taken from the prefix cache instead of computed (prompt tokens, or prompt +
    /// generated tokens of a request resuming after preemption).
    pub cached_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Requests finished (stop or length).
    pub finished: u64,
    /// Requests aborted.
    pub aborted: u64,
}

/// A row of the step in flight.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    id: RequestId,
    serial: u64,
    start: usize,
    len: usize,
    sample: bool,
}

/// A row being planned.
#[derive(Debug, Clone, Copy)]
struct Row {
    id: RequestId,
    len: usize,
    cached: usize,
}

/// The scheduler (see the module docs).
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvGroups,
    requests: HashMap<RequestId, Request>,
    waiting: VecDeque<RequestId>,
    /// In the order they started; the last is preempted first.
    running: Vec<RequestId>,
    in_flight: Option<Vec<InFlight>>,
    next_serial: u64,
    stats: SchedulerStats,
}

impl Scheduler {
    /// A scheduler with an empty queue and a fresh pool.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`], or [`EngineError::Kv`] for a pool it cannot build.
    pub fn new(config: SchedulerConfig) -> Result<Self, EngineError> {
        config.validate()?;
        let kv = KvGroups::new(&config)?;
        Ok(Self {
            config,
            kv,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            next_serial: 0,
            stats: SchedulerStats::default(),
        })
    }

    /// Queues a request at the back of the waiting queue.
    ///
    /// # Errors
    /// [`EngineError::DuplicateRequest`], [`EngineError::EmptyPrompt`],
    /// [`EngineError::ZeroMaxTokens`], [`EngineError::PromptTooLong`],
    /// [`EngineError::TooLargeForPool`]; nothing is queued then.
    pub fn add_request(&mut self, spec: RequestSpec) -> Result<(), EngineError> {
        let id = spec.id;
        let prompt = spec.prompt_ids.len();
        if self.requests.contains_key(&id) {
            return Err(EngineError::DuplicateRequest(id));
        }
        if prompt == 0 {
            return Err(EngineError::EmptyPrompt(id));
        }
        if spec.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens(id));
        }
        let max_model_len = self.config.max_model_len;
        if prompt >= max_model_len {
            return Err(EngineError::PromptTooLong {
                id,
                prompt,
                max_model_len,
            });
        }
        let longest = prompt.saturating_add(spec.max_tokens).min(max_model_len);
        self.kv
            .check_fits(id, longest, self.config.token_budget())?;
        let serial = self.next_serial;
        self.next_serial += 1;
        let tables = self.kv.empty_tables();
        self.requests.insert(id, Request::new(spec, serial, tables));
        self.waiting.push_back(id);
        Ok(())
    }

    /// Ends a live request wherever it is, freeing its blocks. A row of it in the step in
    /// flight is ignored by `update`. Returns whether the request was live.
    ///
    /// # Errors
    /// [`EngineError::Kv`] if its blocks could not be freed (a scheduler bug).
    pub fn abort(&mut self, id: RequestId) -> Result<bool, EngineError> {
        let Some(mut req) = self.requests.remove(&id) else {
            return Ok(false);
        };
        match req.status {
            RequestStatus::Running => self.running.retain(|&r| r != id),
            RequestStatus::Waiting => self.waiting.retain(|&r| r != id),
        }
        self.stats.aborted += 1;
        self.kv.free(&mut req.tables)?;
        Ok(true)
    }

    /// Plans the next step and reserves its blocks (see the module docs for the policy).
    /// An empty plan means nothing can run (no live request).
    ///
    /// # Errors
    /// [`EngineError::StepInFlight`] before the previous plan's `update`; [`EngineError::Kv`]
    /// on a bookkeeping failure (a scheduler bug).
    pub fn schedule(&mut self) -> Result<SchedulerOutput, EngineError> {
        if self.in_flight.is_some() {
            return Err(EngineError::StepInFlight);
        }
        let mut budget = self.config.token_budget();
        let mut rows = Vec::new();
        let mut scheduled = HashSet::new();
        let mut preempted = Vec::new();
        for decode_phase in [true, false] {
            for id in self.running.clone() {
                if budget == 0 {
                    break;
                }
                let Some(req) = self.requests.get(&id) else {
                    continue;
                };
                let remaining = req.num_remaining();
                if req.status != RequestStatus::Running || (remaining == 1) != decode_phase {
                    continue;
                }
                let len = remaining.min(budget);
                if self.reserve_or_preempt(id, len, &scheduled, &mut preempted)? {
                    rows.push(Row { id, len, cached: 0 });
                    scheduled.insert(id);
                    budget -= len;
                }
            }
        }
        if preempted.is_empty() {
            self.admit_waiting(&mut budget, &mut rows)?;
        }
        self.build_plan(rows, preempted)
    }

    /// Reserves blocks for `len` more tokens of running request `id`, preempting the most
    /// recently started unscheduled running requests until it fits. False when `id` itself was
    /// preempted or nothing is left to preempt.
    fn reserve_or_preempt(
        &mut self,
        id: RequestId,
        len: usize,
        scheduled: &HashSet<RequestId>,
        preempted: &mut Vec<RequestId>,
    ) -> Result<bool, EngineError> {
        loop {
            let Some(req) = self.requests.get_mut(&id) else {
                return Ok(false);
            };
            let total = req.num_computed() + len;
            if self.kv.reserve(&mut req.tables, total) {
                return Ok(true);
            }
            let Some(&victim) = self.running.iter().rev().find(|v| !scheduled.contains(v)) else {
                return Ok(false);
            };
            self.preempt(victim)?;
            preempted.push(victim);
            if victim == id {
                return Ok(false);
            }
        }
    }

    /// Frees a running request's blocks and puts it at the front of the waiting queue.
    fn preempt(&mut self, id: RequestId) -> Result<(), EngineError> {
        self.running.retain(|&r| r != id);
        if let Some(req) = self.requests.get_mut(&id) {
            req.status = RequestStatus::Waiting;
            req.num_preemptions += 1;
            self.kv.free(&mut req.tables)?;
            self.waiting.push_front(id);
            self.stats.preemptions += 1;
        }
        Ok(())
    }

    /// Admits waiting requests in order while budget, rows and blocks allow.
    fn admit_waiting(
        &mut self,
        budget: &mut usize,
        rows: &mut Vec<Row>,
    ) -> Result<(), EngineError> {
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(req) = self.requests.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            // Never the last known token: the step must compute it to sample after it; none
            // for a request that skips the cache.
            let end = if req.skip_prefix_cache {
                0
            } else {
                req.tokens.len() - 1
            };
            let lookup = &req.tokens[..end];
            req.tables = self.kv.lookup_prefix(lookup)?;
            let cached = req.num_computed();
            let len = req.num_remaining().min(*budget);
            if !self.kv.reserve(&mut req.tables, cached + len) {
                self.kv.free(&mut req.tables)?;
                break;
            }
            req.status = RequestStatus::Running;
            self.waiting.pop_front();
            self.running.push(id);
            rows.push(Row { id, len, cached });
            *budget -= len;
        }
        Ok(())
    }

    fn build_plan(
        &mut self,
        rows: Vec<Row>,
        preempted: Vec<RequestId>,
    ) -> Result<SchedulerOutput, EngineError> {
        let mut plan = SchedulerOutput {
            preempted,
            ..SchedulerOutput::default()
        };
        let mut in_flight = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(req) = self.requests.get(&row.id) else {
                continue;
            };
            let (start, end) = (req.num_computed(), req.num_computed() + row.len);
            let slots = |t: &poot_kv::BlockTable| {
                (start..end)
                    .map(|p| t.slot(p).map(|s| s as i32))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(EngineError::Internal(
                        "a scheduled position has no reserved slot",
                    ))
            };
            let blocks = |t: &poot_kv::BlockTable| -> Vec<i32> {
                t.blocks().iter().map(|b| b.0 as i32).collect()
            };
            let (head, window) = (&req.tables[0], req.tables.get(1));
            let sample = end == req.tokens.len();
            plan.seqs.push(ScheduledSeq {
                request_id: row.id,
                token_ids: req.tokens[start..end].to_vec(),
                positions: (start..end).map(|p| p as i32).collect(),
                slot_mapping: slots(head)?,
                block_table: blocks(head),
                window_slot_mapping: window.map(slots).transpose()?.unwrap_or_default(),
                window_block_table: window.map(blocks).unwrap_or_default(),
                sample,
                num_cached_tokens: row.cached,
            });
            in_flight.push(InFlight {
                id: row.id,
                serial: req.serial,
                start,
                len: row.len,
                sample,
            });
            plan.num_tokens += row.len;
            plan.num_cached_tokens += row.cached;
        }
        if !plan.is_empty() {
            self.stats.steps += 1;
            self.stats.computed_tokens += plan.num_tokens as u64;
            self.stats.cached_tokens += plan.num_cached_tokens as u64;
            self.in_flight = Some(in_flight);
        }
        Ok(plan)
    }

    fn is_live(&self, row: &InFlight) -> bool {
        self.requests
            .get(&row.id)
            .is_some_and(|r| r.serial == row.serial)
    }

    /// Applies a step's output: commits the KV of every row (caching full blocks), appends each
    /// sampled token and finishes requests on an eos or stop id, `max_tokens` or
    /// `max_model_len`, freeing their blocks. Events come in plan row order.
    ///
    /// # Errors
    /// [`EngineError::NoStepInFlight`]; [`EngineError::OutputMismatch`] when a sampled row is
    /// missing, a token is given for a row that does not sample or is not in the step, or a
    /// row is given twice; nothing changes then. [`EngineError::Kv`] on a bookkeeping failure.
    pub fn update(&mut self, output: StepOutput) -> Result<Vec<RequestEvent>, EngineError> {
        let rows = self.in_flight.as_ref().ok_or(EngineError::NoStepInFlight)?;
        let by_id: HashMap<RequestId, &InFlight> = rows.iter().map(|r| (r.id, r)).collect();
        let mut sampled: HashMap<RequestId, TokenId> = HashMap::new();
        for &(id, token) in &output.sampled {
            let mismatch = |why| EngineError::OutputMismatch { id, why };
            let row = by_id.get(&id).ok_or(mismatch("not in the step"))?;
            if !row.sample {
                return Err(mismatch("its row does not sample"));
            }
            if sampled.insert(id, token).is_some() {
                return Err(mismatch("sampled twice"));
            }
        }
        if let Some(r) = rows
            .iter()
            .find(|r| r.sample && self.is_live(r) && !sampled.contains_key(&r.id))
        {
            return Err(EngineError::OutputMismatch {
                id: r.id,
                why: "its sampled token is missing",
            });
        }
        let rows = self.in_flight.take().unwrap_or_default();
        let mut events = Vec::with_capacity(sampled.len());
        for row in rows {
            if !self.is_live(&row) {
                continue;
            }
            let Some(req) = self.requests.get_mut(&row.id) else {
                continue;
            };
            let Request { tables, tokens, .. } = req;
            self.kv
                .commit(tables, &tokens[row.start..row.start + row.len])?;
            let Some(&token) = sampled.get(&row.id) else {
                continue;
            };
            req.tokens.push(token);
            let finish = req.finish_reason(token, self.config.max_model_len);
            events.push(RequestEvent {
                request_id: row.id,
                token,
                finish,
            });
            if finish.is_some() {
                self.finish(row.id)?;
            }
        }
        Ok(events)
    }

    fn finish(&mut self, id: RequestId) -> Result<(), EngineError> {
        self.running.retain(|&r| r != id);
        if let Some(mut req) = self.requests.remove(&id) {
            self.stats.finished += 1;
            self.kv.free(&mut req.tables)?;
        }
        Ok(())
    }

    /// The settings.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The KV block pool of group 0 (every layer, or the global layers with a window group).
    pub fn pool(&self) -> &BlockPool {
        self.kv.pool(0).expect("group 0 always exists")
    }

    /// The windowed group's pool (`window_group`), if any.
    pub fn window_pool(&self) -> Option<&BlockPool> {
        self.kv.pool(1)
    }

    /// Counters over the scheduler's life.
    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// Waiting requests, front first.
    pub fn waiting(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.waiting.iter().copied()
    }

    /// Running requests, in the order they started.
    pub fn running(&self) -> &[RequestId] {
        &self.running
    }

    /// Whether any request is live (waiting or running).
    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Whether a planned step awaits its `update`.
    pub fn step_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// KV blocks of group 0 held by running requests.
    pub fn num_used_blocks(&self) -> usize {
        self.pool().num_used_blocks()
    }

    /// KV blocks of the windowed group held by running requests (0 without one).
    pub fn num_used_window_blocks(&self) -> usize {
        self.window_pool().map_or(0, BlockPool::num_used_blocks)
    }

    /// A live request's state, or None once it finished or was aborted.
    pub fn request(&self, id: RequestId) -> Option<RequestState<'_>> {
        self.requests.get(&id).map(|r| RequestState {
            status: r.status,
            num_prompt_tokens: r.num_prompt_tokens,
            num_computed_tokens: r.num_computed(),
            output_ids: r.output(),
            num_preemptions: r.num_preemptions,
        })
    }

    /// Checks the invariants in the module docs and the pool's own. O(requests + blocks).
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.running.len() > self.config.max_num_seqs {
            return Err(format!("{} running > max_num_seqs", self.running.len()));
        }
        for (id, r) in &self.requests {
            let listed = match r.status {
                RequestStatus::Waiting => self.waiting.contains(id),
                RequestStatus::Running => self.running.contains(id),
            };
            if !listed {
                return Err(format!(
                    "request {id} is {:?} but not queued as such",
                    r.status
                ));
            }
            if r.tables.len() != self.kv.len() {
                return Err(format!("request {id}: {} tables", r.tables.len()));
            }
            if r.status == RequestStatus::Waiting && r.tables.iter().any(|t| !t.blocks().is_empty())
            {
                return Err(format!("waiting request {id} holds blocks"));
            }
            let head = &r.tables[0];
            if head.capacity() < r.num_computed() || r.num_remaining() == 0 {
                return Err(format!("request {id}: table or token count out of step"));
            }
            if r.tables.iter().any(|t| {
                t.num_tokens() != head.num_tokens() || t.blocks().len() != head.blocks().len()
            }) {
                return Err(format!("request {id}: its groups' tables disagree"));
            }
        }
        if self.waiting.len() + self.running.len() != self.requests.len() {
            return Err("a queue lists a request that is not live".into());
        }
        // Every block in use is held by tables only, once per table.
        self.kv
            .check_holders(self.requests.values().map(|r| r.tables.as_slice()))
    }
}
