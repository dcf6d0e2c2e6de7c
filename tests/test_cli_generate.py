"""``poot generate`` and ``poot chat`` on stories260K (CPU runtime)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from conftest import cpu_runtime_or_skip

from poot.cli import main


@pytest.fixture(autouse=True)
def _cpu() -> None:
    cpu_runtime_or_skip(1)


def test_generate_streams_greedy_text(stories: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(stories / "stories260K-f32.gguf")
    assert main(["generate", "Once upon a time", "--model", model, "--max-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(", there was a little girl named Lily.")
    assert out.endswith("\n")


def test_generate_bad_params_fail_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "x", "--model", "/nonexistent.gguf", "--temperature", "-1"]) == 1
    assert "temperature" in capsys.readouterr().err


def test_chat_uses_the_template(
    stories: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = tmp_path / "hf"
    shutil.copytree(stories / "hf", model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("Once upon a time\n\nLily\n/exit\nignored\n"))
    assert main(["chat", "--model", str(model), "--max-tokens", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # two replies; the blank line is skipped, /exit ends the chat
    assert lines[0].startswith(", there was")


def test_chat_without_template_fails_early(
    stories: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert main(["chat", "--model", str(stories / "hf")]) == 1
    assert "no chat template" in capsys.readouterr().err
