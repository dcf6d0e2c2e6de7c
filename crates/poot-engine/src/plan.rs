//! What one step runs ([`SchedulerOutput`]), what it produced ([`StepOutput`]) and what that meant
//! for each request ([`RequestEvent`]).
//!
//! A plan carries exactly the step inputs of `poot.models.step` before padding: per scheduled
//! sequence its token ids, their positions, the flat KV slot of each
//! (`block * block_size + offset`), its block table and whether the row's last token is sampled
//! (only when the chunk reaches the end of the sequence's known tokens). [`SchedulerOutput::flatten`]
//! lays it out as the runner's arrays (`ids`, `positions`, `slot_mapping`, `token_seq`,
//! `block_tables`, `last_rows`), padded to a step shape: padding tokens get slot -1 (no KV
//! write) and padding table entries point at the null block 0.
//!
//! With a windowed KV group (`SchedulerConfig::window_group`) each row also carries that
//! group's slots and block table (`window_slot_mapping`, `window_block_tables`, padded the
//! same way). Its table is as long as the first group's (released blocks are the null
//! block), so one `max_blocks` serves both; without the group both are empty.

use poot_kv::TokenId;

use crate::{EngineError, FinishReason, RequestId};

/// One sequence's part of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The request.
    pub request_id: RequestId,
    /// The tokens this step computes for it (one for a decode row, a chunk for a prefill).
    pub token_ids: Vec<TokenId>,
    /// The position of each token in its sequence (consecutive).
    pub positions: Vec<i32>,
    /// The flat KV slot each token's K and V are written to.
    pub slot_mapping: Vec<i32>,
    /// The sequence's KV blocks in order (covering at least every position above).
    pub block_table: Vec<i32>,
    /// The windowed group's slot of each token (empty without a windowed group).
    pub window_slot_mapping: Vec<i32>,
    /// The windowed group's blocks, as long as `block_table` (null below the window; empty
    /// without a windowed group).
    pub window_block_table: Vec<i32>,
    /// Whether the row's last token is sampled: the chunk reaches the end of the known tokens.
    pub sample: bool,
    /// Leading tokens whose KV came from the prefix cache instead of being computed (the
    /// positions before `positions[0]`); nonzero only on the first chunk after the request was
    /// admitted, or readmitted after preemption.
    pub num_cached_tokens: usize,
}

impl ScheduledSeq {
    /// Tokens this row computes.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The position of this row's first token.
    pub fn start(&self) -> usize {
        self.positions.first().map_or(0, |&p| p as usize)
    }
}

/// What one step runs; decode rows come first, then prefill chunks, in FCFS order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// The scheduled sequences, one row each.
    pub seqs: Vec<ScheduledSeq>,
    /// Tokens across all rows (at most the step token budget).
    pub num_tokens: usize,
    /// Requests preempted while planning this step (their KV freed; they will recompute).
    pub preempted: Vec<RequestId>,
    /// Tokens skipped thanks to the prefix cache, across all rows.
    pub num_cached_tokens: usize,
}

/// The padded dimensions of a step graph (`poot.models.step.StepShape` without its kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDims {
    /// Token rows.
    pub tokens: usize,
    /// Sequences (rows of `block_tables`).
    pub seqs: usize,
    /// Columns of `block_tables`.
    pub max_blocks: usize,
}

/// A plan laid out as the step graph's i32 inputs (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatStep {
    /// The dims the arrays are padded to.
    pub dims: StepDims,
    /// `[tokens]` token ids.
    pub ids: Vec<i32>,
    /// `[tokens]` positions.
    pub positions: Vec<i32>,
    /// `[tokens]` KV slots; -1 for padding.
    pub slot_mapping: Vec<i32>,
    /// `[tokens]` the row of `block_tables` each token belongs to.
    pub token_seq: Vec<i32>,
    /// `[seqs * max_blocks]` row-major block tables; 0 (the null block) pads.
    pub block_tables: Vec<i32>,
    /// `[seqs]` the token row whose logits each sequence samples.
    pub last_rows: Vec<i32>,
    /// `[tokens]` the windowed group's KV slots; -1 for padding. Empty without the group.
    pub window_slot_mapping: Vec<i32>,
    /// `[seqs * max_blocks]` the windowed group's tables; 0 pads. Empty without the group.
    pub window_block_tables: Vec<i32>,
}

impl StepDims {
    /// The dims a step graph is compiled for when a step needs `need`: tokens, sequences and
    /// block-table width rounded up to powers of two (so a long generation compiles a handful of
    /// graphs, not one per length), tokens capped at `max_step_tokens` (the prefill chunk size)
    /// unless the step itself is longer. The engine's one padding policy.
    pub fn padded(need: StepDims, max_step_tokens: usize) -> StepDims {
        StepDims {
            tokens: need
                .tokens
                .next_power_of_two()
                .min(max_step_tokens.max(need.tokens)),
            seqs: need.seqs.next_power_of_two(),
            max_blocks: need.max_blocks.next_power_of_two(),
        }
    }
}

