"""A real trained model (stories260K, ``../shared/models``) quantized into GPTQ and AWQ int4:
poot's greedy ids for 32 tokens and its logits match the float64 forward of the same
dequantized weights (``tests/family_models.py``'s Llama reference, transformers' layout).

Round-to-nearest quantization (``tests/quant_int4.py``); calibration is not the point, the
layout is. The MLP (172 wide: not a multiple of 32 in, nor of 8 out) stays float, as exporters
leave a layer they cannot pack (``modules_to_not_convert``), so this is also a mixed directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_int4 import quant_config, quantize_layer

import poot

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj")
PROMPT = [1, 403, 407, 261, 378, 259, 251, 76]


def _write(src: Path, dst: Path, packing: str, group: int) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file, save_file

    w = load_file(str(src / "model.safetensors"))
    stored: dict[str, np.ndarray] = {}
    deq: dict[str, np.ndarray] = {}
    for name, v in w.items():
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in LINEAR and parts[2] == "weight":
            tensors, ref = quantize_layer(v, packing, group, sym=packing == "gptq_v2")
            stored.update({f"{parts[0]}.{parts[1]}.{p}": t for p, t in tensors.items()})
            deq[name] = ref
        else:
            stored[name] = v
            deq[name] = v.astype(np.float64)
    dst.mkdir()
    save_file(stored, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant_config(packing, group, sym=packing == "gptq_v2")
    (dst / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
    return deq


@pytest.mark.parametrize(("packing", "group"), [("gptq", 32), ("gptq_v2", 64), ("awq", 32)])
def test_stories_quantized_matches_its_dequantized_reference_for_32_tokens(
    stories: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packing: str, group: int
) -> None:
    import family_models
    import family_reference

    src = stories / "hf"
    cfg: dict[str, Any] = json.loads((src / "config.json").read_text())
    monkeypatch.setitem(family_models.FAMILIES, "stories", cfg)
    deq = _write(src, tmp_path / packing, packing, group)
    llm = poot.LLM(str(tmp_path / packing), threads=1, numerics="exact")
    assert llm.weights.describe("model.layers.0.self_attn.q_proj.weight") == ("Q4_Z", (64, 64))
    assert llm.weights.describe("model.layers.0.mlp.down_proj.weight")[0] == "F32"
    ref = family_reference.reference_logits("stories", deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == family_reference.reference_greedy("stories", deq, PROMPT, 32)
