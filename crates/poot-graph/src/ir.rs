//! The graph IR: SSA values and the equations that define them.
//!
//! Invariants: a `Graph` is in definition order (every equation's operands are defined by an
//! earlier equation), so the equation list is already a valid schedule; value `i` is defined by
//! equation `i`. Shapes are static per traced step (a step shape is one graph). Weights are
//! values too, but only as handles (`Op::Weight`, the stored dtype and shape): no weight data
//! ever lives in a graph.

use poot_core::DType;

pub use crate::kinds::{broadcast_shape, BinaryKind, ReduceKind, UnaryKind};
pub use crate::op_settings::{
    AdjustInputs, AttentionConfig, AttentionMeta, RopeConfig, RopeScaling, RopeStyle, SampleInputs,
    MAX_ROPE_FACTORS,
};

/// An SSA value: the index of the equation that defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index into `Graph::values` and `Graph::equations`.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// A value's static type: element dtype and row-major shape (outermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl ValueInfo {
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        Self { dtype, shape }
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// A stored matmul weight's `(N, K)`: `[N, K]`, or `(1, K)` for a 1-D `[K]` (one row, as
    /// GGUF stores a projection to one output: Qwen2-MoE's shared-expert gate). `(0, 0)` for
    /// any other rank (the tracer never lets one reach a matmul).
    pub fn matrix(&self) -> (usize, usize) {
        match self.shape[..] {
            [k] => (1, k),
            [n, k] => (n, k),
            _ => (0, 0),
        }
    }
}

