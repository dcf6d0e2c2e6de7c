"""Packed experts stay packed: generating with a mixture-of-experts GGUF raises resident memory
by at most 1.15x the file size plus the KV pool (``test_memory.py``'s bound, for MoE).

The checkpoint is written here: Qwen3-MoE's layout with 32 experts of width 512 over 4 layers,
Q8_0 (about 110 MB, nearly all of it experts), random weights. Measured in a fresh interpreter
from /proc's VmRSS, after the imports and before the model is opened. Each expert is re-laid 8
rows at a time (as dense Q8_0 weights are) the first time a step selects it, and its stored pages
are then released, so every expert read is resident once, in the re-laid copy: measured growth
114.2 MiB for the 106.5 MiB file after 24 tokens (112.5 MiB when compiling re-laid every expert,
105.8 MiB when the experts were read through the map; the copy's huge pages round up).
The same layout as an HF directory (F16, 16 experts a layer stored one tensor each) is read in
place through the store's expert stacks: measured 102.4 MiB for the 104.1 MiB safetensors file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from memory_probe import check_growth, measure, needs_proc

D, HEADS, KV_HEADS, HEAD_DIM, LAYERS, EXPERTS, USED, FF, VOCAB = 512, 8, 4, 64, 4, 32, 4, 512, 1024


def _write(path: Path) -> Path:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    q8 = gguf.GGMLQuantizationType.Q8_0

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    wr = gguf.GGUFWriter(str(path), "qwen3moe")
    wr.add_context_length(512)
    wr.add_embedding_length(D)
    wr.add_block_count(LAYERS)
    wr.add_feed_forward_length(FF)
    wr.add_expert_feed_forward_length(FF)
    wr.add_expert_count(EXPERTS)
    wr.add_expert_used_count(USED)
    wr.add_head_count(HEADS)
    wr.add_head_count_kv(KV_HEADS)
    wr.add_key_length(HEAD_DIM)
    wr.add_value_length(HEAD_DIM)
    wr.add_rope_freq_base(1e6)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_tokenizer_model("llama")
    wr.add_token_list([f"w{i}" for i in range(VOCAB)])
    wr.add_token_scores([0.0] * VOCAB)
    wr.add_token_types([1] * VOCAB)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)

    def packed(name: str, arr: np.ndarray) -> None:
        wr.add_tensor(name, quantize(arr, q8), raw_dtype=q8)

    packed("token_embd.weight", mat(VOCAB, D))
    packed("output.weight", mat(VOCAB, D))
    wr.add_tensor("output_norm.weight", np.ones(D, np.float32))
    for i in range(LAYERS):
        p = f"blk.{i}."
        for n in ("attn_norm", "ffn_norm"):
            wr.add_tensor(p + n + ".weight", np.ones(D, np.float32))
        for n in ("attn_q_norm", "attn_k_norm"):
            wr.add_tensor(p + n + ".weight", np.ones(HEAD_DIM, np.float32))
        packed(p + "attn_q.weight", mat(HEADS * HEAD_DIM, D))
        packed(p + "attn_k.weight", mat(KV_HEADS * HEAD_DIM, D))
        packed(p + "attn_v.weight", mat(KV_HEADS * HEAD_DIM, D))
        packed(p + "attn_output.weight", mat(D, HEADS * HEAD_DIM))
        wr.add_tensor(p + "ffn_gate_inp.weight", mat(EXPERTS, D))
        packed(p + "ffn_gate_exps.weight", mat(EXPERTS, FF, D))
        packed(p + "ffn_up_exps.weight", mat(EXPERTS, FF, D))
        packed(p + "ffn_down_exps.weight", mat(EXPERTS, D, FF))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _measure(model: Path) -> dict[str, Any]:
    m = measure(
        model,
        max_model_len=512,
        num_blocks=32,
        prompt=[1, 17, 93, 5, 64, 120, 33, 8],
        max_tokens=16,
        ignore_eos=True,
    )
    assert m["tokens"] == 16 and m["family"] == "Qwen3MoeModel"
    return m


@needs_proc
def test_moe_resident_memory_is_close_to_the_file_size(tmp_path: Path) -> None:
    path = _write(tmp_path / "qwen3moe-32x512-q8_0.gguf")
    check_growth(_measure(path), path.stat().st_size)


def _write_hf(d: Path) -> Path:
    """The same layout as a HF directory: F16, 16 experts a layer stored one tensor each
    (transformers' Qwen3-MoE names), about 100 MB, nearly all of it experts."""
    from family_models import _tokenizer_json
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    experts = EXPERTS // 2

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)

    w = {"model.embed_tokens.weight": mat(VOCAB, D), "lm_head.weight": mat(VOCAB, D)}
    w["model.norm.weight"] = np.ones(D, np.float16)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            w[p + n + ".weight"] = np.ones(D, np.float16)
        for n in ("q_norm", "k_norm"):
            w[p + f"self_attn.{n}.weight"] = np.ones(HEAD_DIM, np.float16)
        for n, rows in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            w[p + f"self_attn.{n}_proj.weight"] = mat(rows * HEAD_DIM, D)
        w[p + "self_attn.o_proj.weight"] = mat(D, HEADS * HEAD_DIM)
        w[p + "mlp.gate.weight"] = mat(experts, D)
        for j in range(experts):
            w[p + f"mlp.experts.{j}.gate_proj.weight"] = mat(FF, D)
            w[p + f"mlp.experts.{j}.up_proj.weight"] = mat(FF, D)
            w[p + f"mlp.experts.{j}.down_proj.weight"] = mat(D, FF)
    d.mkdir(parents=True)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": D,
        "intermediate_size": FF,
        "moe_intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_experts": experts,
        "num_experts_per_tok": USED,
        "norm_topk_prob": True,
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }
    (d / "config.json").write_text(json.dumps(config))
    save_file(w, str(d / "model.safetensors"))
    _tokenizer_json(d / "tokenizer.json", VOCAB)
    return d


@needs_proc
def test_hf_experts_are_read_in_place(tmp_path: Path) -> None:
    """An HF directory's experts (one tensor each) are read where they are mapped: the same
    bound as the GGUF's, against the safetensors file's size."""
    d = _write_hf(tmp_path / "qwen3moe-hf")
    check_growth(_measure(d), (d / "model.safetensors").stat().st_size)
