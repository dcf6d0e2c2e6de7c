"""Gemma 2 and Gemma 3 (text): the Llama block reshaped by Google's choices.

What differs from ``llama.py``, after transformers' ``modeling_gemma2``/``modeling_gemma3`` and
llama.cpp's ``gemma2.cpp``/``gemma3.cpp``:

- the embedding is multiplied by ``sqrt(hidden_size)`` (an f32 constant, as both do);
- RMSNorm multiplies by ``1 + w``: HF files store ``w`` (the trace adds the 1 with an ``add`` of
  a constant row, exactly HF's ``1.0 + weight`` in f32), GGUF files store ``1 + w`` (llama.cpp's
  converter folds it), so GGUF norms are the ordinary ``rms_norm``;
- every block has four norms: before and after attention, before and after the feed-forward;
- the feed-forward is GeGLU, ``down(gelu_tanh(gate(x)) * up(x))``;
- queries are scaled by ``query_pre_attn_scalar ** -0.5`` (HF); llama.cpp uses ``head_dim`` except
  for the 27B models (``hidden / n_heads``), which ``checkpoints.family_hparams`` reproduces;
- layers alternate sliding-window and global attention (``ModelHParams.layer_windows``);
- Gemma 2 soft-caps attention scores (50) and final logits (30): ``c * tanh(x / c)``;
- Gemma 3 normalises q and k per head (as Qwen3, with ``1 + w``), and its windowed layers use
  their own RoPE base (``rope_local_theta``, 10000) without the global layers' RoPE scaling.

The output head is tied to the embedding unless the file has its own ``output.weight``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from poot.models.llama import GGUF_NAMES, HF_NAMES, LlamaModel, rope_scaling_spec

if TYPE_CHECKING:
    from poot._native import Tracer, Value
    from poot.checkpoints import ModelFiles

__all__ = ["GemmaModel"]

GEMMA_HF_NAMES = replace(
    HF_NAMES,
    post_attn_norm="model.layers.{i}.post_attention_layernorm.weight",
    ffn_norm="model.layers.{i}.pre_feedforward_layernorm.weight",
    post_ffn_norm="model.layers.{i}.post_feedforward_layernorm.weight",
)


@dataclass(frozen=True)
class GemmaModel(LlamaModel):
    """A Gemma 2 or Gemma 3 text decoder (see the module docs).

    Attributes:
        norm_plus_one: norm weights are stored as ``w`` and applied as ``1 + w`` (HF layout).
    """

    norm_plus_one: bool = False
    # Constants of the trace being recorded (a Value belongs to one tracer): width -> row.
    _consts: dict[tuple[int, int, str], Value] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_files(cls, files: ModelFiles) -> GemmaModel:
        """The definition for a resolved Gemma 2 / Gemma 3 checkpoint (GGUF or HF layout)."""
        h = files.hparams
        gguf = files.kind == "gguf"
        names = GGUF_NAMES if gguf else GEMMA_HF_NAMES
        return cls(h, names, "neox", rope_scaling_spec(h, str(files.path)), norm_plus_one=not gguf)

    def _const(self, t: Tracer, width: int, value: float, tag: str) -> Value:
        # Keyed by the tracer too: traces of one definition may be recorded concurrently.
        key = (id(t), width, tag)
        v = self._consts.get(key)
        if v is None:
            v = t.literal([value] * width, [width])
            self._consts[key] = v
        return v

    def trace_units(self, t: Tracer, shape: Any, start: int, end: int, kv_base: int = 0) -> None:
        try:
            super().trace_units(t, shape, start, end, kv_base)
        finally:
            for key in [k for k in self._consts if k[0] == id(t)]:
                self._consts.pop(key, None)

    def _weight_norm(self, t: Tracer, name: str, width: int) -> Value:
        w = t.weight(name)
        if self.norm_plus_one:
            w = t.add(self._const(t, width, 1.0, "one"), w)
        return w

    def norm(self, t: Tracer, x: Value, weight: str) -> Value:
        width = x.shape[-1]
        return t.rms_norm(x, self._weight_norm(t, weight, width), self.hparams.rms_norm_eps)

    def embed(self, t: Tracer, table: Value, ids: Value) -> Value:
        d = self.hparams.hidden_size
        return t.mul(t.embedding(table, ids), self._const(t, d, math.sqrt(d), "embed_scale"))

    def qk_norm(self, t: Tracer, i: int, q: Value, k: Value) -> tuple[Value, Value]:
        n, h = self.names, self.hparams
        name = n.q_norm.format(i=i)
        if not t.has_weight(name):
            return q, k  # Gemma 2
        out = []
        for x, heads, wname in ((q, h.n_heads, name), (k, h.n_kv_heads, n.k_norm.format(i=i))):
            rows, width = x.shape
            y = t.reshape(x, [rows * heads, h.head_dim])
            y = t.rms_norm(y, self._weight_norm(t, wname, h.head_dim), h.rms_norm_eps)
            out.append(t.reshape(y, [rows, width]))
        return out[0], out[1]

    def rope_qk(
        self, t: Tracer, i: int, q: Value, k: Value, positions: Value
    ) -> tuple[Value, Value]:
        h = self.hparams
        local = h.window(i) > 0 and h.rope_local_theta is not None
        theta = h.rope_local_theta if local and h.rope_local_theta else h.rope_theta
        scaling = None if local else self.rope_scaling

        def rope(x: Value, heads: int) -> Value:
            return t.rope(
                x,
                positions,
                n_heads=heads,
                head_dim=h.head_dim,
                rot_dim=h.rope_dim,
                theta=theta,
                style=self.rope_style,
                scaling=scaling,
            )

        return rope(q, h.n_heads), rope(k, h.n_kv_heads)

    def attention_scale(self) -> float:
        h = self.hparams
        qpas = h.query_pre_attn_scalar or float(h.head_dim)
        return float(qpas**-0.5)

    def attention_options(self, i: int) -> dict[str, Any]:
        opts = super().attention_options(i)
        if self.hparams.attn_logit_softcap:
            opts["softcap"] = self.hparams.attn_logit_softcap
        return opts

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        n = self.names
        gate = t.gelu(t.matmul(f, t.weight(n.gate.format(i=i))))
        up = t.matmul(f, t.weight(n.up.format(i=i)))
        return t.matmul(t.mul(gate, up), t.weight(n.down.format(i=i)))

    def layer(
        self,
        t: Tracer,
        i: int,
        x: Value,
        ins: Any,
        kv_layer: int,
        last_rows: Value | None = None,
    ) -> Value:
        n = self.names
        att = self.attention(t, i, self.norm(t, x, n.attn_norm.format(i=i)), ins, kv_layer)
        if last_rows is not None:
            att = t.gather_rows(att, last_rows)
            x = t.gather_rows(x, last_rows)
        o = t.matmul(att, t.weight(n.o.format(i=i)))
        x = t.add(x, self.norm(t, o, n.post_attn_norm.format(i=i)))
        f = self.ffn(t, i, self.norm(t, x, n.ffn_norm.format(i=i)))
        return t.add(x, self.norm(t, f, n.post_ffn_norm.format(i=i)))

    def head(self, t: Tracer, x: Value, embed: Value | None) -> Value:
        logits = super().head(t, x, embed)
        cap = self.hparams.final_logit_softcap
        return t.softcap(logits, cap) if cap else logits