/// The coarse ops. Operand shapes are checked by the tracer; see `Tracer` for each rule.
#[derive(Clone, Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "Rope's inline factor table (see RopeScaling); a graph holds one Op per equation"
)]
pub enum Op {
    /// A runtime input, fed by name at every run.
    Input {
        name: String,
    },
    /// A handle to a stored (possibly packed) tensor of the checkpoint.
    Weight {
        name: String,
    },
    /// A small f32 constant (counted against `TraceLimits::max_literal_bytes`).
    Literal {
        data: Vec<f32>,
    },
    /// The stored float weight `x` (F16, BF16 or F32 words) read as `to` (F32, the one
    /// activation float type), exactly: every f16 and bf16 is an f32. The tracer puts one at
    /// each read of a half-precision weight, so the graph says where stored words become
    /// activation floats; a backend fuses it into the reading kernel (`FuseWeightCasts`: the
    /// kernel decodes the stored words, no f32 copy of the weight exists) or runs it as its
    /// own kernel where the reader takes only f32.
    Cast {
        x: ValueId,
        to: DType,
    },
    /// Rows of `table` [V, D] picked by `ids` [T] -> [T, D].
    Embedding {
        table: ValueId,
        ids: ValueId,
    },
    /// RMS norm over the last dim of `x` [T, D], times `weight` [D].
    RmsNorm {
        x: ValueId,
        weight: ValueId,
        eps: f32,
    },
    /// `x` [T, K] times a weight stored [N, K] -> [T, N]; a weight stored 1-D [K] is one row
    /// (N = 1, see `ValueInfo::matrix`).
    MatMul {
        x: ValueId,
        w: ValueId,
    },
    /// Elementwise; `b` is the same shape as `a` or one row broadcast over `a`'s rows.
    Add {
        a: ValueId,
        b: ValueId,
    },
    /// Elementwise, broadcasting like `Add`.
    Mul {
        a: ValueId,
        b: ValueId,
    },
    Silu {
        x: ValueId,
    },
    /// tanh approximation (ggml's and HF's "gelu_pytorch_tanh").
    Gelu {
        x: ValueId,
    },
    /// Over the last dim.
    Softmax {
        x: ValueId,
    },
    /// Each row's values at its ids: `x` [T, E] f32, `ids` [T, k] i32 -> [T, k] (a router's
    /// probabilities of its selected experts), or `ids` [1, k] (an activation or a stored I32
    /// weight: an act-order layer's `input_perm`) for every row.
    GatherCols {
        x: ValueId,
        ids: ValueId,
    },
    /// Mixture-of-experts matmul: `w` is a stored [E, N, K] (experts packed in place), `ids`
    /// [T, k] i32 each token's experts; `x` is [T, K] (every slot of token `t` reads row `t`)
    /// or [T * k, K] (slot `j` of token `t` reads row `t * k + j`) -> [T * k, N], row
    /// `t * k + j` = `x` row times expert `ids[t, j]`. Only the selected experts' rows are read.
    MoeMatMul {
        x: ValueId,
        w: ValueId,
        ids: ValueId,
    },
    /// `y` [T * k, D] combined by `weights` [T, k] -> [T, D]: row `t` = sum over `j` (in order)
    /// of `weights[t, j] * y[t * k + j]`.
    MoeCombine {
        y: ValueId,
        weights: ValueId,
    },
    /// Elementwise `cap * tanh(x / cap)` (Gemma 2's final logit soft-capping).
    Softcap {
        x: ValueId,
        cap: f32,
    },
    /// `x` [T, n_heads * head_dim] rotated by `positions` [T].
    Rope {
        x: ValueId,
        positions: ValueId,
        cfg: RopeConfig,
    },
    /// q [T, H*Dh], k and v [T, Hkv*Dh] -> [T, H*Dh]; writes k/v into the layer's KV blocks.
    PagedAttention {
        q: ValueId,
        k: ValueId,
        v: ValueId,
        meta: AttentionMeta,
        cfg: AttentionConfig,
    },
    /// Elementwise `kind(x)` over an f32 activation (see `UnaryKind`).
    Unary {
        x: ValueId,
        kind: UnaryKind,
    },
    /// `a kind b` with numpy broadcasting (`broadcast_shape`); either operand may be a stored
    /// float weight or an f32 activation.
    Binary {
        a: ValueId,
        b: ValueId,
        kind: BinaryKind,
    },
    /// `x kind value` elementwise (`reverse`: `value kind x`).
    Scalar {
        x: ValueId,
        kind: BinaryKind,
        value: f32,
        reverse: bool,
    },
    /// Layer norm over the last dim: `(x - mean) / sqrt(var + eps)` (biased variance), times
    /// `weight` [D] and plus `bias` [D] where given.
    LayerNorm {
        x: ValueId,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
        eps: f32,
    },
    /// `kind` over the last dim of `x` [.., D] -> [.., 1] (the dim kept, as `keepdim=True`).
    Reduce {
        x: ValueId,
        kind: ReduceKind,
    },
    /// Axes of `x` reordered: output axis `i` is input axis `perm[i]` (a copy).
    Permute {
        x: ValueId,
        perm: Vec<usize>,
    },
    /// `a` [.., M, K] times `b` [.., K, N] -> [.., M, N]; both f32 (activations or stored
    /// f32 weights), batch dims broadcast like `Binary`.
    BatchMatMul {
        a: ValueId,
        b: ValueId,
    },
    /// Over the last two dims [M, N]: element (i, j) becomes -inf where `j > i + N - M` (a
    /// causal attention mask, the last query row seeing every key).
    CausalMask {
        x: ValueId,
    },
    Reshape {
        x: ValueId,
        shape: Vec<usize>,
    },
    /// `x[.., start..end, ..]` along `axis`.
    Slice {
        x: ValueId,
        axis: usize,
        start: usize,
        end: usize,
    },
    Concat {
        xs: Vec<ValueId>,
        axis: usize,
    },
    /// Rows of `x` [T, D] picked by `rows` [R] (i32) -> [R, D] (e.g. each sequence's last token).
    GatherRows {
        x: ValueId,
        rows: ValueId,
    },
    /// The adjoint of `GatherRows`: `src` [T, D] (f32) added into `rows` zero rows by `ids`
    /// [T] (i32) -> [rows, D], row `r` the sum of the `src` rows whose id is `r`, added in
    /// order of `t` (so every runtime rounds alike); an embedding table's gradient.
    ScatterAddRows {
        src: ValueId,
        ids: ValueId,
        rows: usize,
    },
    /// Draws one token id per row of `logits` [S, V] -> [S] (i32); -1 where the row holds a
    /// NaN or +inf, or no token is allowed (every logit -inf).
    Sample {
        logits: ValueId,
        params: SampleInputs,
    },
    /// Penalties and logit bias (see `AdjustInputs`) on `logits` [S, V] -> [S, V]. A row with
    /// any non-finite logit comes out all NaN, so `Sample` reports it.
    AdjustLogits {
        logits: ValueId,
        adjust: AdjustInputs,
    },
    /// Sets disallowed tokens to -inf: bit `j` of `mask[s, w]` (i32 [S, ceil(V/32)]) allows
    /// token `32 w + j`. A row with any non-finite logit comes out all NaN.
    MaskLogits {
        logits: ValueId,
        mask: ValueId,
    },
    /// The ids of each row's `k` largest values of `x` [S, V] -> [S, k] (i32), largest first,
    /// ties by lower id; NaN never ranks.
    TopK {
        x: ValueId,
        k: usize,
    },
    /// `log_softmax(logits[s])[ids[s, j]]` for `logits` [S, V], `ids` [S, K] (i32) -> [S, K];
    /// NaN for an id of -1 or a row with a non-finite logit.
    Logprobs {
        logits: ValueId,
        ids: ValueId,
    },
}

