"""``poot.progress.polled_bar`` and the load-time weight preparation bar it draws."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from poot import _native
from poot.progress import polled_bar


def _wait_for(cond: Callable[[], bool], limit_s: float = 30.0) -> bool:
    """Polls ``cond`` until it holds; False after ``limit_s`` (a hang, not a timing check)."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_the_bar_shows_progress_while_the_body_runs_and_stops_its_thread() -> None:
    state = {"done": 30}
    buf = io.StringIO()
    with polled_bar(
        lambda: (state["done"], 100), desc="prepare weights", file=buf, disable=False, delay=0.0
    ):
        # Drawn from the helper thread while this body still runs.
        assert _wait_for(lambda: " 30%" in buf.getvalue()), buf.getvalue()
        state["done"] = 100
    out = buf.getvalue()
    assert out.rstrip().endswith("]") and "100%" in out and "prepare weights" in out
    assert not any(t.name == "poot-progress" for t in threading.enumerate())


def test_the_bar_never_passes_its_total_and_an_error_in_the_body_still_stops_it() -> None:
    buf = io.StringIO()
    with (
        pytest.raises(RuntimeError, match="boom"),
        polled_bar(lambda: (150, 100), desc="x", file=buf, disable=False, delay=0.0),
    ):
        raise RuntimeError("boom")
    assert "100/100" in buf.getvalue() and "150" not in buf.getvalue()
    assert not any(t.name == "poot-progress" for t in threading.enumerate())


def test_a_short_job_draws_nothing_within_the_delay() -> None:
    buf = io.StringIO()
    with polled_bar(lambda: (1, 2), desc="x", file=buf, disable=False, delay=60.0):
        pass
    assert buf.getvalue() == ""


def _matmul_bytes(path: Path) -> int:
    """Stored bytes of the model's matmul weights: every 2-D tensor except the token embedding,
    which is a matmul weight only when tied (no ``output.weight``)."""
    tensors = _native.GgufFile(path).tensors()
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(
        t.nbytes for t in tensors if len(t.shape) == 2 and (tied or t.name != "token_embd.weight")
    )


def test_loading_reports_every_matmul_weight_prepared_and_draws_it(
    make_llm: Callable[..., Any], stories: Path
) -> None:
    path = stories / "stories260K-Q8_0.gguf"
    llm = make_llm(path)
    want = _matmul_bytes(path)
    assert want > 0 and llm.runtime.weight_progress() == (want, want)
    # A second preparation finds every weight prepared: the figures stay the load's.
    buf = io.StringIO()
    llm.runner.prepare_weights(file=buf)
    assert llm.runtime.weight_progress() == (want, want)
    assert "prepare weights: 100%" in buf.getvalue()


def test_no_bar_off_a_terminal_or_under_tqdm_disable(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for file, env, drawn in (
        (io.StringIO(), None, False),
        (Tty(), "1", False),
        (Tty(), None, True),
    ):
        if env is None:
            monkeypatch.delenv("TQDM_DISABLE", raising=False)
        else:
            monkeypatch.setenv("TQDM_DISABLE", env)
        with polled_bar(lambda: (1, 1), desc="x", file=file, delay=0.0):
            pass
        assert ("100%" in file.getvalue()) == drawn, (env, file.getvalue())
