"""Packed mixture-of-experts feed-forwards: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (GGUF).

A MoE layer replaces the SwiGLU feed-forward by a router and ``E`` experts. GGUF stores the
experts packed as 3-D tensors (``ffn_gate_exps``/``ffn_up_exps`` [E, F, D], ``ffn_down_exps``
[E, D, F]) and the router as ``ffn_gate_inp`` [E, D]. The trace, per layer:

- ``logits = f @ ffn_gate_inp``; ``ids = top_k_ids(logits, k)`` (largest first, ties by lower
  id);
- weights: ``softmax(gather_cols(logits, ids))``, which equals llama.cpp's softmax over every
  expert, top-k, then the selected probabilities divided by their sum (Mixtral, Qwen3-MoE:
  ``norm_w``), or ``gather_cols(softmax(logits), ids)`` without it (OLMoE);
- ``moe_matmul`` for gate, up and down reads only the selected experts' rows of the packed
  tensors, in place (the CPU groups a step's tokens by expert: each expert's rows are streamed
  once per step), and ``moe_combine`` sums each token's expert outputs by its weights.

Mixtral is the Llama block (GGUF ``llama`` with ``llama.expert_count``); Qwen3-MoE the Qwen3
block (per-head q/k norms) with ``qwen3moe.expert_feed_forward_length``-wide experts; OLMoE the
Llama block with q and k RMS-normed over their full width before RoPE (NeoX pairing) and
weights not renormalised. Qwen2-MoE (Qwen1.5-MoE) is the Qwen2 block (q/k/v biases, NeoX
RoPE) with routed experts whose weights are not renormalised (transformers'
``norm_topk_prob`` false, llama.cpp's ``qwen2moe``) plus a shared SwiGLU expert
(``ffn_*_shexp``) that every token takes, scaled by ``sigmoid(f . ffn_gate_inp_shexp)``: the
gate is a 1-D weight [D], which ``matmul`` reads as one row -> [T, 1]. The graph has no sigmoid
op, so the gate is ``softmax([z/2, -z/2])[0]`` (= ``1 / (1 + e^-z)``), and ``moe_combine`` with
one expert per token scales each row of the shared expert's output by it.

Hugging Face directories store the experts one tensor each (``mlp.experts.{j}.gate_proj``);
the weight store describes each layer's complete set as one virtual [E, N, K] tensor
``mlp.experts.gate_proj.weight`` whose pieces are the experts' mapped bytes, read in place (no
copy; ``poot_runtime::weights``). Qwen2-MoE directories run that way (``norm_topk_prob`` from
config.json; every layer sparse: ``decoder_sparse_step`` 1 and no ``mlp_only_layers``, else a
typed error), and so do Mixtral (``block_sparse_moe.experts.{j}.w1``/``w3``/``w2``), Qwen3-MoE
and OLMoE directories; their ``norm_topk_prob`` comes from config.json (Mixtral always
renormalises).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poot.errors import UnsupportedArchitectureError
from poot.models.llama import LlamaModel
from poot.models.qwen3 import Qwen3Model

if TYPE_CHECKING:
    from poot._native import Tracer, Value
    from poot.checkpoints import ModelFiles

__all__ = ["MixtralModel", "OlmoeModel", "Qwen2MoeModel", "Qwen3MoeModel", "moe_ffn"]


@dataclass(frozen=True)
class MoeNames:
    """Tensor names of a MoE layer (``{i}``: the layer): router, packed experts, shared expert."""

    router: str
    gate_exps: str
    up_exps: str
    down_exps: str
    shared_gate: str = ""
    shared_up: str = ""
    shared_down: str = ""
    shared_router: str = ""


GGUF_MOE_NAMES = MoeNames(
    router="blk.{i}.ffn_gate_inp.weight",
    gate_exps="blk.{i}.ffn_gate_exps.weight",
    up_exps="blk.{i}.ffn_up_exps.weight",
    down_exps="blk.{i}.ffn_down_exps.weight",
    shared_gate="blk.{i}.ffn_gate_shexp.weight",
    shared_up="blk.{i}.ffn_up_shexp.weight",
    shared_down="blk.{i}.ffn_down_shexp.weight",
    shared_router="blk.{i}.ffn_gate_inp_shexp.weight",
)
# HF names; the experts are the store's virtual stacks (module docs). Qwen3-MoE and OLMoE:
HF_QWEN_MOE_NAMES = MoeNames(
    router="model.layers.{i}.mlp.gate.weight",
    gate_exps="model.layers.{i}.mlp.experts.gate_proj.weight",
    up_exps="model.layers.{i}.mlp.experts.up_proj.weight",
    down_exps="model.layers.{i}.mlp.experts.down_proj.weight",
)
# Mixtral (w1: gate, w3: up, w2: down):
HF_MIXTRAL_NAMES = MoeNames(
    router="model.layers.{i}.block_sparse_moe.gate.weight",
    gate_exps="model.layers.{i}.block_sparse_moe.experts.w1.weight",
    up_exps="model.layers.{i}.block_sparse_moe.experts.w3.weight",
    down_exps="model.layers.{i}.block_sparse_moe.experts.w2.weight",
)
# Qwen2-MoE, with its shared expert:
HF_QWEN2MOE_NAMES = MoeNames(
    router="model.layers.{i}.mlp.gate.weight",
    gate_exps="model.layers.{i}.mlp.experts.gate_proj.weight",
    up_exps="model.layers.{i}.mlp.experts.up_proj.weight",
    down_exps="model.layers.{i}.mlp.experts.down_proj.weight",
    shared_gate="model.layers.{i}.mlp.shared_expert.gate_proj.weight",
    shared_up="model.layers.{i}.mlp.shared_expert.up_proj.weight",
    shared_down="model.layers.{i}.mlp.shared_expert.down_proj.weight",
    shared_router="model.layers.{i}.mlp.shared_expert_gate.weight",
)


def moe_ffn(
    t: Tracer, i: int, f: Value, k: int, renorm: bool = True, names: MoeNames = GGUF_MOE_NAMES
) -> Value:
    """Layer ``i``'s routed SwiGLU experts of the normed hidden state ``f``; ``renorm``: the
    chosen experts' weights sum to 1 (else they are the full softmax's)."""
    logits = t.matmul(f, t.weight(names.router.format(i=i)))
    ids = t.top_k_ids(logits, k)
    if renorm:
        weights = t.softmax(t.gather_cols(logits, ids))
    else:
        weights = t.gather_cols(t.softmax(logits), ids)
    gate = t.silu(t.moe_matmul(f, t.weight(names.gate_exps.format(i=i)), ids))
    up = t.moe_matmul(f, t.weight(names.up_exps.format(i=i)), ids)
    y = t.moe_matmul(t.mul(gate, up), t.weight(names.down_exps.format(i=i)), ids)
    return t.moe_combine(y, weights)


def sigmoid_col(t: Tracer, z: Value) -> Value:
    """``1 / (1 + e^-z)`` of a [T, 1] column, as ``softmax([z/2, -z/2])``'s first column."""
    half = t.mul(z, t.literal([0.5], [1]))
    neg = t.mul(z, t.literal([-0.5], [1]))
    return t.slice(t.softmax(t.concat([half, neg], 1)), 1, 0, 1)


