"""Act-order GPTQ (``desc_act: true``: ``g_idx`` scatters each group over the input columns),
loaded by re-laying the columns sorted by group and gathering the activations in that order.

References: the float64 dequantization in ``tests/quant_ct.py`` (it reads the packed words and
the scattered ``g_idx`` itself, in the stored column order, never poot's permutation), random
permutations, and the float64 forward of stories260K (a real trained model) on the dequantized
weights. Bounds as in ``test_quant_int4.py``: the gather moves f32 values without rounding, so
one matmul stays within the dot-product bound ``1.01 * k * 2**-24 * sum_i |x_i W_ji|``. wgpu
(exact numerics) is checked against the CPU: 1e-5 on one matmul, the same greedy ids on
stories260K.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from quant_ct import gptq_act_order_layer
from quant_int4 import quant_config

import poot
from poot import _native
from poot.errors import CheckpointFormatError


def _save(d: Path, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _weights(d: Path, packing: str, group: int, bits: int) -> _native.Weights:
    return _native.Weights(_native.SafetensorsModel(str(d), packed=(packing, group, bits)))


@pytest.mark.parametrize(
    ("packing", "bits", "k", "n", "group", "sym"),
    [
        ("gptq", 4, 128, 24, 32, False),
        ("gptq_v2", 4, 256, 40, 64, True),
        ("gptq", 4, 384, 16, 128, True),
        ("gptq_v2", 8, 256, 16, 64, False),
        ("gptq", 8, 128, 8, 32, True),
    ],
)
def test_act_order_matmul_matches_the_float64_dequantization(
    tmp_path: Path, packing: str, bits: int, k: int, n: int, group: int, sym: bool
) -> None:
    rng = np.random.default_rng(k * 7 + n + bits)
    w = rng.standard_normal((n, k))
    t, ref_w = gptq_act_order_layer(w, group, bits, packing == "gptq", sym, rng)
    d = _save(tmp_path, {f"l.{p}": v for p, v in t.items()})
    wts = _weights(d, packing, group, bits)
    assert wts.describe("l.weight") == ("Q4_Z" if bits == 4 else "Q8_Z", (n, k))
    assert wts.describe("l.input_perm") == ("I32", (1, k))
    assert wts.describe("l.g_idx") is None
    x = rng.standard_normal((3, k)).astype(np.float32)
    tr = _native.Tracer(wts, x.shape[0])
    xv = tr.input("x", "f32", list(x.shape))
    tr.output("y", tr.matmul(xv, tr.weight("l.weight")))
    rt = _native.CpuRuntime(1, "exact")
    got = np.asarray(rt.run(rt.prepare(tr.finish(), wts), {"x": x})["y"])
    x64 = x.astype(np.float64)
    bound = 1.01 * k * 2.0**-24 * (np.abs(x64) @ np.abs(ref_w).T)
    assert np.all(np.abs(got - x64 @ ref_w.T) <= bound)


def test_g_idx_already_in_blocks_needs_no_permutation(tmp_path: Path) -> None:
    """A ``g_idx`` constant on each 32 columns (what ``desc_act: false`` exports write, even
    out of order) keeps the stored order: no ``input_perm``, no gather."""
    rng = np.random.default_rng(5)
    t, _ = gptq_act_order_layer(rng.standard_normal((8, 128)), 32, 4, False, False, rng)
    t["g_idx"] = np.repeat(np.array([2, 0, 3, 1], np.int32), 32)
    wts = _weights(_save(tmp_path, {f"l.{p}": v for p, v in t.items()}), "gptq_v2", 32, 4)
    assert wts.describe("l.weight") == ("Q4_Z", (8, 128))
    assert wts.describe("l.input_perm") is None


def test_groups_that_do_not_fill_32_columns_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    t, _ = gptq_act_order_layer(rng.standard_normal((8, 64)), 32, 4, False, False, rng)
    t["g_idx"] = (rng.permutation(64) < 33).astype(np.int32)  # 33 and 31 columns
    d = _save(tmp_path, {f"l.{p}": v for p, v in t.items()})
    with pytest.raises(CheckpointFormatError, match="multiple of 32") as e:
        _weights(d, "gptq", 32, 4)
    assert (e.value.tensor, e.value.kind) == ("l.g_idx", "g_idx")


def _act_order_graph(wts: _native.Weights, rows: int, k: int) -> _native.Graph:
    tr = _native.Tracer(wts, rows)
    xv = tr.input("x", "f32", [rows, k])
    tr.output("y", tr.matmul(xv, tr.weight("l.weight")))
    return tr.finish()


@pytest.mark.device_wgpu
@pytest.mark.parametrize(
    ("packing", "bits", "k", "n", "group", "sym", "rows"),
    [("gptq", 4, 128, 24, 32, False, 3), ("gptq_v2", 8, 256, 16, 64, True, 1)],
)
def test_wgpu_act_order_matmul_matches_the_cpu(
    tmp_path: Path, packing: str, bits: int, k: int, n: int, group: int, sym: bool, rows: int
) -> None:
    """The gather moves f32 values without rounding and both runtimes' exact matmuls decode the
    same blocks, so wgpu equals the CPU within 1e-5 (summation order only)."""
    from wgpu_util import require_wgpu

    require_wgpu()
    rng = np.random.default_rng(k + n + rows)
    t, _ = gptq_act_order_layer(
        rng.standard_normal((n, k)), group, bits, packing == "gptq", sym, rng
    )
    wts = _weights(_save(tmp_path, {f"l.{p}": v for p, v in t.items()}), packing, group, bits)
    x = {"x": rng.standard_normal((rows, k)).astype(np.float32)}
    cpu = _native.CpuRuntime(1, "exact")
    want = np.asarray(cpu.run(cpu.prepare(_act_order_graph(wts, rows, k), wts), x)["y"])
    gpu = _native.WgpuRuntime(60.0, numerics="exact")
    got = np.asarray(gpu.run(gpu.prepare(_act_order_graph(wts, rows, k), wts), x)["y"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.device_wgpu
def test_wgpu_refuses_stored_gather_ids_out_of_range_when_compiling(tmp_path: Path) -> None:
    """A stored I32 ids row is checked once at compile: an id outside the gathered width is a
    typed CompileError naming the tensor, never a NaN column at run time."""
    from wgpu_util import require_wgpu

    from poot.errors import CompileError

    require_wgpu()
    ids = np.array([[0, 3, 4, 1]], np.int32)  # 4 is outside 0..4
    d = _save(tmp_path, {"p": ids, "w": np.zeros((2, 2), np.float32)})
    wts = _native.Weights(_native.SafetensorsModel(str(d)))
    assert wts.describe("p") == ("I32", (1, 4))
    tr = _native.Tracer(wts, 2)
    tr.output("y", tr.gather_cols(tr.input("x", "f32", [2, 4]), tr.weight("p")))
    with pytest.raises(CompileError, match=r"'p' holds gather id 4 outside 0\.\.4"):
        _native.WgpuRuntime(60.0).prepare(tr.finish(), wts)


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj")
PROMPT = [1, 403, 407, 261, 378, 259, 251, 76]


def _stories_act_order(
    stories: Path, d: Path, monkeypatch: pytest.MonkeyPatch, packing: str, bits: int
) -> dict[str, np.ndarray]:
    """Writes stories260K to ``d`` with every attention projection act-order quantized (each
    its own random permutation; the 172-wide MLP stays float); returns the dequantized
    weights in float64."""
    import family_models
    from safetensors.numpy import load_file

    src = stories / "hf"
    cfg = json.loads((src / "config.json").read_text())
    monkeypatch.setitem(family_models.FAMILIES, "stories", cfg)
    rng = np.random.default_rng(bits)
    stored: dict[str, np.ndarray] = {}
    deq: dict[str, np.ndarray] = {}
    for name, v in load_file(str(src / "model.safetensors")).items():
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in LINEAR and parts[2] == "weight":
            t, ref = gptq_act_order_layer(v, 32, bits, packing == "gptq", False, rng)
            stored.update({f"{parts[0]}.{parts[1]}.{p}": a for p, a in t.items()})
            deq[name] = ref
        else:
            stored[name] = v
            deq[name] = v.astype(np.float64)
    _save(d, stored)
    q = dict(quant_config(packing, 32, bits=bits), desc_act=True)
    (d / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (src / f).is_file():
            (d / f).write_bytes((src / f).read_bytes())
    return deq


@pytest.mark.parametrize(("packing", "bits"), [("gptq", 4), ("gptq_v2", 8)])
def test_stories_act_order_matches_its_dequantized_reference_for_32_tokens(
    stories: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packing: str, bits: int
) -> None:
    """stories260K act-order quantized: the float64 forward's 32 greedy ids."""
    import family_reference

    d = tmp_path / "m"
    deq = _stories_act_order(stories, d, monkeypatch, packing, bits)
    llm = poot.LLM(str(d), threads=1, numerics="exact")
    assert llm.weights.describe("model.layers.0.self_attn.q_proj.input_perm") == ("I32", (1, 64))
    ref = family_reference.reference_logits("stories", deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == family_reference.reference_greedy("stories", deq, PROMPT, 32)


@pytest.mark.device_wgpu
def test_wgpu_stories_act_order_gives_the_cpus_greedy_ids(
    stories: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same act-order stories260K on wgpu (exact numerics): the CPU's 32 greedy ids."""
    from wgpu_util import require_wgpu

    require_wgpu()
    d = tmp_path / "m"
    _stories_act_order(stories, d, monkeypatch, "gptq", 4)
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    cpu = poot.LLM(str(d), threads=1, numerics="exact").generate([PROMPT], params)
    gpu = poot.LLM(str(d), backend="wgpu", numerics="exact").generate([PROMPT], params)
    assert list(gpu[0].outputs[0].token_ids) == list(cpu[0].outputs[0].token_ids)
