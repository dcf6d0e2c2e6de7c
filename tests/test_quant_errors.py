"""Quantized checkpoints poot does not load, or that are malformed: typed errors naming the field.

Config-level refusals come from ``poot.checkpoints.quantized.quant_layout`` before any tensor is
read; tensor-level ones from the native re-lay when ``Weights`` is built, naming the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_int4 import quant_config, quantize_layer

from poot import _native
from poot.checkpoints.quantized import quant_layout
from poot.errors import CheckpointFormatError, UnsupportedQuantizationError


@pytest.mark.parametrize(
    ("q", "field"),
    [
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits"),
        ({"quant_method": "gptq", "bits": 2, "group_size": 128}, "bits"),
        ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 48}, "group_size"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version"),
        ({"quant_method": "awq", "bits": 4, "zero_point": False}, "zero_point"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt"),
        ({"quant_method": "hqq", "nbits": 4}, "quant_method"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "config_groups"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method"),
        ({"quant_method": "gptq", "bits": "4"}, "bits"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(
    tmp_path: Path, q: dict[str, Any], field: str
) -> None:
    with pytest.raises(UnsupportedQuantizationError) as e:
        quant_layout({"quantization_config": q}, tmp_path)
    assert isinstance(e.value, CheckpointFormatError) and isinstance(e.value, ValueError)
    assert e.value.kind == "unsupported_quantization"
    assert e.value.field == f"quantization_config.{field}"


def test_quantize_config_json_beside_the_config_is_read(tmp_path: Path) -> None:
    (tmp_path / "quantize_config.json").write_text(
        json.dumps({"bits": 4, "group_size": 64, "sym": False, "desc_act": False})
    )
    layout = quant_layout({}, tmp_path)
    assert layout is not None and layout.native == ("gptq", 64, 4) and not layout.sym
    assert quant_layout({}, tmp_path / "elsewhere") is None


def test_loading_an_unsupported_directory_fails_before_any_weight(tmp_path: Path) -> None:
    """The refusal comes from the config: the directory's tensors are never opened."""
    from family_models import FAMILIES

    import poot

    q = {"quant_method": "gptq", "bits": 3, "group_size": 128}
    (tmp_path / "config.json").write_text(
        json.dumps(dict(FAMILIES["mistral"], quantization_config=q))
    )
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UnsupportedQuantizationError) as e:
        poot.LLM(str(tmp_path))
    assert e.value.field == "quantization_config.bits" and "3-bit" in str(e.value)


def _layer(tmp_path: Path, change: Any, packing: str = "gptq", group: int = 32) -> Path:
    w = np.random.default_rng(0).standard_normal((16, 64))
    tensors, _ = quantize_layer(w, packing, group, g_idx=packing != "awq")
    change(tensors)
    from safetensors.numpy import save_file

    save_file({f"l.{p}": v for p, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": quant_config(packing, group)})
    )
    return tmp_path


def _load(d: Path, packing: str = "gptq", group: int = 32) -> None:
    _native.Weights(_native.SafetensorsModel(str(d), packed=(packing, group, 4)))


def _set(key: str, value: Any) -> Any:
    def change(t: dict[str, np.ndarray]) -> None:
        t[key] = value

    return change


@pytest.mark.parametrize(
    ("change", "tensor", "kind"),
    [
        (lambda t: t.pop("scales"), "l.scales", "missing_tensor"),
        (lambda t: t.pop("qzeros"), "l.qzeros", "missing_tensor"),
        (_set("scales", np.ones((2, 16), np.float32)), "l.scales", "dtype"),
        (_set("scales", np.ones((3, 16), np.float16)), "l.scales", "shape"),
        (_set("qzeros", np.zeros((2, 1), np.int32)), "l.qzeros", "shape"),
        (_set("g_idx", np.full(64, 2, np.int32)), "l.g_idx", "g_idx"),
        # Act-order: 33 and 31 columns, so sorted by group a 32-block still spans two.
        (_set("g_idx", (np.arange(64) * 7 % 64 < 33).astype(np.int32)), "l.g_idx", "g_idx"),
    ],
)
def test_malformed_gptq_layers_are_typed_errors(
    tmp_path: Path, change: Any, tensor: str, kind: str
) -> None:
    d = _layer(tmp_path, change)
    with pytest.raises(CheckpointFormatError) as e:
        _load(d)
    assert (e.value.tensor, e.value.kind) == (tensor, kind)
    assert e.value.field == "quantization_config"


def test_act_order_groups_must_fill_whole_blocks(tmp_path: Path) -> None:
    """Act-order itself loads (``test_quant_actorder.py``); groups of 33 and 31 columns do not."""
    d = _layer(tmp_path, _set("g_idx", (np.arange(64) * 7 % 64 < 33).astype(np.int32)))
    with pytest.raises(CheckpointFormatError, match="multiple of 32"):
        _load(d)


def test_group_size_that_does_not_divide_in_features(tmp_path: Path) -> None:
    d = _layer(tmp_path, lambda t: None)
    with pytest.raises(CheckpointFormatError) as e:
        _load(d, group=128)
    assert e.value.tensor == "l.qweight"


def test_unknown_packing_or_bits_is_a_value_error(tmp_path: Path) -> None:
    d = _layer(tmp_path, lambda t: None)
    with pytest.raises(ValueError, match="packing"):
        _load(d, packing="exl2")
    with pytest.raises(ValueError, match="8-bit"):
        _native.SafetensorsModel(str(d), packed=("awq", 32, 8))
    with pytest.raises(ValueError, match="3-bit"):
        _native.SafetensorsModel(str(d), packed=("gptq", 32, 3))


def test_8bit_layer_read_as_4bit_is_a_shape_error(tmp_path: Path) -> None:
    w = np.random.default_rng(1).standard_normal((16, 64))
    tensors, _ = quantize_layer(w, "gptq", 32, bits=8)
    from safetensors.numpy import save_file

    save_file({f"l.{p}": v for p, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointFormatError) as e:
        _load(tmp_path)
    assert e.value.kind == "shape"
