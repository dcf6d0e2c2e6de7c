//! The one error enum of poot-engine.

use crate::RequestId;

/// Everything the scheduler refuses. Running out of KV blocks is not an error: the scheduler
/// preempts, and a request that could never fit the pool is refused when it is added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A scheduler setting is out of range.
    #[error("invalid scheduler config: {what} = {value} ({why})")]
    InvalidConfig {
        what: &'static str,
        value: usize,
        why: &'static str,
    },
    /// A request id already in the scheduler.
    #[error("request {0} is already in the scheduler")]
    DuplicateRequest(RequestId),
    /// A request with nothing to prefill.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(RequestId),
    /// A request asking for no tokens.
    #[error("request {0} asks for max_tokens = 0")]
    ZeroMaxTokens(RequestId),
    /// A prompt that leaves no room to generate within `max_model_len`.
    #[error("request {id}: a prompt of {prompt} tokens needs {} with one to generate; max_model_len = {max_model_len}", prompt + 1)]
    PromptTooLong {
        id: RequestId,
        prompt: usize,
        max_model_len: usize,
    },
    /// A request whose KV could never fit the pool, even alone.
    #[error("request {id} needs up to {needed} KV blocks; the pool has {usable}")]
    TooLargeForPool {
        id: RequestId,
        needed: usize,
        usable: usize,
    },
    /// `schedule` was called before the previous step's `update`.
    #[error("a step is in flight; call update with its output first")]
    StepInFlight,
    /// `update` was called with no step in flight.
    #[error("no step is in flight; call schedule first")]
    NoStepInFlight,
    /// A step output that does not match the step's plan.
    #[error("step output does not match the plan: request {id}: {why}")]
    OutputMismatch { id: RequestId, why: &'static str },
    /// Padded step dimensions smaller than the plan.
    #[error("step dims too small: {what} needs {needed}, got {got}")]
    DimsTooSmall {
        what: &'static str,
        needed: usize,
        got: usize,
    },
    /// A broken scheduler invariant (a bug, never a user error).
    #[error("scheduler invariant broken: {0}")]
    Internal(&'static str),
    /// A KV bookkeeping failure (a scheduler bug, never a user error).
    #[error(transparent)]
    Kv(#[from] poot_kv::KvError),
}
