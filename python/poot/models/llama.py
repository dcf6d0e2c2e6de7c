"""The Llama-family model definition: Llama 2 and 3, Mistral, SmolLM, Qwen2.

One definition covers them all: RMSNorm, grouped-query attention over the paged KV cache with
RoPE, a SwiGLU feed-forward, q/k/v biases when the checkpoint has them (Qwen2), and an output
head that is either its own tensor or tied to the token embedding. It calls only the tracer.

RoPE pairing depends on how the checkpoint stores q/k: llama.cpp's converter permutes Llama q/k
rows for the interleaved (GPT-J) pairing, so GGUF ``llama`` files use ``"interleaved"``; HF
checkpoints keep the rotate_half layout (``"neox"``), and so do GGUF ``qwen2`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Self

from poot.errors import CheckpointFormatError, UnsupportedArchitectureError
from poot.models.step import StepInputs, StepShape, declare_inputs, trace_head

if TYPE_CHECKING:
    from poot._native import Tracer, Value
    from poot.checkpoints import ModelFiles, ModelHParams

__all__ = ["GGUF_NAMES", "HF_NAMES", "LlamaModel", "WeightNames"]


@dataclass(frozen=True)
class WeightNames:
    """Tensor names of one checkpoint layout; per-layer names take ``{i}``."""

    embed: str
    attn_norm: str
    q: str
    k: str
    v: str
    o: str
    ffn_norm: str
    gate: str
    up: str
    down: str
    norm: str
    output: str
    q_bias: str
    k_bias: str
    v_bias: str
    q_norm: str = ""
    k_norm: str = ""
    post_attn_norm: str = ""
    post_ffn_norm: str = ""


GGUF_NAMES = WeightNames(
    embed="token_embd.weight",
    attn_norm="blk.{i}.attn_norm.weight",
    q="blk.{i}.attn_q.weight",
    k="blk.{i}.attn_k.weight",
    v="blk.{i}.attn_v.weight",
    o="blk.{i}.attn_output.weight",
    ffn_norm="blk.{i}.ffn_norm.weight",
    gate="blk.{i}.ffn_gate.weight",
    up="blk.{i}.ffn_up.weight",
    down="blk.{i}.ffn_down.weight",
    norm="output_norm.weight",
    output="output.weight",
    q_bias="blk.{i}.attn_q.bias",
    k_bias="blk.{i}.attn_k.bias",
    v_bias="blk.{i}.attn_v.bias",
    q_norm="blk.{i}.attn_q_norm.weight",
    k_norm="blk.{i}.attn_k_norm.weight",
    post_attn_norm="blk.{i}.post_attention_norm.weight",
    post_ffn_norm="blk.{i}.post_ffw_norm.weight",
)

HF_NAMES = WeightNames(
    embed="model.embed_tokens.weight",
    attn_norm="model.layers.{i}.input_layernorm.weight",
    q="model.layers.{i}.self_attn.q_proj.weight",
    k="model.layers.{i}.self_attn.k_proj.weight",
    v="model.layers.{i}.self_attn.v_proj.weight",
    o="model.layers.{i}.self_attn.o_proj.weight",
    ffn_norm="model.layers.{i}.post_attention_layernorm.weight",
    gate="model.layers.{i}.mlp.gate_proj.weight",
    up="model.layers.{i}.mlp.up_proj.weight",
    down="model.layers.{i}.mlp.down_proj.weight",
    norm="model.norm.weight",
    output="lm_head.weight",
    q_bias="model.layers.{i}.self_attn.q_proj.bias",
    k_bias="model.layers.{i}.self_attn.k_proj.bias",
    v_bias="model.layers.{i}.self_attn.v_proj.bias",
    q_norm="model.layers.{i}.self_attn.q_norm.weight",
    k_norm="model.layers.{i}.self_attn.k_norm.weight",
)

RopeStyle = Literal["interleaved", "neox"]


def rope_scaling_spec(h: ModelHParams, source: str) -> dict[str, Any] | None:
    """The tracer's rope ``scaling`` argument for the checkpoint's RoPE scaling.

    Raises:
        UnsupportedArchitectureError: a scaling type poot does not implement (yarn, dynamic...).
    """
    s = h.rope_scaling
    if s is None or s.type in ("none", "default"):
        return None
    if s.type == "linear" and s.factor:
        return {"type": "linear", "factor": s.factor}
    if s.type == "llama3" and s.factor and s.original_context_length:
        return {
            "type": "llama3",
            "factor": s.factor,
            "low_freq_factor": float(s.params.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(s.params.get("high_freq_factor", 4.0)),
            "original_max_position": s.original_context_length,
        }
    raise UnsupportedArchitectureError(
        f"{source}: RoPE scaling {s.type!r} is not supported (none, linear, llama3)",
        architecture=h.architecture,
        supported=("none", "linear", "llama3"),
    )


def gguf_f32_vector(files: ModelFiles, name: str, n: int) -> list[float]:
    """The ``n`` values of the GGUF's F32 tensor ``name``, read from the mapped file.

    Raises:
        CheckpointFormatError: the tensor is missing, not F32, or not ``n`` values.
    """
    import numpy as np

    info = next((t for t in files.tensors() if t.name == name), None)
    if info is None or info.dtype != "F32" or info.n_elements != n:
        got = "missing" if info is None else f"{info.dtype} {tuple(info.shape)}"
        raise CheckpointFormatError(
            f"{files.path}: {name} must be {n} F32 values, got {got}",
            kind="bad_tensor",
            file=str(files.path),
            tensor=name,
        )
    return [float(v) for v in np.fromfile(info.file, dtype="<f4", count=n, offset=info.offset)]


def rope_freqs_spec(files: ModelFiles) -> dict[str, Any]:
    """The rope ``factors`` scaling of a GGUF with ``rope_freqs.weight`` (Llama 3.1 and later:
    llama.cpp's converter bakes the llama3 frequency rule into per-pair divisors), times a
    linear factor if the file also states one, as llama.cpp applies both.

    Raises:
        CheckpointFormatError: a malformed tensor.
        UnsupportedArchitectureError: another stated scaling.
    """
    h = files.hparams
    factors = gguf_f32_vector(files, "rope_freqs.weight", h.rope_dim // 2)
    if not all(f > 0 and f != float("inf") for f in factors):
        raise CheckpointFormatError(
            f"{files.path}: rope_freqs.weight must be positive and finite",
            kind="bad_tensor",
            file=str(files.path),
            tensor="rope_freqs.weight",
        )
    base = rope_scaling_spec(h, str(files.path))
    if base is not None and base["type"] == "linear":
        factors = [f * base["factor"] for f in factors]
    elif base is not None:
        raise UnsupportedArchitectureError(
            f"{files.path}: rope_freqs.weight with RoPE scaling {base['type']!r}",
            architecture=h.architecture,
            supported=("none", "linear"),
        )
    return {"type": "factors", "factors": factors, "attn_factor": 1.0}


@dataclass(frozen=True)
class LlamaModel:
    """A Llama-family decoder, traced one step at a time.

    Attributes:
        hparams: the normalized hyperparameters.
        names: the checkpoint's tensor names.
        rope_style: how the checkpoint pairs rotary dimensions.
        rope_scaling: the tracer's rope scaling argument, or None.
        window_group: the windowed layers' KV is a group of its own (``with_window_group``).
    """

    hparams: ModelHParams
    names: WeightNames
    rope_style: RopeStyle
    rope_scaling: dict[str, Any] | None = None
    # Keyword-only, so subclasses' positional fields keep their places.
    window_group: bool = field(default=False, kw_only=True)

    @classmethod
    def from_files(cls, files: ModelFiles) -> LlamaModel:
        """The definition for a resolved checkpoint (GGUF or HF layout).

        Raises:
            UnsupportedArchitectureError: the checkpoint needs something this definition lacks
                (GGUF per-dimension RoPE frequency factors, an unknown RoPE scaling).
        """
        h = files.hparams
        if files.kind == "gguf":
            names = GGUF_NAMES
            arch = files.metadata.get("general.architecture")
            style: RopeStyle = "neox" if arch == "qwen2" else "interleaved"
            if any(t.name == "rope_freqs.weight" for t in files.tensors()):
                return cls(h, names, style, rope_freqs_spec(files))
        else:
            names, style = HF_NAMES, "neox"
        return cls(h, names, style, rope_scaling_spec(h, str(files.path)))

    @classmethod
    def neox(cls, files: ModelFiles, **fields: Any) -> Self:
        """The definition of a family whose checkpoints pair rotary dimensions NeoX-style in
        both layouts (Qwen2's descendants, OLMoE): the layout's tensor names and the stated
        RoPE scaling; ``fields``: the family's own dataclass fields.

        Raises:
            UnsupportedArchitectureError: an unknown RoPE scaling.
        """
        h = files.hparams
        names = GGUF_NAMES if files.kind == "gguf" else HF_NAMES
        return cls(h, names, "neox", rope_scaling_spec(h, str(files.path)), **fields)

    def for_context(self, max_model_len: int) -> LlamaModel:
        """The definition for running with sequences of up to ``max_model_len`` tokens (the
        same one, unless a family's arithmetic depends on it: Phi-3 LongRoPE)."""
        return self

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        """``(n_layers, n_kv_heads, head_dim)`` of the KV cache."""
        h = self.hparams
        return h.n_layers, h.n_kv_heads, h.head_dim

    def with_window_group(self) -> LlamaModel:
        """This definition with its windowed layers' KV in a group of its own: those layers
        read and write the ``window_*`` step inputs and the runtime's last KV layers (global
        layers first, then windowed ones, each in layer order), so the scheduler can give
        their blocks back behind the window (``poot.models.step``). Only for a model that
        interleaves windowed and global layers."""
        windows = [self.hparams.window(i) for i in range(self.hparams.n_layers)]
        if not any(w > 0 for w in windows) or all(w > 0 for w in windows):
            raise ValueError("a window group needs both windowed and global layers")
        return replace(self, window_group=True)

    @property
    def kv_windowed_layers(self) -> int:
        """KV layers of the windowed group (the runtime's last ones); 0 without the group."""
        if not self.window_group:
            return 0
        return sum(1 for i in range(self.hparams.n_layers) if self.hparams.window(i) > 0)

    def kv_layer(self, i: int) -> int:
        """The runtime's KV layer of layer ``i``: ``i``, or with the window group the global
        layers first and the windowed ones after them."""
        if not self.window_group:
            return i
        h = self.hparams
        windowed = h.window(i) > 0
        rank = sum(1 for j in range(i) if (h.window(j) > 0) == windowed)
        return rank + (h.n_layers - self.kv_windowed_layers if windowed else 0)

    def _proj(self, t: Tracer, x: Value, weight: str, bias: str) -> Value:
        y = t.matmul(x, t.weight(weight))
        if t.has_weight(bias):
            y = t.add(y, t.weight(bias))
        return y

    def _rope(self, t: Tracer, x: Value, positions: Value, n_heads: int) -> Value:
        h = self.hparams
        return t.rope(
            x,
            positions,
            n_heads=n_heads,
            head_dim=h.head_dim,
            rot_dim=h.rope_dim,
            theta=h.rope_theta,
            style=self.rope_style,
            scaling=self.rope_scaling,
        )

    def embed(self, t: Tracer, table: Value, ids: Value) -> Value:
        """The hidden state of the step's tokens (families override to scale it)."""
        return t.embedding(table, ids)

    def norm(self, t: Tracer, x: Value, weight: str) -> Value:
        """RMSNorm of ``x`` by the stored weight ``weight``."""
        return t.rms_norm(x, t.weight(weight), self.hparams.rms_norm_eps)

    def qkv(self, t: Tracer, i: int, a: Value) -> tuple[Value, Value, Value]:
        """Layer ``i``'s q, k, v projections of the normed hidden state ``a``."""
        n = self.names
        q = self._proj(t, a, n.q.format(i=i), n.q_bias.format(i=i))
        k = self._proj(t, a, n.k.format(i=i), n.k_bias.format(i=i))
        v = self._proj(t, a, n.v.format(i=i), n.v_bias.format(i=i))
        return q, k, v

    def qk_norm(self, t: Tracer, i: int, q: Value, k: Value) -> tuple[Value, Value]:
        """Hook before RoPE: per-head q/k normalisation in families that have it."""
        return q, k

    def rope_qk(
        self, t: Tracer, i: int, q: Value, k: Value, positions: Value
    ) -> tuple[Value, Value]:
        """Layer ``i``'s rotary embedding of q and k."""
        h = self.hparams
        return self._rope(t, q, positions, h.n_heads), self._rope(t, k, positions, h.n_kv_heads)

    def attention_options(self, i: int) -> dict[str, Any]:
        """Extra ``paged_attention`` arguments of layer ``i`` (window, soft-cap)."""
        window = self.hparams.window(i)
        return {"window": window} if window else {}

    def attention(self, t: Tracer, i: int, a: Value, ins: StepInputs, kv_layer: int) -> Value:
        """Layer ``i``'s attention of the normed hidden state ``a`` (before the output
        projection), writing its k/v into KV layer ``kv_layer``."""
        h = self.hparams
        q, k, v = self.qkv(t, i, a)
        q, k = self.qk_norm(t, i, q, k)
        q, k = self.rope_qk(t, i, q, k, ins.positions)
        slots, tables = ins.slot_mapping, ins.block_tables
        if self.window_group and h.window(i) > 0:
            assert ins.window_slot_mapping is not None and ins.window_block_tables is not None
            slots, tables = ins.window_slot_mapping, ins.window_block_tables
        return t.paged_attention(
            q,
            k,
            v,
            slot_mapping=slots,
            token_seq=ins.token_seq,
            positions=ins.positions,
            block_tables=tables,
            layer=kv_layer,
            n_heads=h.n_heads,
            n_kv_heads=h.n_kv_heads,
            head_dim=h.head_dim,
            scale=self.attention_scale(),
            **self.attention_options(i),
        )

    def attention_scale(self) -> float:
        """The factor on ``q . k``."""
        return float(self.hparams.head_dim**-0.5)

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        """Layer ``i``'s SwiGLU feed-forward of the normed hidden state ``f``."""
        n = self.names
        gate = t.silu(t.matmul(f, t.weight(n.gate.format(i=i))))
        up = t.matmul(f, t.weight(n.up.format(i=i)))
        return t.matmul(t.mul(gate, up), t.weight(n.down.format(i=i)))

    def layer(
        self,
        t: Tracer,
        i: int,
        x: Value,
        ins: StepInputs,
        kv_layer: int,
        last_rows: Value | None = None,
    ) -> Value:
        """One pre-norm decoder block; ``last_rows`` (the last layer) keeps only the rows that
        are sampled after attention (every row's k/v is already written by then)."""
        n = self.names
        att = self.attention(t, i, self.norm(t, x, n.attn_norm.format(i=i)), ins, kv_layer)
        if last_rows is not None:
            att = t.gather_rows(att, last_rows)
            x = t.gather_rows(x, last_rows)
        x = t.add(x, t.matmul(att, t.weight(n.o.format(i=i))))
        f = self.norm(t, x, n.ffn_norm.format(i=i))
        return t.add(x, self.ffn(t, i, f))

    def head(self, t: Tracer, x: Value, embed: Value | None) -> Value:
        """The logits of the final hidden rows."""
        n = self.names
        x = self.norm(t, x, n.norm)
        if t.has_weight(n.output):
            out = t.weight(n.output)
        else:
            out = embed if embed is not None else t.weight(n.embed)
        return t.matmul(x, out)

    def trace(self, t: Tracer, shape: StepShape) -> None:
        """Traces one step of ``shape`` into ``t`` (inputs and outputs per ``poot.models.step``)."""
        self.trace_units(t, shape, 0, self.hparams.n_layers + 2)

    def trace_units(
        self, t: Tracer, shape: StepShape, start: int, end: int, kv_base: int = 0
    ) -> None:
        """Traces units ``[start, end)`` of one step: unit 0 is the embedding, unit ``i + 1``
        layer ``i`` and unit ``n_layers + 1`` the head and sampling step.

        A segment that does not start at 0 takes the hidden state as input ``"hidden"`` (f32
        [rows, hidden_size]: ``tokens`` rows, or ``seqs`` after the last layer gathered each
        sequence's last row); one that does not end at the head outputs it as ``"hidden"``.
        Segments chained in order compute exactly what the whole trace computes (the planner
        streams a model this way, ``poot.planner.streaming``, and splits it over devices,
        ``poot.planner.split``). Layer ``i`` reads and writes KV layer ``i - kv_base`` of the
        runtime's pool, so a device holding only layers ``kv_base..`` holds only their KV.
        With the window group (``with_window_group``) the whole model is one segment and
        layer ``i`` uses KV layer ``kv_layer(i)``.
        """
        h, n = self.hparams, self.names
        if self.window_group and kv_base != 0:
            raise ValueError("a model with a window group runs as one segment (kv_base 0)")
        ins = declare_inputs(t, shape, windowed=self.window_group)
        head_unit = h.n_layers + 1
        embed = None
        if start == 0:
            embed = t.weight(n.embed)
            x = self.embed(t, embed, ins.ids)
        else:
            gathered = start == head_unit and shape.kind != "all_logits"
            rows = shape.seqs if gathered else shape.tokens
            x = t.input("hidden", "f32", [rows, h.hidden_size])
        last = h.n_layers - 1
        for i in range(max(0, start - 1), min(h.n_layers, end - 1)):
            x = self.layer(
                t,
                i,
                x,
                ins,
                self.kv_layer(i) - kv_base,
                # Only each sequence's last row is sampled (every row's k/v is already written),
                # except in an all_logits step, which outputs every row's logits.
                last_rows=ins.last_rows if i == last and shape.kind != "all_logits" else None,
            )
        if end <= head_unit:
            t.output("hidden", x)
            return
        logits = self.head(t, x, embed)
        trace_head(t, logits, shape, ins.last_rows)
