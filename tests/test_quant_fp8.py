"""FP8 E4M3 checkpoints (compressed-tensors ``float-quantized`` and ``quant_method: fp8``), kept
as their E4M3 bytes in poot's F8_S blocks (32 bytes and an f32 scale).

References: ``tests/quant_fp8.py``'s E4M3 table, computed from the format's definition (its two
NaN codes are refused at load, a ``CheckpointFormatError`` naming the weight), and the
float64 dequantization of each layer from its stored bytes and scales; stories260K's float64
forward on those weights. Bounds: E4M3 decodes exactly; the scale multiply is exact for bf16
scales and rounds at most once for f32 ones, so one matmul stays within the dot-product bound
with one more rounding a term, ``1.01 * (k + 1) * 2**-24 * sum_i |x_i W_ji|``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_ct import bf16_bytes, save_raw
from quant_fp8 import TABLE, fp8_layer

import poot
from poot import _native
from poot.checkpoints.quantized import quant_layout
from poot.errors import CheckpointFormatError, UnsupportedQuantizationError


def _scale_bytes(s: np.ndarray, dtype: str) -> bytes:
    return bf16_bytes(s) if dtype == "BF16" else s.astype(np.float32).tobytes()


def _layer_file(
    d: Path,
    codes: np.ndarray,
    s: np.ndarray,
    scale_name: str = "weight_scale",
    scale_dtype: str = "F32",
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_raw(
        d / "model.safetensors",
        {
            "l.weight": ("F8_E4M3", list(codes.shape), codes.tobytes()),
            f"l.{scale_name}": (scale_dtype, list(s.shape), _scale_bytes(s, scale_dtype)),
        },
    )
    return d


def _weights(d: Path, block: int = -1) -> _native.Weights:
    return _native.Weights(_native.SafetensorsModel(str(d), packed=("fp8", block, 8)))


def _rows(wts: _native.Weights, n: int, runtime: Any) -> np.ndarray:
    """Every row of ``l.weight``, decoded by the runtime's embedding lookup."""
    tr = _native.Tracer(wts, n)
    ids = tr.input("ids", "i32", [n])
    tr.output("y", tr.embedding(tr.weight("l.weight"), ids))
    return np.asarray(
        runtime.run(runtime.prepare(tr.finish(), wts), {"ids": np.arange(n, dtype=np.int32)})["y"]
    )


# Every code but the two NaNs (refused at load), which this table replaces by the zeros.
_FINITE = np.arange(256, dtype=np.uint8)
_FINITE[[0x7F, 0xFF]] = [0x00, 0x80]


def _check_codes(got: np.ndarray) -> None:
    want = TABLE[_FINITE].astype(np.float32).reshape(8, 32)
    assert not np.any(np.isnan(got)) and not np.any(np.isinf(got))
    # Bit for bit, the sign of zero (0x80 is -0.0) included.
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _code_table(tmp_path: Path) -> _native.Weights:
    codes = _FINITE.reshape(8, 32)
    wts = _weights(_layer_file(tmp_path, codes, np.ones(1, np.float32)))
    assert wts.describe("l.weight") == ("F8_S", (8, 32))
    assert wts.describe("l.weight_scale") is None
    return wts


def test_every_e4m3_code_decodes_bit_exactly(tmp_path: Path) -> None:
    _check_codes(_rows(_code_table(tmp_path), 8, _native.CpuRuntime(1, "exact")))


@pytest.mark.device_wgpu
def test_every_e4m3_code_decodes_bit_exactly_on_wgpu(tmp_path: Path) -> None:
    """The WGSL decoder (``shaders/wgsl/dec_f8_s.wgsl``) builds the same bit patterns."""
    from wgpu_util import require_wgpu

    require_wgpu()
    _check_codes(_rows(_code_table(tmp_path), 8, _native.WgpuRuntime(60.0)))


def _matmul(wts: _native.Weights, x: np.ndarray, runtime: Any) -> np.ndarray:
    tr = _native.Tracer(wts, x.shape[0])
    xv = tr.input("x", "f32", list(x.shape))
    tr.output("y", tr.matmul(xv, tr.weight("l.weight")))
    return np.asarray(runtime.run(runtime.prepare(tr.finish(), wts), {"x": x})["y"])


def _bound_ok(got: np.ndarray, x: np.ndarray, ref_w: np.ndarray, factor: float = 1.01) -> bool:
    x64 = x.astype(np.float64)
    k = x.shape[1]
    bound = factor * (k + 1) * 2.0**-24 * (np.abs(x64) @ np.abs(ref_w).T)
    return bool(np.all(np.abs(got - x64 @ ref_w.T) <= bound))


