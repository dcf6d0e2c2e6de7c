"""Counting a step's crossings into Rust (tests only): the engine core's scheduler and step
driver behind proxies that log each attribute read (each one a crossing), the runner's Python
entries logged too (tracing on a miss, host-side steps), and a driver that leaves every step
unrun (the runner's path, whose results the one call must equal bit for bit)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from poot import LLM, SamplingParams
from poot.engine_core import EngineCore

__all__ = ["counting", "drive", "host_only"]


class Counting:
    """Forwards to a native object, logging each attribute read (each one crosses into Rust)."""

    def __init__(self, inner: Any, log: list[str]) -> None:
        self._inner, self._log = inner, log

    def __getattr__(self, name: str) -> Any:
        self._log.append(name)
        return getattr(self._inner, name)


RUNNER_ENTRIES = ("plan", "run_plan", "run_sample", "run_all_logits")


@contextmanager
def counting(core: EngineCore) -> Iterator[list[str]]:
    """Puts the core's scheduler and step driver behind proxies that log every attribute read
    (each one a crossing into Rust), and logs the runner's Python entries too (tracing on a
    miss, host-side steps); yields the log."""
    log: list[str] = []
    scheduler, driver, runner = core.scheduler, core.driver, core.runner
    core.scheduler = Counting(scheduler, log)  # type: ignore[assignment]
    core.driver = Counting(driver, log)  # type: ignore[assignment]
    for name in RUNNER_ENTRIES:
        setattr(runner, name, logged(getattr(runner, name), name, log))
    try:
        yield log
    finally:
        core.scheduler, core.driver = scheduler, driver
        for name in RUNNER_ENTRIES:
            delattr(runner, name)


def drive(llm: LLM, params: list[SamplingParams]) -> tuple[list[Any], list[str], int]:
    """Runs one request per ``params`` (prompts ``Once upon``, ``Lily``, ``The cat``) step by
    step to the end under ``counting``; returns the requests, the crossings of their steps
    and the steps."""
    core = llm.core
    prompts = ["Once upon", "Lily", "The cat"]
    with counting(core) as log:
        reqs = [llm.make_request(t, p) for t, p in zip(prompts, params, strict=False)]
        for r in reqs:
            core.add_request(r)
        log.clear()
        steps = 0
        while core.has_unfinished():
            core.step()
            steps += 1
    return reqs, list(log), steps


def logged(f: Any, name: str, log: list[str]) -> Any:
    def call(*args: Any, **kw: Any) -> Any:
        log.append(name)
        return f(*args, **kw)

    return call


class HostOnly:
    """Forwards to the step driver but leaves every step unrun: the runner's path, whose
    results the driver's one call must equal bit for bit."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def step(self, fast: bool = True, forget: Any = (), logits_for: int | None = None) -> Any:
        return self._inner.step(False, list(forget), logits_for)


@contextmanager
def host_only(core: EngineCore) -> Iterator[None]:
    driver = core.driver
    core.driver = HostOnly(driver)  # type: ignore[assignment]
    try:
        yield
    finally:
        core.driver = driver
