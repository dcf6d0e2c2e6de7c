"""Quantized mixture-of-experts safetensors directories: a Qwen2-MoE (Qwen1.5-MoE) checkpoint
whose experts are stored one layer each (``mlp.experts.{j}.gate_proj.qweight`` ...), in GPTQ
(v1, v2, 8-bit), AWQ and FP8 (``quant_method: fp8`` block-128, compressed-tensors
``float-quantized`` per channel).

Each expert layer is re-laid once at load into its packed form (Q4_Z, Q8_Z or F8_S: never a
float copy), and the store describes every layer's experts together as one stack
``mlp.experts.{proj}.weight`` ``[E, out, in]`` whose pieces are those packed copies, read in
place by the expert matmul.

References: the weights are ``tests/qwen2moe_model.py``'s, every linear layer but the router
and the shared expert's 1-row gate quantized by the writers in ``tests/quant_int4.py`` and
``tests/quant_fp8.py``; the reference is that module's float64 forward over the float64
dequantization of the stored words. Bounds: under exact numerics each matmul decodes the same
values as the reference and sums in f32 (the dot-product bound), so the logits are held to the
float families' 2e-4 and the greedy ids must match for 32 tokens; under ggml numerics the
activations are rounded to Q8_0 blocks (up to 1/254 of a block's largest), a few hundredths
on logits of order 1 (``test_quant_int4.py``'s bound, 0.06).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_ct import bf16_bytes, gptq_act_order_layer, save_raw
from quant_fp8 import fp8_layer
from quant_int4 import quant_config, quantize_layer
from qwen2moe_model import CONFIG, make_weights, reference_greedy, reference_logits

import poot
from poot.errors import CheckpointFormatError

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
GREEDY32 = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
STACK = "model.layers.0.mlp.experts.gate_proj.weight"
FP8_BLOCK = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}
FP8_CHANNEL = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "float",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head"],
}


def _quantized(name: str) -> bool:
    """Every linear layer but the router (``mlp.gate``) and the shared expert's gate, as GPTQ,
    AWQ and FP8 exporters leave them."""
    return name.endswith("_proj.weight")


def _int_dir(d: Path, packing: str, bits: int = 4) -> dict[str, np.ndarray]:
    """The directory in GPTQ/AWQ ``packing`` (group 128), and its float64 weights."""
    from family_models import _tokenizer_json
    from safetensors.numpy import save_file

    stored: dict[str, np.ndarray] = {}
    deq: dict[str, np.ndarray] = {}
    for name, v in make_weights(seed=0).items():
        if _quantized(name):
            tensors, ref = quantize_layer(v, packing, 128, bits=bits)
            prefix = name.removesuffix(".weight")
            stored.update({f"{prefix}.{p}": t for p, t in tensors.items()})
            deq[name] = ref
        else:
            stored[name] = v
            deq[name] = v.astype(np.float64)
    d.mkdir(parents=True)
    save_file(stored, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(CONFIG, quantization_config=quant_config(packing, 128, bits=bits))
    (d / "config.json").write_text(json.dumps(cfg))
    _tokenizer_json(d / "tokenizer.json", CONFIG["vocab_size"])
    return deq


def _fp8_dir(d: Path, q: dict[str, Any], layout: str) -> dict[str, np.ndarray]:
    """The directory in FP8 (``layout`` "block" with ``weight_scale_inv``, or "channel" with
    bf16 ``weight_scale``), and its float64 weights."""
    from family_models import _tokenizer_json

    scale_name, scale_dtype = ("weight_scale_inv", "F32")
    if layout == "channel":
        scale_name, scale_dtype = ("weight_scale", "BF16")
    raw: dict[str, tuple[str, list[int], bytes]] = {}
    deq: dict[str, np.ndarray] = {}
    for name, v in make_weights(seed=0).items():
        if _quantized(name):
            codes, s, ref = fp8_layer(v, layout, 128, scale_dtype)
            raw[name] = ("F8_E4M3", list(codes.shape), codes.tobytes())
            sb = bf16_bytes(s) if scale_dtype == "BF16" else s.astype(np.float32).tobytes()
            raw[name.removesuffix("weight") + scale_name] = (scale_dtype, list(s.shape), sb)
            deq[name] = ref
        else:
            raw[name] = ("F32", list(v.shape), v.astype(np.float32).tobytes())
            deq[name] = v.astype(np.float64)
    d.mkdir(parents=True)
    save_raw(d / "model.safetensors", raw)
    (d / "config.json").write_text(json.dumps(dict(CONFIG, quantization_config=q)))
    _tokenizer_json(d / "tokenizer.json", CONFIG["vocab_size"])
    return deq


CASES = {
    "gptq": lambda d: _int_dir(d, "gptq"),
    "gptq_v2": lambda d: _int_dir(d, "gptq_v2"),
    "awq": lambda d: _int_dir(d, "awq"),
    "gptq8": lambda d: _int_dir(d, "gptq", bits=8),
    "fp8_block": lambda d: _fp8_dir(d, FP8_BLOCK, "block"),
    "fp8_channel": lambda d: _fp8_dir(d, FP8_CHANNEL, "channel"),
}
STACK_DTYPE = {"gptq8": "Q8_Z", "fp8_block": "F8_S", "fp8_channel": "F8_S"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("quant-moe")
    made: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}

    def get(case: str) -> tuple[Path, dict[str, np.ndarray]]:
        if case not in made:
            d = root / case
            made[case] = (d, CASES[case](d))
        return made[case]

    return get


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_ids_match_the_dequantized_float64_forward(checkpoints: Any, case: str) -> None:
    d, deq = checkpoints(case)
    llm = poot.LLM(str(d), threads=2, numerics="exact")
    # The experts stay packed: one stack of packed copies, no float tensor of an expert.
    e, fe, hidden = CONFIG["num_experts"], CONFIG["moe_intermediate_size"], CONFIG["hidden_size"]
    assert llm.weights.describe(STACK) == (STACK_DTYPE.get(case, "Q4_Z"), (e, fe, hidden))
    assert llm.weights.describe(STACK.replace("experts.", "experts.3.")) is not None
    ref = reference_logits(deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(deq, PROMPT, 32)


@pytest.mark.parametrize("case", ["gptq", "awq", "fp8_block"])
def test_ggml_numerics_run_the_packed_stacks(checkpoints: Any, case: str) -> None:
    """Under ggml numerics the Q4_Z stacks are re-laid 8 rows at a time (the expert kernel) and
    FP8 stacks read as stored; a batched step gives each prompt the ids it gets alone."""
    d, deq = checkpoints(case)
    llm = poot.LLM(str(d), threads=2, numerics="ggml")
    ref = reference_logits(deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=0.06)
    params = poot.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [PROMPT, PROMPT[3:], [1, 250, 3, 3, 9, 44]]
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    together = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert [list(x) for x in together] == [list(x) for x in alone]


def test_an_act_order_expert_is_refused_naming_it(tmp_path: Path) -> None:
    """An expert whose GPTQ groups are scattered over its columns (``desc_act``) would need its
    activations permuted per expert, which the expert matmul does not do: a typed error naming
    the tensor, at load."""
    from family_models import _tokenizer_json
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    stored: dict[str, np.ndarray] = {}
    for name, v in make_weights(seed=0).items():
        if _quantized(name):
            prefix = name.removesuffix(".weight")
            if prefix == "model.layers.1.mlp.experts.2.up_proj":
                tensors, _ = gptq_act_order_layer(v, 128, 4, True, False, rng)
            else:
                tensors, _ = quantize_layer(v, "gptq", 128)
            stored.update({f"{prefix}.{p}": t for p, t in tensors.items()})
        else:
            stored[name] = v
    save_file(stored, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    q = dict(quant_config("gptq", 128), desc_act=True)
    (tmp_path / "config.json").write_text(json.dumps(dict(CONFIG, quantization_config=q)))
    _tokenizer_json(tmp_path / "tokenizer.json", CONFIG["vocab_size"])
    with pytest.raises(CheckpointFormatError) as e:
        poot.LLM(str(tmp_path), threads=1, numerics="exact")
    assert e.value.tensor == "model.layers.1.mlp.experts.2.up_proj.g_idx"
    assert "act-order" in str(e.value)
