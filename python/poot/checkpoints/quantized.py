"""Quantized Hugging Face checkpoints: which ``quantization_config`` poot loads, and how.

Loaded: GPTQ int4 and int8 (AutoGPTQ, GPTQModel, Optimum; ``checkpoint_format`` ``gptq`` with
the v1 ``zero - 1`` convention or GPTQModel's ``gptq_v2``; act-order ``desc_act`` included),
AWQ int4 (AutoAWQ's GEMM layout) and compressed-tensors ``pack-quantized`` int4 and int8
(llm-compressor; group and channel strategies, symmetric or not, ``actorder`` group or weight,
an ``ignore`` list of layers left in float), at ``group_size`` -1 or a multiple of 32. Their
linear layers are re-laid once, at load, into poot's Q4_Z blocks (32 weights: an f16 scale, a
u8 zero point, 16 bytes of nibbles; 4.75 bits a weight) or Q8_Z blocks (9 bits a weight) and
multiplied by the runtimes' decoded matmuls; no float copy is made. An act-order layer whose
groups are scattered over its input columns is re-laid sorted by group, and its activations are
gathered in the same order in the graph (a ``gather_cols`` before the matmul; the CPU runs it,
wgpu and CUDA have no ``gather_cols`` kernel yet and refuse such a graph).

Invariant: :func:`quant_layout` decides from the config files alone, before any tensor is
read, and refuses every layout, bit width or option it does not load with an
``UnsupportedQuantizationError`` (a ``CheckpointFormatError``,
``kind="unsupported_quantization"``) whose ``field`` names the
config key (``quantization_config.bits``, ...). Malformed tensors (shapes, dtypes, missing
``scales``, ``g_idx`` out of range) are refused by the native re-lay when ``Weights`` is built,
naming the tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from poot.errors import CheckpointFormatError, UnsupportedQuantizationError

Packing = Literal["gptq", "gptq_v2", "awq", "pack-quantized", "fp8"]


@dataclass(frozen=True)
class QuantLayout:
    """A quantized checkpoint's layout, as poot loads it.

    Attributes:
        method: ``"gptq"``, ``"awq"`` or ``"compressed-tensors"``.
        packing: ``"gptq"`` (v1 zeros), ``"gptq_v2"``, ``"awq"`` or ``"pack-quantized"``; what
            the native re-lay reads.
        bits: 4, or 8 for GPTQ (held as Q8_Z: a u8 quant each, an f16 scale and a u16 zero a
            32-block).
        group_size: -1 (one group per row) or a multiple of 32.
        sym: symmetric zeros (the zeros are stored either way and read as stored).
        desc_act: act-order (GPTQ ``desc_act``, compressed-tensors ``actorder``); a ``g_idx``
            that scatters groups is re-laid sorted, with a gather of the activations.
        ignore: compressed-tensors' ``ignore`` list (layers left in float), as written.
        dynamic_activations: the checkpoint asks for dynamic FP8 activations; poot runs them in
            float (weight-only FP8) and says so.
    """

    method: Literal["gptq", "awq", "compressed-tensors", "fp8"]
    packing: Packing
    bits: int
    group_size: int
    sym: bool
    desc_act: bool
    ignore: tuple[str, ...] = ()
    dynamic_activations: bool = False

    @property
    def native(self) -> tuple[str, int, int]:
        """The ``packed=`` argument of ``_native.SafetensorsModel``."""
        return (self.packing, self.group_size, self.bits)

    def describe(self) -> str:
        """One line for ``poot inspect``."""
        ignore = f", ignore {list(self.ignore)}" if self.ignore else ""
        if self.packing == "fp8":
            name = "compressed-tensors float-quantized" if self.method != "fp8" else "fp8"
            scales = "per-tensor or per-channel scales"
            if self.group_size != -1:
                scales = f"{self.group_size}x{self.group_size} block scales"
            acts = (
                "; dynamic FP8 activations run in float (weight-only)"
                if self.dynamic_activations
                else ""
            )
            return (
                f"{name} e4m3, {scales}{ignore}; linear layers held as F8_S (9 bits/weight), "
                f"the rest as stored{acts}"
            )
        group = "per row" if self.group_size == -1 else f"group {self.group_size}"
        zeros = "sym" if self.sym else "asym"
        act = ", act-order" if self.desc_act else ""
        held = "Q4_Z (4.75 bits/weight)" if self.bits == 4 else "Q8_Z (9 bits/weight)"
        name = f"compressed-tensors {self.packing}" if self.packing == "pack-quantized" else ""
        return (
            f"{name or self.packing} int{self.bits}, {group}, {zeros}{act}{ignore}; "
            f"linear layers held as {held}, the rest as stored"
        )


_PACKED_SUFFIXES = (".qweight", ".weight_packed")


def float_weights(names_dtypes: list[tuple[str, str, int]]) -> tuple[int, list[str]]:
    """How many quantized layers a tensor table holds, and the matrices it keeps in float
    (embeddings, a float ``lm_head``, compressed-tensors' ``ignore`` list): ``(name, dtype,
    ndim)`` triples in, for ``poot inspect``.
    """
    layers = {
        n.rsplit(".", 1)[0]
        for n, dt, _ in names_dtypes
        if n.endswith(_PACKED_SUFFIXES) or dt == "F8_E4M3" and n.endswith(".weight")
    }
    floats = [
        n
        for n, dt, ndim in names_dtypes
        if ndim == 2 and dt in ("F32", "F16", "BF16") and n.rsplit(".", 1)[0] not in layers
    ]
    return len(layers), floats


def _refuse(source: str, key: str, message: str) -> UnsupportedQuantizationError:
    return UnsupportedQuantizationError(
        f"{source}: {message}",
        kind="unsupported_quantization",
        file=source,
        field=f"quantization_config.{key}",
    )


def _int(q: dict[str, Any], key: str, default: int, source: str) -> int:
    v = q.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _refuse(source, key, f"{key} must be an integer, got {v!r}")
    return v


def quant_layout(config: dict[str, Any], directory: Path) -> QuantLayout | None:
    """The layout of a checkpoint, from ``config.json``'s ``quantization_config`` (or a
    ``quantize_config.json`` beside it, as older AutoGPTQ exports write); None when it is not
    quantized.

    Raises:
        UnsupportedQuantizationError: a method, bit width or option poot does not load (the
            field is named).
        CheckpointFormatError: a malformed ``quantize_config.json``.
    """
    source = str(directory / "config.json")
    q = config.get("quantization_config")
    side = directory / "quantize_config.json"
    if q is None and side.is_file():
        source = str(side)
        try:
            q = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointFormatError(
                f"{side}: not readable JSON ({e})", kind="invalid_json", file=str(side)
            ) from e
        q = {"quant_method": "gptq", **q} if isinstance(q, dict) else q
    if q is None:
        return None
    if not isinstance(q, dict):
        raise _refuse(source, "quant_method", "quantization_config must be an object")
    method = str(q.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(q, source)
    if method == "fp8":
        return _fp8(q, source)
    if method not in ("gptq", "awq"):
        raise _refuse(
            source,
            "quant_method",
            f"quant_method {method!r} is not supported yet (poot loads gptq, awq, fp8 and "
            "compressed-tensors; bitsandbytes and others are refused)",
        )
    # AutoAWQ's own quant_config spells them w_bit and q_group_size.
    bits = _int(q, "bits", _int(q, "w_bit", 4, source), source)
    if bits != 4 and not (bits == 8 and method == "gptq"):
        only = "4 and 8" if method == "gptq" else "4"
        raise _refuse(
            source, "bits", f"{method} with {bits}-bit weights is not supported ({only} only)"
        )
    group_size = _int(q, "group_size", _int(q, "q_group_size", 128, source), source)
    if group_size != -1 and (group_size <= 0 or group_size % 32):
        raise _refuse(
            source, "group_size", f"group_size {group_size} is not -1 or a multiple of 32"
        )
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise _refuse(
                source, "version", f"AWQ version {version!r} is not supported (GEMM only)"
            )
        zero = q.get("zero_point", True)
        if zero is not True:
            raise _refuse(source, "zero_point", "AWQ without zero points is not supported")
        return QuantLayout("awq", "awq", bits, group_size, sym=False, desc_act=False)
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(
            source,
            "checkpoint_format",
            f"GPTQ checkpoint_format {fmt!r} is not supported (gptq and gptq_v2 only)",
        )
    for key in ("is_marlin_format", "use_exllama_v2_format"):
        if q.get(key):
            raise _refuse(source, key, f"{key} checkpoints are not supported")
    sym = bool(q.get("sym", True))
    desc_act = bool(q.get("desc_act", False))
    packing: Packing = "gptq_v2" if fmt == "gptq_v2" else "gptq"
    return QuantLayout("gptq", packing, bits, group_size, sym=sym, desc_act=desc_act)


def _compressed_tensors(q: dict[str, Any], source: str) -> QuantLayout:
    """compressed-tensors' ``quantization_config`` (llm-compressor): ``pack-quantized`` int4/int8
    weights, one weight scheme for every config group, no activation quantization."""
    fmt = str(q.get("format", "")).lower()
    if fmt not in ("pack-quantized", "float-quantized"):
        raise _refuse(
            source,
            "format",
            f"compressed-tensors format {fmt!r} is not supported (pack-quantized and "
            "float-quantized only; naive/int-quantized, marlin-24 and nvfp4 are refused)",
        )
    sparsity = q.get("sparsity_config") or {}
    if isinstance(sparsity, dict) and str(sparsity.get("format", "dense")).lower() != "dense":
        raise _refuse(
            source, "sparsity_config", "sparse compressed-tensors (2:4 and others) is refused"
        )
    if q.get("kv_cache_scheme"):
        raise _refuse(source, "kv_cache_scheme", "a quantized KV cache scheme is not supported")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse(source, "config_groups", "config_groups must be a non-empty object")
    schemes = []
    dynamic = False
    for gname, group in groups.items():
        key = f"config_groups.{gname}"
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            raise _refuse(source, f"{key}.weights", "each config group needs a weights scheme")
        gfmt = group.get("format")
        if gfmt is not None and str(gfmt).lower() != fmt:
            raise _refuse(source, f"{key}.format", f"group format {gfmt!r} is not {fmt}")
        if group.get("output_activations"):
            raise _refuse(
                source, f"{key}.output_activations", "output activation quantization is refused"
            )
        acts = group.get("input_activations")
        # FP8_DYNAMIC: activations quantized per token at run time. poot runs them in float
        # (weight-only) and says so; static activation scales (W8A8 with input_scale) and
        # integer activations are refused.
        if acts and not (
            fmt == "float-quantized"
            and isinstance(acts, dict)
            and acts.get("dynamic") is True
            and str(acts.get("type", "")).lower() == "float"
        ):
            raise _refuse(
                source,
                f"{key}.input_activations",
                "input_activations quantization is not supported (weight-only; dynamic FP8 "
                "activations with float-quantized weights run in float)",
            )
        dynamic = dynamic or bool(acts)
        if fmt == "float-quantized":
            schemes.append(_ct_float_weights(group["weights"], source, f"{key}.weights"))
        else:
            schemes.append(_ct_weights(group["weights"], source, f"{key}.weights"))
    if any(s != schemes[0] for s in schemes[1:]):
        raise _refuse(
            source,
            "config_groups",
            "config groups with different weight schemes are not supported (one scheme only)",
        )
    bits, group_size, sym, actorder = schemes[0]
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise _refuse(source, "ignore", "ignore must be a list of layer names")
    return QuantLayout(
        "compressed-tensors",
        "fp8" if fmt == "float-quantized" else "pack-quantized",
        bits,
        group_size,
        sym=sym,
        desc_act=actorder,
        ignore=tuple(ignore),
        dynamic_activations=dynamic,
    )


def _block_edge(block: Any, source: str, key: str) -> int:
    """A square FP8 scale block's edge (``[128, 128]`` or ``"128x128"``), a multiple of 32."""
    if isinstance(block, str):
        block = block.lower().split("x")
    try:
        rows, cols = (int(b) for b in block)
    except (TypeError, ValueError):
        raise _refuse(source, key, f"{block!r} is not a [rows, cols] block") from None
    if rows != cols or cols <= 0 or cols % 32:
        raise _refuse(
            source, key, f"scale block {rows}x{cols} is not supported (square, a multiple of 32)"
        )
    return cols


