//! The tracer's rope and paged attention: the ops that carry a position or a KV cache.

use super::{shape_err, Tracer};
use crate::error::TraceError;
use crate::ir::{AttentionConfig, AttentionMeta, Op, RopeConfig, ValueId};

impl Tracer {
    /// Rotates `x` [T, n_heads * head_dim] by `positions` [T].
    pub fn rope(
        &mut self,
        x: ValueId,
        positions: ValueId,
        cfg: RopeConfig,
    ) -> Result<ValueId, TraceError> {
        let xi = self.act("rope", x, "x", Some(2))?;
        let pi = self.ids("rope", positions, "positions", 1)?;
        let width = (cfg.n_heads as usize) * (cfg.head_dim as usize);
        if xi.shape[1] != width || pi.shape[0] != xi.shape[0] {
            return Err(shape_err(
                "rope",
                format!(
                    "x {:?}, positions {:?}, heads {}x{}",
                    xi.shape, pi.shape, cfg.n_heads, cfg.head_dim
                ),
            ));
        }
        if cfg.rot_dim == 0 || cfg.rot_dim > cfg.head_dim || !cfg.rot_dim.is_multiple_of(2) {
            return Err(shape_err(
                "rope",
                format!("rot_dim {} for head_dim {}", cfg.rot_dim, cfg.head_dim),
            ));
        }
        if !(cfg.theta.is_finite() && cfg.theta > 0.0) {
            return Err(shape_err(
                "rope",
                format!("theta must be positive, got {}", cfg.theta),
            ));
        }
        if let crate::ir::RopeScaling::Factors {
            factors,
            attn_factor,
        } = &cfg.scaling
        {
            let half = cfg.rot_dim as usize / 2;
            let ok = |f: f32| f.is_finite() && f > 0.0;
            if half > factors.len() || !factors[..half].iter().all(|&f| ok(f)) || !ok(*attn_factor)
            {
                return Err(shape_err(
                    "rope",
                    format!(
                        "frequency factors need rot_dim / 2 = {half} <= {} positive finite \
                         factors and a positive attn_factor (got {attn_factor})",
                        factors.len()
                    ),
                ));
            }
        }
        self.push(Op::Rope { x, positions, cfg }, xi, 0, 0)
    }

    /// Causal attention over the paged KV cache, writing this step's k/v first.
    pub fn paged_attention(
        &mut self,
        q: ValueId,
        k: ValueId,
        v: ValueId,
        meta: AttentionMeta,
        cfg: AttentionConfig,
    ) -> Result<ValueId, TraceError> {
        const OP: &str = "paged_attention";
        let qi = self.act(OP, q, "q", Some(2))?;
        let ki = self.act(OP, k, "k", Some(2))?;
        let vi = self.act(OP, v, "v", Some(2))?;
        let (h, hkv, dh) = (
            cfg.n_heads as usize,
            cfg.n_kv_heads as usize,
            cfg.head_dim as usize,
        );
        if h == 0 || hkv == 0 || dh == 0 || !h.is_multiple_of(hkv) {
            return Err(shape_err(
                OP,
                format!("{h} heads over {hkv} kv heads of dim {dh}"),
            ));
        }
        if !(cfg.softcap.is_finite() && cfg.softcap >= 0.0) {
            return Err(shape_err(
                OP,
                format!("softcap must be finite and >= 0, got {}", cfg.softcap),
            ));
        }
        let t = qi.shape[0];
        if qi.shape[1] != h * dh || ki.shape != [t, hkv * dh] || vi.shape != ki.shape {
            return Err(shape_err(
                OP,
                format!("q {:?}, k {:?}, v {:?}", qi.shape, ki.shape, vi.shape),
            ));
        }
        for (what, id) in [
            ("slot_mapping", meta.slot_mapping),
            ("token_seq", meta.token_seq),
            ("positions", meta.positions),
        ] {
            let info = self.ids(OP, id, what, 1)?;
            if info.shape[0] != t {
                return Err(shape_err(
                    OP,
                    format!("{what} has {} rows for {t} tokens", info.shape[0]),
                ));
            }
        }
        self.ids(OP, meta.block_tables, "block_tables", 2)?;
        self.push(Op::PagedAttention { q, k, v, meta, cfg }, qi, 0, 0)
    }
}
