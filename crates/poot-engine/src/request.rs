//! Requests as the scheduler sees them.
//!
//! Invariants of a [`Request`] inside the scheduler:
//! - `tokens` is the prompt followed by every accepted output token; preemption never drops
//!   any, so a resumed request prefills `tokens` and continues where it stopped;
//! - `table.num_tokens()` tokens of `tokens` have their KV computed (a prefix of `tokens`);
//!   at least the last token never has (its KV is computed by the step that samples after it);
//! - a waiting request holds no blocks; a running one holds blocks covering at least its
//!   computed tokens.

use poot_kv::{BlockTable, TokenId};

/// A request's id, chosen by the caller and unique among live requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What a caller asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// Unique among live requests.
    pub id: RequestId,
    /// The prompt's token ids (at least one).
    pub prompt_ids: Vec<TokenId>,
    /// Most tokens to generate (at least one).
    pub max_tokens: usize,
    /// End-of-sequence ids: sampling one finishes with `Stop` unless `ignore_eos`.
    pub eos_ids: Vec<TokenId>,
    /// Ids that finish with `Stop` even when `ignore_eos` is set.
    pub stop_ids: Vec<TokenId>,
    /// Keep going past end-of-sequence ids.
    pub ignore_eos: bool,
    /// Never start from the prefix cache: every token of the prompt is computed by the
    /// request's own steps (a request asking for every prompt position's logits: vLLM's
    /// rule). Its full blocks still join the cache for others.
    pub skip_prefix_cache: bool,
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or stop id was sampled (it is the last output token).
    Stop,
    /// `max_tokens` generated, or the sequence reached `max_model_len`.
    Length,
}

/// Where a live request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    /// Queued: holds no blocks (new, or preempted and waiting to recompute).
    Waiting,
    /// Holds blocks and is scheduled every step it fits (prefilling or decoding).
    Running,
}

/// A live request (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Distinguishes this request from an earlier one with the same id (after an abort).
    pub(crate) serial: u64,
    pub(crate) tokens: Vec<TokenId>,
    pub(crate) num_prompt_tokens: usize,
    pub(crate) max_tokens: usize,
    pub(crate) eos_ids: Vec<TokenId>,
    pub(crate) stop_ids: Vec<TokenId>,
    pub(crate) ignore_eos: bool,
    pub(crate) skip_prefix_cache: bool,
    pub(crate) status: RequestStatus,
    /// One block table per KV group (`groups`); group 0's counts the committed tokens.
    pub(crate) tables: Vec<BlockTable>,
    pub(crate) num_preemptions: u32,
}

impl Request {
    pub(crate) fn new(spec: RequestSpec, serial: u64, tables: Vec<BlockTable>) -> Self {
        Self {
            serial,
            num_prompt_tokens: spec.prompt_ids.len(),
            tokens: spec.prompt_ids,
            max_tokens: spec.max_tokens,
            eos_ids: spec.eos_ids,
            stop_ids: spec.stop_ids,
            ignore_eos: spec.ignore_eos,
            skip_prefix_cache: spec.skip_prefix_cache,
            status: RequestStatus::Waiting,
            tables,
            num_preemptions: 0,
        }
    }

    pub(crate) fn num_computed(&self) -> usize {
        self.tables.first().map_or(0, BlockTable::num_tokens)
    }

    pub(crate) fn num_remaining(&self) -> usize {
        self.tokens.len() - self.num_computed()
    }

    pub(crate) fn output(&self) -> &[TokenId] {
        &self.tokens[self.num_prompt_tokens..]
    }

    /// Why `token`, just appended, finishes the request, if it does.
    pub(crate) fn finish_reason(
        &self,
        token: TokenId,
        max_model_len: usize,
    ) -> Option<FinishReason> {
        if (!self.ignore_eos && self.eos_ids.contains(&token)) || self.stop_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.output().len() >= self.max_tokens || self.tokens.len() >= max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

/// A read-only view of a live request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestState<'a> {
    /// Waiting or running.
    pub status: RequestStatus,
    /// Prompt tokens.
    pub num_prompt_tokens: usize,
    /// Tokens whose KV is computed.
    pub num_computed_tokens: usize,
    /// Output tokens so far.
    pub output_ids: &'a [TokenId],
    /// Times it was preempted.
    pub num_preemptions: u32,
}
