"""Qwen3 (dense): the Llama block with an RMSNorm over each q and k head before RoPE.

Differences from Qwen2 (``llama.py``): no q/k/v biases, ``head_dim`` stated by the checkpoint
(128 in every released size, not ``hidden_size / n_heads``), and ``q_norm``/``k_norm`` weights
of ``[head_dim]`` applied to every head of every token (transformers' ``Qwen3Attention``,
llama.cpp's ``attn_q_norm``/``attn_k_norm``). RoPE is the NeoX pairing in both GGUF and HF
layouts. The per-head norm is a reshape to ``[tokens * heads, head_dim]``, the ordinary
``rms_norm`` and a reshape back: no new op, the same kernel on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from poot.models.llama import LlamaModel

if TYPE_CHECKING:
    from poot._native import Tracer, Value
    from poot.checkpoints import ModelFiles

__all__ = ["Qwen3Model", "head_rms_norm"]


def head_rms_norm(t: Tracer, x: Value, weight: Value, n_heads: int, eps: float) -> Value:
    """RMSNorm of every head of ``x`` ``[T, n_heads * head_dim]`` by ``weight [head_dim]``."""
    rows, width = x.shape
    head_dim = width // n_heads
    y = t.rms_norm(t.reshape(x, [rows * n_heads, head_dim]), weight, eps)
    return t.reshape(y, [rows, width])


@dataclass(frozen=True)
class Qwen3Model(LlamaModel):
    """A Qwen3 decoder (see the module docs)."""

    @classmethod
    def from_files(cls, files: ModelFiles) -> Qwen3Model:
        """The definition for a resolved Qwen3 checkpoint (GGUF or HF layout)."""
        return cls.neox(files)

    def qk_norm(self, t: Tracer, i: int, q: Value, k: Value) -> tuple[Value, Value]:
        h, n = self.hparams, self.names
        eps = h.rms_norm_eps
        q = head_rms_norm(t, q, t.weight(n.q_norm.format(i=i)), h.n_heads, eps)
        k = head_rms_norm(t, k, t.weight(n.k_norm.format(i=i)), h.n_kv_heads, eps)
        return q, k
