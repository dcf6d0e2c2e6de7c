//! Recording the sampling step's device kernels (adapters with f64; see `crate::sample`).
//!
//! Invariants: every setting the CPU's row functions refuse is refused here, on the host,
//! before anything is submitted (so a bad request never reaches the device); the host only
//! prepares per-row words the CPU computes the same way (1/temperature in f64, each
//! penalty entry's `presence + frequency * count` in f32), and the device does the rest.
//! One difference in what is refused: the CPU checks a row's adjust entries only when the
//! row's logits are finite (a broken row is poisoned first), while here every row's entries
//! are checked before the logits exist, so a bad entry on a broken row is an error here.

use std::sync::Arc;

use poot_core::DType;
use poot_graph::{AdjustInputs, SampleInputs, ValueId};
use poot_runtime::RuntimeError;

use super::{kernel_err, Exec};
use crate::gpu::Buffer;
use crate::kernels::Kernel;
use crate::sample::{check, id_digits, SampleParams, MAX_VOCAB};

fn bytes<T: Copy, const N: usize>(items: impl Iterator<Item = T>, f: fn(T) -> [u8; N]) -> Vec<u8> {
    items.flat_map(f).collect()
}

impl Exec<'_> {
    fn rows_of(&self, logits: ValueId) -> (usize, usize) {
        let s = self.shape(logits);
        (s[0], s[1])
    }

    /// `Sample` on the device: one id per row (`sample.wgsl`).
    pub(super) fn sample_device(
        &mut self,
        logits: ValueId,
        params: &SampleInputs,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let (s, vocab) = self.rows_of(logits);
        if vocab == 0 || vocab > MAX_VOCAB {
            return Err(kernel_err(
                "sample",
                format!("a logits row of {vocab} values"),
            ));
        }
        let missing = || kernel_err("sample", "sampling parameters are not host inputs".into());
        let temp = self.host_f32(params.temperature).ok_or_else(missing)?;
        let top_k = self.host_i32(params.top_k).ok_or_else(missing)?;
        let top_p = self.host_f32(params.top_p).ok_or_else(missing)?;
        let min_p = self.host_f32(params.min_p).ok_or_else(missing)?;
        let uniform = self.host_f32(params.uniform).ok_or_else(missing)?;
        let mut rp = Vec::with_capacity(s * 5);
        for r in 0..s {
            let p = SampleParams {
                temperature: temp[r],
                top_k: top_k[r],
                top_p: top_p[r],
                min_p: min_p[r],
                uniform: uniform[r],
            };
            check(&p)?;
            // The CPU's inv_t; 0 marks a greedy row.
            let inv_t = if p.temperature == 0.0 {
                0.0
            } else {
                1.0 / f64::from(p.temperature)
            };
            rp.extend([
                inv_t,
                f64::from(p.top_k),
                f64::from(p.top_p),
                f64::from(p.min_p),
                f64::from(p.uniform),
            ]);
        }
        let rpb = self.upload(&bytes(rp.into_iter(), f64::to_le_bytes))?;
        let lb = self.buf(logits, "sample")?;
        let out = self.alloc(s as u64 * 4)?;
        let words = [vocab as u32, s as u32, id_digits(vocab), 0];
        let bufs = vec![lb, rpb, out.clone()];
        self.dispatch(Kernel::Sample, DType::F32, bufs, &words, [s as u32, 1, 1])?;
        Ok(out)
    }

    /// `AdjustLogits`: the CPU's checks, then each entry folded to (id, flags, pen, bias).
    pub(super) fn adjust(
        &mut self,
        logits: ValueId,
        a: &AdjustInputs,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let (s, v) = self.rows_of(logits);
        let w = self.shape(a.ids)[1];
        let err = |d: String| kernel_err("adjust_logits", d);
        let missing = || err("the adjust lists are not host inputs".into());
        let ids = self.host_i32(a.ids).ok_or_else(missing)?;
        let counts = self.host_i32(a.counts).ok_or_else(missing)?;
        let bias = self.host_f32(a.bias).ok_or_else(missing)?;
        let rep = self.host_f32(a.repetition).ok_or_else(missing)?;
        let presence = self.host_f32(a.presence).ok_or_else(missing)?;
        let frequency = self.host_f32(a.frequency).ok_or_else(missing)?;
        let mut entries = Vec::with_capacity((s * w).max(1) * 16);
        for r in 0..s {
            let (rp, pr, fr) = (rep[r], presence[r], frequency[r]);
            if !(rp.is_finite() && rp > 0.0 && pr.is_finite() && fr.is_finite()) {
                return Err(err(format!(
                    "repetition {rp} (> 0), presence {pr}, frequency {fr} must be finite"
                )));
            }
            for j in r * w..(r + 1) * w {
                let (id, count, b) = (ids[j], counts[j], bias[j]);
                if id >= v as i32 {
                    return Err(err(format!(
                        "token id {id} is outside the vocabulary of {v}"
                    )));
                }
                if id >= 0 && !b.is_finite() && b != f32::NEG_INFINITY {
                    return Err(err(format!("bias {b} for id {id}")));
                }
                let flags = u32::from(count >= 0 && rp != 1.0) | (u32::from(count > 0) << 1);
                let pen = pr + fr * count as f32;
                entries.extend(id.to_le_bytes());
                entries.extend(flags.to_le_bytes());
                entries.extend(pen.to_le_bytes());
                entries.extend(b.to_le_bytes());
            }
        }
        entries.resize(entries.len().max(16), 0);
        let eb = self.upload(&entries)?;
        let rb = self.upload(&bytes(rep.iter().copied(), f32::to_le_bytes))?;
        let lb = self.buf(logits, "adjust_logits")?;
        let out = self.alloc((s * v) as u64 * 4)?;
        let words = [v as u32, s as u32, w as u32, 0];
        let bufs = vec![lb, eb, rb, out.clone()];
        self.dispatch(
            Kernel::AdjustLogits,
            DType::F32,
            bufs,
            &words,
            [s as u32, 1, 1],
        )?;
        Ok(out)
    }

    /// `MaskLogits` (`mask_logits.wgsl`).
    pub(super) fn mask(
        &mut self,
        logits: ValueId,
        mask: ValueId,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let (s, v) = self.rows_of(logits);
        let bufs = vec![
            self.buf(logits, "mask_logits")?,
            self.buf(mask, "mask_logits")?,
        ];
        let out = self.alloc((s * v) as u64 * 4)?;
        let words = [v as u32, s as u32, v.div_ceil(32) as u32, 0];
        let bufs = [bufs, vec![out.clone()]].concat();
        self.dispatch(
            Kernel::MaskLogits,
            DType::F32,
            bufs,
            &words,
            [s as u32, 1, 1],
        )?;
        Ok(out)
    }

    /// `TopK` ids (`top_k.wgsl`), every TopK: a vocabulary row's top-20 and a router's experts;
    /// a workgroup per row, over a 2-D grid when the rows pass a grid row's 65535 workgroups.
    pub(super) fn top_k(&mut self, x: ValueId, k: usize) -> Result<Arc<Buffer>, RuntimeError> {
        let (s, v) = self.rows_of(x);
        let out = self.alloc((s * k) as u64 * 4)?;
        let bufs = vec![self.buf(x, "top_k")?, out.clone()];
        let gx = s.clamp(1, 65535);
        let words = [v as u32, s as u32, k as u32, gx as u32];
        let grid = [gx as u32, s.div_ceil(gx).max(1) as u32, 1];
        self.dispatch(Kernel::TopK, DType::F32, bufs, &words, grid)?;
        Ok(out)
    }

    /// `Logprobs` (`logprobs.wgsl`); host ids are checked as the CPU checks them.
    pub(super) fn logprobs(
        &mut self,
        logits: ValueId,
        ids: ValueId,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let (s, v) = self.rows_of(logits);
        let k = self.shape(ids)[1];
        if let Some(h) = self.host_i32(ids) {
            if let Some(&bad) = h.iter().find(|&&i| i < -1 || i >= v as i32) {
                return Err(kernel_err(
                    "logprobs",
                    format!("token id {bad} is outside the vocabulary of {v}"),
                ));
            }
        }
        let out = self.alloc((s * k) as u64 * 4)?;
        let bufs = vec![
            self.buf(logits, "logprobs")?,
            self.buf(ids, "logprobs")?,
            out.clone(),
        ];
        let words = [v as u32, s as u32, k as u32, 0];
        self.dispatch(Kernel::Logprobs, DType::F32, bufs, &words, [s as u32, 1, 1])?;
        Ok(out)
    }
}
