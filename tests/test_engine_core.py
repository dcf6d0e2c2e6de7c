"""The engine core and the seams around it: ``EngineCore`` driven directly, its clients
touching nothing private, the planner and sampling modules free of the imports the design
forbids, and the ``Runtime`` Protocol offered by every runtime the engine drives."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_hooks import HookedRuntime
from step_crossings import counting as _counting
from step_crossings import drive as _drive
from step_crossings import host_only as _host_only

from poot import LLM, SamplingParams, _native
from poot.engine_core import EngineCore, log_softmax
from poot.planner.null_runtime import NullRuntime
from poot.runner import LOGIT_OPS
from poot.runtimes import Runtime

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "poot"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def llm(stories: Path) -> LLM:
    return LLM(str(stories / "stories260K-Q8_0.gguf"), num_blocks=32, max_step_tokens=32)


def test_the_core_runs_requests_to_the_end_and_frees_their_blocks(llm: LLM) -> None:
    core: EngineCore = llm.core
    want = [o.outputs[0].token_ids for o in llm.generate(["Once upon", "Lily"], GREEDY)]
    a, b = llm.make_request("Once upon", GREEDY), llm.make_request("Lily", GREEDY)
    core.add_request(a)
    core.add_request(b)
    assert core.has_unfinished() and core.is_live(a.request_id) and a.request_id != b.request_id
    steps = 0
    while core.has_unfinished():
        changed = core.step()
        steps += 1
        assert all(r in (a, b) for r in changed)
    assert [a.out, b.out] == want
    assert a.finish_reason == b.finish_reason == "length"
    assert steps >= len(want[0]) and llm.scheduler.used_blocks == 0


def test_abort_frees_a_live_request_and_ignores_others(llm: LLM) -> None:
    core = llm.core
    a, b = llm.make_request("Once upon", GREEDY), llm.make_request("Lily", GREEDY)
    core.add_request(a)
    core.add_request(b)
    core.step()
    assert llm.scheduler.used_blocks > 0
    assert core.abort(a.request_id) and not core.is_live(a.request_id)
    assert not core.abort(a.request_id)  # already gone
    assert not core.abort(10**9)  # never added
    while core.has_unfinished():
        core.step()
    assert b.finish_reason == "length" and a.finish_reason is None
    assert llm.scheduler.used_blocks == 0 and not llm.scheduler.step_in_flight


def test_a_failed_step_ends_its_requests_and_leaves_the_core_usable(llm: LLM) -> None:
    core = llm.core
    runner = core.runner

    def broken(n: int) -> None:
        raise RuntimeError("the device went away")

    req = llm.make_request("Once upon", GREEDY)
    core.add_request(req)
    original = runner.runtime
    runner.runtime = HookedRuntime(original, broken)
    try:
        with pytest.raises(RuntimeError, match="went away"):
            core.step()
    finally:
        runner.runtime = original
    assert not core.is_live(req.request_id) and not core.has_unfinished()
    assert llm.scheduler.used_blocks == 0 and not llm.scheduler.step_in_flight
    assert llm.generate("Lily", GREEDY)[0].outputs[0].finish_reason == "length"


def test_stats_asked_during_a_step_give_the_last_counts(llm: LLM) -> None:
    # The server's /metrics asks from another thread while a step holds the native driver and
    # scheduler; here the hook asks from inside the step's run, which holds them the same way.
    core = llm.core
    runner = core.runner
    before = core.stats()
    seen: list[dict[str, int]] = []
    original = runner.runtime
    runner.runtime = HookedRuntime(original, lambda n: seen.append(core.stats()))
    try:
        llm.generate("Once upon", GREEDY)
    finally:
        runner.runtime = original
    assert seen and all(s["num_blocks"] == before["num_blocks"] for s in seen)
    assert seen[0]["decode_tokens"] == before["decode_tokens"]
    after = core.stats()
    assert after["decode_tokens"] > before["decode_tokens"] and after["used_blocks"] == 0


def _warm_steps(llm: LLM, params: SamplingParams) -> tuple[list[str], int, list[list[int]]]:
    """Runs two requests on ``llm``'s core after warming their plans (``_drive``); returns
    the crossings, the steps and the outputs."""
    want = [o.outputs[0].token_ids for o in llm.generate(["Once upon", "Lily"], params)]
    reqs, log, steps = _drive(llm, [params, params])
    assert [r.out for r in reqs] == want  # the same tokens as the plain loop
    return log, steps, want


WARM_CASES = [
    SamplingParams(max_tokens=6, temperature=0.0),
    SamplingParams(max_tokens=6, temperature=0.8, seed=1),
]


@pytest.mark.parametrize("params", WARM_CASES, ids=["greedy", "seeded"])
def test_a_warm_step_crosses_into_rust_once(llm: LLM, params: SamplingParams) -> None:
    # Scheduling, laying out, running and applying are one call; nothing else crosses, and
    # the runner's Python path (tracing on a miss, host-side steps) is not taken.
    log, steps, want = _warm_steps(llm, params)
    assert steps > 1 and log == ["step"] * steps
    assert all(len(w) == 6 for w in want)


@pytest.mark.parametrize("params", WARM_CASES, ids=["greedy", "seeded"])
def test_a_warm_wgpu_step_crosses_into_rust_once(stories: Path, params: SamplingParams) -> None:
    log, steps, _ = _warm_steps(_wgpu_llm(stories), params)
    assert steps > 1 and log == ["step"] * steps


def test_a_warm_guided_step_crosses_once_and_fills_its_mask_meanwhile(llm: LLM) -> None:
    # The mask is the one call back into Python: the driver runs the step on a thread and
    # asks for the mask while the forward pass runs.
    core = llm.core
    params = SamplingParams(max_tokens=8, temperature=0.0, regex="[a-z ]{8}")
    llm.generate(["Once upon", "Lily"], params)  # warms the plans of these shapes
    fills: list[int] = []
    fill_masks = core.guide.fill_masks

    def counted(rows: Any, seqs: int) -> Any:
        fills.append(len(rows))
        return fill_masks(rows, seqs)

    core.guide.fill_masks = counted  # type: ignore[method-assign]
    try:
        reqs, log, steps = _drive(llm, [params, params])
    finally:
        del core.guide.fill_masks
    # A finished grammar ends its request on the host, which frees its blocks (one abort at
    # its end, not a step's crossing).
    assert [c for c in log if c != "abort"] == ["step"] * steps
    assert log.count("abort") == sum(r.ended_by_host for r in reqs) <= len(reqs)
    assert len(fills) == steps and all(n > 0 for n in fills)
    assert all(r.finish_reason is not None for r in reqs)
    assert all(all(c.islower() or c == " " for c in "".join(r.text)) for r in reqs)


@pytest.mark.parametrize("runtime", ["native", "python"])
def test_a_failed_mask_ends_its_step_with_the_mask_s_error(llm: LLM, runtime: str) -> None:
    # On a runtime that is a Python object the mask is its run's late input too: the slot
    # fails, and the mask's own error is raised.
    core = llm.core
    params = SamplingParams(max_tokens=4, temperature=0.0, regex="[a-z ]{4}")

    def broken(rows: Any, seqs: int) -> Any:
        raise ValueError("the grammar engine went away")

    req = llm.make_request("Once upon", params)
    core.add_request(req)
    core.guide.fill_masks = broken  # type: ignore[method-assign]
    original = core.runner.runtime
    if runtime == "python":
        core.runner.runtime = HookedRuntime(original, lambda n: None)
    try:
        with pytest.raises(ValueError, match="went away"):
            core.step()
    finally:
        del core.guide.fill_masks
        core.runner.runtime = original
    assert not core.is_live(req.request_id) and not core.has_unfinished()
    assert llm.scheduler.used_blocks == 0 and not llm.scheduler.step_in_flight
    again = llm.generate("Once upon", params)[0].outputs[0]
    assert len(again.token_ids) > 0


def _wgpu_llm(stories: Path) -> LLM:
    from wgpu_util import require_wgpu

    require_wgpu()
    return LLM(str(stories / "stories260K-f32.gguf"), backend="wgpu", num_blocks=32)


@pytest.fixture(params=["cpu", "wgpu"])
def any_llm(request: pytest.FixtureRequest, llm: LLM, stories: Path) -> LLM:
    return llm if request.param == "cpu" else _wgpu_llm(stories)


# A prompt shorter than a block: no prefix cache hit however often it runs.
SHORT = "Once upon a time"


def _prefill_then_logits(llm: LLM, params: SamplingParams) -> tuple[Any, Any, list[str]]:
    """A request's prefill step, then a decode step asked for its row's logits; returns the
    request, the logits and the crossings of each step."""
    core = llm.core
    with _counting(core) as log:
        req = llm.make_request(SHORT, params)
        core.add_request(req)
        log.clear()
        core.step()  # the prefill, with prompt logprobs
        first = list(log)
        log.clear()
        logits = core.step_logits(req)  # a decode step that also brings back the row's logits
        second = list(log)
    assert not core.has_unfinished() and llm.scheduler.used_blocks == 0
    return req, logits, [*first, "|", *second]


def test_prompt_logprobs_and_a_row_s_logits_cross_once(any_llm: LLM) -> None:
    # The prefill chunk asking for prompt logprobs runs as an all_logits step and brings back
    # its tokens' logits; a step asked for a row's logits brings that row back: one call each,
    # with the runner's path's results bit for bit.
    llm = any_llm
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2)
    assert len(llm.tokenizer.encode(SHORT)) < llm.block_size
    with _host_only(llm.core):
        want, want_logits, host_log = _prefill_then_logits(llm, params)
    assert host_log.count("update") == 2  # that path applies each step by a second call
    _prefill_then_logits(llm, params)  # the driver takes the plans it has not held yet
    got, logits, log = _prefill_then_logits(llm, params)
    assert log == ["step", "|", "step"]
    assert got.out == want.out and got.out[-1] == int(np.argmax(logits))
    assert got.prompt_logprobs == want.prompt_logprobs and got.prompt_logprobs[1] is not None
    assert np.array_equal(logits, want_logits)


def test_llm_logits_crosses_once_per_step(any_llm: LLM) -> None:
    llm = any_llm
    ids = llm.tokenizer.encode(SHORT)
    with _host_only(llm.core):
        want = llm.logits(ids)
    llm.logits(ids)  # the driver takes the plans it has not held yet
    with _counting(llm.core) as log:
        got = llm.logits(ids)
    # Admission, one call per step, and the check that no step is left in flight.
    assert log[0] == "add_request" and log[-1] == "step_in_flight"
    assert log[1:-1] == ["step"] * (len(log) - 2) and len(log) > 2
    assert np.array_equal(got, want)


def test_a_row_s_logits_in_a_batch_run_both_plans_in_one_call(llm: LLM) -> None:
    # With another row in the step, the asked row's logits come from a logits run and every
    # row's token from the sample run: still one call.
    core = llm.core
    greedy = SamplingParams(max_tokens=3, temperature=0.0)
    want = [o.outputs[0].token_ids for o in llm.generate(["Once upon", "Lily"], greedy)]

    def run(log: list[str]) -> tuple[Any, Any, list[Any]]:
        a, b = llm.make_request("Once upon", greedy), llm.make_request("Lily", greedy)
        core.add_request(a)
        core.add_request(b)
        log.clear()
        got = []
        while core.has_unfinished():
            got.append(core.step_logits(a))
        return a, b, got

    run([])  # the driver takes the plans it has not held yet
    with _counting(core) as log:
        a, b, got = run(log)
    assert log == ["step"] * len(got)
    assert [a.out, b.out] == want
    rows = [x for x in got if x is not None]
    assert len(rows) == len(want[0]) and all(x.dtype == np.float32 for x in rows)
    assert [int(np.argmax(x)) for x in rows] == want[0]


@pytest.mark.parametrize("backend", ["cpu", "wgpu"])
def test_prompt_logprobs_after_a_cache_hit_cross_once_per_step(stories: Path, backend: str) -> None:
    # A request asking for prompt logprobs never starts from the prefix cache (vLLM's rule):
    # its own prefill computes every position, one call a step, with the cold run's values.
    kw: dict[str, Any] = {"num_blocks": 32, "max_step_tokens": 32, "block_size": 4}
    if backend == "wgpu":
        from wgpu_util import require_wgpu

        require_wgpu()
        llm = LLM(str(stories / "stories260K-f32.gguf"), backend="wgpu", **kw)
    else:
        llm = LLM(str(stories / "stories260K-Q8_0.gguf"), **kw)
    prompt = "Once upon a time there was a little girl named Lily"
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    cold = llm.generate(prompt, params)[0]
    # The prompt's blocks are cached: a plain request of it starts from them.
    llm.generate(prompt, SamplingParams(max_tokens=2, temperature=0.0))
    cached = llm.stats()["prefill_cached_tokens"]
    assert cached > 0
    core = llm.core
    with _counting(core) as log:
        req = llm.make_request(prompt, params)
        core.add_request(req)
        log.clear()
        steps = 0
        while core.has_unfinished():
            core.step()
            steps += 1
    assert log == ["step"] * steps
    assert llm.stats()["prefill_cached_tokens"] == cached
    assert req.prompt_logprobs == cold.prompt_logprobs and req.out == cold.outputs[0].token_ids


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_prompt_logprobs_of_a_cached_prefix_on_a_windowed_model(
    family_checkpoints: Any, family: str
) -> None:
    # Windowed layers keep only their window's KV, so a cached prefix cannot give the
    # positions behind it: the request computes its whole prompt in its own steps (one call
    # each), and every entry is log_softmax of LLM.logits over the prefix, past the window too.
    from poot.driver_options import DriverOptions

    opts = DriverOptions(block_size=4, max_step_tokens=4, max_num_seqs=1)
    path = str(family_checkpoints(family)["gguf"])
    llm = LLM(path, threads=1, numerics="exact", driver=opts)
    prompt = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    cold = llm.generate([prompt], params)[0]
    core = llm.core
    with _counting(core) as log:
        req = llm.make_request(prompt, params)
        core.add_request(req)
        log.clear()
        steps = 0
        while core.has_unfinished():
            core.step()
            steps += 1
    assert log == ["step"] * steps and steps >= len(prompt) // 4
    assert req.prompt_logprobs == cold.prompt_logprobs
    entries = req.prompt_logprobs
    for i in range(1, len(prompt)):
        want = log_softmax(llm.logits(prompt[:i]))[prompt[i]]
        assert entries[i][prompt[i]].logprob == float(want), i


def _guided_python_runs(llm: LLM, runtime: Any) -> tuple[list[Any], list[str], int, int]:
    """Two guided requests on ``runtime`` (a Python object) after a warm-up run: the
    requests, the crossings, the steps and the masks filled."""
    core = llm.core
    params = SamplingParams(max_tokens=8, temperature=0.0, regex="[a-z ]{8}")
    original = core.runner.runtime
    core.runner.runtime = runtime
    fills: list[int] = []
    fill_masks = core.guide.fill_masks

    def counted(rows: Any, seqs: int) -> Any:
        fills.append(len(rows))
        return fill_masks(rows, seqs)

    try:
        _drive(llm, [params, params])  # the driver takes the plans for this runtime
        core.guide.fill_masks = counted  # type: ignore[method-assign]
        reqs, log, steps = _drive(llm, [params, params])
    finally:
        core.runner.runtime = original
        vars(core.guide).pop("fill_masks", None)
    return reqs, [c for c in log if c != "abort"], steps, len(fills)


def test_a_guided_step_on_a_python_runtime_crosses_once(llm: LLM) -> None:
    # The driver runs the step through the runtime's own run (a Python call back, as any run
    # on it is) with the mask as its late input, filled meanwhile: one crossing, the native
    # runtime's tokens.
    params = SamplingParams(max_tokens=8, temperature=0.0, regex="[a-z ]{8}")
    want = [o.outputs[0].token_ids for o in llm.generate(["Once upon", "Lily"], params)]
    runtime = HookedRuntime(llm.core.runner.runtime, lambda n: None)
    reqs, log, steps, fills = _guided_python_runs(llm, runtime)
    assert log == ["step"] * steps and fills == steps > 1
    assert [r.out for r in reqs] == want


def test_a_guided_split_step_on_a_python_runtime_crosses_once(llm: LLM) -> None:
    # A Python runtime without the logit ops: the forward pass through its run while the mask
    # is filled, the sampling step on the host runtime, in the one call.
    params = SamplingParams(max_tokens=8, temperature=0.0, regex="[a-z ]{8}")
    want = [o.outputs[0].token_ids for o in llm.generate(["Once upon", "Lily"], params)]
    runner = llm.core.runner
    no_logit_ops = HookedRuntime(runner.runtime, lambda n: None)
    no_logit_ops.supports = lambda op: op not in LOGIT_OPS  # type: ignore[method-assign]
    runner.samples_on_device = False
    try:
        reqs, log, steps, fills = _guided_python_runs(llm, no_logit_ops)
    finally:
        runner.samples_on_device = True
    assert log == ["step"] * steps and fills == steps > 1
    assert [r.out for r in reqs] == want


def test_a_guided_step_on_the_planner_s_runtime_crosses_once(llm: LLM, stories: Path) -> None:
    from poot.planner import CompileConfig
    from poot.planner.runners import LeasedRuntime

    params = SamplingParams(max_tokens=8, temperature=0.0, regex="[a-z ]{8}")
    want = [o.outputs[0].token_ids for o in llm.generate(["Once upon", "Lily"], params)]
    planned = LLM(
        str(stories / "stories260K-Q8_0.gguf"),
        num_blocks=32,
        max_step_tokens=32,
        config=CompileConfig(allow_gpu=False),
    )
    runtime = planned.core.runner.runtime
    assert isinstance(runtime, LeasedRuntime)
    reqs, log, steps, fills = _guided_python_runs(planned, runtime)
    assert log == ["step"] * steps and fills == steps > 1
    assert [r.out for r in reqs] == want


def test_a_split_step_crosses_once_with_the_runner_s_results(
    stories: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a runtime without the logit ops (here wgpu sampling on the host, as on an adapter
    # without shader-f64) a step that penalizes, masks or asks for logprobs runs split: the
    # forward pass on the device, the sampling step on a host CPU runtime. The driver runs
    # both in the one call, with the runner's split path's results bit for bit.
    from wgpu_util import require_wgpu

    import poot.llm

    require_wgpu()

    def host_sampling(timeout_s: float, numerics: Any = "exact") -> Any:
        return _native.WgpuRuntime(timeout_s, numerics=numerics, host_sampling=True)

    monkeypatch.setattr(poot.llm, "_make_wgpu_runtime", host_sampling)
    llm = LLM(str(stories / "stories260K-f32.gguf"), backend="wgpu", num_blocks=32)
    assert not llm.core.runner.samples_on_device
    params = [
        SamplingParams(max_tokens=5, temperature=0.8, seed=3, repetition_penalty=1.3, logprobs=2),
        SamplingParams(max_tokens=5, temperature=0.0, regex="[a-z ]{5}"),
        SamplingParams(max_tokens=5, temperature=0.0, prompt_logprobs=1, presence_penalty=0.5),
    ]
    with _host_only(llm.core):
        want, host_log, _ = _drive(llm, params)
    assert "update" in host_log and "run_sample" in host_log
    _drive(llm, params)  # the driver takes the plans it has not held yet
    got, log, steps = _drive(llm, params)
    # A finished grammar ends its request on the host (one abort, not a step's crossing).
    assert [c for c in log if c != "abort"] == ["step"] * steps and steps > 1
    for g, w in zip(got, want, strict=True):
        assert g.out == w.out and g.finish_reason == w.finish_reason
        assert g.logprobs == w.logprobs and g.prompt_logprobs == w.prompt_logprobs
    assert got[0].logprobs and got[2].prompt_logprobs[1] is not None


# ---- the seams, checked over the source --------------------------------------------------


def _private_reads(path: Path) -> list[str]:
    """``x._name`` reads in ``path`` where ``x`` is not ``self``/``cls`` (dunders allowed)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{path.name}:{node.lineno}: .{name}")
    return found


