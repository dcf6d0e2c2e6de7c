//! The settings an equation carries besides its operands (rope, attention, the sampling
//! step's inputs), re-exported by `ir`. Plain data: `Copy`, so `Op` stays cheap to clone.

use crate::ir::ValueId;

/// Rotary embedding pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-J / ggml "normal": rotates pairs (2i, 2i+1). GGUF llama files store q/k for this.
    Interleaved,
    /// GPT-NeoX / HF rotate_half: rotates pairs (i, i + rot_dim/2).
    NeoX,
}

/// Rotary frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "Factors keeps its table inline so RopeConfig (and Op) stay Copy-able and \
              self-contained; the cost is about 260 bytes per op, counted in artifact_bytes"
)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1 frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: u32,
    },
    /// Per-pair frequency divisors (Phi-3 LongRoPE's short or long factors, GGUF
    /// `rope_factors_*` / `rope_freqs`): pair `i`'s inverse frequency is divided by
    /// `factors[i]` for `i < rot_dim / 2` (at most [`MAX_ROPE_FACTORS`] pairs; the rest of the
    /// array is unused), and every cos and sin is multiplied by `attn_factor` (LongRoPE's
    /// attention scaling; 1 for none). A fixed array keeps the op `Copy`.
    Factors {
        factors: [f32; MAX_ROPE_FACTORS],
        attn_factor: f32,
    },
}

/// Most rotation pairs [`RopeScaling::Factors`] holds (`rot_dim` up to 128).
pub const MAX_ROPE_FACTORS: usize = 64;

/// Static parameters of a rope op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub n_heads: u32,
    pub head_dim: u32,
    /// Leading dims of each head that rotate (partial rotary when < head_dim).
    pub rot_dim: u32,
    pub theta: f32,
    pub style: RopeStyle,
    pub scaling: RopeScaling,
}

/// Static parameters of paged attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionConfig {
    /// Which layer's KV blocks this op reads and writes.
    pub layer: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub scale: f32,
    /// Sliding window: `0` attends to every position `0..=pos`; `w > 0` only to
    /// `pos + 1 - w ..= pos` (Mistral, Gemma's local layers). Positions outside it are never
    /// read; the paged pool keeps their blocks (see `docs/families.md`).
    pub window: u32,
    /// Attention logit soft-cap: `0` none; `c > 0` turns each score `s` into
    /// `c * tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: f32,
}

/// Per-step attention metadata, all runtime inputs (i32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionMeta {
    /// [T]: flat KV slot (block * block_size + offset) where token t's k/v are written; -1 skips.
    pub slot_mapping: ValueId,
    /// [T]: the sequence row (into `block_tables`) token t belongs to.
    pub token_seq: ValueId,
    /// [T]: token t's position in its sequence; it attends to positions 0..=pos.
    pub positions: ValueId,
    /// [S, max_blocks]: each sequence's KV block ids in order.
    pub block_tables: ValueId,
}

/// Per-row sampling inputs of a `Sample` node (each [S]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleInputs {
    /// f32; 0 means greedy.
    pub temperature: ValueId,
    /// i32; 0 means no top-k cut.
    pub top_k: ValueId,
    /// f32 in (0, 1]; 1 means no nucleus cut.
    pub top_p: ValueId,
    /// f32 in [0, 1): keep tokens whose probability is at least min_p times the top one's.
    pub min_p: ValueId,
    /// f32 in [0, 1): the host's seeded uniform draw for this row, so runs are reproducible.
    pub uniform: ValueId,
}

/// Per-row inputs of an `AdjustLogits` node: a sparse list of `W` token ids per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdjustInputs {
    /// i32 [S, W]: the token ids the row adjusts; -1 pads (and is skipped).
    pub ids: ValueId,
    /// i32 [S, W]: times each id was generated so far; 0 = seen only in the prompt;
    /// -1 = not seen (the entry carries only a bias).
    pub counts: ValueId,
    /// f32 [S, W]: the additive logit bias of each id.
    pub bias: ValueId,
    /// f32 [S]: repetition penalty over seen ids (1 = none): positive logits are divided by
    /// it, negative ones multiplied.
    pub repetition: ValueId,
    /// f32 [S]: subtracted once from each generated id's logit.
    pub presence: ValueId,
    /// f32 [S]: subtracted per occurrence from each generated id's logit.
    pub frequency: ValueId,
}
