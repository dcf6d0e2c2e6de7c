"""Resident memory of loading a model directory and generating from it, measured as
``tests/test_memory.py`` does: a fresh interpreter, /proc's VmRSS after the imports, after
loading and after generating 8 tokens, and the peak (VmHWM). Tests only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

_SCRIPT = r"""
import json, sys

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

def peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")

import numpy, tokenizers, jinja2  # imports are not the model's memory
import poot, poot.llm, poot.tokenizer, poot.models

base = rss()
llm = poot.LLM(sys.argv[1], threads=1, max_model_len=256, num_blocks=16)
loaded = rss()
out = llm.generate([[1, 2, 3]], poot.SamplingParams(max_tokens=8, temperature=0))
print(json.dumps({
    "base": base,
    "loaded": loaded,
    "after": rss(),
    "kv_bytes": llm.runtime.memory()["kv_bytes"],
    "peak": peak(),
    "tokens": len(out[0].outputs[0].token_ids),
}))
"""


def measure(directory: Path) -> dict[str, Any]:
    """``base``, ``loaded``, ``after`` and ``peak`` (bytes of RSS), the KV pool's
    ``kv_bytes`` and the ``tokens`` generated."""
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(directory)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
