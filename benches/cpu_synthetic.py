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

import numpy as np

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


LLAMA_1B = Shape("llama", 2048, 16, 32, 8, 8192, 128256, 500000.0, tag="llama32-1b")
QWEN2_05B = Shape("qwen2", 896, 24, 14, 2, 4864, 151936, 1000000.0, qkv_bias=True, tag="qwen2-0.5b")
# Qwen2.5-1.5B: dim 1536, 28 layers, 12/2 heads (head_dim 128), FFN 8960, tied embeddings.
QWEN25_15B = Shape(
    "qwen2", 1536, 28, 12, 2, 8960, 151936, 1000000.0, qkv_bias=True, tag="qwen2.5-1.5b"
)


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


def synthetic_gguf(shape: Shape, quant: str, smollm_path: Path) -> Path:
    """The cached synthetic GGUF of ``shape`` stored as ``quant`` (a ggml type name or "mix"),
    written through the ``gguf`` package on first use."""
    import gguf

    tag = shape.tag
    path = cache_dir() / f"synthetic-{tag}-{quant}.gguf"
    if path.is_file():
        return path
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), shape.arch)
    w.add_name(f"synthetic {tag} {quant}")
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
    _tokenizer_fields(w, smollm_path, shape.vocab)
    tensors = _tensors(shape, quant)
    gtype = gguf.GGMLQuantizationType
    for name, ty, rows, cols in tensors:
        if ty == "F32":
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        elif ty == "F16":
            w.add_tensor_info(name, (rows, cols), np.dtype(np.float16), rows * cols * 2)
        else:
            per, nbytes, _ = _BLOCKS.get(ty, (1, 2, ()))
            byte_shape = (rows, cols // per * nbytes)
            w.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), rows * byte_shape[1], raw_dtype=gtype[ty]
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, ty, rows, cols in tensors:
        data = _data(rng, ty, rows, cols, name)
        if ty == "BF16":
            data = data.view(np.uint8).reshape(rows, cols * 2)
        w.write_tensor_data(data)
    w.close()
    tmp.rename(path)
    return path