CASES = [
    # layout, block (native spec), scale name, scale dtype, n, k
    ("tensor", -1, "weight_scale", "F32", 24, 128),
    ("channel", -1, "weight_scale", "BF16", 40, 96),
    ("block", 128, "weight_scale", "BF16", 200, 320),
    ("block", 128, "weight_scale_inv", "F32", 200, 320),
    ("block", 64, "weight_scale_inv", "F32", 72, 192),
]


@pytest.mark.parametrize(("layout", "block", "scale_name", "scale_dtype", "n", "k"), CASES)
def test_one_matmul_matches_the_float64_dequantization(
    tmp_path: Path, layout: str, block: int, scale_name: str, scale_dtype: str, n: int, k: int
) -> None:
    rng = np.random.default_rng(n * 3 + k)
    codes, s, ref_w = fp8_layer(rng.standard_normal((n, k)), layout, max(block, 1), scale_dtype)
    wts = _weights(_layer_file(tmp_path, codes, s, scale_name, scale_dtype), block)
    assert wts.describe("l.weight") == ("F8_S", (n, k))
    x = rng.standard_normal((3, k)).astype(np.float32)
    assert _bound_ok(_matmul(wts, x, _native.CpuRuntime(1, "exact")), x, ref_w)


@pytest.mark.device_wgpu
@pytest.mark.parametrize("numerics", ["exact", "ggml"])
def test_wgpu_matmul_matches_the_reference(tmp_path: Path, numerics: str) -> None:
    from wgpu_util import require_wgpu

    require_wgpu()
    rng = np.random.default_rng(4)
    codes, s, ref_w = fp8_layer(rng.standard_normal((200, 320)), "block", 128, "F32")
    wts = _weights(_layer_file(tmp_path, codes, s, "weight_scale_inv"), 128)
    x = rng.standard_normal((5, 320)).astype(np.float32)
    gpu = _native.WgpuRuntime(60.0, numerics=numerics)  # type: ignore[arg-type]
    assert _bound_ok(_matmul(wts, x, gpu), x, ref_w, factor=2.02)


@pytest.mark.parametrize(
    ("codes_shape", "scale", "scale_dtype", "tensor", "kind"),
    [
        ((8, 48), np.ones(1, np.float32), "F32", "l.weight", "shape"),
        ((8, 64), np.ones((3, 1), np.float32), "F32", "l.weight_scale", "shape"),
        ((8, 64), np.ones((8, 1), np.int32), "I32", "l.weight_scale", "dtype"),
    ],
)
def test_malformed_layers_are_typed_errors(
    tmp_path: Path,
    codes_shape: tuple[int, int],
    scale: np.ndarray,
    scale_dtype: str,
    tensor: str,
    kind: str,
) -> None:
    d = tmp_path / "m"
    d.mkdir()
    save_raw(
        d / "model.safetensors",
        {
            "l.weight": ("F8_E4M3", list(codes_shape), bytes(int(np.prod(codes_shape)))),
            "l.weight_scale": (scale_dtype, list(scale.shape), scale.tobytes()),
        },
    )
    with pytest.raises(CheckpointFormatError) as e:
        _weights(d)
    assert (e.value.tensor, e.value.kind) == (tensor, kind)


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_a_nan_code_is_refused_naming_the_weight(tmp_path: Path, code: int) -> None:
    """E4M3's NaN codes are no weight any quantizer writes: loading says where one is."""
    codes = np.full((8, 64), 0x38, np.uint8)
    codes[5, 40] = code
    d = _layer_file(tmp_path / "m", codes, np.ones(1, np.float32))
    with pytest.raises(CheckpointFormatError) as e:
        _weights(d)
    assert (e.value.tensor, e.value.kind) == ("l.weight", "value")
    assert f"row 5, column 40 holds the E4M3 NaN code {code:#04x}" in str(e.value)


def test_a_missing_scale_is_named(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    save_raw(d / "model.safetensors", {"l.weight": ("F8_E4M3", [8, 64], bytes(512))})
    with pytest.raises(CheckpointFormatError) as e:
        _weights(d)
    assert (e.value.tensor, e.value.kind) == ("l.weight_scale_inv", "missing_tensor")


def _ct_fp8(strategy: str, **extra: Any) -> dict[str, Any]:
    weights: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True}
    weights.update(strategy=strategy, dynamic=False, **extra)
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
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


FP8_BLOCK = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def test_layouts_read_from_the_config(tmp_path: Path) -> None:
    lay = quant_layout({"quantization_config": FP8_BLOCK}, tmp_path)
    assert lay is not None and lay.native == ("fp8", 128, 8) and lay.dynamic_activations
    lay = quant_layout({"quantization_config": _ct_fp8("channel")}, tmp_path)
    assert lay is not None and lay.native == ("fp8", -1, 8) and lay.ignore == ("lm_head",)
    block = _ct_fp8("block", block_structure=[128, 128])
    lay = quant_layout({"quantization_config": block}, tmp_path)
    assert lay is not None and lay.native == ("fp8", 128, 8)


