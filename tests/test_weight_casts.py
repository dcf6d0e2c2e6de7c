"""Dense BF16/F16 weights stay their stored words, read through explicit casts in the graph.

The tracer records a ``cast`` to F32 at each read of a half weight (matmuls, the embedding and
the tied head, norms, elementwise operands); every backend fuses it into the reading kernel
(which decodes the stored words: no f32 copy of the weight), so a compiled plan holds no cast
where a kernel reads the weight itself. A cast nothing fuses runs as its own kernel: checked
here on the CPU and wgpu runtimes over every 16-bit pattern, bit for bit against numpy (CUDA's
``cast_f32``: ``crates/poot-cuda/tests/cast.rs``). A model with half weights gives the float64
reference's logits of the same values; memory: ``tests/test_quant_memory.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_models import FAMILIES, _tokenizer_json, make_weights
from family_reference import reference_logits
from quant_ct import bf16_bytes, save_raw
from wgpu_util import require_wgpu

import poot
from poot import _native, errors
from poot.checkpoints import resolve_model_files
from poot.models import StepShape, model_definition

FAMILY = "mistral"
PROMPT = [1, 17, 93, 5, 64, 120, 33, 8]


def _to_bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded toward zero to bf16 values (kept as float32)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32) & 0xFFFF0000
    return u.view(np.float32)


def _half_dir(root: Path, dtype: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The family's random weights stored all in ``dtype`` ("BF16" or "F16"); returns the
    directory and the stored values as float32."""
    w = make_weights(FAMILY)
    if dtype == "BF16":
        values = {n: _to_bf16(v) for n, v in w.items()}
        raw = {n: ("BF16", list(v.shape), bf16_bytes(v)) for n, v in values.items()}
    else:
        values = {n: v.astype(np.float16).astype(np.float32) for n, v in w.items()}
        raw = {n: ("F16", list(v.shape), v.astype("<f2").tobytes()) for n, v in values.items()}
    d = root / dtype
    d.mkdir()
    save_raw(d / "model.safetensors", raw)
    torch_dtype = "bfloat16" if dtype == "BF16" else "float16"
    (d / "config.json").write_text(json.dumps(dict(FAMILIES[FAMILY], torch_dtype=torch_dtype)))
    _tokenizer_json(d / "tokenizer.json", FAMILIES[FAMILY]["vocab_size"])
    return d, values


@pytest.fixture(scope="module", params=["BF16", "F16"])
def half_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, dict[str, np.ndarray]]:
    d, values = _half_dir(tmp_path_factory.mktemp("casts"), request.param)
    return request.param, d, values


def _trace(d: Path) -> tuple[Any, Any]:
    files = resolve_model_files(d)
    weights = _native.Weights(files.safetensors)  # type: ignore[arg-type]
    shape = StepShape(8, 1, 1, "logits")
    t = _native.Tracer(weights, shape.tokens)
    model_definition(files).trace(t, shape)
    return t.finish(), weights


# Where each op reads a stored weight (operand positions).
_READS = {"embedding": (0,), "matmul": (1,), "rms_norm": (1,), "add": (1,), "mul": (1,)}


def test_the_traced_graph_reads_half_weights_through_casts(half_model: Any) -> None:
    dtype, d, _ = half_model
    g, weights = _trace(d)
    eqs = g.equations()
    reads = 0
    for i, (op, ins, _, _, _) in enumerate(eqs):
        for pos in _READS.get(op, ()):
            src = eqs[ins[pos]]
            if src[0] == "weight":
                pytest.fail(f"equation {i} ({op}) reads weight {src[2]['name']} directly")
            if src[0] == "cast":
                stored = eqs[src[1][0]]
                assert stored[0] == "weight" and stored[3] == dtype
                assert src[2] == {"to": "F32"} and src[3] == "F32" and src[4] == stored[4]
                assert ins[pos] == i - 1, "each cast sits just before its reader"
                reads += 1
    n_layers = FAMILIES[FAMILY]["num_hidden_layers"]
    # embedding, head, final norm; per layer 2 norms and q, k, v, o, gate, up, down.
    assert reads == 3 + n_layers * 9
    assert sum(e[0] == "cast" for e in eqs) == reads
    # Compiled for the CPU: every cast is fused, each reader takes the stored weight itself.
    plan = _native.CpuRuntime(1).prepare(g, weights)
    peqs = plan.graph.equations()
    assert not any(e[0] == "cast" for e in peqs)
    for op, ins, _, _, _ in peqs:
        for pos in _READS.get(op, ()):
            if op in ("embedding", "matmul", "rms_norm"):
                assert peqs[ins[pos]][0] == "weight" and peqs[ins[pos]][3] == dtype


def test_a_half_model_gives_the_reference_logits(half_model: Any) -> None:
    _, d, values = half_model
    llm = poot.LLM(str(d), threads=1, numerics="exact")
    got = llm.logits(PROMPT)
    want = reference_logits(FAMILY, values, PROMPT)[-1]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def _all_half_words() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)


def _numpy_decode(words: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return (words.astype(np.uint32) << 16).view(np.float32)
    return words.view(np.float16).astype(np.float32)


def _runtime(backend: str) -> Any:
    if backend == "wgpu":
        require_wgpu()
        return _native.WgpuRuntime(timeout_s=60.0)
    return _native.CpuRuntime(1)


@pytest.mark.parametrize("backend", ["cpu", "wgpu"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_standalone_cast_is_exact(backend: str, dtype: str) -> None:
    """Every 16-bit pattern (zeros, subnormals, infinities, NaNs) decodes to numpy's f32 bits;
    NaNs stay NaN. An output read straight from the cast keeps it in the plan as a kernel."""
    words = _all_half_words()
    if dtype == "f16":
        arrays = {"h": words.view(np.float16)}
        weights = _native.Weights.from_arrays(arrays)
    else:
        weights = _native.Weights.from_arrays({"h": words}, dtypes={"h": "bf16"})
    t = _native.Tracer(weights, 1)
    t.output("y", t.cast(t.weight("h"), "f32"))
    rt = _runtime(backend)
    plan = rt.prepare(t.finish(), weights)
    assert [e[0] for e in plan.graph.equations()] == ["weight", "cast"]
    got = rt.run(plan, {})["y"]
    want = _numpy_decode(words, dtype)
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_cast_refuses_what_it_cannot_read() -> None:
    weights = _native.Weights.from_arrays(
        {"h": np.zeros((4, 4), np.float16), "f": np.zeros((4,), np.float32)}
    )
    t = _native.Tracer(weights, 1)
    with pytest.raises(errors.TraceError, match="cast"):
        t.cast(t.input("x", "f32", [1, 4]))
    with pytest.raises(errors.TraceError, match="to must be"):
        t.cast(t.weight("h"), "f16")
    # An F32 weight may be cast (a copy); a cast is read as the weight it casts.
    c = t.cast(t.weight("f"))
    assert (c.dtype, c.shape) == ("F32", (4,))
