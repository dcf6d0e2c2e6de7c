//! The two ops with state or host work: paged attention (the KV write, then attention over the
//! layer's pool) and the `Sample` node (a device argmax for every row; rows with a temperature
//! are also queued for the host sampler over their read-back logits; see `crate::sample`).

use std::sync::Arc;

use poot_core::DType;
use poot_graph::ValueId;
use poot_runtime::RuntimeError;

use super::{kernel_err, lane_grid, Exec, HostRow};
use crate::gpu::Buffer;
use crate::kernels::Kernel;
use crate::sample::{check, SampleParams};

impl Exec<'_> {
    pub(super) fn attention(
        &mut self,
        numel: usize,
        q: ValueId,
        k: ValueId,
        v: ValueId,
        meta: &poot_graph::AttentionMeta,
        cfg: &poot_graph::AttentionConfig,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let kv = self.kv.ok_or(RuntimeError::KvNotConfigured)?;
        let layer = cfg.layer as usize;
        if layer >= kv.k.len() {
            return Err(kernel_err(
                "paged_attention",
                format!("layer {layer} but the KV pool has {} layers", kv.k.len()),
            ));
        }
        if cfg.n_kv_heads != kv.cfg.n_kv_heads || cfg.head_dim != kv.cfg.head_dim {
            return Err(kernel_err(
                "paged_attention",
                format!(
                    "graph has {}x{} kv heads, the pool {}x{}",
                    cfg.n_kv_heads, cfg.head_dim, kv.cfg.n_kv_heads, kv.cfg.head_dim
                ),
            ));
        }
        let t = self.shape(q)[0];
        let row = (cfg.n_kv_heads * cfg.head_dim) as usize;
        let blocks = kv.cfg.layer_blocks(layer);
        let slots = blocks as usize * kv.cfg.block_size as usize;
        let tables = self.shape(meta.block_tables);
        let (kc, vc) = (kv.k[layer].clone(), kv.v[layer].clone());
        let (grid, lanes_x) = lane_grid(t * row);
        let bufs = vec![
            self.buf(k, "paged_attention")?,
            self.buf(v, "paged_attention")?,
            self.buf(meta.slot_mapping, "paged_attention")?,
            kc.clone(),
            vc.clone(),
        ];
        let ggml = self.rt.ggml();
        let words = [t as u32, row as u32, slots as u32, lanes_x, u32::from(ggml)];
        self.dispatch(Kernel::KvWrite, DType::F32, bufs, &words, grid)?;
        let out = self.alloc(numel as u64 * 4)?;
        let bufs = vec![
            self.buf(q, "paged_attention")?,
            kc,
            vc,
            self.buf(meta.token_seq, "paged_attention")?,
            self.buf(meta.positions, "paged_attention")?,
            self.buf(meta.block_tables, "paged_attention")?,
            out.clone(),
        ];
        let words = [
            t as u32,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            kv.cfg.block_size,
            tables[1] as u32,
            blocks,
            cfg.scale.to_bits(),
            tables[0] as u32,
            cfg.window,
            cfg.softcap.to_bits(),
        ];
        let kernel = if ggml {
            Kernel::AttentionGgml
        } else {
            Kernel::Attention
        };
        self.dispatch(kernel, DType::F32, bufs, &words, [t as u32, cfg.n_heads, 1])?;
        Ok(out)
    }

    pub(super) fn sample(
        &mut self,
        i: usize,
        logits: ValueId,
        params: &poot_graph::SampleInputs,
    ) -> Result<Arc<Buffer>, RuntimeError> {
        let (s, vocab) = (self.shape(logits)[0], self.shape(logits)[1]);
        let missing = || kernel_err("sample", "sampling parameters are not host inputs".into());
        let temp = self.host_f32(params.temperature).ok_or_else(missing)?;
        let top_k = self.host_i32(params.top_k).ok_or_else(missing)?;
        let top_p = self.host_f32(params.top_p).ok_or_else(missing)?;
        let min_p = self.host_f32(params.min_p).ok_or_else(missing)?;
        let uniform = self.host_f32(params.uniform).ok_or_else(missing)?;
        let lb = self.buf(logits, "sample")?;
        let mut read_logits = false;
        for r in 0..s {
            let p = SampleParams {
                temperature: temp[r],
                top_k: top_k[r],
                top_p: top_p[r],
                min_p: min_p[r],
                uniform: uniform[r],
            };
            check(&p)?;
            if p.temperature > 0.0 {
                read_logits = true;
                for (name, v) in &self.plan.graph.outputs {
                    if v.index() == i {
                        self.host_rows.push(HostRow {
                            output: name.clone(),
                            row: r,
                            logits_at: self.extra_reads.len() as u64,
                            vocab,
                            params: p,
                        });
                    }
                }
            }
        }
        if read_logits {
            self.extra_reads.push((lb.clone(), (s * vocab) as u64 * 4));
        }
        let out = self.alloc(s as u64 * 4)?;
        let words = [vocab as u32, s as u32];
        self.dispatch(
            Kernel::Argmax,
            DType::F32,
            vec![lb, out.clone()],
            &words,
            [s as u32, 1, 1],
        )?;
        Ok(out)
    }
}