@pytest.mark.parametrize(
    ("q", "field"),
    [
        (dict(FP8_BLOCK, fmt="e5m2"), "fmt"),
        (dict(FP8_BLOCK, activation_scheme="static"), "activation_scheme"),
        (dict(FP8_BLOCK, weight_block_size=[128, 64]), "weight_block_size"),
        (dict(FP8_BLOCK, weight_block_size=[48, 48]), "weight_block_size"),
        (_ct_fp8("token"), "config_groups.group_0.weights.strategy"),
        (
            _ct_fp8("block", block_structure="128x64"),
            "config_groups.group_0.weights.block_structure",
        ),
        (_ct_fp8("tensor", num_bits=4), "config_groups.group_0.weights.type"),
        (_ct_fp8("tensor", type="int"), "config_groups.group_0.weights.type"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(
    tmp_path: Path, q: dict[str, Any], field: str
) -> None:
    with pytest.raises(UnsupportedQuantizationError) as e:
        quant_layout({"quantization_config": q}, tmp_path)
    assert e.value.field == f"quantization_config.{field}"


def test_static_activation_scales_are_refused(tmp_path: Path) -> None:
    q = _ct_fp8("channel")
    q["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    with pytest.raises(UnsupportedQuantizationError) as e:
        quant_layout({"quantization_config": q}, tmp_path)
    assert e.value.field == "quantization_config.config_groups.group_0.input_activations"


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")
PROMPT = [1, 403, 407, 261, 378, 259, 251, 76]


def _stories(
    stories: Path,
    d: Path,
    q: dict[str, Any],
    layout: str,
    block: int,
    scale_name: str,
    scale_dtype: str,
) -> dict[str, np.ndarray]:
    """stories260K with every projection but ``down_proj`` (172 inputs: not whole 32-blocks,
    so left float, as exporters leave it) in FP8."""
    from safetensors.numpy import load_file

    src = stories / "hf"
    cfg = json.loads((src / "config.json").read_text())
    raw: dict[str, tuple[str, list[int], bytes]] = {}
    deq: dict[str, np.ndarray] = {}
    for name, v in load_file(str(src / "model.safetensors")).items():
        parts = name.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in LINEAR and parts[2] == "weight":
            codes, s, ref = fp8_layer(v, layout, block, scale_dtype)
            raw[name] = ("F8_E4M3", list(codes.shape), codes.tobytes())
            sname = f"{parts[0]}.{parts[1]}.{scale_name}"
            raw[sname] = (scale_dtype, list(s.shape), _scale_bytes(s, scale_dtype))
            deq[name] = ref
        else:
            raw[name] = ("F32", list(v.shape), v.astype(np.float32).tobytes())
            deq[name] = v.astype(np.float64)
    d.mkdir()
    save_raw(d / "model.safetensors", raw)
    (d / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (src / f).is_file():
            (d / f).write_bytes((src / f).read_bytes())
    return deq


STORIES_CASES = [
    (FP8_BLOCK, "block", 128, "weight_scale_inv", "F32"),
    (_ct_fp8("channel"), "channel", 1, "weight_scale", "BF16"),
    (_ct_fp8("tensor"), "tensor", 1, "weight_scale", "F32"),
]


@pytest.mark.parametrize(("q", "layout", "block", "scale_name", "scale_dtype"), STORIES_CASES)
def test_stories_matches_its_dequantized_reference_for_32_tokens(
    stories: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    q: dict[str, Any],
    layout: str,
    block: int,
    scale_name: str,
    scale_dtype: str,
) -> None:
    import family_models
    import family_reference

    cfg = json.loads((stories / "hf" / "config.json").read_text())
    monkeypatch.setitem(family_models.FAMILIES, "stories", cfg)
    deq = _stories(stories, tmp_path / "m", q, layout, block, scale_name, scale_dtype)
    llm = poot.LLM(str(tmp_path / "m"), threads=1, numerics="exact")
    assert llm.weights.describe("model.layers.0.self_attn.q_proj.weight") == ("F8_S", (64, 64))
    assert llm.weights.describe("model.layers.0.mlp.up_proj.weight") == ("F8_S", (172, 64))
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

    _stories(stories, tmp_path / "m", FP8_BLOCK, "block", 128, "weight_scale_inv", "F32")
    assert main(["inspect", "--json", "--quiet", str(tmp_path / "m")]) == 0
    fmt = json.loads(capsys.readouterr().out)["format"]
    assert fmt["quantization"].startswith(
        "fp8 e4m3, 128x128 block scales; linear layers held as F8_S"
    )
    assert fmt["quantization"].endswith("dynamic FP8 activations run in float (weight-only)")
    assert fmt["quantized_layers"] == 6 * 5
    assert "model.layers.0.mlp.down_proj.weight" in fmt["float_weights"]
    assert not any("q_proj" in n for n in fmt["float_weights"])
