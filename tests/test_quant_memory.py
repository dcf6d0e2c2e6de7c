"""Packed stays packed for GPTQ too: loading a GPTQ int4 directory raises resident memory by
at most 1.2x its file size plus the KV pool. A dense BF16 or F16 directory of the same
shapes stays within 1.15x (the graph reads its words through casts the kernels fuse; an f32
copy of the weights alone would be 2x): the CPU runtime's copy of a float matrix (moved to
huge pages where the kernel offers them) releases the file's mapped pages of that tensor, as
the GGUF path does, so the weights never count twice, at the peak (VmHWM) included. The Q4_Z
re-lay is 1.14x the int4 tensors at group 128 and the source tensors' mapped pages are
dropped once copied (``crates/poot-runtime/src/gptq_awq.rs``); a second copy, or the file's
pages kept beside the copy, would be 2x and more. The CPU plan re-lays that copy with one
scale and zero point per row per group (``kernels/matmul/repack_zg.rs``, 4.19 bits a weight)
and releases it. Measured by ``tests/memory_probe.py``.

Generating is checked separately, against the same directory's load: each step shape's plan
used to copy every re-laid tensor under 1 MB (most of a small model's layers) as if it were
mapped, once more per plan; the store now says which tensors it holds in its own memory
(``WeightStore::mapped``), and those are read in place.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from memory_probe import measure, needs_proc
from quant_int4 import quant_config, quantize_layer

D, F, LAYERS, VOCAB = 1024, 2816, 4, 256


def _write(directory: Path, kind: str = "gptq") -> Path:
    """A Llama-shaped GPTQ int4 g128 directory (``kind`` "gptq": about 29 MB, int4 layers,
    float embeddings), the same shapes as block-FP8 ("fp8": ``quant_method: fp8``, 128x128 f32
    ``weight_scale_inv``; about 52 MB), or dense and unquantized ("bf16" or "f16": about
    100 MB, read through the graph's casts with no f32 copy)."""
    from family_models import FAMILIES, _tokenizer_json
    from quant_ct import bf16_bytes, save_raw
    from quant_fp8 import fp8_layer
    from safetensors.numpy import save_file

    fp8, dense = kind == "fp8", kind in ("bf16", "f16")
    rng = np.random.default_rng(0)
    st = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, D)).astype(np.float32),
        "lm_head.weight": rng.standard_normal((VOCAB, D)).astype(np.float32),
        "model.norm.weight": np.ones(D, np.float32),
    }
    shapes = {"self_attn.q_proj": (D, D), "self_attn.k_proj": (D, D), "self_attn.v_proj": (D, D)}
    shapes |= {"self_attn.o_proj": (D, D), "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D)}
    shapes |= {"mlp.down_proj": (D, F)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        st[p + "input_layernorm.weight"] = np.ones(D, np.float32)
        st[p + "post_attention_layernorm.weight"] = np.ones(D, np.float32)
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
    directory.mkdir()
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
    config = dict(FAMILIES["mistral"], hidden_size=D, intermediate_size=F, sliding_window=None)
    config |= {"num_hidden_layers": LAYERS, "num_attention_heads": 8, "num_key_value_heads": 8}
    q: dict[str, object] = quant_config("gptq", 128)
    if fp8:
        q = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if not dense:
        config |= {"quantization_config": q}
    else:
        config |= {"torch_dtype": "bfloat16" if kind == "bf16" else "float16"}
    (directory / "config.json").write_text(json.dumps(config))
    _tokenizer_json(directory / "tokenizer.json", VOCAB)
    return directory


@needs_proc
@pytest.mark.parametrize("kind", ["gptq", "fp8", "bf16", "f16"])
def test_resident_memory_is_close_to_the_file_size(tmp_path: Path, kind: str) -> None:
    """The F8_S re-lay is 1.125x the FP8 weights (an f32 scale a 32-block); the same bounds.
    A dense directory has no re-lay: loading stays within 1.15x."""
    d = _write(tmp_path / "m", kind)
    m = measure(d)
    assert m["tokens"] == 8
    file_size = (d / "model.safetensors").stat().st_size
    loaded = m["loaded"] - m["base"]
    dense = kind in ("bf16", "f16")
    # Measured (3 runs, KV excluded): GPTQ 1.18x (1.20x from the LTO wheel CI builds: its
    # larger code pages; 1.19x on the grouped re-lay), FP8 1.14x, BF16 0.96x. Of a 29 MB GPTQ
    # directory's growth, the weights are 0.97x (Q4_Z re-laid 8 rows at a time, one scale and
    # zero point a group of 128, when the first plan compiles; 1.09x a block); the rest is
    # the native library's code pages (4 MB, 0.14x) and the interpreter's heap, less the KV
    # pool, which is not touched yet. The 0.08x the bound once left room for was the sources'
    # mapped pages, faulted back in around the norms the first plan copies, now released
    # again (`WeightStore::release_unserved`).
    bound = (1.15 if dense else 1.25) * file_size + m["kv_bytes"]
    assert loaded <= bound, (
        f"loading grew RSS by {loaded} bytes; bound {bound:.0f} "
        f"(file {file_size}, kv {m['kv_bytes']})"
    )
    generating = m["after"] - m["loaded"]
    assert generating <= 1.15 * file_size, f"generating grew RSS by {generating} bytes"
    # The peak: never above what loading and generating leave behind by more than 0.1x, so no
    # moment holds a tensor's copy beside its mapped pages (measured: 0.03x, 0.01x dense).
    peak = m["peak"] - m["base"]
    slack = 0.1 * file_size
    assert peak <= m["after"] - m["base"] + slack, (
        f"peak growth {peak} bytes, after generating {m['after'] - m['base']}"
    )
