"""Phi-3 / Phi-3.5 / Phi-4-mini: the Llama block with fused projections.

After transformers' ``modeling_phi3`` and llama.cpp's ``phi3.cpp``: q, k and v come from one
fused ``qkv_proj`` (GGUF ``attn_qkv``) whose output rows are ``[q | k | v]``, and the SwiGLU
gate and up from one ``gate_up_proj`` (GGUF ``ffn_up``, ``2 * intermediate_size`` rows) whose
output is ``[gate | up]``; both are one matmul followed by ``slice``s, so the packed weights are
read once, in place. RoPE is the NeoX pairing over ``rope_dim`` dims (Phi-4-mini rotates 3/4 of
each head). A GGUF with separate ``attn_q``/``attn_k``/``attn_v`` tensors is read as such.

LongRoPE ("longrope", formerly "su": Phi-3-mini-128k, Phi-3.5, Phi-4-mini): per-pair frequency
divisors, the short set or the long set, and a cos/sin scale ``attention_factor`` (HF's
``_compute_longrope_parameters``: ``sqrt(1 + ln(factor) / ln(original_context))`` with
``factor = max_position_embeddings / original_max_position_embeddings`` unless stated). Which set
applies is decided once per ``LLM`` by its ``max_model_len`` (``for_context``), as llama.cpp
decides it by its context size: the long factors when it exceeds the original context, else
the short ones. (transformers switches per forward by the sequence length instead.) GGUF files
hold the factors as ``rope_factors_short``/``rope_factors_long`` f32 tensors and the scale as
``phi3.rope.scaling.attn_factor`` (1 when absent, as llama.cpp reads it).

Phi-3's config.json ``sliding_window`` (2047 for Phi-3-mini-4k) is applied to HF directories as
transformers applies it; llama.cpp disables it for GGUF files (ggml-org/llama.cpp#13676) and so
does poot, to give llama.cpp's answer for a GGUF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from poot.errors import CheckpointFormatError
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
class LongRope:
    """A checkpoint's LongRoPE parameters (see the module docs)."""

    short: tuple[float, ...]
    long: tuple[float, ...]
    original_context: int
    attn_factor: float

    def spec(self, long: bool) -> dict[str, Any]:
        """The tracer's rope ``scaling`` argument for the short or the long factors."""
        factors = self.long if long else self.short
        return {"type": "factors", "factors": list(factors), "attn_factor": self.attn_factor}


def _bad(files: ModelFiles, what: str) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{files.path}: LongRoPE {what}", kind="bad_hparams", file=str(files.path), field="rope"
    )


def _factors(files: ModelFiles, values: Any, which: str, pairs: int) -> tuple[float, ...]:
    if not isinstance(values, list | tuple) or len(values) != pairs:
        raise _bad(files, f"{which} factors must be {pairs} numbers (rope_dim / 2)")
    out = tuple(float(v) for v in values)
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise _bad(files, f"{which} factors must be positive and finite")
    return out


def _gguf_tensor(files: ModelFiles, name: str, pairs: int) -> tuple[float, ...]:
    info = next((t for t in files.tensors() if t.name == name), None)
    if info is None:
        raise _bad(files, f"has rope factors but no {name}")
    if info.dtype != "F32" or info.n_elements != pairs:
        raise _bad(files, f"{name} must be {pairs} F32 values, got {info.dtype} {info.shape}")
    data = np.fromfile(info.file, dtype="<f4", count=pairs, offset=info.offset)
    return _factors(files, data.tolist(), name, pairs)


def longrope_of(files: ModelFiles) -> LongRope | None:
    """The checkpoint's LongRoPE parameters, or None when it has none.

    Raises:
        CheckpointFormatError: factors of the wrong count, sign or type.
    """
    h = files.hparams
    pairs = h.rope_dim // 2
    if files.kind == "gguf":
        names = {t.name for t in files.tensors()}
        if "rope_factors_long.weight" not in names and "rope_factors_short.weight" not in names:
            return None
        arch = h.architecture
        orig = files.metadata.get(f"{arch}.rope.scaling.original_context_length")
        attn = files.metadata.get(f"{arch}.rope.scaling.attn_factor")
        return LongRope(
            short=_gguf_tensor(files, "rope_factors_short.weight", pairs),
            long=_gguf_tensor(files, "rope_factors_long.weight", pairs),
            original_context=int(orig) if isinstance(orig, int) else h.context_length,
            attn_factor=float(attn) if isinstance(attn, int | float) else 1.0,
        )
    s = h.rope_scaling
    if s is None or s.type not in _LONGROPE:
        return None
    orig = s.original_context_length or h.context_length
    factor = s.factor
    if files.config.get("original_max_position_embeddings") is not None or factor is None:
        # transformers: Phi-3 takes the ratio of the two context lengths as the factor.
        factor = h.context_length / orig
    attn = s.params.get("attention_factor")
    if not isinstance(attn, int | float):
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return LongRope(
        short=_factors(files, s.params.get("short_factor"), "short", pairs),
        long=_factors(files, s.params.get("long_factor"), "long", pairs),
        original_context=orig,
        attn_factor=float(attn),
    )


@dataclass(frozen=True)
class Phi3Model(LlamaModel):
    """A Phi-3-family decoder (see the module docs)."""

    long_rope: LongRope | None = None

    @classmethod
    def from_files(cls, files: ModelFiles) -> Phi3Model:
        """The definition for a resolved Phi-3 checkpoint (GGUF or HF layout); LongRoPE
        checkpoints start on their short factors (``for_context`` picks).

        Raises:
            CheckpointFormatError: malformed LongRoPE factors.
            UnsupportedArchitectureError: another RoPE scaling poot does not implement.
        """
        h = files.hparams
        names = PHI3_GGUF_NAMES if files.kind == "gguf" else PHI3_HF_NAMES
        lr = longrope_of(files)
        if lr is not None:
            return cls(h, names, "neox", lr.spec(long=False), long_rope=lr)
        return cls(h, names, "neox", rope_scaling_spec(h, str(files.path)))

    def for_context(self, max_model_len: int) -> Phi3Model:
        """The long factors when ``max_model_len`` exceeds the original context."""
        lr = self.long_rope
        if lr is None:
            return self
        return replace(self, rope_scaling=lr.spec(long=max_model_len > lr.original_context))

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
