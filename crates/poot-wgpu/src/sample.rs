//! The sampling step on wgpu.
//!
//! Where the adapter offers `shader-f64` (lavapipe, NVIDIA, AMD) the whole step runs on the
//! device, as the CPU runtime runs it (`poot_runtime::sample`): `adjust_logits.wgsl`,
//! `mask_logits.wgsl` (the mask may be a late input: see `submit`), `sample.wgsl`
//! (temperature, top-k, top-p, min-p and the row's seeded uniform draw), `top_k.wgsl` and
//! `logprobs.wgsl`; the host reads back only token ids (a -1 marks a row with non-finite
//! logits) and the logprobs a row asked for. The uniform draw is the host's (the request's
//! seeded stream in poot/request.py), so a seed gives the same draws on both runtimes.
//!
//! What is exact and what is bounded: the mask, top-k ids, greedy rows and every cut by count
//! are integer work over the CPU's rank order (descending value, ties by lower id) and equal
//! the CPU's bit for bit. The penalties follow the CPU's f32 steps (the division in f64,
//! rounded once). Weights are f64 as on the CPU, but summed in a fixed tree rather than in
//! rank order and exponentiated by `exp64` (a few ulp from glibc's), so a draw or a top-p cut
//! can differ only when u * mass falls between the CPU's and the device's value of a running
//! mass: at most V^2 * 2^-52 per draw (5e-7 at V = 49152) in the worst case, near 1e-9 in the
//! typical one (see `sample.wgsl`). Logprobs are the CPU's f32 or one ulp from it.
//!
//! Without `shader-f64` the logit ops are unsupported (`supports` says so and the engine
//! samples such steps on a host CPU runtime), greedy rows are a device argmax
//! (`argmax.wgsl`) and rows with a temperature are sampled on the host over their read-back
//! logits row by the CPU's own row function.

pub(crate) use poot_runtime::sample::{sample_row, SampleSettings as SampleParams};

/// Refuses settings the CPU sampler refuses, for every row (greedy rows too).
pub(crate) fn check(p: &SampleParams) -> Result<(), poot_runtime::RuntimeError> {
    p.check()
}

/// Hex digits of a token id in a vocabulary of `vocab` (the sampler's id passes).
pub(crate) fn id_digits(vocab: usize) -> u32 {
    let bits = usize::BITS - vocab.saturating_sub(1).leading_zeros();
    bits.div_ceil(4).max(1)
}

/// The largest vocabulary the device sampler takes (its id digits must fit 28 bits).
pub(crate) const MAX_VOCAB: usize = 1 << 28;

#[cfg(test)]
mod tests {
    #[test]
    fn id_digits_cover_every_id() {
        for (v, d) in [(1, 1), (16, 1), (17, 2), (256, 2), (49152, 4), (151936, 5)] {
            assert_eq!(super::id_digits(v), d, "{v}");
        }
    }
}
