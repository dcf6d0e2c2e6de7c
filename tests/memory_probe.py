"""Resident memory of loading a model and generating from it, measured in a fresh interpreter
(so other tests' allocations do not count): /proc's VmRSS after the imports, after loading and
after generating, and the peak (VmHWM). Tests only; every memory test measures through
``measure``.

Invariants: the imports (numpy, tokenizers, jinja2, poot) are done before the first reading, so
``base`` holds none of the model; generation is greedy (temperature 0), so a run is repeatable.

Fixed per-process costs: with ``warmup``, a tiny model of the same layout is loaded, run and
dropped in the same interpreter before ``base`` is read, and the heap's free pages are handed
back (glibc's ``malloc_trim``). ``base`` then holds what any process that has run a model holds
whatever the model: the native library's code pages (a few MB, more from the LTO wheel than
from an editable build), the interpreter's lazily imported modules, the thread pool. What the
measured model adds is counted in full: its weights, the KV pool, its tokenizer (a new object,
parsed from its own ``tokenizer.json``), its plans and their buffers. The peak counter is
reset at ``base`` (``/proc/self/clear_refs``), so the warm-up's peak is not the model's; where
the kernel refuses the reset, ``peak`` still includes it, an over-estimate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

_SCRIPT = r"""
import ctypes, gc, json, sys

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no " + key)

def kinds():
    # Resident bytes by mapping: the native library's code and data, other files (shared
    # libraries, the checkpoint's mapped pages), the brk heap, and anonymous maps (large
    # allocations, re-laid weights, thread arenas and stacks, the KV pool).
    out = {"native": 0, "files": 0, "heap": 0, "anon": 0}
    path = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if not head[0].endswith(":"):
                path = head[5].strip() if len(head) > 5 else ""
            elif head[0] == "Rss:":
                kind = ("native" if "_native" in path else "heap" if path == "[heap]"
                        else "anon" if path == "" or path.startswith("[") else "files")
                out[kind] += int(head[1]) * 1024
    return out

def trim():
    fn = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    if fn is not None:
        fn(0)

import numpy, tokenizers, jinja2  # imports are not the model's memory
import poot, poot.llm, poot.tokenizer, poot.models

args = json.loads(sys.argv[2])
if args["warmup"] is not None:
    warm = poot.LLM(args["warmup"], threads=1, max_model_len=64, num_blocks=4)
    warm.generate([[1, 2, 3]], poot.SamplingParams(max_tokens=4, temperature=0))
    del warm
    gc.collect()
    trim()
base = status("VmRSS")
base_kinds = kinds()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
except OSError:
    pass
llm = poot.LLM(
    sys.argv[1], threads=1, max_model_len=args["max_model_len"], num_blocks=args["num_blocks"]
)
loaded = status("VmRSS")
loaded_kinds = kinds()
params = poot.SamplingParams(
    max_tokens=args["max_tokens"], temperature=0, ignore_eos=args["ignore_eos"]
)
out = llm.generate([args["prompt"]], params)
after = status("VmRSS")
after_kinds = kinds()
peak = status("VmHWM")
# The tokenizer's own share, for the report: the same tokenizer.json loaded once more.
before_tok = status("VmRSS")
tok = poot.tokenizer.load_tokenizer(llm.files)
tokenizer = status("VmRSS") - before_tok
print(json.dumps({
    "base": base,
    "loaded": loaded,
    "after": after,
    "kv_bytes": llm.runtime.memory()["kv_bytes"],
    "peak": peak,
    "tokens": len(out[0].outputs[0].token_ids),
    "family": type(llm.definition).__name__,
    "tokenizer": tokenizer,
    "kinds": {
        "loaded": {k: v - base_kinds[k] for k, v in loaded_kinds.items()},
        "after": {k: v - base_kinds[k] for k, v in after_kinds.items()},
    },
}))
"""

needs_proc = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")


def measure(
    model: Path,
    *,
    max_model_len: int = 256,
    num_blocks: int = 16,
    prompt: str | Sequence[int] = (1, 2, 3),
    max_tokens: int = 8,
    ignore_eos: bool = False,
    warmup: Path | None = None,
) -> dict[str, Any]:
    """Loads ``model`` (a file or directory) with a KV pool of ``num_blocks`` blocks and
    generates ``max_tokens`` greedily from ``prompt`` (text or token ids); with ``warmup`` (a
    tiny model of the same layout), that one first (see the module docs). Returns ``base``,
    ``loaded``, ``after`` and ``peak`` (bytes of RSS; ``peak`` counted from ``base``), the KV
    pool's ``kv_bytes``, the ``tokens`` generated, the model's ``family`` (its definition's
    class name), ``tokenizer`` (what loading its tokenizer once more adds) and ``kinds``
    (growth over ``base`` by mapping kind, ``loaded`` and ``after``)."""
    args = {
        "max_model_len": max_model_len,
        "num_blocks": num_blocks,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "warmup": None if warmup is None else str(warmup),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(model), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def describe(m: dict[str, Any], file_size: int) -> str:
    """One line for a failed bound: each phase's growth over the file, KV pool excluded, the
    tokenizer's share and the growth by mapping kind after generating."""

    def x(v: int) -> str:
        return f"{(v - m['kv_bytes']) / file_size:.3f}x"

    kinds = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in m["kinds"]["after"].items())
    return (
        f"file {file_size / 2**20:.1f} MiB, kv {m['kv_bytes'] / 2**20:.1f} MiB; less the KV "
        f"pool: loaded {x(m['loaded'] - m['base'])}, after {x(m['after'] - m['base'])}, peak "
        f"{x(m['peak'] - m['base'])}; tokenizer {m['tokenizer'] / 2**20:.1f} MiB; "
        f"after by kind (MiB): {kinds}"
    )


