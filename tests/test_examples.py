"""Every example in examples/ runs to completion on the stories260K model (a subprocess each,
as a user would run it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
OFFLINE = ["generate.py", "stream.py", "batch.py", "guided_json.py"]


@pytest.mark.parametrize("name", OFFLINE)
def test_example_runs(name: str, stories: Path) -> None:
    model = stories / "stories260K-f32.gguf"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--model", str(model)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    if name == "guided_json.py":
        json.loads(done.stdout.split(" [finish_reason=")[0])


def test_server_client_example(stories: Path) -> None:
    from server_process import ServerProcess

    # stories260K has no chat template of its own: give it a plain one.
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    server = ServerProcess(
        ["--model", str(stories / "stories260K-f32.gguf"), "--chat-template", template]
    )
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "server_client.py"), "--base-url", server.url + "/v1"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= 2 and lines[-1].startswith("{")
