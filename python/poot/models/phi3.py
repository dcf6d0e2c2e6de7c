"""Phi-3 / Phi-3.5 / Phi-4-mini: the Llama block with fused projections.

After transformers' ``modeling_phi3`` and llama.cpp's ``phi3.cpp``: q, k and v come from one
fused ``qkv_proj`` (GGUF ``attn_qkv``) whose output rows are ``[q | k | v]``, and the SwiGLU
gate and up from one ``gate_up_proj`` (GGUF ``ffn_up``, ``2 * intermediate_size`` rows) whose
output is ``[gate | up]``; both are one matmul followed by ``slice``s, so the packed weights are
read once, in place. RoPE is the NeoX pairing over ``rope_dim`` dims (Phi-4-mini rotates 3/4 of
each head). A GGUF with separate ``attn_q``/``attn_k``/``attn_v`` tensors is read as such.

Not supported (typed errors): LongRoPE / "su" scaling (Phi-3-mini-128k, Phi-3.5, Phi-4-mini's
long context: per-dimension frequency factors chosen by context length, GGUF
``rope_factors_long``/``rope_factors_short``).

Phi-3's config.json ``sliding_window`` (2047 for Phi-3-mini-4k) is applied to HF directories as
transformers applies it; llama.cpp disables it for GGUF files (ggml-org/llama.cpp#13676) and so
does poot, to give llama.cpp's answer for a GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from poot.errors import UnsupportedArchitectureError
from poot.models.llama import GGUF_NAMES, HF_NAMES, LlamaModel, rope_scaling_spec

if TYPE_CHECKING:
    from poot._native import Tracer, Value
    from poot.checkpoints import ModelFiles

__all__ = ["Phi3Model"]

PHI3_GGUF_NAMES = replace(GGUF_NAMES, q="blk.{i}.attn_qkv.weight", up="blk.{i}.ffn_up.weight")
PHI3_HF_NAMES = replace(
    HF_NAMES,
    q="model.layers.{i}.self_attn.qkv_proj.weight",
    up="model.layers.{i}.mlp.gate_up_proj.weight",
)
_LONGROPE = ("longrope", "su")


@dataclass(frozen=True)
class Phi3Model(LlamaModel):
    """A Phi-3-family decoder (see the module docs)."""

    @classmethod
    def from_files(cls, files: ModelFiles) -> Phi3Model:
        """The definition for a resolved Phi-3 checkpoint (GGUF or HF layout).

        Raises:
            UnsupportedArchitectureError: LongRoPE ("su") scaling.
        """
        h = files.hparams
        gguf = files.kind == "gguf"
        long = gguf and any(t.name.startswith("rope_factors_") for t in files.tensors())
        if long or (h.rope_scaling is not None and h.rope_scaling.type in _LONGROPE):
            raise UnsupportedArchitectureError(
                f"{files.path}: Phi-3 LongRoPE scaling (short/long frequency factors) is not "
                "supported yet; the 4k-context Phi-3 models run",
                architecture=h.architecture,
                supported=("phi3 without rope scaling",),
            )
        names = PHI3_GGUF_NAMES if gguf else PHI3_HF_NAMES
        return cls(h, names, "neox", rope_scaling_spec(h, str(files.path)))

    def qkv(self, t: Tracer, i: int, a: Value) -> tuple[Value, Value, Value]:
        name = self.names.q.format(i=i)
        if not t.has_weight(name):
            # A GGUF converted with separate q/k/v tensors.
            sep = replace(
                self.names,
                q="blk.{i}.attn_q.weight",
                k="blk.{i}.attn_k.weight",
                v="blk.{i}.attn_v.weight",
            )
            return replace(self, names=sep).qkv_separate(t, i, a)
        h = self.hparams
        qw, kvw = h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim
        qkv = t.matmul(a, t.weight(name))
        return (
            t.slice(qkv, 1, 0, qw),
            t.slice(qkv, 1, qw, qw + kvw),
            t.slice(qkv, 1, qw + kvw, qw + 2 * kvw),
        )

    def qkv_separate(self, t: Tracer, i: int, a: Value) -> tuple[Value, Value, Value]:
        """The unfused projections (``LlamaModel.qkv``)."""
        return super().qkv(t, i, a)

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        n, ff = self.names, self.hparams.intermediate_size
        gate_up = t.matmul(f, t.weight(n.up.format(i=i)))
        gate = t.silu(t.slice(gate_up, 1, 0, ff))
        up = t.slice(gate_up, 1, ff, 2 * ff)
        return t.matmul(t.mul(gate, up), t.weight(n.down.format(i=i)))