impl Op {
    /// A short name for errors and tables.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Weight { .. } => "weight",
            Op::Literal { .. } => "literal",
            Op::Cast { .. } => "cast",
            Op::Embedding { .. } => "embedding",
            Op::RmsNorm { .. } => "rms_norm",
            Op::MatMul { .. } => "matmul",
            Op::Add { .. } => "add",
            Op::Mul { .. } => "mul",
            Op::Silu { .. } => "silu",
            Op::Gelu { .. } => "gelu",
            Op::Softmax { .. } => "softmax",
            Op::Softcap { .. } => "softcap",
            Op::GatherCols { .. } => "gather_cols",
            Op::MoeMatMul { .. } => "moe_matmul",
            Op::MoeCombine { .. } => "moe_combine",
            Op::Rope { .. } => "rope",
            Op::PagedAttention { .. } => "paged_attention",
            Op::Reshape { .. } => "reshape",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::GatherRows { .. } => "gather_rows",
            Op::ScatterAddRows { .. } => "scatter_add_rows",
            Op::Sample { .. } => "sample",
            Op::AdjustLogits { .. } => "adjust_logits",
            Op::MaskLogits { .. } => "mask_logits",
            Op::TopK { .. } => "top_k",
            Op::Logprobs { .. } => "logprobs",
            Op::Unary { kind, .. } => kind.name(),
            Op::Binary { kind, .. } => kind.binary_name(),
            Op::Scalar { kind, .. } => kind.scalar_name(),
            Op::LayerNorm { .. } => "layer_norm",
            Op::Permute { .. } => "permute",
            Op::Reduce { kind, .. } => kind.name(),
            Op::BatchMatMul { .. } => "batch_matmul",
            Op::CausalMask { .. } => "causal_mask",
        }
    }

    /// The values this op reads, in a fixed order.
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Op::Input { .. } | Op::Weight { .. } | Op::Literal { .. } => vec![],
            Op::Embedding { table, ids } => vec![*table, *ids],
            Op::RmsNorm { x, weight, .. } => vec![*x, *weight],
            Op::MatMul { x, w } => vec![*x, *w],
            Op::Add { a, b } | Op::Mul { a, b } => vec![*a, *b],
            Op::Silu { x } | Op::Gelu { x } | Op::Softmax { x } | Op::Softcap { x, .. } => {
                vec![*x]
            }
            Op::Rope { x, positions, .. } => vec![*x, *positions],
            Op::PagedAttention { q, k, v, meta, .. } => vec![
                *q,
                *k,
                *v,
                meta.slot_mapping,
                meta.token_seq,
                meta.positions,
                meta.block_tables,
            ],
            Op::Reshape { x, .. } | Op::Slice { x, .. } | Op::Cast { x, .. } => vec![*x],
            Op::Concat { xs, .. } => xs.clone(),
            Op::GatherRows { x, rows } => vec![*x, *rows],
            Op::ScatterAddRows { src, ids, .. } => vec![*src, *ids],
            Op::GatherCols { x, ids } => vec![*x, *ids],
            Op::MoeMatMul { x, w, ids } => vec![*x, *w, *ids],
            Op::MoeCombine { y, weights } => vec![*y, *weights],
            Op::Sample { logits, params } => vec![
                *logits,
                params.temperature,
                params.top_k,
                params.top_p,
                params.min_p,
                params.uniform,
            ],
            Op::AdjustLogits { logits, adjust } => vec![
                *logits,
                adjust.ids,
                adjust.counts,
                adjust.bias,
                adjust.repetition,
                adjust.presence,
                adjust.frequency,
            ],
            Op::MaskLogits { logits, mask } => vec![*logits, *mask],
            Op::TopK { x, .. } => vec![*x],
            Op::Logprobs { logits, ids } => vec![*logits, *ids],
            Op::Unary { x, .. }
            | Op::Scalar { x, .. }
            | Op::Permute { x, .. }
            | Op::Reduce { x, .. }
            | Op::CausalMask { x } => vec![*x],
            Op::Binary { a, b, .. } | Op::BatchMatMul { a, b } => vec![*a, *b],
            Op::LayerNorm {
                x, weight, bias, ..
            } => std::iter::once(*x).chain(*weight).chain(*bias).collect(),
        }
    }

    /// The same op with every operand passed through `f` (used by passes that renumber).
    pub fn map_operands(&self, f: &mut impl FnMut(ValueId) -> ValueId) -> Op {
        let mut op = self.clone();
        match &mut op {
            Op::Input { .. } | Op::Weight { .. } | Op::Literal { .. } => {}
            Op::Embedding { table, ids } => {
                *table = f(*table);
                *ids = f(*ids);
            }
            Op::RmsNorm { x, weight, .. } => {
                *x = f(*x);
                *weight = f(*weight);
            }
            Op::MatMul { x, w } => {
                *x = f(*x);
                *w = f(*w);
            }
            Op::Add { a, b } | Op::Mul { a, b } => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::Silu { x } | Op::Gelu { x } | Op::Softmax { x } | Op::Softcap { x, .. } => {
                *x = f(*x)
            }
            Op::Rope { x, positions, .. } => {
                *x = f(*x);
                *positions = f(*positions);
            }
            Op::PagedAttention { q, k, v, meta, .. } => {
                *q = f(*q);
                *k = f(*k);
                *v = f(*v);
                meta.slot_mapping = f(meta.slot_mapping);
                meta.token_seq = f(meta.token_seq);
                meta.positions = f(meta.positions);
                meta.block_tables = f(meta.block_tables);
            }
            Op::Reshape { x, .. } | Op::Slice { x, .. } | Op::Cast { x, .. } => *x = f(*x),
            Op::Concat { xs, .. } => xs.iter_mut().for_each(|x| *x = f(*x)),
            Op::GatherRows { x, rows } => {
                *x = f(*x);
                *rows = f(*rows);
            }
            Op::ScatterAddRows { src, ids, .. } => {
                *src = f(*src);
                *ids = f(*ids);
            }
            Op::GatherCols { x, ids } => {
                *x = f(*x);
                *ids = f(*ids);
            }
            Op::MoeMatMul { x, w, ids } => {
                *x = f(*x);
                *w = f(*w);
                *ids = f(*ids);
            }
            Op::MoeCombine { y, weights } => {
                *y = f(*y);
                *weights = f(*weights);
            }
            Op::Sample { logits, params } => {
                *logits = f(*logits);
                params.temperature = f(params.temperature);
                params.top_k = f(params.top_k);
                params.top_p = f(params.top_p);
                params.min_p = f(params.min_p);
                params.uniform = f(params.uniform);
            }
            Op::AdjustLogits { logits, adjust } => {
                *logits = f(*logits);
                adjust.ids = f(adjust.ids);
                adjust.counts = f(adjust.counts);
                adjust.bias = f(adjust.bias);
                adjust.repetition = f(adjust.repetition);
                adjust.presence = f(adjust.presence);
                adjust.frequency = f(adjust.frequency);
            }
            Op::MaskLogits { logits, mask } => {
                *logits = f(*logits);
                *mask = f(*mask);
            }
            Op::TopK { x, .. } => *x = f(*x),
            Op::Logprobs { logits, ids } => {
                *logits = f(*logits);
                *ids = f(*ids);
            }
            Op::Unary { x, .. }
            | Op::Scalar { x, .. }
            | Op::Permute { x, .. }
            | Op::Reduce { x, .. }
            | Op::CausalMask { x } => *x = f(*x),
            Op::Binary { a, b, .. } | Op::BatchMatMul { a, b } => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::LayerNorm {
                x, weight, bias, ..
            } => {
                *x = f(*x);
                if let Some(w) = weight {
                    *w = f(*w);
                }
                if let Some(b) = bias {
                    *b = f(*b);
                }
            }
        }
        op
    }
}

