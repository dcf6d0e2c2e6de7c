"""A small random-weight Qwen2-MoE (Qwen1.5-MoE) checkpoint and its float64 reference.

Tests only. Qwen1.5-MoE-A2.7B's layout scaled down: the Qwen2 block (q/k/v biases, NeoX RoPE,
2 heads of 128), 8 routed experts of width 128 with 4 per token, weights *not* renormalised
(``norm_topk_prob`` false), and a shared SwiGLU expert of width 384 scaled by
``sigmoid(x . shared_expert_gate)``.

- ``make_weights``: HF-named float32 weights from a seed;
- ``write_hf``: config.json + model.safetensors (experts one tensor each, as HF stores them);
- ``write_gguf``: the GGUF llama.cpp's converter makes (``qwen2moe``: experts packed
  [E, F, D], the shared expert's gate as the 1-D ``ffn_gate_inp_shexp`` [D]);
- ``reference_logits``: a float64 numpy forward written from transformers'
  ``modeling_qwen2_moe`` (``Qwen2MoeSparseMoeBlock``: softmax over the router's logits, top-k,
  no renormalisation unless ``norm_topk_prob``, plus ``sigmoid(shared_expert_gate(x)) *
  shared_expert(x)``): no torch here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_experts": 8,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
HEAD_DIM = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights drawn from ``seed``."""
    c = CONFIG
    rng = np.random.default_rng(seed)
    d, v, e = c["hidden_size"], c["vocab_size"], c["num_experts"]
    fe, fs = c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    qw, kvw = c["num_attention_heads"] * HEAD_DIM, c["num_key_value_heads"] * HEAD_DIM

    def mat(*shape: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(v, d, scale=1.0)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1.0 + mat(d, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1.0 + mat(d, scale=0.1)
        for name, rows in (("q", qw), ("k", kvw), ("v", kvw)):
            w[p + f"self_attn.{name}_proj.weight"] = mat(rows, d)
            w[p + f"self_attn.{name}_proj.bias"] = mat(rows, scale=0.5)
        w[p + "self_attn.o_proj.weight"] = mat(d, qw)
        # Scaled so a token's top-k probabilities sum well below 1 (renormalising matters).
        w[p + "mlp.gate.weight"] = mat(e, d, scale=0.1)
        for j in range(e):
            w[p + f"mlp.experts.{j}.gate_proj.weight"] = mat(fe, d)
            w[p + f"mlp.experts.{j}.up_proj.weight"] = mat(fe, d)
            w[p + f"mlp.experts.{j}.down_proj.weight"] = mat(d, fe)
        w[p + "mlp.shared_expert.gate_proj.weight"] = mat(fs, d)
        w[p + "mlp.shared_expert.up_proj.weight"] = mat(fs, d)
        w[p + "mlp.shared_expert.down_proj.weight"] = mat(d, fs)
        # Scaled so the gates spread over (0, 1) rather than sitting at 0.5.
        w[p + "mlp.shared_expert_gate.weight"] = mat(1, d, scale=0.2)
    w["model.norm.weight"] = 1.0 + mat(d, scale=0.1)
    w["lm_head.weight"] = mat(v, d)
    return {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in w.items()}


def write_hf(directory: Path, w: dict[str, np.ndarray], config: dict | None = None) -> Path:
    from family_models import _tokenizer_json
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or CONFIG))
    save_file(w, str(directory / "model.safetensors"))
    _tokenizer_json(directory / "tokenizer.json", CONFIG["vocab_size"])
    return directory


