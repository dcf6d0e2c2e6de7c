//! poot-engine: the driver's scheduler, a pure state machine.
//!
//! [`Scheduler::schedule`] returns a [`SchedulerOutput`] (rows, their token ids, positions, KV slots,
//! block tables and which rows sample) with every block it needs already reserved;
//! [`Scheduler::update`] takes the step's [`StepOutput`] (sampled token ids) and returns one
//! [`RequestEvent`] per accepted token. No device handle lives here, so the whole policy —
//! FCFS under a per-step token budget, decode rows before prefill chunks, chunked prefill as
//! the only prefill path, prefix-cache reuse, preemption by recompute — is tested with fake
//! outputs on any machine.
//!
//! Guarantees: no step holds more than `min(max_batched_tokens, max_step_tokens)` tokens or
//! `max_num_seqs` rows; a request preempted and resumed produces the same tokens it would have
//! unpreempted (it recomputes prompt + generated tokens); every block returns to the pool when
//! a request ends, however it ends (finish, abort before, during or after a step).
//!
//! Modules: `config` (settings), `groups` (KV groups: one pool and one table per request for
//! each group of layers that read the same positions), `request` (request specs and states), `plan` (step plans,
//! outputs, events and the runner's flat input layout), `sampling` (each request's sampling
//! state between steps, numpy's seeded stream continued, and a step's sampling inputs),
//! `scheduler` (the policy).

mod config;
mod error;
mod groups;
mod plan;
mod request;
mod sampling;
mod scheduler;

pub use config::SchedulerConfig;
pub use error::EngineError;
pub use plan::{FlatStep, RequestEvent, ScheduledSeq, SchedulerOutput, StepDims, StepOutput};
pub use poot_kv::{BlockId, TokenId};
pub use request::{FinishReason, RequestId, RequestSpec, RequestState, RequestStatus};
pub use sampling::{step_sampling, Pcg64, RequestSampling, SamplingSpec, StepSampling};
pub use scheduler::{Scheduler, SchedulerStats};