def shared_expert(t: Tracer, i: int, f: Value, names: MoeNames = GGUF_MOE_NAMES) -> Value:
    """Layer ``i``'s shared SwiGLU expert, scaled per token by its sigmoid gate (Qwen2-MoE)."""
    gate = t.silu(t.matmul(f, t.weight(names.shared_gate.format(i=i))))
    up = t.matmul(f, t.weight(names.shared_up.format(i=i)))
    y = t.matmul(t.mul(gate, up), t.weight(names.shared_down.format(i=i)))
    g = sigmoid_col(t, t.matmul(f, t.weight(names.shared_router.format(i=i))))
    return t.moe_combine(y, g)


def _check(files: ModelFiles) -> None:
    if files.hparams.n_experts_used <= 0:
        raise UnsupportedArchitectureError(
            f"{files.path}: no expert_used_count",
            architecture=files.hparams.architecture,
        )


def _routing(files: ModelFiles, hf: MoeNames, gguf_renorm: bool) -> tuple[MoeNames, bool]:
    """The expert names and renormalisation of a checkpoint: a GGUF's as llama.cpp runs the
    family (``gguf_renorm``), an HF directory's from config.json's ``norm_topk_prob`` (which
    defaults to the GGUF rule: Mixtral always renormalises and states no key)."""
    if files.kind == "gguf":
        return GGUF_MOE_NAMES, gguf_renorm
    return hf, bool(files.config.get("norm_topk_prob", gguf_renorm))


class _RoutedFfn:
    """The feed-forward of a block whose MLP is routed experts only (``moe_ffn``); mixed in
    ahead of the dense family's class, whose dataclass fields ``moe`` and ``renorm`` it reads."""

    hparams: Any
    moe: MoeNames
    renorm: bool

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        return moe_ffn(t, i, f, self.hparams.n_experts_used, self.renorm, self.moe)


