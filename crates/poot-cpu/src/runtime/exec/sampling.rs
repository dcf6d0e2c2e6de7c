//! The sampling step's ops (`sample`, `adjust_logits`, `mask_logits`, `top_k`, `logprobs`):
//! each row through the row functions every runtime shares (`poot_runtime::sample`).

use poot_graph::Op;
use poot_runtime::sample::{
    adjust_row, logprobs_row, mask_row, sample_row, top_k_row, Adjust, SampleSettings,
};
use poot_runtime::RuntimeError;

use super::{Buf, Exec};

impl Exec<'_> {
    /// Runs one sampling-step op; `numel` is its output's element count.
    pub(super) fn sampling_op(&self, op: &Op, numel: usize) -> Result<Buf, RuntimeError> {
        Ok(match op {
            Op::Sample { logits, params } => {
                let v = self.shape(*logits)[1];
                let l = self.f32(*logits, "sample")?;
                let temp = self.f32(params.temperature, "sample")?;
                let top_k = self.i32(params.top_k, "sample")?;
                let top_p = self.f32(params.top_p, "sample")?;
                let min_p = self.f32(params.min_p, "sample")?;
                let uniform = self.f32(params.uniform, "sample")?;
                let mut out = Vec::with_capacity(numel);
                for r in 0..numel {
                    let s = SampleSettings {
                        temperature: temp[r],
                        top_k: top_k[r],
                        top_p: top_p[r],
                        min_p: min_p[r],
                        uniform: uniform[r],
                    };
                    out.push(sample_row(&l[r * v..(r + 1) * v], s)?);
                }
                Buf::I32(out)
            }
            Op::AdjustLogits { logits, adjust } => {
                let v = self.shape(*logits)[1];
                let w = self.shape(adjust.ids)[1];
                let mut out = self.f32(*logits, "adjust_logits")?.to_vec();
                let ids = self.i32(adjust.ids, "adjust_logits")?;
                let counts = self.i32(adjust.counts, "adjust_logits")?;
                let bias = self.f32(adjust.bias, "adjust_logits")?;
                let rep = self.f32(adjust.repetition, "adjust_logits")?;
                let pres = self.f32(adjust.presence, "adjust_logits")?;
                let freq = self.f32(adjust.frequency, "adjust_logits")?;
                for (r, row) in out.chunks_mut(v).enumerate() {
                    let a = Adjust {
                        ids: &ids[r * w..(r + 1) * w],
                        counts: &counts[r * w..(r + 1) * w],
                        bias: &bias[r * w..(r + 1) * w],
                        repetition: rep[r],
                        presence: pres[r],
                        frequency: freq[r],
                    };
                    adjust_row(row, &a)?;
                }
                Buf::F32(out)
            }
            Op::MaskLogits { logits, mask } => {
                let v = self.shape(*logits)[1];
                let words = self.shape(*mask)[1];
                let mut out = self.f32(*logits, "mask_logits")?.to_vec();
                let m = self.i32(*mask, "mask_logits")?;
                for (r, row) in out.chunks_mut(v).enumerate() {
                    mask_row(row, &m[r * words..(r + 1) * words]);
                }
                Buf::F32(out)
            }
            Op::TopK { x, k } => {
                let v = self.shape(*x)[1];
                let xv = self.f32(*x, "top_k")?;
                let mut out = vec![0i32; numel];
                for (row, o) in xv.chunks(v).zip(out.chunks_mut(*k)) {
                    top_k_row(row, o);
                }
                Buf::I32(out)
            }
            Op::Logprobs { logits, ids } => {
                let v = self.shape(*logits)[1];
                let k = self.shape(*ids)[1];
                let l = self.f32(*logits, "logprobs")?;
                let idv = self.i32(*ids, "logprobs")?;
                let mut out = vec![0f32; numel];
                for ((row, i), o) in l.chunks(v).zip(idv.chunks(k)).zip(out.chunks_mut(k)) {
                    logprobs_row(row, i, o)?;
                }
                Buf::F32(out)
            }
            _ => unreachable!("sampling_op is only called for the sampling step's ops"),
        })
    }
}
