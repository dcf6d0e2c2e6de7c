"""``poot-serve --device-budget``: a budget the default model's weights do not fit makes the
planner stream them (through ``--spill-dir``), and the server serves that plan: the same
greedy tokens as a resident ``LLM``. A real server process on loopback; the spill files go
under the test's temporary directory, never the user's cache.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")

from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines  # noqa: E402

from poot import LLM, SamplingParams  # noqa: E402
from poot.errors import ConfigError  # noqa: E402
from poot.server.config import parse_size  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def streamed(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    spill = tmp_path_factory.mktemp("spill")
    # 100 MiB for weights (about 97 MB), KV pool and buffers: the weights stream.
    srv = ServerProcess(
        [
            "--model",
            str(default_model_path),
            "--threads",
            "2",
            "-q",
            "--max-model-len",
            "256",
            "--device-budget",
            "100MiB",
            "--spill-dir",
            str(spill),
        ]  # fmt: skip
    )
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


def test_a_streamed_model_serves_the_resident_tokens(
    streamed: ServerProcess, default_model_path: Path
) -> None:
    want = LLM(str(default_model_path), max_model_len=256, threads=1, progress=False).generate(
        PROMPT, SamplingParams(max_tokens=6, temperature=0)
    )[0]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    r = httpx.post(f"{streamed.url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want.outputs[0].text
    assert "planned under the budgets: weights streamed" in streamed.log()


@pytest.mark.parametrize(
    ("text", "value"),
    [("1048576", 1 << 20), ("512MiB", 512 << 20), ("2GB", 2 * 10**9), ("1.5 GiB", 3 << 29)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12XB", "-5MiB", "0"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text)


@pytest.mark.parametrize(
    "args", [["--device-budget", "lots"], ["--host-budget", "0"], ["--stall-timeout", "0"]]
)
def test_bad_budget_flags_exit_2(args: list[str]) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "poot.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
