//! The sampling step's tracer ops: logit adjustments, the token mask, top-k ids, logprobs
//! and the draw. Every per-row operand must have the logits' row count `S`.

use poot_core::DType;

use super::{shape_err, Tracer};
use crate::error::TraceError;
use crate::ir::{AdjustInputs, Op, SampleInputs, ValueId, ValueInfo};

/// Most alternatives a `top_k` node may return (an output buffer per row, not a cut).
pub const MAX_TOP_K_IDS: usize = 64;

impl Tracer {
    /// Checks that each `(what, value, dtype, width)` is [S] (width None) or [S, width].
    fn rows(
        &self,
        op: &'static str,
        s: usize,
        operands: &[(&str, ValueId, DType, Option<usize>)],
    ) -> Result<(), TraceError> {
        for &(what, id, dtype, width) in operands {
            let rank = if width.is_some() { 2 } else { 1 };
            let info = self.expect(op, id, what, |d| d == dtype, Some(rank))?;
            if info.shape[0] != s {
                return Err(shape_err(
                    op,
                    format!("{what} has {} rows for {s}", info.shape[0]),
                ));
            }
            if let Some(w) = width {
                if info.shape[1] != w {
                    return Err(shape_err(
                        op,
                        format!("{what} has width {} for {w}", info.shape[1]),
                    ));
                }
            }
        }
        Ok(())
    }

    /// One token id per row of `logits` [S, V] -> [S] i32 (-1: no token; see `Op::Sample`).
    pub fn sample(&mut self, logits: ValueId, params: SampleInputs) -> Result<ValueId, TraceError> {
        let li = self.act("sample", logits, "logits", Some(2))?;
        let s = li.shape[0];
        self.rows(
            "sample",
            s,
            &[
                ("temperature", params.temperature, DType::F32, None),
                ("top_k", params.top_k, DType::I32, None),
                ("top_p", params.top_p, DType::F32, None),
                ("min_p", params.min_p, DType::F32, None),
                ("uniform", params.uniform, DType::F32, None),
            ],
        )?;
        self.push(
            Op::Sample { logits, params },
            ValueInfo::new(DType::I32, vec![s]),
            0,
            0,
        )
    }

    /// Penalties and logit bias on `logits` [S, V] -> [S, V] (see `AdjustInputs`).
    pub fn adjust_logits(
        &mut self,
        logits: ValueId,
        adjust: AdjustInputs,
    ) -> Result<ValueId, TraceError> {
        let li = self.act("adjust_logits", logits, "logits", Some(2))?;
        let s = li.shape[0];
        let w = self.info(adjust.ids)?.shape.get(1).copied().unwrap_or(0);
        self.rows(
            "adjust_logits",
            s,
            &[
                ("ids", adjust.ids, DType::I32, Some(w)),
                ("counts", adjust.counts, DType::I32, Some(w)),
                ("bias", adjust.bias, DType::F32, Some(w)),
                ("repetition", adjust.repetition, DType::F32, None),
                ("presence", adjust.presence, DType::F32, None),
                ("frequency", adjust.frequency, DType::F32, None),
            ],
        )?;
        self.push(Op::AdjustLogits { logits, adjust }, li, 0, 0)
    }

    /// Disallowed tokens to -inf by a bitmask `mask` [S, ceil(V/32)] (i32).
    pub fn mask_logits(&mut self, logits: ValueId, mask: ValueId) -> Result<ValueId, TraceError> {
        let li = self.act("mask_logits", logits, "logits", Some(2))?;
        let words = li.shape[1].div_ceil(32);
        self.rows(
            "mask_logits",
            li.shape[0],
            &[("mask", mask, DType::I32, Some(words))],
        )?;
        self.push(Op::MaskLogits { logits, mask }, li, 0, 0)
    }

    /// The ids of each row's `k` largest values of `x` [S, V] -> [S, k] (i32).
    pub fn top_k_ids(&mut self, x: ValueId, k: usize) -> Result<ValueId, TraceError> {
        let xi = self.act("top_k", x, "x", Some(2))?;
        if k == 0 || k > MAX_TOP_K_IDS || k > xi.shape[1] {
            return Err(shape_err(
                "top_k",
                format!(
                    "k={k} must be in 1..={} and at most the row width {}",
                    MAX_TOP_K_IDS, xi.shape[1]
                ),
            ));
        }
        let out = ValueInfo::new(DType::I32, vec![xi.shape[0], k]);
        self.push(Op::TopK { x, k }, out, 0, 0)
    }

    /// `log_softmax(logits)` at `ids` [S, K] -> [S, K] f32.
    pub fn logprobs(&mut self, logits: ValueId, ids: ValueId) -> Result<ValueId, TraceError> {
        let li = self.act("logprobs", logits, "logits", Some(2))?;
        let ii = self.ids("logprobs", ids, "ids", 2)?;
        if ii.shape[0] != li.shape[0] {
            return Err(shape_err(
                "logprobs",
                format!("ids has {} rows for {}", ii.shape[0], li.shape[0]),
            ));
        }
        let out = ValueInfo::new(DType::F32, ii.shape.clone());
        self.push(Op::Logprobs { logits, ids }, out, 0, 0)
    }
}
