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
