"""Synthetic GGUFs for the CPU bench table: real model shapes, random weights.

Speed depends on shapes and storage types, not on values, so a file with the layer layout,
head counts and tensor types of Llama 3.2 1B or Qwen2 0.5B measures what those models would.
Weights are random bytes with every block scale set to a small finite f16 (so no NaN or
subnormal arithmetic), float weights small normals. The vocabulary is SmolLM2's tokenizer
padded with unreachable tokens to the real model's vocabulary size, so the LM head has the
real shape and both poot and llama.cpp load the file. Files are cached under
``$XDG_CACHE_HOME/poot/bench-gguf`` (never in the repository) and rebuilt only when missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cpu_synthetic_families import Family, Tensor, metadata, tensors

# Bytes per block and the byte offsets of the f16 scale fields, per ggml type name.
_BLOCKS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    # name: (elements per block, bytes per block, f16 scale offsets)
    "Q4_0": (32, 18, (0,)),
    "Q4_1": (32, 20, (0, 2)),
    "Q5_0": (32, 22, (0,)),
    "Q8_0": (32, 34, (0,)),
    "Q4_K": (256, 144, (0, 2)),
    "Q6_K": (256, 210, (208,)),
}


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (the fields GGUF metadata needs)."""

    arch: str
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_base: float
    qkv_bias: bool = False
    tag: str = ""
    family: Family | None = None  # the layouts of cpu_synthetic_families; None: llama/qwen2


LLAMA_1B = Shape("llama", 2048, 16, 32, 8, 8192, 128256, 500000.0, tag="llama32-1b")
QWEN2_05B = Shape("qwen2", 896, 24, 14, 2, 4864, 151936, 1000000.0, qkv_bias=True, tag="qwen2-0.5b")
# Qwen2.5-1.5B: dim 1536, 28 layers, 12/2 heads (head_dim 128), FFN 8960, tied embeddings.
QWEN25_15B = Shape(
    "qwen2", 1536, 28, 12, 2, 8960, 151936, 1000000.0, qkv_bias=True, tag="qwen2.5-1.5b"
)
# The families of issue 28 at their real shapes (MoE models with fewer layers: the label says).
QWEN3_06B = Shape(
    "qwen3", 1024, 28, 16, 8, 3072, 151936, 1000000.0, tag="qwen3-0.6b",
    family=Family(head_dim=128, qk_norm="head", context=40960),
)  # fmt: skip
GEMMA2_2B = Shape(
    "gemma2", 2304, 26, 8, 4, 9216, 256000, 10000.0, tag="gemma2-2b",
    family=Family(head_dim=256, gemma=2, window=4096, context=8192),
)  # fmt: skip
GEMMA3_1B = Shape(
    "gemma3", 1152, 26, 4, 1, 6912, 262144, 1000000.0, tag="gemma3-1b",
    family=Family(head_dim=256, qk_norm="head", gemma=3, window=512, context=32768),
)  # fmt: skip
PHI35_MINI = Shape(
    "phi3", 3072, 32, 32, 32, 8192, 32064, 10000.0, tag="phi3.5-mini",
    family=Family(fused=True, tied=False, context=4096),
)  # fmt: skip
# Qwen3-30B-A3B: 48 layers of 128 experts (width 768, 8 per token), 32/4 heads of 128.
QWEN3_30B_A3B = Shape(
    "qwen3moe", 2048, 8, 32, 4, 768, 151936, 1000000.0, tag="qwen3-30b-a3b-8l",
    family=Family(head_dim=128, qk_norm="head", experts=128, experts_used=8, expert_ff=768,
                  tied=False, context=40960),
)  # fmt: skip
# Qwen1.5-MoE-A2.7B: 24 layers of 60 experts (width 1408, 4 per token) and a shared expert.
QWEN15_MOE = Shape(
    "qwen2moe", 2048, 6, 16, 16, 1408, 151936, 1000000.0, qkv_bias=True, tag="qwen1.5-moe-6l",
    family=Family(experts=60, experts_used=4, expert_ff=1408, shared_ff=5632, tied=False,
                  context=8192),
)  # fmt: skip
# OLMoE-1B-7B: 16 layers of 64 experts (width 1024, 8 per token), full-width q/k norms.
OLMOE_1B_7B = Shape(
    "olmoe", 2048, 8, 16, 16, 1024, 50304, 10000.0, tag="olmoe-1b-7b-8l",
    family=Family(qk_norm="full", experts=64, experts_used=8, expert_ff=1024, tied=False),
)  # fmt: skip
# Mixtral-8x7B: 32 layers of 8 experts (width 14336, 2 per token), 32/8 heads of 128.
MIXTRAL_8X7B = Shape(
    "llama", 4096, 2, 32, 8, 14336, 32000, 1000000.0, tag="mixtral-8x7b-2l",
    family=Family(experts=8, experts_used=2, expert_ff=14336, tied=False, context=32768),
)  # fmt: skip