@dataclass(frozen=True)
class MixtralModel(_RoutedFfn, LlamaModel):
    """Mixtral: the Llama block with routed experts (see the module docs)."""

    moe: MoeNames = GGUF_MOE_NAMES
    renorm: bool = True

    @classmethod
    def from_files(cls, files: ModelFiles) -> MixtralModel:
        """The definition for a Mixtral GGUF or HF directory.

        Raises:
            UnsupportedArchitectureError: no experts used per token.
        """
        _check(files)
        base = LlamaModel.from_files(files)
        moe, renorm = _routing(files, HF_MIXTRAL_NAMES, True)
        return cls(base.hparams, base.names, base.rope_style, base.rope_scaling, moe, renorm)


@dataclass(frozen=True)
class Qwen3MoeModel(_RoutedFfn, Qwen3Model):
    """Qwen3-MoE: the Qwen3 block with routed experts (see the module docs)."""

    moe: MoeNames = GGUF_MOE_NAMES
    renorm: bool = True

    @classmethod
    def from_files(cls, files: ModelFiles) -> Qwen3MoeModel:
        """The definition for a Qwen3-MoE GGUF or HF directory.

        Raises:
            UnsupportedArchitectureError: no experts used per token.
        """
        _check(files)
        moe, renorm = _routing(files, HF_QWEN_MOE_NAMES, True)
        return cls.neox(files, moe=moe, renorm=renorm)


@dataclass(frozen=True)
class OlmoeModel(_RoutedFfn, LlamaModel):
    """OLMoE: full-width q/k RMSNorm, routed experts without renormalisation."""

    moe: MoeNames = GGUF_MOE_NAMES
    renorm: bool = False

    @classmethod
    def from_files(cls, files: ModelFiles) -> OlmoeModel:
        """The definition for an OLMoE GGUF or HF directory.

        Raises:
            UnsupportedArchitectureError: no experts used per token.
        """
        _check(files)
        moe, renorm = _routing(files, HF_QWEN_MOE_NAMES, False)
        return cls.neox(files, moe=moe, renorm=renorm)

    def qk_norm(self, t: Tracer, i: int, q: Value, k: Value) -> tuple[Value, Value]:
        n, eps = self.names, self.hparams.rms_norm_eps
        q = t.rms_norm(q, t.weight(n.q_norm.format(i=i)), eps)
        k = t.rms_norm(k, t.weight(n.k_norm.format(i=i)), eps)
        return q, k


@dataclass(frozen=True)
class Qwen2MoeModel(LlamaModel):
    """Qwen2-MoE / Qwen1.5-MoE: the Qwen2 block with routed and shared experts (module docs)."""

    moe: MoeNames = GGUF_MOE_NAMES
    renorm: bool = False

    @classmethod
    def from_files(cls, files: ModelFiles) -> Qwen2MoeModel:
        """The definition for a Qwen2-MoE GGUF or HF directory.

        Raises:
            UnsupportedArchitectureError: no experts used per token; no shared expert (every
                released Qwen2-MoE has one); an HF config with dense layers
                (``mlp_only_layers``, ``decoder_sparse_step`` other than 1).
        """
        _check(files)
        h = files.hparams
        arch = h.architecture
        if files.kind != "gguf":
            cfg: dict[str, Any] = dict(files.config)
            dense = cfg.get("mlp_only_layers") or []
            if dense or cfg.get("decoder_sparse_step", 1) != 1:
                raise UnsupportedArchitectureError(
                    f"{files.path}: Qwen2-MoE with dense layers (mlp_only_layers {dense}, "
                    f"decoder_sparse_step {cfg.get('decoder_sparse_step', 1)})",
                    architecture=arch,
                )
            shared = "model.layers.0.mlp.shared_expert_gate.weight"
            renorm = bool(cfg.get("norm_topk_prob", False))
            moe = HF_QWEN2MOE_NAMES
        else:
            # llama.cpp's qwen2moe never renormalises (Qwen1.5-MoE: norm_topk_prob false).
            shared, renorm, moe = "blk.0.ffn_gate_inp_shexp.weight", False, GGUF_MOE_NAMES
        if h.expert_shared_ff <= 0 or not any(t.name == shared for t in files.tensors()):
            raise UnsupportedArchitectureError(
                f"{files.path}: a Qwen2-MoE checkpoint without a shared expert "
                f"(expert_shared_feed_forward_length, {shared})",
                architecture=arch,
            )
        return cls.neox(files, moe=moe, renorm=renorm)

    def ffn(self, t: Tracer, i: int, f: Value) -> Value:
        k = self.hparams.n_experts_used
        routed = moe_ffn(t, i, f, k, renorm=self.renorm, names=self.moe)
        return t.add(routed, shared_expert(t, i, f, self.moe))
