"""Qwen2 (q/k/v biases, untied head, NeoX rope, GQA) on a tiny random-weight model.

The test writes the model itself, as a Hugging Face directory and as a GGUF file holding the
same weights, and checks poot's logits and greedy ids against an independent float64 numpy
forward pass written here, following transformers' Qwen2 modeling code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot

CFG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
HEAD_DIM = CFG["hidden_size"] // CFG["num_attention_heads"]


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, f, v = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    kv = CFG["num_key_value_heads"] * HEAD_DIM

    def mat(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(v, d, scale=0.5)}
    for i in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1.0 + mat(d, scale=0.1)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(d, d)
        w[p + "self_attn.q_proj.bias"] = mat(d, scale=0.2)
        w[p + "self_attn.k_proj.weight"] = mat(kv, d)
        w[p + "self_attn.k_proj.bias"] = mat(kv, scale=0.2)
        w[p + "self_attn.v_proj.weight"] = mat(kv, d)
        w[p + "self_attn.v_proj.bias"] = mat(kv, scale=0.2)
        w[p + "self_attn.o_proj.weight"] = mat(d, d)
        w[p + "post_attention_layernorm.weight"] = (1.0 + mat(d, scale=0.1)).astype(np.float32)
        w[p + "mlp.gate_proj.weight"] = mat(f, d)
        w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
    w["model.norm.weight"] = (1.0 + mat(d, scale=0.1)).astype(np.float32)
    w["lm_head.weight"] = mat(v, d, scale=0.3)
    return w


def _rms_norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + CFG["rms_norm_eps"]) * w


def _rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """NeoX / rotate_half on [T, H, Dh]."""
    half = HEAD_DIM // 2
    inv_freq = 1.0 / (CFG["rope_theta"] ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM))
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def reference_logits(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """All positions' logits [T, V], in float64."""
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    t = len(ids)
    h, hkv = CFG["num_attention_heads"], CFG["num_key_value_heads"]
    pos = np.arange(t)
    x = w64["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for i in range(CFG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms_norm(x, w64[p + "input_layernorm.weight"])
        q = a @ w64[p + "self_attn.q_proj.weight"].T + w64[p + "self_attn.q_proj.bias"]
        k = a @ w64[p + "self_attn.k_proj.weight"].T + w64[p + "self_attn.k_proj.bias"]
        v = a @ w64[p + "self_attn.v_proj.weight"].T + w64[p + "self_attn.v_proj.bias"]
        q = _rope(q.reshape(t, h, HEAD_DIM), pos)
        k = _rope(k.reshape(t, hkv, HEAD_DIM), pos)
        v = v.reshape(t, hkv, HEAD_DIM)
        k = np.repeat(k, h // hkv, axis=1)
        v = np.repeat(v, h // hkv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(HEAD_DIM) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(t, h * HEAD_DIM)
        x = x + attn @ w64[p + "self_attn.o_proj.weight"].T
        m = _rms_norm(x, w64[p + "post_attention_layernorm.weight"])
        gate = m @ w64[p + "mlp.gate_proj.weight"].T
        up = m @ w64[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w64[p + "mlp.down_proj.weight"].T
    x = _rms_norm(x, w64["model.norm.weight"])
    return x @ w64["lm_head.weight"].T


def _tokenizer_json(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(CFG["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def write_hf(dirpath: Path, w: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "config.json").write_text(json.dumps(CFG))
    save_file(w, str(dirpath / "model.safetensors"))
    _tokenizer_json(dirpath / "tokenizer.json")
    return dirpath


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(path: Path, w: dict[str, np.ndarray]) -> Path:
    """The same weights as a qwen2 GGUF, named and laid out as llama.cpp's converter does
    (qwen2 keeps q/k unpermuted: NeoX rope)."""
    import gguf

    wr = gguf.GGUFWriter(str(path), "qwen2")
    wr.add_context_length(CFG["max_position_embeddings"])
    wr.add_embedding_length(CFG["hidden_size"])
    wr.add_block_count(CFG["num_hidden_layers"])
    wr.add_feed_forward_length(CFG["intermediate_size"])
    wr.add_head_count(CFG["num_attention_heads"])
    wr.add_head_count_kv(CFG["num_key_value_heads"])
    wr.add_rope_freq_base(CFG["rope_theta"])
    wr.add_layer_norm_rms_eps(CFG["rms_norm_eps"])
    # A SentencePiece vocabulary of plain pieces: the tests feed token ids, not text.
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"w{i}" for i in range(CFG["vocab_size"])])
    wr.add_token_scores([0.0] * CFG["vocab_size"])
    wr.add_token_types([1] * CFG["vocab_size"])
    wr.add_bos_token_id(CFG["bos_token_id"])
    wr.add_eos_token_id(CFG["eos_token_id"])
    for name, arr in w.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{_GGUF_NAMES[rest]}"
        wr.add_tensor(gname, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("qwen2-tiny")
    w = _weights()
    return {
        "weights": w,
        "hf": write_hf(root / "hf", w),
        "gguf": write_gguf(root / "qwen2-tiny-f32.gguf", w),
    }


PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77]


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_logits_match_numpy_forward(tiny: dict[str, Any], form: str) -> None:
    llm = poot.LLM(str(tiny[form]), threads=1)
    ref = reference_logits(tiny["weights"], PROMPT)[-1]
    got = llm.logits(PROMPT)
    assert got.dtype == np.float32 and got.shape == (CFG["vocab_size"],)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_greedy_ids_match_numpy_forward(tiny: dict[str, Any], form: str) -> None:
    llm = poot.LLM(str(tiny[form]), threads=1)
    params = poot.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    ids = list(PROMPT)
    for _ in range(12):
        ids.append(int(np.argmax(reference_logits(tiny["weights"], ids)[-1])))
    assert list(got) == ids[len(PROMPT) :]
