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
    # pydantic's model machinery: the bodies are validated by pydantic-core from written-out
    # core schemas (``poot.server.protocol``).
    "pydantic",
    "pydantic.main",
    # uvicorn's command line and reloaders (``poot.server.uvicorn_core`` skips its __init__),
    # and a WebSocket protocol (the API has no WebSocket route).
    "uvicorn.main",
    "uvicorn.supervisors",
    "click",
    "watchfiles",
    "multiprocessing",
    "websockets",
    "uvicorn.protocols.websockets",
)

# The start-up path of ``poot.server.cli.main``: its imports, the app, and what uvicorn's
# ``Config.load`` imports before the socket serves (protocols, lifespan, event loop).
_START_UP = """
import sys, json
import poot.server.cli, poot.server.loading, poot.server.app, poot.server.shutdown
from poot.server.app import create_app
from poot.server.config import ServerConfig
from poot.server.uvicorn_core import Config
app = create_app(ServerConfig(), loader=lambda: None)
Config(app, lifespan="on", ws="none").load()
print(json.dumps(sorted(sys.modules)))
"""


def _start_up_modules() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _START_UP], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout))


def test_the_server_start_imports_no_module_it_does_not_use() -> None:
    loaded = _start_up_modules()
    assert "uvicorn.config" in loaded and "uvicorn.protocols.http.httptools_impl" in loaded
    assert [m for m in _NOT_AT_START if m in loaded] == []


def test_uvicorn_is_still_whole_when_asked_for() -> None:
    """The package skipped at start runs its __init__ the first time a name it lacks is asked
    for, so other code in the process (``uvicorn.run``, ``from uvicorn import main``) works."""
    code = (
        "import sys\n"
        "import poot.server.shutdown\n"
        "import uvicorn\n"
        "assert 'uvicorn.main' not in sys.modules\n"
        "from uvicorn import Config, Server\n"
        "assert 'uvicorn.main' not in sys.modules\n"
        "assert uvicorn.Config.__module__ == 'uvicorn.config'\n"
        "from uvicorn import main, run\n"
        "cli = sys.modules['uvicorn.main']\n"
        "assert run is cli.run and main is cli.main\n"
        "assert uvicorn.Server is Server and 'click' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "ok", out.stderr


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