def _ct_float_weights(w: dict[str, Any], source: str, key: str) -> tuple[int, int, bool, bool]:
    """``(8, block or -1, True, False)`` for a compressed-tensors FP8 E4M3 weight scheme."""
    kind = str(w.get("type", "")).lower()
    bits = _int(w, "num_bits", 8, source)
    if kind != "float" or bits != 8:
        raise _refuse(
            source, f"{key}.type", f"float-quantized {kind} {bits}-bit weights are not FP8 E4M3"
        )
    if w.get("dynamic"):
        raise _refuse(source, f"{key}.dynamic", "dynamic weight quantization is not supported")
    strategy = str(w.get("strategy", "")).lower()
    if strategy in ("tensor", "channel"):
        return 8, -1, True, False
    if strategy == "block":
        return (
            8,
            _block_edge(w.get("block_structure"), source, f"{key}.block_structure"),
            True,
            False,
        )
    raise _refuse(
        source,
        f"{key}.strategy",
        f"FP8 strategy {strategy!r} is not supported (tensor, channel and block only)",
    )


def _fp8(q: dict[str, Any], source: str) -> QuantLayout:
    """transformers' ``quant_method: fp8`` (fine-grained FP8: DeepSeek-V3, Qwen3 FP8 exports)."""
    fmt = str(q.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise _refuse(source, "fmt", f"FP8 format {fmt!r} is not supported (e4m3 only)")
    scheme = str(q.get("activation_scheme", "dynamic")).lower()
    if scheme != "dynamic":
        raise _refuse(
            source,
            "activation_scheme",
            f"activation_scheme {scheme!r} is not supported (dynamic only, run in float)",
        )
    block = q.get("weight_block_size")
    edge = -1 if block is None else _block_edge(block, source, "weight_block_size")
    ignore = q.get("modules_to_not_convert") or []
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise _refuse(source, "modules_to_not_convert", "must be a list of module names")
    return QuantLayout(
        "fp8",
        "fp8",
        8,
        edge,
        sym=True,
        desc_act=False,
        ignore=tuple(ignore),
        dynamic_activations=True,
    )


def _ct_weights(w: dict[str, Any], source: str, key: str) -> tuple[int, int, bool, bool]:
    """``(bits, group_size, symmetric, act-order)`` of one compressed-tensors weight scheme."""
    kind = str(w.get("type", "int")).lower()
    if kind != "int":
        raise _refuse(source, f"{key}.type", f"weights of type {kind!r} are not supported (int)")
    bits = _int(w, "num_bits", 4, source)
    if bits not in (4, 8):
        raise _refuse(source, f"{key}.num_bits", f"{bits}-bit weights are not supported (4, 8)")
    if w.get("dynamic"):
        raise _refuse(source, f"{key}.dynamic", "dynamic weight quantization is not supported")
    strategy = str(w.get("strategy", "")).lower()
    if strategy == "channel":
        group_size = -1
    elif strategy == "group":
        group_size = _int(w, "group_size", 128, source)
        if group_size <= 0 or group_size % 32:
            raise _refuse(
                source, f"{key}.group_size", f"group_size {group_size} is not a multiple of 32"
            )
    else:
        raise _refuse(
            source,
            f"{key}.strategy",
            f"strategy {strategy!r} is not supported (group and channel only)",
        )
    actorder = w.get("actorder")
    if actorder not in (None, False, True, "group", "weight", "dynamic", "static"):
        raise _refuse(source, f"{key}.actorder", f"actorder {actorder!r} is not known")
    # compressed-tensors' ActivationOrdering: "dynamic" aliases "group" and "static" aliases
    # "weight" (True is "group"). "weight" quantizes in activation order but keeps each group's
    # columns contiguous (no weight_g_idx is stored); "group" stores the scattered
    # weight_g_idx. The re-lay follows the tensors either way.
    return bits, group_size, bool(w.get("symmetric", True)), actorder in (True, "group", "dynamic")
