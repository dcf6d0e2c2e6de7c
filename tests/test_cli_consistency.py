"""One CLI: shared flags, ``--json`` where a table is printed, an example in every ``--help``,
documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from poot.cli import build_parser, main
from poot.server.cli import build_parser as serve_parser

COMMANDS = ["pull", "inspect", "generate", "chat", "doctor", "validate-hardware"]


def _subparsers() -> dict[str, object]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return dict(action.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_has_an_example(name: str) -> None:
    text = _subparsers()[name].format_help()  # type: ignore[attr-defined]
    assert "examples:" in text and f"poot {name}" in text.split("examples:")[1]


def test_top_level_and_server_help_document_exit_codes() -> None:
    assert "exit codes:" in build_parser().format_help()
    text = serve_parser().format_help()
    assert "exit codes:" in text and "examples:" in text


@pytest.mark.parametrize("name", ["pull", "inspect", "generate", "chat"])
def test_model_commands_take_model_flag(name: str) -> None:
    opts = {o for a in _subparsers()[name]._actions for o in a.option_strings}  # type: ignore[attr-defined]
    assert "--model" in opts


@pytest.mark.parametrize("name", ["generate", "chat"])
def test_run_commands_take_backend_and_threads(name: str) -> None:
    opts = {o for a in _subparsers()[name]._actions for o in a.option_strings}  # type: ignore[attr-defined]
    assert {"--backend", "--threads"} <= opts
    serve = {o for a in serve_parser()._actions for o in a.option_strings}
    assert {"--model", "--backend", "--threads"} <= serve


@pytest.mark.parametrize("name", ["inspect", "doctor"])
def test_table_commands_offer_json(name: str) -> None:
    opts = {o for a in _subparsers()[name]._actions for o in a.option_strings}  # type: ignore[attr-defined]
    assert "--json" in opts


def test_inspect_model_flag_and_positional(
    stories: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = str(stories / "stories260K-f32.gguf")
    assert main(["inspect", "--model", gguf, "--json", "--no-tensors"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "gguf"
    assert main(["inspect", gguf, "--model", "other.gguf"]) == 2
    assert "two models given" in capsys.readouterr().err


def test_exit_codes_as_documented(tmp_path: Path) -> None:
    def run(*args: str) -> int:
        return subprocess.run(
            [sys.executable, "-m", "poot.cli", *args], capture_output=True, timeout=120
        ).returncode

    assert run("--version") == 0
    assert run("no-such-command") == 2
    assert run("inspect", str(tmp_path / "missing.gguf")) == 2
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 8)
    assert run("inspect", str(bad)) == 1
