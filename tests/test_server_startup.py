"""``poot-serve``'s start-up: what it imports, and the trace it logs at debug level.

Speed itself is measured by ``benches/bench_server.py`` (start to ``/health`` 200, then the
first request), never asserted here. What is checked is structural: the modules the start-up
must not import (each costs tens of milliseconds, or belongs to another path), and that every
phase of the start is in the debug trace, in order, once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from server_process import CLEAN_EXIT, ServerProcess

# What a served request needs is imported before /health says 200; these are not needed by
# it: FastAPI (the app is Starlette's), tqdm (progress bars only draw on a terminal), the
# planner (only with --device-budget/--host-budget), the hub client (only to download).
# (``poot-serve`` also turns pydantic's scan of every installed package's entry points off;
# pydantic still imports ``importlib.metadata`` itself.)
_NOT_AT_START = (
    "fastapi",
    "tqdm",
    "poot.planner",
    "huggingface_hub",
    "transformers",
    "torch",
    # Guided decoding's engine: imported by the first guided request (which builds its
    # tokenizer then anyway, about a second); with it goes the package metadata machinery.
    "llguidance",
)


def test_the_server_start_imports_no_module_it_does_not_use() -> None:
    code = (
        "import sys, json\n"
        "import poot.server.cli, poot.server.loading, poot.server.app, poot.server.shutdown\n"
        "import uvicorn\n"
        f"print(json.dumps([m for m in {list(_NOT_AT_START)!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) == [], out.stdout


def test_debug_logs_each_start_up_phase_once_in_order(default_model_path: Path) -> None:
    server = ServerProcess(
        ["--model", str(default_model_path), "--max-model-len", "256", "--log-level", "debug"]
    )
    try:
        log = server.log()
    finally:
        assert server.stop() in CLEAN_EXIT
    phases = [
        "poot-serve imported",
        "listening",
        "model code imported",
        "web stack imported",
        "app created",
        "serving: the event loop runs",
        "ready: /health answers 200",
    ]
    where = []
    for phase in phases:
        lines = [m for m in re.finditer(r"startup (\d+\.\d+) s: .*", log) if phase in m.group(0)]
        assert len(lines) == 1, (phase, log)
        where.append(float(lines[0].group(1)))
    assert where == sorted(where), log
    # The load thread's phases (ordered against the main thread's only by time).
    assert re.search(r"startup \d+\.\d+ s: \[poot-load\] model loaded \(", log), log
    assert "load: tokenizer in" in log and "load: model mapped in" in log, log
