//! The `Sample` node on wgpu: greedy rows are an argmax on the device (`argmax.wgsl`, -1 for a
//! row with a NaN or +inf, or with every logit -inf, as on the CPU); rows with a temperature are
//! sampled on the host over their read-back logits row, by the row function every runtime
//! shares (`poot_runtime::sample`), so the semantics are the CPU's exactly.
//!
//! The other sampling-step ops (`adjust_logits`, `mask_logits`, `top_k`, `logprobs`) have no
//! kernel here: `supports` is false for them, and the engine runs those steps' sampling on the
//! host (see python/poot/runner.py). A device top-k/top-p needs a sort or radix select per row.

pub(crate) use poot_runtime::sample::{sample_row, SampleSettings as SampleParams};

/// Refuses settings the CPU sampler refuses, for every row (greedy rows too).
pub(crate) fn check(p: &SampleParams) -> Result<(), poot_runtime::RuntimeError> {
    p.check()
}
