"""GPTQ (v1 and v2) and AWQ int4 safetensors checkpoints, kept packed as Q4_Z.

References: the float64 dequantization in ``tests/quant_int4.py``, written from the formats'
published definitions (it reads the packed words itself, not poot's re-lay), and the float64
forward pass of ``tests/family_models.py`` run on those dequantized weights.

Bounds. One matmul: poot's exact CPU path decodes Q4_Z to the very f32 values of the
reference (``(q - z) * s`` is exact), then sums ``k`` f32 products, so
``|got - ref| <= 1.01 * k * 2**-24 * sum_i |x_i * W_ji|`` (the standard dot-product bound).
A whole model: the same float64 forward the float checkpoints are held to, with the tolerance
the float families use (2e-4 on logits of order 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_int4 import quant_config, quantize_layer

import poot
from poot import _native

PACKINGS = ["gptq", "gptq_v2", "awq"]


def _write(directory: Path, tensors: dict[str, np.ndarray], config: dict[str, Any]) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _matmul(
    directory: Path, packing: str, group: int, x: np.ndarray, n: int, bits: int = 4
) -> np.ndarray:
    st = _native.SafetensorsModel(str(directory), packed=(packing, group, bits))
    w = _native.Weights(st)
    assert w.describe("l.weight") == ("Q4_Z" if bits == 4 else "Q8_Z", (n, x.shape[1]))
    assert w.describe("l.qweight") is None, "the int4 source tensors are hidden"
    t = _native.Tracer(w, x.shape[0])
    xv = t.input("x", "f32", list(x.shape))
    t.output("y", t.matmul(xv, t.weight("l.weight")))
    rt = _native.CpuRuntime(1, "exact")
    return np.asarray(rt.run(rt.prepare(t.finish(), w), {"x": x})["y"])


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize(
    ("k", "n", "group", "sym", "g_idx"),
    [
        (128, 24, -1, False, False),
        (96, 40, 32, True, False),
        (256, 16, 64, False, True),
        (384, 72, 128, False, True),
        (256, 8, 128, True, False),
    ],
)
def test_one_matmul_matches_the_float64_dequantization(
    tmp_path: Path, packing: str, k: int, n: int, group: int, sym: bool, g_idx: bool
) -> None:
    rng = np.random.default_rng(k * 1000 + n)
    w = rng.standard_normal((n, k))
    # AWQ checkpoints carry no g_idx; GPTQ ones may (act-order off: one group per 32 columns).
    tensors, ref_w = quantize_layer(w, packing, group, sym, g_idx and packing != "awq")
    d = _write(tmp_path, {f"l.{p}": v for p, v in tensors.items()}, {})
    x = rng.standard_normal((3, k)).astype(np.float32)
    got = _matmul(d, packing, group, x, n)
    x64 = x.astype(np.float64)
    ref = x64 @ ref_w.T
    bound = 1.01 * k * 2.0**-24 * (np.abs(x64) @ np.abs(ref_w).T)
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) - bound)


@pytest.mark.device_wgpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("numerics", ["exact", "ggml"])
def test_wgpu_matmul_matches_the_reference(tmp_path: Path, numerics: str, bits: int) -> None:
    """The WGSL Q4_Z and Q8_Z decoders (``shaders/wgsl/dec_q{4,8}_z.wgsl``) decode the same
    exact values; the sums may differ in order, so the bound is the dot-product bound, twice."""
    from wgpu_util import require_wgpu

    require_wgpu()
    k, n = 256, 40
    rng = np.random.default_rng(7)
    tensors, ref_w = quantize_layer(rng.standard_normal((n, k)), "gptq", 64, bits=bits)
    d = _write(tmp_path, {f"l.{p}": v for p, v in tensors.items()}, {})
    x = rng.standard_normal((5, k)).astype(np.float32)
    w = _native.Weights(_native.SafetensorsModel(str(d), packed=("gptq", 64, bits)))
    t = _native.Tracer(w, x.shape[0])
    xv = t.input("x", "f32", list(x.shape))
    t.output("y", t.matmul(xv, t.weight("l.weight")))
    g = t.finish()
    gpu = _native.WgpuRuntime(60.0, numerics=numerics)  # type: ignore[arg-type]
    got = np.asarray(gpu.run(gpu.prepare(g, w), {"x": x})["y"])
    x64 = x.astype(np.float64)
    bound = 2.02 * k * 2.0**-24 * (np.abs(x64) @ np.abs(ref_w).T)
    assert np.all(np.abs(got - x64 @ ref_w.T) <= bound)


@pytest.mark.parametrize("packing", ["gptq", "gptq_v2"])
@pytest.mark.parametrize(("k", "n", "group", "sym"), [(128, 24, -1, True), (256, 40, 64, False)])
def test_gptq_8bit_matmul_matches_the_float64_dequantization(
    tmp_path: Path, packing: str, k: int, n: int, group: int, sym: bool
) -> None:
    rng = np.random.default_rng(k + n)
    tensors, ref_w = quantize_layer(rng.standard_normal((n, k)), packing, group, sym, bits=8)
    d = _write(tmp_path, {f"l.{p}": v for p, v in tensors.items()}, {})
    x = rng.standard_normal((2, k)).astype(np.float32)
    got = _matmul(d, packing, group, x, n, bits=8)
    x64 = x.astype(np.float64)
    bound = 1.01 * k * 2.0**-24 * (np.abs(x64) @ np.abs(ref_w).T)
    assert np.all(np.abs(got - x64 @ ref_w.T) <= bound)


def test_gptq_v1_zero_of_zero_reads_as_sixteen(tmp_path: Path) -> None:
    """v1 stores zero - 1 in 4 bits: a zero of 0 is stored 15 and read back as 16."""
    k, n = 32, 8
    qw = np.zeros((k // 8, n), np.int32)  # every quant 0
    qz = np.full((1, n // 8), -1, np.int32)  # every stored zero 15
    s = np.full((1, n), 0.5, np.float16)
    d = _write(tmp_path, {"l.qweight": qw, "l.qzeros": qz, "l.scales": s}, {})
    got = _matmul(d, "gptq", -1, np.ones((1, k), np.float32), n)
    np.testing.assert_array_equal(got, np.full((1, n), (0 - 16) * 0.5 * k))


# ---------------------------------------------------------------------------------------------
# A whole model.

FAMILY = "mistral"
PROMPT = [2, 17, 93, 5, 64, 120, 33, 8]
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantized_model(
    root: Path, packing: str, group: int, bits: int = 4
) -> tuple[Path, dict[str, np.ndarray]]:
    """The family's random float weights with every linear layer quantized (lm_head stays
    float, as GPTQ and AWQ leave it), and the dequantized float64 weights."""
    from family_models import FAMILIES, _tokenizer_json, make_weights

    w = make_weights(FAMILY, seed=3)
    stored: dict[str, np.ndarray] = {}
    deq: dict[str, np.ndarray] = {}
    for name, v in w.items():
        mod = name.rsplit(".", 2)
        if name.endswith(".weight") and len(mod) == 3 and mod[1] in LINEAR:
            g_idx = packing != "awq"
            tensors, ref = quantize_layer(v, packing, group, g_idx=g_idx, bits=bits)
            prefix = name.removesuffix(".weight")
            stored.update({f"{prefix}.{p}": t for p, t in tensors.items()})
            deq[name] = ref
        else:
            stored[name] = v
            deq[name] = v.astype(np.float64)
    config = dict(FAMILIES[FAMILY], quantization_config=quant_config(packing, group, bits=bits))
    d = _write(root / f"{packing}-g{group}-{bits}", stored, config)
    _tokenizer_json(d / "tokenizer.json", config["vocab_size"])
    return d, deq


@pytest.mark.parametrize(
    ("packing", "group", "bits"),
    [("gptq", 128, 4), ("gptq_v2", 64, 4), ("awq", 128, 4), ("gptq", 128, 8)],
)
def test_model_logits_and_greedy_ids_match_the_dequantized_reference(
    tmp_path: Path, packing: str, group: int, bits: int
) -> None:
    from family_reference import reference_greedy, reference_logits

    d, deq = _quantized_model(tmp_path, packing, group, bits)
    llm = poot.LLM(str(d), threads=1, numerics="exact")
    ref = reference_logits(FAMILY, deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(FAMILY, deq, PROMPT, 8)


@pytest.mark.device_wgpu
def test_model_on_wgpu_matches_the_dequantized_reference(tmp_path: Path) -> None:
    from family_reference import reference_greedy, reference_logits
    from wgpu_util import require_wgpu

    require_wgpu()
    d, deq = _quantized_model(tmp_path, "gptq", 64)
    llm = poot.LLM(str(d), backend="wgpu", numerics="exact")
    ref = reference_logits(FAMILY, deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(FAMILY, deq, PROMPT, 8)


def test_auto_numerics_runs_them_as_quantized(tmp_path: Path) -> None:
    """``numerics="auto"`` treats an int4 directory as quantized (llama.cpp's arithmetic: an f16
    KV cache, and the Q4_Z projections take Q8_0 activations and integer dots as ggml's Q4_0
    does, each activation rounded by up to 1/254 of its block's largest; carried through two
    layers that is a few hundredths on logits of about 1)."""
    from family_reference import reference_logits

    d, deq = _quantized_model(tmp_path, "awq", 128)
    llm = poot.LLM(str(d), threads=1)
    assert llm.numerics == "ggml"
    ref = reference_logits(FAMILY, deq, PROMPT)[-1]
    got = llm.logits(PROMPT)
    np.testing.assert_allclose(got, ref, rtol=0, atol=0.06)
    # The integer path ran: exact numerics' decoded matmul is far closer to the reference.
    exact = poot.LLM(str(d), threads=1, numerics="exact").logits(PROMPT)
    assert np.abs(exact - ref).max() < np.abs(got - ref).max() / 10


def test_inspect_shows_the_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from poot.cli import main

    d, _ = _quantized_model(tmp_path, "gptq", 128)
    assert main(["inspect", "--json", "--quiet", str(d)]) == 0
    fmt = json.loads(capsys.readouterr().out)["format"]
    assert fmt["quantization"].startswith("gptq int4, group 128, asym")
    assert "Q4_Z" in fmt["quantization"]
    assert fmt["quantized_layers"] == 2 * len(LINEAR)
    assert sorted(fmt["float_weights"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert main(["inspect", str(d)]) == 0
    assert "quantized   14 packed layers; kept in float: " in capsys.readouterr().out
