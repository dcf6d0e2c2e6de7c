"""Streaming out of core on the CPU: the same greedy ids as the resident run, under a device
budget smaller than the model, through a bounded double buffer; stalls, spill dir, cancel."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest

import poot
from poot.errors import Cancelled, SpillDirError, Stalled
from poot.planner import CompileConfig
from poot.planner.compiled import CompiledModel, standing_bytes

PROMPT = "Once upon a time"


def _greedy(llm: poot.LLM, n: int) -> list[int]:
    params = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return list(llm.generate([PROMPT], params)[0].outputs[0].token_ids)


@pytest.fixture(scope="module")
def stories_q8(stories: Path) -> Path:
    return stories / "stories260K-Q8_0.gguf"


@functools.cache
def _kv(gguf: Path) -> int:
    """The KV pool the device budget holds besides weights (the LLM's own)."""
    from planner_fixtures import llm_kv_bytes

    return llm_kv_bytes(gguf)


def _returned(c: CompiledModel) -> bool:
    """Every forward gave its bytes back: only the standing lease (weights, KV) is held."""
    snap = c.ledger.snapshot()
    held = sum(standing_bytes(c.stats, c.placement).values())
    return snap["device"]["used"] == held and snap["host"]["used"] == snap["disk"]["used"] == 0


def test_stories_streams_with_resident_ids(stories_q8: Path, tmp_path: Path) -> None:
    want = _greedy(poot.LLM(stories_q8), 24)
    size = stories_q8.stat().st_size
    cfg = CompileConfig(
        allow_gpu=False, device_budget_bytes=_kv(stories_q8) + size // 2, spill_dir=tmp_path
    )
    llm = poot.LLM(stories_q8, config=cfg)
    c = llm.compiled
    assert c is not None and c.streams and not c.direct
    assert _greedy(llm, 24) == want
    snap = c.ledger.snapshot()
    assert 0 < snap["device"]["peak"] <= _kv(stories_q8) + size // 2
    assert snap["device"]["used"] == _kv(stories_q8) and _returned(c)
    assert "streamed through a double buffer" in c.explain()
    spans = c.recorder.last()
    assert {s.kind for s in spans} == {"load", "compute"}
    assert list(tmp_path.iterdir()) == []  # no buffer file outlives its chunk


def test_default_model_streams_with_resident_ids(default_model_path: Path, tmp_path: Path) -> None:
    want = _greedy(poot.LLM(default_model_path), 8)
    budget = _kv(default_model_path) + default_model_path.stat().st_size * 7 // 10
    llm = poot.LLM(
        default_model_path,
        config=CompileConfig(allow_gpu=False, device_budget_bytes=budget, spill_dir=tmp_path),
    )
    assert llm.compiled is not None and llm.compiled.streams
    assert _greedy(llm, 8) == want
    assert llm.compiled.ledger.snapshot()["device"]["peak"] <= budget


def test_resident_plan_takes_the_direct_path(stories_q8: Path) -> None:
    llm = poot.LLM(stories_q8, config=CompileConfig(allow_gpu=False))
    assert llm.compiled is not None and llm.compiled.direct
    # On the CPU the direct path prepares the weights at load too, not in the first request.
    prepared = llm.runtime.memory()["weight_bytes"]
    assert prepared > 0 and llm.stats()["prepared_entries"] == 0
    assert _greedy(llm, 8) == _greedy(poot.LLM(stories_q8), 8)
    ledger = llm.compiled.ledger
    assert ledger.leases > 1  # the standing lease, then one per forward
    # Resident weights and the KV pool hold their bytes; every forward returned its own.
    want = llm.compiled.stats.total_weight_bytes + _kv(stories_q8)
    assert ledger.snapshot()["device"]["used"] == want and _returned(llm.compiled)


def test_tmpfs_spill_dir_is_refused(stories_q8: Path) -> None:
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    from planner_fixtures import kv_bytes

    spill = Path(tempfile.mkdtemp(prefix="poot-spill-test-", dir=shm))
    # poot.compile alone plans the workload's KV pool (an LLM passes its own, bigger one).
    kv = kv_bytes(stories_q8)
    try:
        cfg = CompileConfig(allow_gpu=False, device_budget_bytes=kv + 120_000, spill_dir=spill)
        with pytest.raises(SpillDirError) as e:
            poot.compile(stories_q8, cfg)
        assert e.value.fs_type == 0x01021994 and str(spill) in str(e.value)
        ok = CompileConfig(
            allow_gpu=False,
            device_budget_bytes=kv + 120_000,
            spill_dir=spill,
            allow_tmpfs_spill=True,
        )
        assert poot.compile(stories_q8, ok).streams
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def test_a_stalled_load_raises_stalled_naming_the_chunk(stories_q8: Path, tmp_path: Path) -> None:
    cfg = CompileConfig(
        allow_gpu=False,
        device_budget_bytes=_kv(stories_q8) + 120_000,
        spill_dir=tmp_path,
        stall_timeout_s=0.3,
    )
    llm = poot.LLM(stories_q8, config=cfg)
    gate = threading.Event()
    runtime = llm.runner.runtime

    def stuck(tensors, dest, progress):  # type: ignore[no-untyped-def]
        gate.wait(10)
        raise OSError("source gone")

    runtime.copy = stuck  # type: ignore[union-attr]
    with pytest.raises(Stalled) as e:
        _greedy(llm, 2)
    gate.set()
    assert "chunk 0" in e.value.waited_for and e.value.timeout_s == 0.3
    assert llm.compiled is not None
    # The stuck loader gives its slot back once its copy ends (here: fails).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _returned(llm.compiled):
        time.sleep(0.01)
    assert _returned(llm.compiled)


def test_cancel_stops_only_its_own_forward(stories_q8: Path, tmp_path: Path) -> None:
    cfg = CompileConfig(
        allow_gpu=False, device_budget_bytes=_kv(stories_q8) + 120_000, spill_dir=tmp_path
    )
    llm = poot.LLM(stories_q8, config=cfg)
    c = llm.compiled
    assert c is not None
    runtime = llm.runner.runtime
    real_copy = runtime.copy  # type: ignore[union-attr]
    other = c.generations.begin()  # another forward in flight
    c.cancel(other)

    def cancel_mine(tensors, dest, progress):  # type: ignore[no-untyped-def]
        c.cancel(runtime.current_generation)  # type: ignore[union-attr]
        return real_copy(tensors, dest, progress)

    runtime.copy = cancel_mine  # type: ignore[union-attr]
    with pytest.raises(Cancelled):
        _greedy(llm, 2)
    # Our forward ended; the other one's cancel is still in force.
    assert c.generations.is_cancelled(other)
    runtime.copy = real_copy  # type: ignore[union-attr]
    assert len(_greedy(llm, 2)) == 2
    assert c.generations.is_cancelled(other)


def test_async_engine_over_a_streamed_model(stories_q8: Path, tmp_path: Path) -> None:
    """The server's engine runs whatever plan its LLM compiled: batched requests stream too."""
    import asyncio

    prompts = ["Once upon a time", "The cat", "Lily and Tom went to"]
    params = poot.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    resident = poot.LLM(stories_q8)
    want = [resident.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    cfg = CompileConfig(
        allow_gpu=False,
        device_budget_bytes=_kv(stories_q8) + stories_q8.stat().st_size // 2,
        spill_dir=tmp_path,
    )
    llm = poot.LLM(stories_q8, config=cfg)
    assert llm.compiled is not None and llm.compiled.streams
    engine = poot.AsyncEngine(llm)

    async def one(prompt: str) -> list[int]:
        return [t async for out in engine.add_request(prompt, params) for t in out.token_ids]

    async def main() -> list[list[int]]:
        got = await asyncio.gather(*(one(p) for p in prompts))
        await engine.shutdown()
        return list(got)

    assert asyncio.run(main()) == want
    assert _returned(llm.compiled)


def test_streamed_logprobs_and_logits_match_resident(stories_q8: Path, tmp_path: Path) -> None:
    import numpy as np

    params = poot.SamplingParams(max_tokens=6, temperature=0.0, logprobs=3)
    resident = poot.LLM(stories_q8)
    cfg = CompileConfig(
        allow_gpu=False,
        device_budget_bytes=_kv(stories_q8) + stories_q8.stat().st_size // 2,
        spill_dir=tmp_path,
    )
    streamed = poot.LLM(stories_q8, config=cfg)
    a = resident.generate([PROMPT], params)[0].outputs[0]
    b = streamed.generate([PROMPT], params)[0].outputs[0]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    ids = resident.tokenizer.encode(PROMPT)
    np.testing.assert_array_equal(resident.logits(ids), streamed.logits(ids))


def test_streams_from_disk_when_the_host_budget_is_short(stories_q8: Path, tmp_path: Path) -> None:
    size = stories_q8.stat().st_size
    cfg = CompileConfig(
        allow_gpu=False,
        device_budget_bytes=_kv(stories_q8) + size // 2,
        host_budget_bytes=_kv(stories_q8) + size * 6 // 10,
        spill_dir=tmp_path,
    )
    llm = poot.LLM(stories_q8, config=cfg)
    assert llm.compiled is not None
    assert llm.compiled.placement.segments[0].residency == "disk"
    assert "streamed from disk" in llm.compiled.explain()
    assert _greedy(llm, 12) == _greedy(poot.LLM(stories_q8), 12)
    assert llm.compiled.ledger.snapshot()["host"]["peak"] <= size * 6 // 10


def test_a_plan_on_a_device_this_build_cannot_run_is_refused(
    stories_q8: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planner_fixtures import cpu, gpu

    import poot.planner.compiled as compiled_mod
    from poot.errors import BackendNotCompiledError

    fake = {"cpu": cpu(), "cuda:0": gpu()}
    monkeypatch.setattr(compiled_mod, "_profiles_from", lambda *a: (dict(fake), {}))
    with pytest.raises(BackendNotCompiledError) as e:
        poot.LLM(stories_q8, config=CompileConfig())
    assert e.value.backend == "cuda" and "cuda:0" in str(e.value)
    llm = poot.LLM(stories_q8, config=CompileConfig(allow_gpu=False))
    assert llm.compiled is not None and llm.compiled.placement.devices == ("cpu",)
