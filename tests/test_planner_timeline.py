"""The HTML timeline: self-contained (no fetches), simulated and measured, rendered in headless
Chromium (Debian's ``chromium``) to check what it shows."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import poot
from poot.planner import CompileConfig


@pytest.fixture(scope="module")
def streamed(stories: Path, tmp_path_factory: pytest.TempPathFactory) -> poot.LLM:
    gguf = stories / "stories260K-Q8_0.gguf"
    spill = tmp_path_factory.mktemp("spill")
    from planner_fixtures import llm_kv_bytes

    budget = llm_kv_bytes(gguf) + gguf.stat().st_size // 2  # the KV pool, then half the weights
    llm = poot.LLM(
        gguf, config=CompileConfig(allow_gpu=False, device_budget_bytes=budget, spill_dir=spill)
    )
    llm.generate(["Once"], poot.SamplingParams(max_tokens=3, temperature=0.0))
    return llm


def _no_fetches(page: str) -> None:
    # The only URL is the SVG namespace, which is a name, not a fetch.
    assert re.findall(r"https?://[^\s\"'<>]+", page) == ["http://www.w3.org/2000/svg"]
    assert not re.search(r"\b(src|href)\s*=", page)
    assert "@import" not in page and "url(" not in page


@pytest.mark.parametrize("measured", [False, True])
def test_page_is_self_contained(streamed: poot.LLM, tmp_path: Path, measured: bool) -> None:
    assert streamed.compiled is not None
    path = streamed.compiled.visualize(tmp_path / "run.html", measured=measured)
    page = path.read_text()
    _no_fetches(page)
    kind = "measured" if measured else "simulated"
    assert f"poot step timeline ({kind})" in page
    assert 'data-lane="cpu"' in page and 'data-lane="cpu load"' in page


def test_measured_needs_a_run(stories: Path, tmp_path: Path) -> None:
    compiled = poot.compile(stories / "stories260K-Q8_0.gguf", CompileConfig(allow_gpu=False))
    with pytest.raises(ValueError, match="no measured step"):
        compiled.visualize(tmp_path / "x.html", measured=True)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)")


@pytest.mark.parametrize("measured", [False, True])
def test_chromium_renders_lanes_and_spans(
    streamed: poot.LLM, tmp_path: Path, measured: bool
) -> None:
    browser = _chromium()
    assert streamed.compiled is not None
    path = streamed.compiled.visualize(tmp_path / "run.html", measured=measured)
    base = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # a fetch would fail the render
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [*base, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert 'data-rendered="yes"' in dom  # the inline script ran
    lanes = set(re.findall(r'<text class="lane"[^>]*data-lane="([^"]+)"', dom))
    # The simulated view adds the op lane (each unit's matmul and other-op parts) and the
    # ledger; a streamed run records loads and computes only.
    assert lanes == ({"cpu", "cpu load"} if measured else {"cpu", "cpu load", "cpu ops", "ledger"})
    rects = re.findall(r'<rect class="span (\w+)"', dom)
    chunks = len(streamed.compiled.placement.segments[0].chunks)
    steps = len(re.findall(r'<line class="step"', dom))  # every step the LLM ran, in sequence
    assert steps == len(streamed.compiled.recorder.view()[2]) >= 1
    assert rects.count("load") == chunks * steps and rects.count("compute") >= chunks * steps
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,400", path.as_uri()],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 5000  # a drawn page, not a blank one
