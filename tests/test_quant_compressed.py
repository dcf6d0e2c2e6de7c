"""compressed-tensors ``pack-quantized`` checkpoints (llm-compressor), kept packed as Q4_Z/Q8_Z.

References: ``tests/quant_ct.py`` packs as compressed-tensors' ``pack_to_int32`` does and
dequantizes in float64 by its ``unpack_from_int32`` definition, in the stored column order; the
whole-model reference is the float64 forward of stories260K on those dequantized weights. Bounds
as in ``test_quant_int4.py`` (the decode is exact; the dot-product bound covers the sums).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_ct import bf16_bytes, ct_config, ct_layer, dequant_ct, save_raw

import poot
from poot import _native
from poot.checkpoints.quantized import quant_layout
from poot.errors import CheckpointFormatError, UnsupportedQuantizationError


def _save(d: Path, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _weights(d: Path, group: int, bits: int) -> _native.Weights:
    return _native.Weights(_native.SafetensorsModel(str(d), packed=("pack-quantized", group, bits)))


def _matmul(wts: _native.Weights, x: np.ndarray) -> np.ndarray:
    tr = _native.Tracer(wts, x.shape[0])
    xv = tr.input("x", "f32", list(x.shape))
    tr.output("y", tr.matmul(xv, tr.weight("l.weight")))
    rt = _native.CpuRuntime(1, "exact")
    return np.asarray(rt.run(rt.prepare(tr.finish(), wts), {"x": x})["y"])


def _check(got: np.ndarray, x: np.ndarray, ref_w: np.ndarray) -> None:
    x64 = x.astype(np.float64)
    bound = 1.01 * x.shape[1] * 2.0**-24 * (np.abs(x64) @ np.abs(ref_w).T)
    assert np.all(np.abs(got - x64 @ ref_w.T) <= bound)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    ("k", "n", "group", "sym", "actorder"),
    [
        (128, 24, -1, True, False),
        (128, 16, -1, False, False),
        (96, 40, 32, False, False),
        (256, 16, 64, True, True),
        (384, 72, 128, False, True),
    ],
)
def test_one_matmul_matches_the_float64_dequantization(
    tmp_path: Path, bits: int, k: int, n: int, group: int, sym: bool, actorder: bool
) -> None:
    rng = np.random.default_rng(k * 13 + n + bits)
    t, ref_w = ct_layer(rng.standard_normal((n, k)), bits, group, sym, actorder, rng)
    wts = _weights(_save(tmp_path, {f"l.{p}": v for p, v in t.items()}), group, bits)
    assert wts.describe("l.weight") == ("Q4_Z" if bits == 4 else "Q8_Z", (n, k))
    assert wts.describe("l.weight_packed") is None, "the packed source tensors are hidden"
    assert (wts.describe("l.input_perm") is not None) == actorder
    x = rng.standard_normal((3, k)).astype(np.float32)
    _check(_matmul(wts, x), x, ref_w)


@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_bf16_and_f32_scales_that_f16_holds_exactly_load(tmp_path: Path, dtype: str) -> None:
    """llm-compressor writes scales in the model's dtype; held as f16, they must convert
    exactly (the RTN scales here are f16 values, so they do)."""
    rng = np.random.default_rng(11)
    t, _ = ct_layer(rng.standard_normal((16, 64)), 4, 32, False, False, rng)
    s = t.pop("weight_scale").astype(np.float32)
    if dtype == "BF16":  # keep bf16's 8 significant bits (each then an f16 value too)
        s = (s.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    ref_w = dequant_ct({**t, "weight_scale": s}, 4)
    raw = {f"l.{p}": ("I32", list(v.shape), v.tobytes()) for p, v in t.items()}
    data = bf16_bytes(s) if dtype == "BF16" else s.tobytes()
    raw["l.weight_scale"] = (dtype, list(s.shape), data)
    tmp_path.mkdir(exist_ok=True)
    save_raw(tmp_path / "model.safetensors", raw)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    _check(_matmul(_weights(tmp_path, 32, 4), x), x, ref_w)


def test_unpacked_int8_zero_points_of_older_releases_load(tmp_path: Path) -> None:
    """Before compressed-tensors packed them, asymmetric zero points were stored as I8
    ``[n, groups]`` (signed); both forms give the same weights."""
    from quant_ct import unpack_from_int32

    rng = np.random.default_rng(12)
    t, ref_w = ct_layer(rng.standard_normal((24, 128)), 4, 32, False, False, rng)
    zp = unpack_from_int32(t["weight_zero_point"], 4, 24, packed_dim=0)
    # C order: safetensors.numpy writes a transposed view's buffer as it lies in memory.
    t["weight_zero_point"] = np.ascontiguousarray(zp, np.int8)
    wts = _weights(_save(tmp_path, {f"l.{p}": v for p, v in t.items()}), 32, 4)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    _check(_matmul(wts, x), x, ref_w)


def _bad_layer(tmp_path: Path, change: Any) -> Path:
    rng = np.random.default_rng(2)
    t, _ = ct_layer(rng.standard_normal((16, 64)), 4, 32, False, False, rng)
    change(t)
    return _save(tmp_path, {f"l.{p}": v for p, v in t.items()})


def _set(key: str, value: Any) -> Any:
    def change(t: dict[str, np.ndarray]) -> None:
        t[key] = value

    return change


@pytest.mark.parametrize(
    ("change", "tensor", "kind"),
    [
        (lambda t: t.pop("weight_scale"), "l.weight_scale", "missing_tensor"),
        (lambda t: t.pop("weight_shape"), "l.weight_shape", "missing_tensor"),
        (_set("weight_scale", np.ones((16, 3), np.float16)), "l.weight_scale", "shape"),
        (_set("weight_scale", np.ones((16, 2), np.int32)), "l.weight_scale", "dtype"),
        (_set("weight_scale", np.full((16, 2), 0.1, np.float32)), "l.weight_scale", "scale"),
        (_set("weight_shape", np.array([16, 72], np.int32)), "l.weight_packed", "shape"),
        (_set("weight_shape", np.array([-1, 64], np.int32)), "l.weight_shape", "shape"),
        (_set("weight_packed", np.zeros((16, 8), np.float32)), "l.weight_packed", "dtype"),
        (_set("weight_zero_point", np.zeros((1, 2), np.int32)), "l.weight_zero_point", "shape"),
        (_set("weight_g_idx", np.full(64, 5, np.int32)), "l.weight_g_idx", "g_idx"),
    ],
)
def test_malformed_layers_are_typed_errors(
    tmp_path: Path, change: Any, tensor: str, kind: str
) -> None:
    d = _bad_layer(tmp_path, change)
    with pytest.raises(CheckpointFormatError) as e:
        _weights(d, 32, 4)
    assert (e.value.tensor, e.value.kind) == (tensor, kind)


def _cfg(**weights: Any) -> dict[str, Any]:
    q = ct_config(4, 128, True, False, ["lm_head"])
    q["config_groups"]["group_0"]["weights"].update(weights)
    return q


@pytest.mark.parametrize(
    ("q", "field"),
    [
        (dict(ct_config(4, 128, True, False, []), format="naive-quantized"), "format"),
        (dict(ct_config(4, 128, True, False, []), format="marlin-24"), "format"),
        (_cfg(type="float", num_bits=8), "config_groups.group_0.weights.type"),
        (_cfg(num_bits=2), "config_groups.group_0.weights.num_bits"),
        (_cfg(strategy="tensor"), "config_groups.group_0.weights.strategy"),
        (_cfg(strategy="block"), "config_groups.group_0.weights.strategy"),
        (_cfg(group_size=48), "config_groups.group_0.weights.group_size"),
        (_cfg(actorder="sideways"), "config_groups.group_0.weights.actorder"),
        (_cfg(dynamic=True), "config_groups.group_0.weights.dynamic"),
        (
            dict(ct_config(4, 128, True, False, []), sparsity_config={"format": "sparse-24"}),
            "sparsity_config",
        ),
        (
            dict(ct_config(4, 128, True, False, []), kv_cache_scheme={"num_bits": 8}),
            "kv_cache_scheme",
        ),
        (dict(ct_config(4, 128, True, False, []), config_groups={}), "config_groups"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(
    tmp_path: Path, q: dict[str, Any], field: str
) -> None:
    with pytest.raises(UnsupportedQuantizationError) as e:
        quant_layout({"quantization_config": q}, tmp_path)
    assert e.value.field == f"quantization_config.{field}"


def test_activation_quantization_and_mixed_schemes_are_refused(tmp_path: Path) -> None:
    q = ct_config(8, 128, True, False, [])
    q["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "int"}
    with pytest.raises(UnsupportedQuantizationError) as e:
        quant_layout({"quantization_config": q}, tmp_path)
    assert e.value.field == "quantization_config.config_groups.group_0.input_activations"
    q = ct_config(4, 128, True, False, [])
    q["config_groups"]["group_1"] = ct_config(8, -1, True, False, [])["config_groups"]["group_0"]
    with pytest.raises(UnsupportedQuantizationError) as e:
        quant_layout({"quantization_config": q}, tmp_path)
    assert e.value.field == "quantization_config.config_groups"


def test_layouts_read_from_the_config(tmp_path: Path) -> None:
    lay = quant_layout(
        {"quantization_config": ct_config(4, 64, False, True, ["lm_head"])}, tmp_path
    )
    assert lay is not None and lay.native == ("pack-quantized", 64, 4)
    assert (lay.sym, lay.desc_act, lay.ignore) == (False, True, ("lm_head",))
    weight_order = _cfg(actorder="weight")
    lay = quant_layout({"quantization_config": weight_order}, tmp_path)
    assert lay is not None and not lay.desc_act
    chan = quant_layout({"quantization_config": ct_config(8, -1, True, False, [])}, tmp_path)
    assert chan is not None and chan.native == ("pack-quantized", -1, 8)


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj")
PROMPT = [1, 403, 407, 261, 378, 259, 251, 76]


def _stories(
    stories: Path, d: Path, bits: int, group: int, sym: bool, actorder: bool
) -> dict[str, np.ndarray]:
    """stories260K with its attention projections pack-quantized; the MLP (172 wide) is in the
    ``ignore`` list, as llm-compressor leaves what it cannot pack, and stays float."""
    from safetensors.numpy import load_file

    src = stories / "hf"
    cfg = json.loads((src / "config.json").read_text())
    rng = np.random.default_rng(bits + group)
    stored: dict[str, np.ndarray] = {}
    deq: dict[str, np.ndarray] = {}
    ignore = ["lm_head"]
    for name, v in load_file(str(src / "model.safetensors")).items():
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in LINEAR and parts[2] == "weight":
            t, ref = ct_layer(v, bits, group, sym, actorder, rng)
            stored.update({f"{parts[0]}.{parts[1]}.{p}": a for p, a in t.items()})
            deq[name] = ref
        else:
            if name.endswith("proj.weight"):
                ignore.append(name.removesuffix(".weight"))
            stored[name] = v
            deq[name] = v.astype(np.float64)
    _save(d, stored)
    q = ct_config(bits, group, sym, actorder, ignore)
    (d / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (src / f).is_file():
            (d / f).write_bytes((src / f).read_bytes())
    return deq


@pytest.mark.parametrize(
    ("bits", "group", "sym", "actorder"),
    [(4, 32, False, True), (4, -1, True, False), (8, 64, False, False)],
)
def test_stories_matches_its_dequantized_reference_for_32_tokens(
    stories: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bits: int,
    group: int,
    sym: bool,
    actorder: bool,
) -> None:
    import family_models
    import family_reference

    cfg = json.loads((stories / "hf" / "config.json").read_text())
    monkeypatch.setitem(family_models.FAMILIES, "stories", cfg)
    deq = _stories(stories, tmp_path / "m", bits, group, sym, actorder)
    llm = poot.LLM(str(tmp_path / "m"), threads=1, numerics="exact")
    want = "Q4_Z" if bits == 4 else "Q8_Z"
    assert llm.weights.describe("model.layers.0.self_attn.q_proj.weight") == (want, (64, 64))
    assert llm.weights.describe("model.layers.0.mlp.down_proj.weight")[0] == "F32"
    ref = family_reference.reference_logits("stories", deq, PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == family_reference.reference_greedy("stories", deq, PROMPT, 32)


def test_inspect_shows_the_layout(
    stories: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from poot.cli import main

    _stories(stories, tmp_path / "m", 4, 32, False, True)
    assert main(["inspect", "--json", "--quiet", str(tmp_path / "m")]) == 0
    fmt = json.loads(capsys.readouterr().out)["format"]
    assert fmt["quantization"].startswith(
        "compressed-tensors pack-quantized int4, group 32, asym, act-order, ignore ['lm_head'"
    )
    assert fmt["quantized_layers"] == 4 * 5  # stories260K: 5 layers
    assert not any("self_attn" in n for n in fmt["float_weights"])
    assert "model.layers.0.mlp.down_proj.weight" in fmt["float_weights"]
