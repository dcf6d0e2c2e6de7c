"""Synthetic Hugging Face quantized checkpoints for the CPU bench table: a real model's shape,
random weights, in the layouts GPTQ (AutoGPTQ v1, int4, group 128) and FP8 (``quant_method:
fp8``, E4M3 with 128 x 128 block scales) export.

As in ``cpu_synthetic.py``, speed depends on shapes and storage types, not values: quants are
random words with small finite scales, E4M3 codes random with the NaN codes avoided, embeddings
small f16 normals. The GPTQ zero points vary by group and column, as an asymmetric (``sym:
false``) export's do: a symmetric one's (all 8) would take poot's Q4_0 layout, and the row would
not measure the zero-point kernel its config names. Every linear layer is quantized, the LM head
too (untied, as GPTQModel's ``lm_head: true`` and FP8 exports of tied models write it), so the
bytes a decode step reads are near the GGUF row of the nearest bit width (Q4_0: 4.5 bits a
weight, poot's grouped Q4_Z at group 128 4.19; Q8_0: 8.5, poot's grouped FP8 8.25). The
tokenizer is SmolLM2's (from its GGUF), padded with unreachable tokens to the shape's
vocabulary. Directories are cached under ``$XDG_CACHE_HOME/poot/bench-hf`` (never in the
repository) and rebuilt only when missing.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from cpu_synthetic import Shape

LAYOUTS = ("gptq-int4-g128", "fp8-block128")
GROUP = 128
# Appended to a cached directory's name when what a layout writes changes, so that an older
# directory is not reused (the GPTQ zeros became asymmetric).
REVISION = {"gptq-int4-g128": "-asym"}


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    d = base / "poot" / "bench-hf"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _linears(shape: Shape) -> Iterator[tuple[str, int, int]]:
    """(HF prefix, out_features, in_features) of every linear layer, the LM head last."""
    hd = shape.dim // shape.heads
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        yield p + "self_attn.q_proj", shape.heads * hd, shape.dim
        yield p + "self_attn.k_proj", shape.kv_heads * hd, shape.dim
        yield p + "self_attn.v_proj", shape.kv_heads * hd, shape.dim
        yield p + "self_attn.o_proj", shape.dim, shape.heads * hd
        yield p + "mlp.gate_proj", shape.ffn, shape.dim
        yield p + "mlp.up_proj", shape.ffn, shape.dim
        yield p + "mlp.down_proj", shape.dim, shape.ffn
    yield "lm_head", shape.vocab, shape.dim


# A tensor to write: (name, safetensors dtype, shape, make the bytes).
Tensor = tuple[str, str, tuple[int, ...], Callable[[], np.ndarray]]


def _tensors(shape: Shape, layout: str, rng: np.random.Generator) -> list[Tensor]:
    def normal_f16(*dims: int) -> Callable[[], np.ndarray]:
        return lambda: (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    def ones_f16(n: int) -> Callable[[], np.ndarray]:
        return lambda: np.ones(n, np.float16)

    out: list[Tensor] = [
        (
            "model.embed_tokens.weight",
            "F16",
            (shape.vocab, shape.dim),
            normal_f16(shape.vocab, shape.dim),
        )
    ]
    for i in range(shape.layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out.append(
                (f"model.layers.{i}.{norm}.weight", "F16", (shape.dim,), ones_f16(shape.dim))
            )
    out.append(("model.norm.weight", "F16", (shape.dim,), ones_f16(shape.dim)))
    for prefix, n, k in _linears(shape):
        out += _gptq(prefix, n, k, rng) if layout == "gptq-int4-g128" else _fp8(prefix, n, k, rng)
    return out


def _gptq(prefix: str, n: int, k: int, rng: np.random.Generator) -> list[Tensor]:
    """One GPTQ v1 int4 g128 layer: random quants, asymmetric zero points 4..13 per group and
    column (v1 stores zero - 1, so nibbles 3..12), small f16 scales, the sequential ``g_idx`` of a
    ``desc_act: false`` export."""
    g = k // GROUP

    def qweight() -> np.ndarray:
        return rng.integers(0, 2**32, (k // 8, n), dtype=np.uint32).view(np.int32)

    def qzeros() -> np.ndarray:
        nibbles = rng.integers(3, 13, (g, n // 8, 8), dtype=np.uint32)
        words = (nibbles << (4 * np.arange(8, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
        return words.view(np.int32)

    def scales() -> np.ndarray:
        return rng.uniform(0.001, 0.004, (g, n)).astype(np.float16)

    def g_idx() -> np.ndarray:
        return (np.arange(k) // GROUP).astype(np.int32)

    return [
        (f"{prefix}.qweight", "I32", (k // 8, n), qweight),
        (f"{prefix}.qzeros", "I32", (g, n // 8), qzeros),
        (f"{prefix}.scales", "F16", (g, n), scales),
        (f"{prefix}.g_idx", "I32", (k,), g_idx),
    ]


def _fp8(prefix: str, n: int, k: int, rng: np.random.Generator) -> list[Tensor]:
    """One block-FP8 layer: random E4M3 codes (the NaN codes 0x7f and 0xff avoided) and small
    f32 block scales."""
    blocks = (-(-n // GROUP), -(-k // GROUP))

    def codes() -> np.ndarray:
        c = rng.integers(0, 256, (n, k), dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] &= 0xFE
        return c

    def scales() -> np.ndarray:
        return rng.uniform(2e-5, 1e-4, blocks).astype(np.float32)

    return [
        (f"{prefix}.weight", "F8_E4M3", (n, k), codes),
        (f"{prefix}.weight_scale_inv", "F32", blocks, scales),
    ]


def _write_safetensors(path: Path, tensors: list[Tensor]) -> None:
    """A safetensors file written tensor by tensor (the whole model never sits in memory)."""
    item = {"F16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dt, dims, _ in tensors:
        size = int(np.prod(dims)) * item[dt]
        header[name] = {"dtype": dt, "shape": list(dims), "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, dt, dims, make in tensors:
            data = np.ascontiguousarray(make())
            assert data.nbytes == int(np.prod(dims)) * item[dt], name
            f.write(data.tobytes())


def _tokenizer(smollm_path: Path, vocab: int, dst: Path) -> None:
    """SmolLM2's byte-level BPE as a ``tokenizer.json``, padded to ``vocab`` tokens."""
    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(str(smollm_path))
    tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    tokens += [f"<unused_{i}>" for i in range(vocab - len(tokens))]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(dst / "tokenizer.json"))


