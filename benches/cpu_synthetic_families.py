"""Synthetic GGUF layouts of the families beyond Llama/Qwen2 for the CPU bench table: Qwen3,
Gemma 2, Gemma 3, Phi-3, and the mixture-of-experts families (Qwen3-MoE, Qwen2-MoE, OLMoE,
Mixtral) with experts stored as llama.cpp stores them (3-D ``ffn_*_exps`` tensors, the F32
router ``ffn_gate_inp``).

Each layout is the tensor list and the metadata llama.cpp's converter writes for that
architecture, at the real model's shapes (MoE models with fewer layers, said in the row's
label, so they fit a small machine; per-token work per layer is the real one). The vocabulary
is SentencePiece pieces ``w{i}`` (the bench feeds ids, never text), so any vocabulary size
loads in both poot and llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Tensor(NamedTuple):
    """One tensor: ``rows`` x ``cols`` (a vector: rows 1, F32), times ``experts`` when it is an
    expert stack ([experts, rows, cols] in GGUF's row-major order)."""

    name: str
    ty: str
    rows: int
    cols: int
    experts: int = 0


@dataclass(frozen=True)
class Family:
    """What a family adds to the llama layout (``cpu_synthetic.Shape`` holds the sizes)."""

    head_dim: int = 0  # 0: dim // heads
    qk_norm: str = ""  # "head": [head_dim] per head (Qwen3, Gemma 3); "full": OLMoE's full width
    gemma: int = 0  # 2 or 3: four norms per block, soft-caps (2), windows
    window: int = 0
    fused: bool = False  # Phi-3: attn_qkv and a gate+up ffn_up of twice the width
    experts: int = 0
    experts_used: int = 0
    expert_ff: int = 0
    shared_ff: int = 0  # Qwen2-MoE's shared expert (with its 1-D gate)
    tied: bool = True
    context: int = 4096


def _ty(quant: str, name: str) -> str:
    """A weight's type: ``quant``, or for "q4_k_m" llama.cpp's Q4_K_M choice simplified as
    the bench's other q4_k_m rows do (Q6_K for the embedding, output and down projections)."""
    if quant != "q4_k_m":
        return quant
    return "Q6_K" if name in ("token_embd", "output", "ffn_down", "ffn_down_exps") else "Q4_K"


def tensors(shape: Any, fam: Family, quant: str) -> list[Tensor]:
    """Every tensor of ``shape`` (a ``cpu_synthetic.Shape``) in file order."""
    d, h, hkv = shape.dim, shape.heads, shape.kv_heads
    hd = fam.head_dim or d // h
    out = [Tensor("token_embd.weight", _ty(quant, "token_embd"), shape.vocab, d)]
    for i in range(shape.layers):
        p = f"blk.{i}."
        out.append(Tensor(p + "attn_norm.weight", "F32", 1, d))
        if fam.fused:
            out.append(Tensor(p + "attn_qkv.weight", _ty(quant, "attn_qkv"), (h + 2 * hkv) * hd, d))
        else:
            for name, rows in (("attn_q", h * hd), ("attn_k", hkv * hd), ("attn_v", hkv * hd)):
                out.append(Tensor(p + name + ".weight", _ty(quant, name), rows, d))
                if shape.qkv_bias:
                    out.append(Tensor(p + name + ".bias", "F32", 1, rows))
        if fam.qk_norm == "head":
            out += [Tensor(p + "attn_q_norm.weight", "F32", 1, hd)]
            out += [Tensor(p + "attn_k_norm.weight", "F32", 1, hd)]
        elif fam.qk_norm == "full":
            out += [Tensor(p + "attn_q_norm.weight", "F32", 1, h * hd)]
            out += [Tensor(p + "attn_k_norm.weight", "F32", 1, hkv * hd)]
        out.append(Tensor(p + "attn_output.weight", _ty(quant, "attn_output"), d, h * hd))
        if fam.gemma:
            out.append(Tensor(p + "post_attention_norm.weight", "F32", 1, d))
        out.append(Tensor(p + "ffn_norm.weight", "F32", 1, d))
        out += _ffn(shape, fam, quant, p)
        if fam.gemma:
            out.append(Tensor(p + "post_ffw_norm.weight", "F32", 1, d))
    out.append(Tensor("output_norm.weight", "F32", 1, d))
    if not fam.tied:
        out.append(Tensor("output.weight", _ty(quant, "output"), shape.vocab, d))
    return out


def _ffn(shape: Any, fam: Family, quant: str, p: str) -> list[Tensor]:
    d = shape.dim
    if not fam.experts:
        up = 2 * shape.ffn if fam.fused else shape.ffn
        mats = [] if fam.fused else [("ffn_gate", shape.ffn, d)]
        mats += [("ffn_up", up, d), ("ffn_down", d, shape.ffn)]
        return [Tensor(p + n + ".weight", _ty(quant, n), r, c) for n, r, c in mats]
    e, f = fam.experts, fam.expert_ff
    out = [Tensor(p + "ffn_gate_inp.weight", "F32", e, d)]
    for name, rows, cols in (
        ("ffn_gate_exps", f, d),
        ("ffn_up_exps", f, d),
        ("ffn_down_exps", d, f),
    ):
        out.append(Tensor(p + name + ".weight", _ty(quant, name), rows, cols, e))
    if fam.shared_ff:
        s = fam.shared_ff
        out.append(Tensor(p + "ffn_gate_inp_shexp.weight", "F32", 1, d))
        for name, rows, cols in (
            ("ffn_gate_shexp", s, d),
            ("ffn_up_shexp", s, d),
            ("ffn_down_shexp", d, s),
        ):
            out.append(
                Tensor(p + name + ".weight", _ty(quant, name.replace("_shexp", "")), rows, cols)
            )
    return out


def metadata(w: Any, shape: Any, fam: Family) -> None:
    """The architecture's metadata (``w`` a ``gguf.GGUFWriter`` for ``shape.arch``)."""
    hd = fam.head_dim or shape.dim // shape.heads
    w.add_block_count(shape.layers)
    w.add_context_length(fam.context)
    w.add_embedding_length(shape.dim)
    w.add_feed_forward_length(fam.expert_ff if fam.experts and not shape.ffn else shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(shape.rope_base)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-6)
    if fam.window:
        w.add_sliding_window(fam.window)
    if fam.gemma == 2:
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    if fam.fused:
        w.add_uint32(f"{shape.arch}.rope.scaling.original_context_length", fam.context)
    if fam.experts:
        w.add_expert_count(fam.experts)
        w.add_expert_used_count(fam.experts_used)
        w.add_expert_feed_forward_length(fam.expert_ff)
    if fam.shared_ff:
        w.add_expert_shared_feed_forward_length(fam.shared_ff)
    # Plain pieces, and the special tokens llama.cpp looks up by text for some names (its
    # Phi-3 branch requires <unk>, <s>, </s> and <|endoftext|>), as control tokens.
    tokens = [f"w{i}" for i in range(shape.vocab)]
    types = [1] * shape.vocab
    special = {0: "<unk>", 1: "<s>", 2: "</s>", 32000: "<|endoftext|>"}
    for i, text in special.items():
        if i < shape.vocab:
            tokens[i], types[i] = text, 3
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * shape.vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