_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_SHARED = {"gate_proj": "ffn_gate_shexp", "up_proj": "ffn_up_shexp", "down_proj": "ffn_down_shexp"}
_EXPS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def gguf_tensors(w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors of llama.cpp's converter (``Qwen2MoeModel``) for the HF weights ``w``."""
    c = CONFIG
    out = {
        "token_embd.weight": w["model.embed_tokens.weight"],
        "output_norm.weight": w["model.norm.weight"],
        "output.weight": w["lm_head.weight"],
    }
    for i in range(c["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = w[p + "input_layernorm.weight"]
        out[b + "ffn_norm.weight"] = w[p + "post_attention_layernorm.weight"]
        for hf, gg in _ATTN.items():
            out[b + gg + ".weight"] = w[p + f"self_attn.{hf}.weight"]
            if hf != "o_proj":
                out[b + gg + ".bias"] = w[p + f"self_attn.{hf}.bias"]
        out[b + "ffn_gate_inp.weight"] = w[p + "mlp.gate.weight"]
        for hf, gg in _EXPS.items():
            out[b + gg + ".weight"] = np.stack(
                [w[p + f"mlp.experts.{j}.{hf}.weight"] for j in range(c["num_experts"])]
            )
        for hf, gg in _SHARED.items():
            out[b + gg + ".weight"] = w[p + f"mlp.shared_expert.{hf}.weight"]
        out[b + "ffn_gate_inp_shexp.weight"] = w[p + "mlp.shared_expert_gate.weight"].reshape(-1)
    return out


def write_gguf(path: Path, w: dict[str, np.ndarray], shared: bool = True) -> Path:
    """The GGUF; ``shared=False`` leaves the shared expert out (a file poot must refuse)."""
    import gguf

    c = CONFIG
    wr = gguf.GGUFWriter(str(path), "qwen2moe")
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_block_count(c["num_hidden_layers"])
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(c["num_attention_heads"])
    wr.add_head_count_kv(c["num_key_value_heads"])
    wr.add_rope_freq_base(c["rope_theta"])
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_expert_count(c["num_experts"])
    wr.add_expert_used_count(c["num_experts_per_tok"])
    wr.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if shared:
        wr.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    v = c["vocab_size"]
    # A SentencePiece vocabulary of plain pieces: the tests feed token ids, not text.
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"w{i}" for i in range(v)])
    wr.add_token_scores([0.0] * v)
    wr.add_token_types([1] * v)
    wr.add_bos_token_id(c["bos_token_id"])
    wr.add_eos_token_id(c["eos_token_id"])
    for name, arr in gguf_tensors(w).items():
        if shared or "shexp" not in name:
            wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    eps = CONFIG["rms_norm_eps"]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """rotate_half RoPE of x [T, H, Dh]."""
    half = HEAD_DIM // 2
    inv = 1.0 / CONFIG["rope_theta"] ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    g = x @ gate.T
    return ((g / (1.0 + np.exp(-g))) * (x @ up.T)) @ down.T


def _moe(w: dict[str, np.ndarray], p: str, m: np.ndarray) -> np.ndarray:
    """transformers' Qwen2MoeSparseMoeBlock."""
    c = CONFIG
    logits = m @ w[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(m)
    for t in range(m.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[: c["num_experts_per_tok"]]
        wts = probs[t, top]
        if c["norm_topk_prob"]:
            wts = wts / wts.sum()
        for e, wt in zip(top, wts, strict=True):
            q = f"{p}mlp.experts.{e}."
            out[t] += wt * _swiglu(
                m[t], w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"]
            )
    s = p + "mlp.shared_expert."
    shared = _swiglu(
        m, w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"]
    )
    gate = 1.0 / (1.0 + np.exp(-(m @ w[p + "mlp.shared_expert_gate.weight"].T)))
    return out + gate * shared


def reference_logits(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """All positions' logits [T, V] in float64."""
    c = CONFIG
    w = {k: a.astype(np.float64) for k, a in w.items()}
    t, h, hkv = len(ids), c["num_attention_heads"], c["num_key_value_heads"]
    pos = np.arange(t)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (
            a @ w[p + f"self_attn.{n}_proj.weight"].T + w[p + f"self_attn.{n}_proj.bias"]
            for n in "qkv"
        )
        q = _rope(q.reshape(t, h, HEAD_DIM), pos)
        k = _rope(k.reshape(t, hkv, HEAD_DIM), pos)
        v = v.reshape(t, hkv, HEAD_DIM)
        k, v = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * HEAD_DIM**-0.5
        s = np.where((pos[:, None] >= pos[None, :])[None], s, -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        att = np.einsum("hts,shd->thd", e / e.sum(axis=-1, keepdims=True), v).reshape(t, -1)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        x = x + _moe(w, p, _rms(x, w[p + "post_attention_layernorm.weight"]))
    return _rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def reference_greedy(w: dict[str, np.ndarray], prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(reference_logits(w, ids)[-1])))
    return ids[len(prompt) :]
