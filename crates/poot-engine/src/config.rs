//! The scheduler's settings, validated once at construction.

use crate::EngineError;

/// What one scheduler may do per step and how big its KV pool is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once (rows of a step).
    pub max_num_seqs: usize,
    /// Most tokens in one step across all rows (a throughput knob).
    pub max_batched_tokens: usize,
    /// Most tokens one step graph may hold (`TraceLimits.max_tokens`); a hard limit, so every
    /// prefill chunk and every whole step stays within it.
    pub max_step_tokens: usize,
    /// Most tokens (prompt + generated) in one sequence; reaching it finishes with `Length`.
    pub max_model_len: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV pool, the null block included.
    pub num_blocks: usize,
    /// Reuse cached full blocks of shared prompt prefixes.
    pub enable_prefix_caching: bool,
    /// Identifies the model (and anything else that changes KV) in block hashes.
    pub model_key: u64,
    /// `Some(W)` when every layer attends to a sliding window of at most `W` positions: a
    /// running request's blocks wholly before its last `W - 1` positions go back to the pool
    /// after each step (no later token reads them). None: every position is kept.
    pub kv_window: Option<usize>,
    /// `Some(W)` when some layers attend to a sliding window of at most `W` positions and
    /// the others to every position (Gemma 2 and 3): the windowed layers' KV is a second
    /// group with its own pool ([`SchedulerConfig::window_pool_blocks`] blocks) and block
    /// tables, released behind the window after each step, while the `num_blocks` pool keeps
    /// every position for the global layers. None: one group.
    pub window_group: Option<usize>,
}

impl SchedulerConfig {
    /// Tokens one step may schedule: `min(max_batched_tokens, max_step_tokens)`.
    pub fn token_budget(&self) -> usize {
        self.max_batched_tokens.min(self.max_step_tokens)
    }

    /// Blocks in the windowed group's pool (the null block included) when `window_group` is
    /// set: what `max_num_seqs` requests hold at most at once (the window behind a step, the
    /// step's tokens, a block of rounding at each end, per request), never more than
    /// `num_blocks`; 0 without a windowed group.
    pub fn window_pool_blocks(&self) -> usize {
        let Some(w) = self.window_group.filter(|&w| w > 0) else {
            return 0;
        };
        let per_seq =
            crate::groups::window_span_blocks(w, self.token_budget(), self.block_size.max(1));
        self.max_num_seqs
            .saturating_mul(per_seq)
            .saturating_add(1)
            .min(self.num_blocks)
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] for a zero limit, a budget too small to give every
    /// running sequence its decode token, or a `max_model_len` past `i32::MAX` (positions are
    /// i32 step inputs). Pool-size errors come from `poot_kv::BlockPool::new`.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |what, value, why| Err(EngineError::InvalidConfig { what, value, why });
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs", 0, "must be at least 1");
        }
        if self.max_batched_tokens == 0 {
            return bad("max_batched_tokens", 0, "must be at least 1");
        }
        if self.max_step_tokens == 0 {
            return bad("max_step_tokens", 0, "must be at least 1");
        }
        if self.max_num_seqs > self.token_budget() {
            return bad(
                "max_num_seqs",
                self.max_num_seqs,
                "exceeds min(max_batched_tokens, max_step_tokens): decode rows would not fit",
            );
        }
        if self.kv_window == Some(0) {
            return bad(
                "kv_window",
                0,
                "must be at least 1 (None keeps every position)",
            );
        }
        if self.window_group == Some(0) {
            return bad(
                "window_group",
                0,
                "must be at least 1 (None: one group keeps every position)",
            );
        }
        if self.window_group.is_some() && self.kv_window.is_some() {
            return bad(
                "window_group",
                self.window_group.unwrap_or(0),
                "needs kv_window None (with every layer windowed there is one group)",
            );
        }
        if self.max_model_len < 2 || self.max_model_len > i32::MAX as usize {
            return bad(
                "max_model_len",
                self.max_model_len,
                "must be in 2..=i32::MAX",
            );
        }
        Ok(())
    }
}
