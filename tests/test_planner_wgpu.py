"""The planner on a real wgpu adapter (lavapipe here): validate-hardware measures it, the planner
uses its measured profile (and drops it for the CPU, saying why), and a plan split over the CPU
and the adapter runs with the CPU-only run's greedy ids.

Skips without a wgpu adapter; ``POOT_REQUIRE_WGPU=1`` (``make test-device-wgpu``) fails instead.
No timing thresholds: the benchmarks' numbers are only checked to be measured (positive, finite).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

import poot
from poot import SamplingParams
from poot.cli import main
from poot.config import Settings
from poot.planner.compiled import CompileConfig

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module", autouse=True)
def _wgpu() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache dir whose profiles `poot validate-hardware --quick` measured (CPU and lavapipe);
    POOT_CACHE_DIR points at it for the module."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOT_CACHE_DIR", str(root))
        assert main(["validate-hardware", "--quick"]) == 0
        yield root


@pytest.fixture
def f32(stories: Path) -> Path:
    return stories / "stories260K-f32.gguf"


def _greedy(llm: poot.LLM, n: int, **kw: int) -> list[int]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)  # type: ignore[arg-type]
    return list(llm.generate(["Once upon a time"], params)[0].outputs[0].token_ids)


def test_validate_hardware_validates_the_adapter_and_doctor_marks_it(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from poot import _native

    assert main(["validate-hardware", "--quick", "--json"]) == 0
    reports = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    wgpu = reports["wgpu:0"]
    assert wgpu["status"] == "validated", wgpu
    checks = wgpu["checks"]
    assert set(checks.values()) == {"ok"}
    assert {"matmul Q8_0 ggml", "matmul F16 exact", "softmax", "benchmarks"} <= set(checks)
    prof = wgpu["profile"]
    for value in (prof["read_bw_gbps"], prof["link_gbps"], prof["link_latency_us"]):
        assert math.isfinite(value) and value > 0
    assert set(prof["gemv_gbps"]) == set(prof["gemm_gflops"]) == {"F32", "F16", "Q8_0", "Q4_1"}
    assert all(v > 0 for v in (*prof["gemv_gbps"].values(), *prof["gemm_gflops"].values()))
    stored = Path(wgpu["stored"])
    assert stored.is_relative_to(cache / "profiles") and stored.is_file()
    body = json.loads(stored.read_text())
    assert body["version"] == _native.__version__ and body["identity"].startswith("wgpu|")
    assert body["profile"]["source"] == "measured" and body["profile"]["kind"] == "wgpu"
    assert main(["doctor", "--json"]) == 0
    doctor = {d["key"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
    assert doctor["wgpu:0"]["status"] == "validated"


def test_a_conformance_failure_fails_the_device_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import poot.planner.validate_wgpu as vw
    from poot import _native

    # A real deviation: F16 products taken in f16 (the opt-in f16 arithmetic) miss the exact
    # bound of 2e-4 that a validated adapter must meet.
    monkeypatch.setattr(
        vw,
        "_open",
        lambda n, api="wgpu": _native.WgpuRuntime(60.0, f16_arithmetic=True, numerics=n, api=api),
    )
    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path))
    if not _native.WgpuRuntime(60.0, f16_arithmetic=True).adapter["f16_arithmetic"]:
        pytest.skip("this adapter has no shader-f16: f16 arithmetic is not taken")
    assert main(["validate-hardware", "--quick", "--json"]) == 1
    wgpu = next(r for r in json.loads(capsys.readouterr().out) if r["key"] == "wgpu:0")
    assert wgpu["status"] == "failed" and wgpu["stored"] is None
    assert "exceeds atol" in wgpu["checks"]["matmul F16 exact"]
    assert "benchmarks" not in wgpu["checks"]
    assert not list((tmp_path / "profiles").glob("wgpu-*"))


def test_the_planner_drops_lavapipe_for_the_cpu_with_measured_numbers(
    cache: Path, f32: Path, stories: Path
) -> None:
    from planner_fixtures import GB, scaled_stats

    from poot.planner.compiled import place

    compiled = poot.compile(f32, settings=Settings(cache_dir=cache))
    lava = compiled.profiles["wgpu:0"]
    assert lava.validated and lava.software and compiled.profiles["cpu"].validated
    assert compiled.placement.devices == ("cpu",)
    why = compiled.dropped["wgpu:0"]
    assert "costs" in why and "measured" in why and "CPU's own cores" in why
    assert f"wgpu:0: {why}" in compiled.explain()
    # The same decision for a model a thousand times larger (stories' layer structure, 1 GB
    # of Q8_0 weights): lavapipe's measured rates lose to the CPU's, alone or in a split.
    stats = scaled_stats(stories / "stories260K-Q8_0.gguf", 1 * GB)
    placed = place(stats, compiled.profiles, compiled.host, CompileConfig(), cache / "spill")
    assert placed.chosen.placement.devices == ("cpu",)
    assert "wgpu:0" in placed.dropped and "costs" in placed.dropped["wgpu:0"]
    both = [c for c in placed.candidates if len(c.placement.devices) == 2]
    assert both and all(c.cost.total_s > placed.chosen.cost.total_s for c in both)


@pytest.mark.parametrize(
    "spec",
    [(("cpu", 0, 3), ("wgpu:0", 3, 7)), (("wgpu:0", 0, 4), ("cpu", 4, 7))],
    ids=["cpu-then-wgpu", "wgpu-then-cpu"],
)
def test_a_split_plan_runs_with_the_cpu_greedy_ids(
    cache: Path, f32: Path, tmp_path: Path, spec: tuple[tuple[str, int, int], ...]
) -> None:
    from planner_fixtures import llm_kv_bytes

    from poot.planner.runners import SplitStepRunner

    want = _greedy(poot.LLM(f32), 32)
    llm = poot.LLM(f32, config=CompileConfig(force_placement=spec))
    assert llm.compiled is not None and isinstance(llm.runner, SplitStepRunner)
    assert llm.compiled.placement.devices == tuple(s[0] for s in spec)
    assert "pinned by CompileConfig.force_placement" in llm.compiled.explain()
    parts = llm.runner.runtime.parts
    assert [p.runtime.name for p in parts] == [s[0].split(":")[0] for s in spec]
    # Each device holds the KV of its own layers only (stories260K: 5 layers).
    assert [p.layers for p in parts] == [(0, spec[0][2] - 1), (spec[0][2] - 1, 6 - spec[0][2])]
    assert _greedy(llm, 32) == want
    # Each device's ledger pool holds its segment's weights and the KV of its layers; the two
    # KV shares make up the LLM's pool (f32 entries on both in exact numerics).
    c = llm.compiled
    snap = c.ledger.snapshot()
    kv = {s.device: c.stats.kv_of(s.start, s.end, s.device) for s in c.placement.segments}
    for s in c.placement.segments:
        want_held = c.stats.bytes_of(s.start, s.end) + kv[s.device]
        assert snap[f"device:{s.device}"]["used"] == want_held
    assert sum(kv.values()) == llm_kv_bytes(f32) and all(kv.values())
    lanes = {s.lane for s in llm.compiled.recorder.last()}
    assert lanes == {"cpu", "wgpu:0"}
    page = llm.compiled.visualize(tmp_path / "split.html", measured=True).read_text()
    assert "wgpu:0" in page and "cpu" in page


def test_a_split_ending_on_wgpu_samples_logprobs_on_the_host(cache: Path, f32: Path) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3)
    want = poot.LLM(f32).generate(["Once upon a time"], params)[0].outputs[0]
    spec = (("cpu", 0, 2), ("wgpu:0", 2, 7))
    llm = poot.LLM(f32, config=CompileConfig(force_placement=spec))
    got = llm.generate(["Once upon a time"], params)[0].outputs[0]
    assert got.token_ids == want.token_ids
    assert got.logprobs is not None and want.logprobs is not None
    for a, b in zip(got.logprobs, want.logprobs, strict=True):
        assert a.keys() == b.keys()
        assert all(abs(a[k].logprob - b[k].logprob) < 1e-3 for k in a)


def test_the_whole_model_on_the_adapter_takes_the_direct_path(cache: Path, f32: Path) -> None:
    llm = poot.LLM(f32, config=CompileConfig(force_placement=(("wgpu:0", 0, 7),)))
    assert llm.compiled is not None and llm.compiled.direct
    assert llm.runtime.name == "wgpu" and llm.backend == "wgpu"
    assert _greedy(llm, 16) == _greedy(poot.LLM(f32), 16)


def test_streaming_to_the_adapter_is_refused(cache: Path, f32: Path) -> None:
    from planner_fixtures import llm_kv_bytes

    from poot.errors import BackendNotCompiledError

    budget = llm_kv_bytes(f32) + f32.stat().st_size // 2  # the KV pool, then half the weights
    cfg = CompileConfig(force_placement=(("wgpu:0", 0, 7),), device_budget_bytes=budget)
    with pytest.raises(BackendNotCompiledError, match="streams weights to wgpu:0") as e:
        poot.LLM(f32, config=cfg)
    assert e.value.backend == "wgpu"