def check_growth(m: dict[str, Any], file_size: int, factor: float = 1.15) -> None:
    """Generating (from ``base``, so loading included) grew RSS by at most ``factor`` times
    the file size plus the KV pool."""
    grown = m["after"] - m["base"]
    bound = factor * file_size + m["kv_bytes"]
    print(
        f"RSS grew {grown / 2**20:.1f} MiB; file {file_size / 2**20:.1f} MiB; "
        f"bound {bound / 2**20:.1f} MiB"
    )
    assert grown <= bound, (
        f"RSS grew {grown} bytes; bound {bound:.0f} (file {file_size}, kv {m['kv_bytes']})"
    )


def write_llama_dir(
    directory: Path,
    kind: str = "gptq",
    *,
    hidden: int = 1024,
    ffn: int = 2816,
    layers: int = 4,
    vocab: int = 256,
) -> Path:
    """A Llama-shaped safetensors directory with random weights, head_dim 128: GPTQ int4 g128
    (``kind`` "gptq", float embeddings; about 29 MB at the default shapes), block-FP8 ("fp8":
    ``quant_method: fp8``, 128x128 f32 ``weight_scale_inv``; about 52 MB), or dense and
    unquantized ("bf16" or "f16": about 100 MB, read through the graph's casts with no f32
    copy). ``hidden`` and ``ffn`` are multiples of 128."""
    from family_models import FAMILIES, _tokenizer_json
    from quant_ct import bf16_bytes, save_raw
    from quant_fp8 import fp8_layer
    from quant_int4 import quant_config, quantize_layer
    from safetensors.numpy import save_file

    fp8, dense = kind == "fp8", kind in ("bf16", "f16")
    d, f = hidden, ffn
    rng = np.random.default_rng(0)
    st = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, d)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((vocab, d)).astype(np.float32),
        "model.norm.weight": np.ones(d, np.float32),
    }
    shapes = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (d, d), "self_attn.v_proj": (d, d)}
    shapes |= {"self_attn.o_proj": (d, d), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d)}
    shapes |= {"mlp.down_proj": (d, f)}
    for i in range(layers):
        p = f"model.layers.{i}."
        st[p + "input_layernorm.weight"] = np.ones(d, np.float32)
        st[p + "post_attention_layernorm.weight"] = np.ones(d, np.float32)
        for name, shape in shapes.items():
            w = rng.standard_normal(shape) * 0.02
            if dense:
                st[f"{p}{name}.weight"] = w.astype(np.float32)
                continue
            if fp8:
                codes, scale, _ = fp8_layer(w, "block", 128)
                st[f"{p}{name}.weight"] = codes
                st[f"{p}{name}.weight_scale_inv"] = scale
                continue
            tensors, _ = quantize_layer(w, "gptq", 128)
            st.update({f"{p}{name}.{k}": v for k, v in tensors.items()})
    directory.mkdir(parents=True)
    if dense:

        def bf16(v: np.ndarray) -> np.ndarray:  # truncated to bf16 values
            return (np.ascontiguousarray(v, np.float32).view(np.uint32) & 0xFFFF0000).view(
                np.float32
            )

        if kind == "f16":
            raw = {n: ("F16", list(v.shape), v.astype("<f2").tobytes()) for n, v in st.items()}
        else:
            raw = {n: ("BF16", list(v.shape), bf16_bytes(bf16(v))) for n, v in st.items()}
        save_raw(directory / "model.safetensors", raw)
    elif fp8:
        # numpy has no E4M3 type: the codes go in as raw F8_E4M3 bytes.
        raw = {
            n: ("F8_E4M3" if v.dtype == np.uint8 else "F32", list(v.shape), v.tobytes())
            for n, v in st.items()
        }
        save_raw(directory / "model.safetensors", raw)
    else:
        save_file(st, str(directory / "model.safetensors"))
    heads = d // 128
    config = dict(FAMILIES["mistral"], hidden_size=d, intermediate_size=f, sliding_window=None)
    config |= {"num_hidden_layers": layers, "num_attention_heads": heads}
    config |= {"num_key_value_heads": heads, "vocab_size": vocab}
    q: dict[str, object] = quant_config("gptq", 128)
    if fp8:
        q = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if not dense:
        config |= {"quantization_config": q}
    else:
        config |= {"torch_dtype": "bfloat16" if kind == "bf16" else "float16"}
    (directory / "config.json").write_text(json.dumps(config))
    _tokenizer_json(directory / "tokenizer.json", vocab)
    return directory