def with_layers(shape: Shape, layers: int) -> Shape:
    """``shape`` with ``layers`` layers (a quick check of a row's code path, not a measurement)."""
    import dataclasses

    return dataclasses.replace(shape, layers=layers, tag=f"{shape.tag}-{layers}l-check")


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    d = base / "poot" / "bench-gguf"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _types(shape: Shape, quant: str, layer: int, name: str) -> str:
    """The storage type of one 2D weight. ``quant`` "mix" is Qwen2 Q4_K_M's choice: rows of
    896 are not whole 256-blocks, so q/k/o/gate/up are Q5_0, v alternates Q8_0/Q5_0 and the
    down projection (rows of 4864) alternates Q6_K/Q4_K; the tied embedding is Q8_0."""
    if quant == "q4_k_m":
        # A real Qwen2.5-1.5B Q4_K_M's mix: Q4_K, with Q6_K for ffn_down and the (tied) output.
        return "Q6_K" if name in ("token_embd", "ffn_down") else "Q4_K"
    if quant != "mix":
        return quant
    if name == "token_embd":
        return "Q8_0"
    if name == "attn_v":
        return "Q8_0" if layer % 2 == 0 else "Q5_0"
    if name == "ffn_down":
        return "Q6_K" if layer % 2 == 0 else "Q4_K"
    return "Q5_0"


def _tensors(shape: Shape, quant: str) -> list[tuple[str, str, int, int]]:
    """(name, type, rows, cols) of every tensor, in file order (the LM head is tied)."""
    hd = shape.dim // shape.heads
    out = [("token_embd.weight", _types(shape, quant, 0, "token_embd"), shape.vocab, shape.dim)]
    for i in range(shape.layers):
        p = f"blk.{i}."
        mats = [
            ("attn_q", shape.heads * hd, shape.dim),
            ("attn_k", shape.kv_heads * hd, shape.dim),
            ("attn_v", shape.kv_heads * hd, shape.dim),
            ("attn_output", shape.dim, shape.heads * hd),
            ("ffn_gate", shape.ffn, shape.dim),
            ("ffn_up", shape.ffn, shape.dim),
            ("ffn_down", shape.dim, shape.ffn),
        ]
        out.append((p + "attn_norm.weight", "F32", 1, shape.dim))
        out.append((p + "ffn_norm.weight", "F32", 1, shape.dim))
        for name, rows, cols in mats:
            out.append((p + name + ".weight", _types(shape, quant, i, name), rows, cols))
        if shape.qkv_bias:
            for name, rows in (("attn_q", shape.heads), ("attn_k", shape.kv_heads)):
                out.append((p + name + ".bias", "F32", 1, rows * hd))
            out.append((p + "attn_v.bias", "F32", 1, shape.kv_heads * hd))
    out.append(("output_norm.weight", "F32", 1, shape.dim))
    return out


