"""The tracer, graphs and limits through the bindings, and the mapping of every graph and
runtime error to its class in ``poot.errors``.

Each trace budget and each compile limit has a test that trips it and sees its specific class.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import cpu_runtime_or_skip

from poot import _native, errors
from poot.checkpoints import RopeScaling, resolve_model_files
from poot.models import LlamaModel, StepShape, model_definition
from poot.models.llama import rope_scaling_spec


@pytest.fixture(scope="module")
def weights(shared_models: Path) -> _native.Weights:
    f = _native.GgufFile(str(shared_models / "stories260K" / "stories260K-f32.gguf"))
    return _native.Weights(f)


def tiny_trace(t: _native.Tracer) -> _native.Value:
    ids = t.input("ids", "i32", [t.step_tokens])
    x = t.embedding(t.weight("token_embd.weight"), ids)
    y = t.rms_norm(x, t.weight("output_norm.weight"), 1e-5)
    return t.matmul(y, t.weight("blk.0.attn_q.weight"))


# ---- limits -------------------------------------------------------------------------------


def test_limits_defaults_mirror_rust() -> None:
    t = _native.TraceLimits()
    assert (t.max_tokens, t.max_values, t.max_equations) == (512, 1 << 16, 1 << 16)
    assert (t.max_literal_bytes, t.max_records) == (1 << 20, 1 << 16)
    c = _native.CompileLimits()
    assert (c.max_equations, c.max_kernel_instructions, c.max_kernel_locals) == (1 << 17, 256, 64)
    assert c.max_artifact_bytes == 4 << 30
    assert _native.TraceLimits(max_tokens=8).max_tokens == 8
    assert _native.TraceLimits(max_tokens=8) == _native.TraceLimits(max_tokens=8)
    with pytest.raises(TypeError):
        _native.TraceLimits(8)  # type: ignore[misc]


# ---- each trace budget trips with its resource, limit and total ---------------------------


def test_step_above_max_tokens_is_refused_before_tracing(weights: _native.Weights) -> None:
    with pytest.raises(errors.TraceBudgetError) as e:
        _native.Tracer(weights, 9, _native.TraceLimits(max_tokens=8))
    assert (e.value.resource, e.value.limit, e.value.total) == ("tokens", 8, 9)
    assert isinstance(e.value, errors.TraceError) and isinstance(e.value, ValueError)
    assert e.value.kind == "budget"


@pytest.mark.parametrize(
    ("limits", "resource", "limit"),
    [
        ({"max_equations": 3}, "equations", 3),
        ({"max_values": 3}, "values", 3),
        ({"max_records": 2}, "records", 2),
    ],
)
def test_each_count_budget_trips(
    weights: _native.Weights, limits: dict[str, int], resource: str, limit: int
) -> None:
    t = _native.Tracer(weights, 4, _native.TraceLimits(**limits))
    with pytest.raises(errors.TraceBudgetError) as e:
        tiny_trace(t)
    assert (e.value.resource, e.value.limit, e.value.total) == (resource, limit, limit + 1)
    assert resource in str(e.value)


def test_literal_bytes_budget_trips_before_conversion(weights: _native.Weights) -> None:
    t = _native.Tracer(weights, 1, _native.TraceLimits(max_literal_bytes=16))
    t.literal([1.0, 2.0], [2])
    before = t.usage()

    class Huge:
        # A sequence that would take forever to convert: the budget refuses it first.
        def __len__(self) -> int:
            return 10**9

    with pytest.raises(errors.TraceBudgetError) as e:
        t.literal(Huge(), [10**9])  # type: ignore[arg-type]
    assert (e.value.resource, e.value.limit, e.value.total) == ("literal_bytes", 16, 8 + 4 * 10**9)
    with pytest.raises(errors.TraceBudgetError):
        t.literal([0.0] * 3, [3])
    assert t.usage() == before  # nothing of a refused equation was recorded


def test_output_counts_as_a_record(weights: _native.Weights) -> None:
    t = _native.Tracer(weights, 1, _native.TraceLimits(max_records=1))
    x = t.input("ids", "i32", [1])
    with pytest.raises(errors.TraceBudgetError) as e:
        t.output("y", x)
    assert e.value.resource == "records"


def test_model_trace_over_budget_is_refused(shared_models: Path) -> None:
    files = resolve_model_files(shared_models / "stories260K" / "stories260K-f32.gguf")
    model = model_definition(files)
    w = _native.Weights(files.gguf)  # type: ignore[arg-type]
    t = _native.Tracer(w, 16, _native.TraceLimits(max_equations=50))
    with pytest.raises(errors.TraceBudgetError) as e:
        model.trace(t, StepShape(16, 1, 1))
    assert e.value.resource == "equations" and e.value.total == 51


# ---- each compile limit trips with its class ----------------------------------------------


def test_pass_expansion_past_max_equations(weights: _native.Weights) -> None:
    t = _native.Tracer(weights, 2)
    t.output("y", tiny_trace(t))
    g = t.finish()
    assert g.eliminate_dead_code().n_equations == g.n_equations
    with pytest.raises(errors.CompileExpansionError) as e:
        g.eliminate_dead_code(_native.CompileLimits(max_equations=3))
    assert (e.value.pass_name, e.value.limit, e.value.total) == ("dead_code_elimination", 3, 4)
    assert isinstance(e.value, errors.CompileError) and isinstance(e.value, RuntimeError)


def _compile(weights: _native.Weights, limits: _native.CompileLimits) -> _native.Plan:
    rt = cpu_runtime_or_skip(1)
    t = _native.Tracer(weights, 2)
    t.output("y", tiny_trace(t))
    return rt.prepare(t.finish(), weights, limits)


def test_runtime_compile_expansion(weights: _native.Weights) -> None:
    with pytest.raises(errors.CompileExpansionError):
        _compile(weights, _native.CompileLimits(max_equations=2))


def test_artifact_over_max_bytes_is_refused(weights: _native.Weights) -> None:
    with pytest.raises(errors.ArtifactTooLargeError) as e:
        _compile(weights, _native.CompileLimits(max_artifact_bytes=1))
    assert e.value.limit == 1 and e.value.total > 1
    plan = _compile(weights, _native.CompileLimits())
    assert plan.artifact_bytes > 1


# ---- the mapping of every variant ----------------------------------------------------------

MAPPING: list[tuple[str, type[Exception], type[Exception], dict[str, Any]]] = [
    (
        "trace_budget",
        errors.TraceBudgetError,
        ValueError,
        {"resource": "values", "limit": 1, "total": 2, "kind": "budget"},
    ),
    ("trace_shape", errors.TraceError, ValueError, {"kind": "shape", "op": "matmul"}),
    (
        "expansion",
        errors.CompileExpansionError,
        RuntimeError,
        {"pass_name": "probe", "limit": 1, "total": 2},
    ),
    (
        "body_limit",
        errors.KernelBodyLimitError,
        RuntimeError,
        {"kernel": "fused_probe", "what": "instructions", "limit": 1, "total": 2},
    ),
    ("artifact", errors.ArtifactTooLargeError, RuntimeError, {"limit": 1, "total": 2}),
    ("unsupported", errors.UnsupportedOpError, RuntimeError, {"backend": "probe", "op": "rope"}),
    ("invalid", errors.CompileError, RuntimeError, {}),
    ("missing_input", errors.GraphInputError, ValueError, {"name": "ids", "expected": None}),
    (
        "input_mismatch",
        errors.GraphInputError,
        ValueError,
        {"name": "ids", "expected": "I32[4]", "got": "F32[4]"},
    ),
    ("missing_weight", errors.CompileError, RuntimeError, {}),
    ("kernel", errors.KernelError, ValueError, {"op": "embedding"}),
    ("timeout", errors.DeviceTimeoutError, TimeoutError, {"during": "run"}),
    ("poisoned", errors.RuntimePoisonedError, RuntimeError, {"reason": "probe"}),
    (
        "out_of_memory",
        errors.DeviceMemoryError,
        MemoryError,
        {"what": "kv cache", "requested": 2, "limit": 1},
    ),
    ("kv_not_configured", errors.KvCacheNotConfiguredError, RuntimeError, {}),
    ("not_compiled_in", errors.BackendNotCompiledError, RuntimeError, {"backend": "cuda"}),
    (
        "device_unavailable",
        errors.DeviceUnavailableError,
        RuntimeError,
        {"backend": "cuda", "missing": "the NVIDIA driver library libcuda.so.1"},
    ),
]


@pytest.mark.parametrize(("variant", "cls", "builtin", "fields"), MAPPING)
def test_every_error_variant_maps_to_its_class(
    variant: str, cls: type[Exception], builtin: type[Exception], fields: dict[str, Any]
) -> None:
    with pytest.raises(cls) as e:
        _native._mapping_probe(variant)
    assert type(e.value) is cls
    assert isinstance(e.value, errors.PootError) and isinstance(e.value, builtin)
    for name, value in fields.items():
        assert getattr(e.value, name) == value, name
    assert str(e.value)


def test_unknown_probe_variant() -> None:
    with pytest.raises(ValueError, match="unknown variant"):
        _native._mapping_probe("nope")


# ---- tracer rules ----------------------------------------------------------------------------


def test_trace_errors_carry_kind_op_and_name(weights: _native.Weights) -> None:
    t = _native.Tracer(weights, 2)
    x = t.input("x", "f32", [2, 3])
    with pytest.raises(errors.TraceError) as e:
        t.matmul(x, t.weight("blk.0.attn_q.weight"))
    assert (e.value.kind, e.value.op) == ("shape", "matmul")
    with pytest.raises(errors.TraceError) as e:
        t.weight("no.such.tensor")
    assert (e.value.kind, e.value.name) == ("unknown_weight", "no.such.tensor")
    with pytest.raises(errors.TraceError) as e:
        t.input("x", "f32", [1])
    assert e.value.kind == "duplicate_input"
    with pytest.raises(errors.TraceError) as e:
        t.input("y", "f64", [1])
    assert e.value.kind == "shape"
    t.output("out", x)
    with pytest.raises(errors.TraceError) as e:
        t.output("out", x)
    assert e.value.kind == "duplicate_output"


def test_values_belong_to_their_tracer(weights: _native.Weights) -> None:
    a, b = _native.Tracer(weights, 1), _native.Tracer(weights, 1)
    x = a.input("x", "f32", [1, 64])
    with pytest.raises(errors.TraceError) as e:
        b.silu(x)
    assert e.value.kind == "bad_value"
    a.finish()
    with pytest.raises(errors.TraceError) as e:
        a.silu(x)
    assert e.value.kind == "finished"


def test_every_op_traces_with_shapes(weights: _native.Weights) -> None:
    t = _native.Tracer(weights, 4)
    x = t.input("x", "f32", [4, 64])
    pos = t.input("pos", "i32", [4])
    assert (x.dtype, x.shape) == ("F32", (4, 64))
    assert t.has_weight("output_norm.weight") and not t.has_weight("nope")
    w = t.weight("blk.0.attn_q.weight")
    assert (w.dtype, w.shape) == ("F32", (64, 64))
    lit = t.literal([0.5] * 64, [64])
    y = t.mul(t.add(t.matmul(x, w), lit), lit)
    y = t.softmax(t.gelu(t.silu(y)))
    for style, scaling in [
        ("interleaved", None),
        ("neox", {"type": "linear", "factor": 2.0}),
        (
            "neox",
            {
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position": 8192,
            },
        ),
    ]:
        r = t.rope(y, pos, n_heads=8, head_dim=8, theta=1e4, style=style, scaling=scaling)
        assert r.shape == (4, 64)
    with pytest.raises(errors.TraceError):
        t.rope(y, pos, n_heads=8, head_dim=8, scaling={"type": "yarn", "factor": 2.0})
    k = t.slice(y, 1, 0, 32)
    z = t.reshape(t.concat([k, k], 1), [4, 8, 8])
    assert z.shape == (4, 8, 8)
    slots, seq = t.input("slots", "i32", [4]), t.input("seq", "i32", [4])
    tables = t.input("tables", "i32", [1, 2])
    att = t.paged_attention(
        y,
        k,
        k,
        slot_mapping=slots,
        token_seq=seq,
        positions=pos,
        block_tables=tables,
        layer=0,
        n_heads=8,
        n_kv_heads=4,
        head_dim=8,
    )
    rows = t.input("rows", "i32", [1])
    last = t.gather_rows(att, rows)
    logits = t.matmul(last, t.weight("token_embd.weight"))
    s = {
        "temperature": t.input("temperature", "f32", [1]),
        "top_k": t.input("top_k", "i32", [1]),
        "top_p": t.input("top_p", "f32", [1]),
        "min_p": t.input("min_p", "f32", [1]),
        "uniform": t.input("uniform", "f32", [1]),
    }
    f32w, i32w = ("f32", [1, 4]), ("i32", [1, 4])
    adjusted = t.adjust_logits(
        logits,
        ids=t.input("adj_ids", *i32w),
        counts=t.input("adj_counts", *i32w),
        bias=t.input("adj_bias", *f32w),
        repetition=t.input("repetition", "f32", [1]),
        presence=t.input("presence", "f32", [1]),
        frequency=t.input("frequency", "f32", [1]),
    )
    masked = t.mask_logits(adjusted, t.input("mask", "i32", [1, 16]))  # 512 tokens / 32
    ids = t.sample(masked, **s)
    assert (ids.dtype, ids.shape) == ("I32", (1,))
    top = t.top_k_ids(logits, 5)
    assert (top.dtype, top.shape) == ("I32", (1, 5))
    lp = t.logprobs(logits, top)
    assert (lp.dtype, lp.shape) == ("F32", (1, 5))
    with pytest.raises(errors.TraceError, match="mask"):
        t.mask_logits(logits, t.input("bad_mask", "i32", [1, 15]))
    with pytest.raises(errors.TraceError, match="k=65"):
        t.top_k_ids(logits, 65)
    t.output("lp", lp)
    t.output("ids", ids)
    g = t.finish()
    assert g.step_tokens == 4
    assert ("ids", "I32", (1,)) in g.outputs()
    assert [n for n, _, _ in g.inputs()][:2] == ["x", "pos"]
    assert {n for n, _, _ in g.weights()} == {"blk.0.attn_q.weight", "token_embd.weight"}
    eqs = g.equations()
    assert len(eqs) == g.n_equations
    assert eqs[ids.id][0] == "sample" and eqs[att.id][2]["n_kv_heads"] == 4
    assert g.output_ids() == {"ids": ids.id, "lp": lp.id}
    text = g.dump()
    assert f"%{ids.id} = sample(" in text and 'output "ids"' in text


def test_weights_need_a_checkpoint() -> None:
    with pytest.raises(TypeError, match="GgufFile or a SafetensorsModel"):
        _native.Weights("model.gguf")  # type: ignore[arg-type]


def test_weights_describe(weights: _native.Weights) -> None:
    assert weights.describe("token_embd.weight") == ("F32", (512, 64))
    assert weights.describe("nope") is None
    assert "output_norm.weight" in weights and weights.total_bytes > 0


# ---- model definitions and the registry -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "style"),
    [
        ("stories260K-f32.gguf", "interleaved"),
        ("stories260K-Q4_0.gguf", "interleaved"),
        ("hf", "neox"),
    ],
)
def test_llama_definition_traces_both_layouts(shared_models: Path, name: str, style: str) -> None:
    files = resolve_model_files(shared_models / "stories260K" / name)
    model = model_definition(files)
    assert isinstance(model, LlamaModel) and model.rope_style == style
    src = files.gguf if files.gguf is not None else files.safetensors
    w = _native.Weights(src)  # type: ignore[arg-type]
    for shape in [StepShape(16, 2, 4), StepShape(1, 1, 1, "logits")]:
        t = _native.Tracer(w, shape.tokens)
        model.trace(t, shape)
        g = t.finish()
        out = g.outputs()
        if shape.kind == "logits":
            assert out == [("logits", "F32", (1, 512))]
        else:
            assert out == [("token_ids", "I32", (2,))]
        ops = [e[0] for e in g.equations()]
        assert ops.count("paged_attention") == 5 and ops.count("rope") == 10
        # tied head: the output matmul reads the embedding table
        assert len(g.weights()) == 2 + 9 * 5


def _fake_files(kind: str, arch: str) -> Any:
    return SimpleNamespace(
        kind=kind,
        path=Path("/x"),
        metadata={"general.architecture": arch} if kind == "gguf" else {},
        config={"architectures": [arch]} if kind == "hf" else {},
    )


@pytest.mark.parametrize(
    ("kind", "arch", "supported"),
    [("gguf", "gpt2", "llama"), ("hf", "GPT2LMHeadModel", "Qwen2ForCausalLM")],
)
def test_unknown_architecture_lists_supported(kind: str, arch: str, supported: str) -> None:
    with pytest.raises(errors.UnsupportedArchitectureError) as e:
        model_definition(_fake_files(kind, arch))
    assert e.value.architecture == arch and supported in e.value.supported
    assert supported in str(e.value)
    assert isinstance(e.value, errors.CheckpointError) and isinstance(e.value, ValueError)


def test_rope_scaling_spec() -> None:
    base = SimpleNamespace(architecture="llama", rope_scaling=None)
    assert rope_scaling_spec(base, "x") is None  # type: ignore[arg-type]
    llama3 = RopeScaling(
        type="llama3",
        factor=8.0,
        original_context_length=8192,
        params={"low_freq_factor": 1.0, "high_freq_factor": 4.0},
    )
    spec = rope_scaling_spec(SimpleNamespace(architecture="llama", rope_scaling=llama3), "x")  # type: ignore[arg-type]
    assert spec == {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position": 8192,
    }
    linear = RopeScaling(type="linear", factor=2.0)
    assert rope_scaling_spec(SimpleNamespace(architecture="llama", rope_scaling=linear), "x") == {  # type: ignore[arg-type]
        "type": "linear",
        "factor": 2.0,
    }
    yarn = RopeScaling(type="yarn", factor=4.0)
    with pytest.raises(errors.UnsupportedArchitectureError, match="yarn"):
        rope_scaling_spec(SimpleNamespace(architecture="llama", rope_scaling=yarn), "x")  # type: ignore[arg-type]


# ---- runtime errors through real paths ----------------------------------------------------


def test_run_errors_timeout_and_poisoning(weights: _native.Weights) -> None:
    import numpy as np

    rt = cpu_runtime_or_skip(1)
    t = _native.Tracer(weights, 2)
    ids = t.input("ids", "i32", [2])
    t.output("y", t.silu(t.embedding(t.weight("token_embd.weight"), ids)))
    plan = rt.prepare(t.finish(), weights)
    ok = {"ids": np.array([1, 2], np.int32)}
    y = rt.run(plan, ok)["y"]
    assert y.dtype == np.float32 and y.shape == (2, 64)
    with pytest.raises(errors.GraphInputError) as e:
        rt.run(plan, {"ids": np.array([1, 2], np.int64)})
    assert e.value.name == "ids" and "int64" in str(e.value.got)
    with pytest.raises(errors.GraphInputError):
        rt.run(plan, {})
    with pytest.raises(errors.KernelError) as k:
        rt.run(plan, {"ids": np.array([1, 999], np.int32)})
    assert k.value.op == "embedding"
    assert rt.health() == {"status": "ok", "reason": None}
    with pytest.raises(errors.DeviceTimeoutError):
        rt.run(plan, ok, timeout_s=0)
    assert rt.health()["status"] == "poisoned"
    with pytest.raises(errors.RuntimePoisonedError):
        rt.run(plan, ok)
    with pytest.raises(ValueError, match="timeout_s"):
        rt.run(plan, ok, timeout_s=float("nan"))


def test_kv_pool_over_its_limit_is_refused() -> None:
    rt = cpu_runtime_or_skip(1)
    with pytest.raises(errors.DeviceMemoryError) as e:
        rt.configure_kv(n_layers=64, n_kv_heads=64, head_dim=256, block_size=64, num_blocks=2**20)
    assert e.value.requested > e.value.limit
    rt.configure_kv(n_layers=1, n_kv_heads=1, head_dim=8, block_size=4, num_blocks=2)
    assert rt.memory()["kv_bytes"] == 2 * 4 * 1 * 8 * 4 * 2