def _quant_config(layout: str) -> dict[str, object]:
    if layout == "gptq-int4-g128":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GROUP,
            "sym": False,
            "desc_act": False,
            "checkpoint_format": "gptq",
            "lm_head": True,
        }
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [GROUP, GROUP],
    }


def synthetic_hf(shape: Shape, layout: str, smollm_path: Path) -> Path:
    """The cached synthetic directory of ``shape`` in ``layout`` (one of ``LAYOUTS``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    path = cache_dir() / f"synthetic-{shape.tag}-{layout}{REVISION.get(layout, '')}"
    if path.is_dir():
        return path
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM" if shape.arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": shape.arch,
        "hidden_size": shape.dim,
        "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": shape.vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": shape.rope_base,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "quantization_config": _quant_config(layout),
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    _tokenizer(smollm_path, shape.vocab, tmp)
    rng = np.random.default_rng(0)
    _write_safetensors(tmp / "model.safetensors", _tensors(shape, layout, rng))
    tmp.rename(path)
    return path


def bytes_per_token(shape: Shape, layout: str, ctx: int, kv_elem: int = 2) -> tuple[int, int]:
    """(bytes of weights one decode step reads as poot holds them, KV bytes at context
    ``ctx``): every linear layer in poot's grouped re-lays, Q4_Z at group 128 with one scale
    and zero a row per group (67 bytes a 128-column run, ``matmul/repack_zg.rs``) or FP8 with
    one f32 scale a row per 128 columns (132, ``matmul/repack_f8g.rs``), the norms, one
    embedding row; KV elements of ``kv_elem`` bytes. Every shape's inputs are whole 128s."""
    run = 67 if layout == "gptq-int4-g128" else 132
    weights = sum(n * k // 128 * run for _, n, k in _linears(shape))
    weights += (2 * shape.layers + 1) * shape.dim * 2 + shape.dim * 2
    hd = shape.dim // shape.heads
    return weights, 2 * shape.layers * ctx * shape.kv_heads * hd * kv_elem
