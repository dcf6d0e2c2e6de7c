"""``poot.AsyncEngine``: concurrent streamed requests sharing steps, aborts, cancellation and
per-request errors, with blocks back in the pool every way out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_hooks import HookedRuntime

from poot import AsyncEngine, SamplingParams, StreamOutput, errors
from poot.async_engine import RequestAbortedError

PROMPTS: list[Any] = ["Once upon a time", "The cat", "Lily and Tom went to", [1, 403, 407]]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture
def llm(make_llm: Callable[..., Any], stories: Path) -> Any:
    return make_llm(stories / "stories260K-f32.gguf", "cpu", max_step_tokens=8)


async def _collect(engine: AsyncEngine, prompt: Any, params: SamplingParams) -> list[StreamOutput]:
    return [out async for out in engine.add_request(prompt, params)]


async def _wait_blocks_free(llm: Any) -> None:
    for _ in range(500):
        if llm.scheduler.used_blocks == 0:
            return
        await asyncio.sleep(0.01)


def test_concurrent_requests_match_generate(llm: Any) -> None:
    want = [llm.generate(p, GREEDY)[0].outputs[0] for p in PROMPTS]
    engine = AsyncEngine(llm)
    steps_before = llm.stats()["steps"]

    async def main() -> list[list[StreamOutput]]:
        got = await asyncio.gather(*(_collect(engine, p, GREEDY) for p in PROMPTS))
        await engine.shutdown()
        return got

    got = asyncio.run(main())
    for outs, w in zip(got, want, strict=True):
        assert [t for o in outs for t in o.token_ids] == w.token_ids
        assert "".join(o.text for o in outs) == w.text
        assert outs[-1].finish_reason == "length"
        assert all(o.finish_reason is None for o in outs[:-1])
    # The requests shared steps: fewer than running them one after another.
    one_at_a_time = sum(len(outs) for outs in got)
    assert llm.stats()["steps"] - steps_before < one_at_a_time
    assert llm.scheduler.used_blocks == 0


def test_abort_mid_decode_frees_blocks(llm: Any) -> None:
    engine = AsyncEngine(llm)

    async def main() -> None:
        other = asyncio.create_task(_collect(engine, PROMPTS[1], GREEDY))
        gen = engine.add_request(PROMPTS[0], GREEDY, request_id="a")
        seen = 0
        with pytest.raises(RequestAbortedError):
            async for _ in gen:
                seen += 1
                if seen == 3:
                    assert llm.scheduler.used_blocks > 0
                    await engine.abort("a")
        outs = await other
        assert outs[-1].finish_reason == "length"
        await _wait_blocks_free(llm)
        await engine.shutdown()

    asyncio.run(main())
    assert llm.scheduler.used_blocks == 0
    assert not llm.scheduler.has_unfinished_requests


def test_cancelled_consumer_frees_blocks(llm: Any) -> None:
    engine = AsyncEngine(llm)
    want = llm.generate(PROMPTS[2], GREEDY)[0].outputs[0].token_ids

    async def main() -> list[StreamOutput]:
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.add_request(PROMPTS[0], GREEDY):
                started.set()

        task = asyncio.create_task(consume())
        other = asyncio.create_task(_collect(engine, PROMPTS[2], GREEDY))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        outs = await other
        await _wait_blocks_free(llm)
        assert engine.num_requests == 0
        await engine.shutdown()
        return outs

    outs = asyncio.run(main())
    assert [t for o in outs for t in o.token_ids] == want
    assert llm.scheduler.used_blocks == 0
    assert llm.stats()["aborted"] >= 1


def test_bad_request_fails_alone(llm: Any) -> None:
    engine = AsyncEngine(llm)
    want = llm.generate(PROMPTS[1], GREEDY)[0].outputs[0].token_ids
    vocab = llm.files.hparams.vocab_size

    async def main() -> list[StreamOutput]:
        good = asyncio.create_task(_collect(engine, PROMPTS[1], GREEDY))
        with pytest.raises(errors.GraphInputError):
            await _collect(engine, [1, vocab + 5], GREEDY)
        with pytest.raises(errors.ContextLengthError):
            await _collect(engine, [1] * llm.max_model_len, GREEDY)
        outs = await good
        await engine.shutdown()
        return outs

    outs = asyncio.run(main())
    assert [t for o in outs for t in o.token_ids] == want
    assert llm.scheduler.used_blocks == 0


def test_failed_step_fails_its_requests(llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = AsyncEngine(llm)

    def failing(calls: int) -> None:
        if calls == 3:
            raise errors.DeviceTimeoutError("injected", during="run")

    monkeypatch.setattr(llm.runner, "runtime", HookedRuntime(llm.runner.runtime, failing))

    async def main() -> list[StreamOutput]:
        with pytest.raises(errors.DeviceTimeoutError):
            await _collect(engine, PROMPTS[0], GREEDY)
        outs = await _collect(engine, PROMPTS[1], GREEDY)
        await engine.shutdown()
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "length"
    assert llm.scheduler.used_blocks == 0
    assert not llm.scheduler.step_in_flight


def test_shutdown_ends_requests(llm: Any) -> None:
    engine = AsyncEngine(llm)

    async def main() -> None:
        gen = engine.add_request(PROMPTS[0], GREEDY)
        await gen.__anext__()
        await engine.shutdown()
        with pytest.raises(errors.PootError):
            async for _ in gen:
                pass
        with pytest.raises(errors.PootError):
            await _collect(engine, PROMPTS[1], GREEDY)

    asyncio.run(main())
    assert llm.scheduler.used_blocks == 0
