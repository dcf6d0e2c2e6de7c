//! Quantized activations kept between the matmuls of one step that read the same input, at the
//! bottom of the kernel tree (the quantized matmul families take it; the executor owns it).
//!
//! Invariant: a cached quantization is reused only for the same key (and for Q8, the same
//! `with_sum`); any other key requantizes, so a stale entry is never read. Cost: the quantized
//! copy of one input (34 or 36 bytes per 32 values, 292 per 256 for Q8_K).

use crate::kernels::qact::{quantize_row_q8k, quantize_rows_q8, BlockQ8, BlockQ8K, QK8, QK_K};
use crate::pool::ThreadPool;

/// Quantized activations kept between matmuls that read the same input (a layer's q/k/v, or
/// gate/up), so each input is quantized once. `key` names the input uniquely for the cache's
/// owner (the executor: run and value); a different key requantizes.
#[derive(Debug, Default)]
pub(crate) struct ActCache {
    q8_key: Option<(u64, bool)>,
    pub(crate) q8: Vec<BlockQ8>,
    q8k_key: Option<u64>,
    pub(crate) q8k: Vec<BlockQ8K>,
}

impl ActCache {
    /// `x` as Q8_0/Q8_1 blocks (`with_sum`), quantized unless `key` was quantized last.
    pub(crate) fn q8(
        &mut self,
        key: u64,
        x: &[f32],
        with_sum: bool,
        pool: &ThreadPool,
    ) -> &[BlockQ8] {
        if self.q8_key != Some((key, with_sum)) {
            self.q8.clear();
            self.q8.resize(x.len() / QK8, Default::default());
            quantize_rows_q8(x, &mut self.q8, with_sum, pool);
            self.q8_key = Some((key, with_sum));
        }
        &self.q8
    }

    /// `x` as Q8_K blocks, quantized unless `key` was quantized last.
    pub(crate) fn q8k(&mut self, key: u64, x: &[f32]) -> &[BlockQ8K] {
        if self.q8k_key != Some(key) {
            self.q8k.clear();
            self.q8k.resize(x.len() / QK_K, Default::default());
            quantize_row_q8k(x, &mut self.q8k);
            self.q8k_key = Some(key);
        }
        &self.q8k
    }
}
