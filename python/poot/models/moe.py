"""Packed mixture-of-experts feed-forwards: Mixtral and Qwen3-MoE (GGUF).

A MoE layer replaces the SwiGLU feed-forward by a router and ``E`` experts. GGUF stores the
experts packed as 3-D tensors (``ffn_gate_exps``/``ffn_up_exps`` [E, F, D], ``ffn_down_exps``
[E, D, F]) and the router as ``ffn_gate_inp`` [E, D]. The trace, per layer:

- ``logits = f @ ffn_gate_inp``; ``ids = top_k_ids(logits, k)`` (largest first, ties by lower
  id);
- weights: ``softmax(gather_cols(logits, ids))``, which equals llama.cpp's softmax over every
  expert, top-k, then the selected probabilities divided by their sum (Mixtral, Qwen3-MoE:
  ``norm_w``); families without that renormalisation are refused;
- ``moe_matmul`` for gate, up and down reads only the selected experts' rows of the packed
  tensors, in place (the CPU groups a step's tokens by expert: each expert's rows are streamed
  once per step), and ``moe_combine`` sums each token's expert outputs by its weights.

Mixtral is the Llama block (GGUF ``llama`` with ``llama.expert_count``); Qwen3-MoE the Qwen3
block (per-head q/k norms) with ``qwen3moe.expert_feed_forward_length``-wide experts. Hugging
Face directories of MoE models (experts stored one tensor each) are refused: packing them in
place needs a weight view poot does not have yet. Shared experts (Qwen2-MoE) and OLMoE's
full-width q/k norms are not implemented either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from poot.errors import UnsupportedArchitectureError
from poot.models.llama import LlamaModel
from poot.models.qwen3 import Qwen3Model

if TYPE_CHECKING:
    from poot._native import Tracer, Value
    from poot.checkpoints import ModelFiles

__all__ = ["MixtralModel", "Qwen3MoeModel", "moe_ffn"]


def moe_ffn(t: Tracer, i: int, f: Value, k: int) -> Value:
    """Layer ``i``'s routed SwiGLU experts of the normed hidden state ``f`` (GGUF names)."""
    p = f"blk.{i}."
    logits = t.matmul(f, t.weight(p + "ffn_gate_inp.weight"))
    ids = t.top_k_ids(logits, k)
    weights = t.softmax(t.gather_cols(logits, ids))
    gate = t.silu(t.moe_matmul(f, t.weight(p + "ffn_gate_exps.weight"), ids))
    up = t.moe_matmul(f, t.weight(p + "ffn_up_exps.weight"), ids)
    y = t.moe_matmul(t.mul(gate, up), t.weight(p + "ffn_down_exps.weight"), ids)
    return t.moe_combine(y, weights)


def _check(files: ModelFiles) -> None:
    if files.kind != "gguf":
        raise UnsupportedArchitectureError(
            f"{files.path}: mixture-of-experts models run from GGUF files only (their HF "
            "directories store each expert apart)",
            architecture=files.hparams.architecture,
            supported=("GGUF llama (Mixtral)", "GGUF qwen3moe"),
        )
    if files.hparams.n_experts_used <= 0:
        raise UnsupportedArchitectureError(
            f"{files.path}: no expert_used_count",
            architecture=files.hparams.architecture,
        )


@dataclass(frozen=True)
class MixtralModel(LlamaModel):
    """Mixtral: the Llama block with routed experts (see the module docs)."""

    @classmethod
    def from_files(cls, files: ModelFiles) -> MixtralModel:
        """The definition for a Mixtral GGUF.

        Raises:
            UnsupportedArchitectureError: not a GGUF, or no experts used per token.
        """
        _check(files)
        base = LlamaModel.from_files(files)
        return cls(base.hparams, base.names, base.rope_style, base.rope_scaling)

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        return moe_ffn(t, i, f, self.hparams.n_experts_used)


@dataclass(frozen=True)
class Qwen3MoeModel(Qwen3Model):
    """Qwen3-MoE: the Qwen3 block with routed experts (see the module docs)."""

    @classmethod
    def from_files(cls, files: ModelFiles) -> Qwen3MoeModel:
        """The definition for a Qwen3-MoE GGUF.

        Raises:
            UnsupportedArchitectureError: not a GGUF, or no experts used per token.
        """
        _check(files)
        base = Qwen3Model.from_files(files)
        return cls(base.hparams, base.names, base.rope_style, base.rope_scaling)

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        return moe_ffn(t, i, f, self.hparams.n_experts_used)
