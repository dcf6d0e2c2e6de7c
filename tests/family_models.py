"""Small random-weight checkpoints of the model families, and references to check poot against.

Tests only. For each family in ``FAMILIES`` (the family's real head shapes, few layers, a small
vocabulary and a sliding window short enough that a test's prompt crosses it):

- ``make_weights`` draws Hugging Face-named float32 weights from a seed;
- ``write_hf`` writes them as a HF directory (config.json + model.safetensors + tokenizer.json);
- ``write_gguf`` writes the same weights as the GGUF llama.cpp's converter makes (its tensor
  names, Gemma's norm weights stored as ``1 + w``, Llama q/k rows permuted for the interleaved
  RoPE, fused Phi-3 tensors kept fused);
- the references to check poot against live beside it: ``family_reference.py`` (a float64
  numpy forward pass written from transformers' modeling code, the fallback reference: no torch
  here) and ``family_llama_cpp.py`` (llama.cpp on a GGUF, the independent reference for GGUF
  files).

Files are cached under ``POOT_FAMILY_CACHE`` (default: a pytest tmp dir) by family and seed.
Run ``python tests/family_models.py OUT_DIR`` to write every family's files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

# Family -> config.json. The head shapes are the released models' (Qwen3-0.6B: head_dim 128,
# 2:1 GQA, q wider than hidden; Gemma 2/3: head_dim 256; Phi-3-mini: head_dim 96, fused
# tensors; Mistral 7B v0.1: every layer windowed).
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 256,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "sliding_window": 7,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    },
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    },
    "phi3": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 192,
        "intermediate_size": 320,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    # Phi-4-mini's shape of LongRoPE: head_dim 128, 3/4 of it rotating (48 factor pairs), GQA.
    "phi3_long": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 256,
        "intermediate_size": 320,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "partial_rotary_factor": 0.75,
        "vocab_size": 256,
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 64,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(48)],
            "long_factor": [1.0 + 0.9 * i for i in range(48)],
        },
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    # Llama 3.1's GGUF layout: interleaved RoPE (permuted q/k) with per-pair frequency divisors
    # in rope_freqs.weight (llama.cpp's converter bakes the llama3 rule into them). GGUF only.
    "llama31": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_freqs": [1.0] * 16 + [1.0 + 0.5 * i for i in range(32)] + [8.0] * 16,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    # Mixtral's layout (GGUF ``llama`` with experts), scaled down: 4 experts, 2 per token.
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 256,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    # Qwen3-30B-A3B's layout scaled down: per-head q/k norms, 8 experts of width 128, 2 per token.
    "qwen3moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 256,
        "intermediate_size": 384,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    # OLMoE's layout scaled down: q/k RMS-normed over their full width, weights not
    # renormalised; 8 experts, 2 per token.
    "olmoe": {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "hidden_size": 256,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 256,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 5,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
}

GGUF_ARCH = {
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "phi3_long": "phi3",
    "llama31": "llama",
    "mixtral": "llama",
    "qwen3moe": "qwen3moe",
    "olmoe": "olmoe",
    "mistral": "llama",
}


def head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def is_gemma(family: str) -> bool:
    return family.startswith("gemma")


def n_experts(family: str) -> int:
    cfg = FAMILIES[family]
    return int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)


def moe_hf_names(family: str) -> tuple[str, dict[str, str]]:
    """A MoE layer's router and per-expert names (``{j}``: the expert) under
    ``model.layers.{i}.``, as transformers names them."""
    if family == "mixtral":
        e = "block_sparse_moe.experts.{j}."
        return "block_sparse_moe.gate.weight", {
            "gate": e + "w1.weight",
            "up": e + "w3.weight",
            "down": e + "w2.weight",
        }
    e = "mlp.experts.{j}."
    return "mlp.gate.weight", {
        "gate": e + "gate_proj.weight",
        "up": e + "up_proj.weight",
        "down": e + "down_proj.weight",
    }


def expert_ff(family: str) -> int:
    cfg = FAMILIES[family]
    return int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])


def make_weights(family: str, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights of ``family`` drawn from ``seed``."""
    cfg = FAMILIES[family]
    rng = np.random.default_rng(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = head_dim(cfg)
    qw, kvw = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def mat(*shape: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Gemma stores w with the norm applying (1 + w); the others store w near 1.
        base = 0.0 if is_gemma(family) else 1.0
        return (base + mat(n, scale=0.1)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(v, d, scale=1.0 if not is_gemma(family) else 0.06)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        if family.startswith("phi3"):
            w[p + "self_attn.qkv_proj.weight"] = mat(qw + 2 * kvw, d)
            w[p + "mlp.gate_up_proj.weight"] = mat(2 * f, d)
        elif n_experts(family):
            w[p + "self_attn.q_proj.weight"] = mat(qw, d)
            w[p + "self_attn.k_proj.weight"] = mat(kvw, d)
            w[p + "self_attn.v_proj.weight"] = mat(kvw, d)
            fe = expert_ff(family)
            router, ex = moe_hf_names(family)
            w[p + router] = mat(n_experts(family), d, scale=1.0)
            for j in range(n_experts(family)):
                w[p + ex["gate"].format(j=j)] = mat(fe, d)
                w[p + ex["up"].format(j=j)] = mat(fe, d)
                w[p + ex["down"].format(j=j)] = mat(d, fe)
        else:
            w[p + "self_attn.q_proj.weight"] = mat(qw, d)
            w[p + "self_attn.k_proj.weight"] = mat(kvw, d)
            w[p + "self_attn.v_proj.weight"] = mat(kvw, d)
            w[p + "mlp.gate_proj.weight"] = mat(f, d)
            w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, qw)
        if not n_experts(family):
            w[p + "mlp.down_proj.weight"] = mat(d, f)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if family in ("qwen3", "gemma3", "qwen3moe"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        elif family == "olmoe":
            w[p + "self_attn.q_norm.weight"] = norm(qw)
            w[p + "self_attn.k_norm.weight"] = norm(kvw)
        if is_gemma(family):
            w[p + "pre_feedforward_layernorm.weight"] = norm(d)
            w[p + "post_feedforward_layernorm.weight"] = norm(d)
    w["model.norm.weight"] = norm(d)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(v, d)
    return w


def longrope(family: str, long: bool) -> tuple[np.ndarray, float] | None:
    """(ext_factors, attention_factor) of a LongRoPE family, HF's recipe; None for others."""
    cfg = FAMILIES[family]
    if "rope_freqs" in cfg:
        return np.asarray(cfg["rope_freqs"], np.float64), 1.0
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type") not in ("longrope", "su"):
        return None
    orig = cfg["original_max_position_embeddings"]
    factor = cfg["max_position_embeddings"] / orig
    attn = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 else 1.0
    return np.asarray(rs["long_factor" if long else "short_factor"], np.float64), attn


# ---------------------------------------------------------------------------------------------
# Writers.


def _tokenizer_json(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def write_hf(directory: Path, family: str, w: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(FAMILIES[family]))
    save_file(w, str(directory / "model.safetensors"))
    _tokenizer_json(directory / "tokenizer.json", FAMILIES[family]["vocab_size"])
    return directory


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _permute(wt: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row permutation for Llama-architecture GGUFs."""
    return (
        wt.reshape(n_head, 2, wt.shape[0] // n_head // 2, *wt.shape[1:])
        .swapaxes(1, 2)
        .reshape(wt.shape)
    )


def gguf_tensors(family: str, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The GGUF tensors llama.cpp's converter makes from the HF weights ``w``."""
    cfg = FAMILIES[family]
    out: dict[str, np.ndarray] = {}
    router, ex = moe_hf_names(family)
    for name, arr in w.items():
        if ".experts." in name:
            continue  # packed below
        if n_experts(family) and name.endswith("." + router):
            layer = name.split(".")[2]
            out[f"blk.{layer}.ffn_gate_inp.weight"] = arr
            for hf, gg in (
                ("gate", "ffn_gate_exps"),
                ("up", "ffn_up_exps"),
                ("down", "ffn_down_exps"),
            ):
                out[f"blk.{layer}.{gg}.weight"] = np.stack(
                    [
                        w[f"model.layers.{layer}." + ex[hf].format(j=j)]
                        for j in range(n_experts(family))
                    ]
                )
            continue
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            if rest == "post_attention_layernorm.weight":
                leaf = "post_attention_norm.weight" if is_gemma(family) else "ffn_norm.weight"
            else:
                leaf = _LAYER_NAMES[rest]
            gname = f"blk.{layer}.{leaf}"
            if GGUF_ARCH[family] == "llama" and rest == "self_attn.q_proj.weight":
                arr = _permute(arr, cfg["num_attention_heads"])
            elif GGUF_ARCH[family] == "llama" and rest == "self_attn.k_proj.weight":
                arr = _permute(arr, cfg["num_key_value_heads"])
        if is_gemma(family) and name.endswith("norm.weight"):
            arr = (arr + 1.0).astype(np.float32)  # the converter folds Gemma's (1 + w)
        out[gname] = arr
    return out


def write_gguf(path: Path, family: str, w: dict[str, np.ndarray]) -> Path:
    import gguf

    cfg = FAMILIES[family]
    arch = GGUF_ARCH[family]
    hd = head_dim(cfg)
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_key_length(hd)
    wr.add_value_length(hd)
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_rope_dimension_count(int(hd * cfg.get("partial_rotary_factor", 1.0)))
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("sliding_window"):
        wr.add_sliding_window(cfg["sliding_window"])
    if family == "gemma2":
        wr.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        wr.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if family == "gemma3":
        types = cfg["layer_types"]
        wr.add_array(
            f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in types]
        )
        wr.add_float32(f"{arch}.rope.freq_base_swa", cfg["rope_local_base_freq"])
    if family.startswith("phi3"):
        wr.add_uint32(
            f"{arch}.rope.scaling.original_context_length", cfg["original_max_position_embeddings"]
        )
    if n_experts(family):
        wr.add_expert_count(n_experts(family))
        wr.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            wr.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if "rope_freqs" in cfg:
        wr.add_tensor("rope_freqs.weight", np.asarray(cfg["rope_freqs"], np.float32))
    lr = longrope(family, False) if "rope_freqs" not in cfg else None
    if lr is not None:
        # llama.cpp's converter: the factors as tensors, HF's attention factor as metadata.
        wr.add_float32(f"{arch}.rope.scaling.attn_factor", lr[1])
        for which in ("long", "short"):
            ext = np.asarray(cfg["rope_scaling"][f"{which}_factor"], np.float32)
            wr.add_tensor(f"rope_factors_{which}.weight", ext)
    # A SentencePiece vocabulary of plain pieces: the tests feed token ids, not text.
    v = cfg["vocab_size"]
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"w{i}" for i in range(v)])
    wr.add_token_scores([0.0] * v)
    wr.add_token_types([1] * v)
    wr.add_bos_token_id(cfg["bos_token_id"])
    wr.add_eos_token_id(cfg["eos_token_id"])
    for name, arr in gguf_tensors(family, w).items():
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def write_family(root: Path, family: str, seed: int = 0) -> dict[str, Any]:
    """Writes (or reuses) ``family``'s HF dir and GGUF under ``root``; returns weights and paths."""
    w = make_weights(family, seed)
    d = root / f"{family}-s{seed}"
    hf, gg = d / "hf", d / f"{family}-tiny-f32.gguf"
    if not (hf / "model.safetensors").is_file():
        write_hf(hf, family, w)
    if not gg.is_file():
        d.mkdir(parents=True, exist_ok=True)
        write_gguf(gg.with_suffix(".tmp"), family, w)
        gg.with_suffix(".tmp").rename(gg)
    return {"family": family, "weights": w, "hf": hf, "gguf": gg}


if __name__ == "__main__":
    import sys

    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "family-models")
    for fam in FAMILIES:
        print(write_family(out_dir, fam)["gguf"])