/// A traced step: equations in definition order, their value types, and named outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// Equation `i` defines value `i`.
    pub equations: Vec<Op>,
    pub values: Vec<ValueInfo>,
    pub outputs: Vec<(String, ValueId)>,
    /// Tokens in the step this graph was traced for.
    pub step_tokens: usize,
}

impl Graph {
    pub fn info(&self, v: ValueId) -> &ValueInfo {
        &self.values[v.index()]
    }

    pub fn op(&self, v: ValueId) -> &Op {
        &self.equations[v.index()]
    }

    /// Names and types of the runtime inputs, in definition order.
    pub fn inputs(&self) -> impl Iterator<Item = (&str, ValueId, &ValueInfo)> {
        self.equations
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                Op::Input { name } => Some((name.as_str(), ValueId(i as u32), &self.values[i])),
                _ => None,
            })
    }

    /// Peak bytes of live buffers when equations run in order and each value's buffer is
    /// freed after `last_use[v]` (the index of its last reader; outputs carry a value past
    /// the end). `bytes(i)` is what value `i` holds (0 for values with no buffer of their own).
    pub fn peak_live_bytes(&self, last_use: &[usize], bytes: impl Fn(usize) -> u64) -> u64 {
        let mut frees: Vec<Vec<usize>> = vec![Vec::new(); self.equations.len()];
        for (v, &last) in last_use.iter().enumerate() {
            if last < frees.len() {
                frees[last].push(v);
            }
        }
        let (mut live, mut peak) = (0u64, 0u64);
        for (i, freed) in frees.iter().enumerate() {
            live = live.saturating_add(bytes(i));
            peak = peak.max(live);
            for &v in freed {
                live = live.saturating_sub(bytes(v));
            }
        }
        peak
    }

    /// The stored weight `v` reads: `v` itself for an `Op::Weight`, its source for an
    /// `Op::Cast` of one; `None` for anything else.
    pub fn stored_source(&self, v: ValueId) -> Option<ValueId> {
        match self.op(v) {
            Op::Weight { .. } => Some(v),
            Op::Cast { x, .. } if matches!(self.op(*x), Op::Weight { .. }) => Some(*x),
            _ => None,
        }
    }

    /// Names of the stored tensors the graph reads, in definition order.
    pub fn weights(&self) -> impl Iterator<Item = (&str, ValueId, &ValueInfo)> {
        self.equations
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                Op::Weight { name } => Some((name.as_str(), ValueId(i as u32), &self.values[i])),
                _ => None,
            })
    }
}