impl SchedulerOutput {
    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The smallest dims that hold this plan unpadded.
    pub fn dims(&self) -> StepDims {
        StepDims {
            tokens: self.num_tokens,
            seqs: self.seqs.len(),
            max_blocks: self
                .seqs
                .iter()
                .map(|s| s.block_table.len().max(s.window_block_table.len()))
                .max()
                .unwrap_or(0),
        }
    }

    /// The plan as step inputs padded to `dims`.
    ///
    /// # Errors
    /// [`EngineError::DimsTooSmall`] when `dims` is smaller than [`SchedulerOutput::dims`].
    pub fn flatten(&self, dims: StepDims) -> Result<FlatStep, EngineError> {
        let need = self.dims();
        for (what, needed, got) in [
            ("tokens", need.tokens, dims.tokens),
            ("seqs", need.seqs, dims.seqs),
            ("max_blocks", need.max_blocks, dims.max_blocks),
        ] {
            if got < needed {
                return Err(EngineError::DimsTooSmall { what, needed, got });
            }
        }
        let mut f = FlatStep {
            dims,
            ids: Vec::with_capacity(dims.tokens),
            positions: Vec::with_capacity(dims.tokens),
            slot_mapping: Vec::with_capacity(dims.tokens),
            token_seq: Vec::with_capacity(dims.tokens),
            block_tables: vec![0; dims.seqs * dims.max_blocks],
            last_rows: vec![0; dims.seqs],
            window_slot_mapping: Vec::new(),
            window_block_tables: Vec::new(),
        };
        let windowed = self.seqs.iter().any(|s| !s.window_block_table.is_empty());
        if windowed {
            f.window_slot_mapping.reserve(dims.tokens);
            f.window_block_tables = vec![0; dims.seqs * dims.max_blocks];
        }
        for (row, s) in self.seqs.iter().enumerate() {
            f.ids.extend(s.token_ids.iter().map(|&t| t as i32));
            f.positions.extend(&s.positions);
            f.slot_mapping.extend(&s.slot_mapping);
            f.token_seq
                .extend(std::iter::repeat_n(row as i32, s.num_tokens()));
            f.last_rows[row] = f.ids.len() as i32 - 1;
            let start = row * dims.max_blocks;
            f.block_tables[start..start + s.block_table.len()].copy_from_slice(&s.block_table);
            if windowed {
                if s.window_slot_mapping.len() != s.num_tokens() {
                    return Err(EngineError::Internal(
                        "a row lacks the windowed group's slots",
                    ));
                }
                f.window_slot_mapping.extend(&s.window_slot_mapping);
                let w = &s.window_block_table;
                f.window_block_tables[start..start + w.len()].copy_from_slice(w);
            }
        }
        let pad = dims.tokens - f.ids.len();
        f.ids.extend(std::iter::repeat_n(0, pad));
        f.positions.extend(std::iter::repeat_n(0, pad));
        f.slot_mapping.extend(std::iter::repeat_n(-1, pad));
        f.token_seq.extend(std::iter::repeat_n(0, pad));
        if windowed {
            f.window_slot_mapping.extend(std::iter::repeat_n(-1, pad));
        }
        Ok(f)
    }
}

/// What a step produced: the sampled token of every row whose `sample` was set (rows of
/// requests aborted since the plan may be left out or are ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// `(request, token)` per sampled row.
    pub sampled: Vec<(RequestId, TokenId)>,
}

/// One accepted token, and whether it finished its request (whose blocks are then freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestEvent {
    /// The request.
    pub request_id: RequestId,
    /// The token appended to its output.
    pub token: TokenId,
    /// Set when this token finished the request.
    pub finish: Option<FinishReason>,
}

#[cfg(test)]
mod tests {
    use super::StepDims;

    fn dims(tokens: usize, seqs: usize, max_blocks: usize) -> StepDims {
        StepDims {
            tokens,
            seqs,
            max_blocks,
        }
    }

    #[test]
    fn padding_rounds_to_powers_of_two_under_the_chunk_size() {
        assert_eq!(StepDims::padded(dims(1, 1, 1), 256), dims(1, 1, 1));
        assert_eq!(StepDims::padded(dims(3, 3, 5), 256), dims(4, 4, 8));
        // A 200-token chunk pads to the chunk size, not past it.
        assert_eq!(StepDims::padded(dims(200, 1, 13), 200), dims(200, 1, 16));
        assert_eq!(StepDims::padded(dims(130, 2, 9), 160), dims(160, 2, 16));
        // A step longer than the chunk size (a caller's own) is never cut.
        assert_eq!(StepDims::padded(dims(300, 1, 1), 256), dims(300, 1, 1));
        assert_eq!(StepDims::padded(dims(0, 0, 0), 8), dims(1, 1, 1));
    }
}