@pytest.mark.parametrize("client", ["llm.py", "async_engine.py"])
def test_the_core_s_clients_touch_nothing_private(client: str) -> None:
    assert _private_reads(PACKAGE / client) == []


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (annotations only)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports when it runs, at any depth (lazy imports included)."""
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_planner_never_imports_the_llm() -> None:
    for path in sorted((PACKAGE / "planner").glob("*.py")):
        assert "poot.llm" not in _imports(path), path.name


def test_sampling_and_guidance_do_not_import_each_other() -> None:
    assert "poot.guidance" not in _imports(PACKAGE / "sampling.py")
    assert "poot.sampling" not in _imports(PACKAGE / "guidance.py")


# ---- the runtime seam --------------------------------------------------------------------


@pytest.mark.parametrize(("numerics", "entry"), [("exact", 4), ("ggml", 2)])
def test_the_cpu_runtime_states_its_seam(numerics: str, entry: int) -> None:
    rt = _native.CpuRuntime(1, numerics)  # type: ignore[arg-type]
    assert isinstance(rt, Runtime)
    assert rt.kv_entry_bytes == entry
    # The planner sizes pools before it builds runtimes: the class says the same.
    assert _native.CpuRuntime.kv_entry_bytes_for(numerics) == entry
    assert _native.WgpuRuntime.kv_entry_bytes_for(numerics) == 4
    assert _native.CudaRuntime.kv_entry_bytes_for(numerics) == 4
    assert all(rt.supports(op) for op in (*LOGIT_OPS, "matmul", "paged_attention"))


def test_kv_entry_bytes_for_refuses_unknown_numerics() -> None:
    for cls in (_native.CpuRuntime, _native.WgpuRuntime, _native.CudaRuntime):
        with pytest.raises(ValueError, match="numerics"):
            cls.kv_entry_bytes_for("fast")


def test_the_pool_is_sized_by_the_runtime_s_entry_and_the_scheduler_s_blocks(
    stories: Path,
) -> None:
    for numerics in ("exact", "ggml"):
        m = LLM(str(stories / "stories260K-f32.gguf"), numerics=numerics, num_blocks=16)  # type: ignore[arg-type]
        layers, heads, dim = m.definition.kv_shape
        assert m.scheduler.pool_blocks == m.scheduler.num_blocks + 1 == 17
        want = m.scheduler.pool_blocks * m.block_size * layers * 2 * heads * dim
        assert m.runtime.memory()["kv_bytes"] == want * m.runtime.kv_entry_bytes


def test_the_null_runtime_offers_the_seam() -> None:
    from planner_fixtures import gpu

    null = NullRuntime(gpu(), {})
    assert isinstance(null, Runtime) and null.supports("adjust_logits")
    assert null.kv_entry_bytes == 4