def _data(rng: np.random.Generator, ty: str, rows: int, cols: int, name: str) -> np.ndarray:
    if ty == "F32":
        if rows > 1:  # a router: small normals, so tokens choose different experts
            return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        if name.endswith(".bias"):
            return (rng.standard_normal(cols, dtype=np.float32) * 0.02).astype(np.float32)
        return np.ones(cols, dtype=np.float32)
    if ty in ("F16", "BF16"):
        out = np.empty((rows, cols), dtype=np.float16 if ty == "F16" else np.uint16)
        step = max(1, (1 << 24) // cols)
        for r in range(0, rows, step):
            v = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32) * 0.02
            if ty == "F16":
                out[r : r + step] = v.astype(np.float16)
            else:
                out[r : r + step] = (v.view(np.uint32) >> 16).astype(np.uint16)
        return out
    per, nbytes, scales = _BLOCKS[ty]
    blocks = rows * cols // per
    raw = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    for off in scales:
        raw[:, off : off + 2] = scale
    if ty == "Q4_K":
        raw[:, 4:16] &= 0x3F  # 6-bit scales/mins, keep them moderate
    return raw.reshape(rows, cols // per * nbytes)


def _tokenizer_fields(
    writer: object, smollm_path: Path, vocab: int
) -> None:  # pragma: no cover - exercised by the bench
    import gguf

    r = gguf.GGUFReader(str(smollm_path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    pad = vocab - len(tokens)
    w = writer
    w.add_tokenizer_model("gpt2")  # type: ignore[attr-defined]
    w.add_tokenizer_pre("smollm")  # type: ignore[attr-defined]
    w.add_token_list(list(tokens) + [f"<unused_{i}>" for i in range(pad)])  # type: ignore[attr-defined]
    w.add_token_types(list(types) + [1] * pad)  # type: ignore[attr-defined]
    w.add_token_merges(list(merges))  # type: ignore[attr-defined]
    w.add_bos_token_id(1)  # type: ignore[attr-defined]
    w.add_eos_token_id(2)  # type: ignore[attr-defined]
    w.add_add_bos_token(False)  # type: ignore[attr-defined]


def synthetic_gguf(shape: Shape, quant: str, smollm_path: Path | None) -> Path:
    """The cached synthetic GGUF of ``shape`` stored as ``quant`` (a ggml type name, "mix" or
    "q4_k_m"), written through the ``gguf`` package on first use. ``smollm_path`` lends its
    tokenizer to the llama/qwen2 shapes; the families' shapes carry their own."""
    import gguf

    tag = shape.tag
    path = cache_dir() / f"synthetic-{tag}-{quant}.gguf"
    if path.is_file():
        return path
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), shape.arch)
    w.add_name(f"synthetic {tag} {quant}")
    if shape.family is not None:
        metadata(w, shape, shape.family)
        return _write(w, tensors(shape, shape.family, quant), tmp, path)
    w.add_block_count(shape.layers)
    w.add_context_length(4096)
    w.add_embedding_length(shape.dim)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape.dim // shape.heads)
    w.add_vocab_size(shape.vocab)
    if smollm_path is None:
        raise ValueError(f"{tag}: the llama/qwen2 shapes take SmolLM2's tokenizer; none given")
    _tokenizer_fields(w, smollm_path, shape.vocab)
    return _write(w, [Tensor(*t) for t in _tensors(shape, quant)], tmp, path)


def _write(w: Any, items: list[Tensor], tmp: Path, path: Path) -> Path:
    """Writes ``items`` (random data, see ``_data``) after ``w``'s metadata; renames ``tmp``
    to ``path`` once complete."""
    import gguf

    gtype = gguf.GGMLQuantizationType
    for name, ty, rows, cols, experts in items:
        lead = (experts,) if experts else ()
        n = rows * cols * max(experts, 1)
        if ty == "F32":
            shape = (rows, cols) if rows > 1 else (cols,)
            w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
        elif ty == "F16":
            w.add_tensor_info(name, (*lead, rows, cols), np.dtype(np.float16), n * 2)
        else:
            per, nbytes, _ = _BLOCKS.get(ty, (1, 2, ()))
            byte_shape = (*lead, rows, cols // per * nbytes)
            w.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), n // per * nbytes, raw_dtype=gtype[ty]
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, ty, rows, cols, experts in items:
        data = _data(rng, ty, rows * max(experts, 1), cols, name)
        if ty == "BF16":
            data = data.view(np.uint8).reshape(rows, cols * 2)
        w.write_tensor_data(data)
    w.close()
    tmp.rename(path)
    return path
