"""Resident memory of loading a model and generating from it, measured in a fresh interpreter
(so other tests' allocations do not count): /proc's VmRSS after the imports, after loading and
after generating, and the peak (VmHWM). Tests only; every memory test measures through
``measure``.

Invariants: the imports (numpy, tokenizers, jinja2, poot) are done before the first reading, so
``base`` holds none of the model; generation is greedy (temperature 0), so a run is repeatable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

_SCRIPT = r"""
import json, sys

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no " + key)

import numpy, tokenizers, jinja2  # imports are not the model's memory
import poot, poot.llm, poot.tokenizer, poot.models

args = json.loads(sys.argv[2])
base = status("VmRSS")
llm = poot.LLM(
    sys.argv[1], threads=1, max_model_len=args["max_model_len"], num_blocks=args["num_blocks"]
)
loaded = status("VmRSS")
params = poot.SamplingParams(
    max_tokens=args["max_tokens"], temperature=0, ignore_eos=args["ignore_eos"]
)
out = llm.generate([args["prompt"]], params)
print(json.dumps({
    "base": base,
    "loaded": loaded,
    "after": status("VmRSS"),
    "kv_bytes": llm.runtime.memory()["kv_bytes"],
    "peak": status("VmHWM"),
    "tokens": len(out[0].outputs[0].token_ids),
    "family": type(llm.definition).__name__,
}))
"""

needs_proc = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")


def measure(
    model: Path,
    *,
    max_model_len: int = 256,
    num_blocks: int = 16,
    prompt: str | Sequence[int] = (1, 2, 3),
    max_tokens: int = 8,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """Loads ``model`` (a file or directory) with a KV pool of ``num_blocks`` blocks and
    generates ``max_tokens`` greedily from ``prompt`` (text or token ids). Returns ``base``,
    ``loaded``, ``after`` and ``peak`` (bytes of RSS), the KV pool's ``kv_bytes``, the
    ``tokens`` generated and the model's ``family`` (its definition's class name)."""
    args = {
        "max_model_len": max_model_len,
        "num_blocks": num_blocks,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(model), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def check_growth(m: dict[str, Any], file_size: int, factor: float = 1.15) -> None:
    """Generating (from ``base``, so loading included) grew RSS by at most ``factor`` times
    the file size plus the KV pool."""
    grown = m["after"] - m["base"]
    bound = factor * file_size + m["kv_bytes"]
    print(
        f"RSS grew {grown / 2**20:.1f} MiB; file {file_size / 2**20:.1f} MiB; "
        f"bound {bound / 2**20:.1f} MiB"
    )
    assert grown <= bound, (
        f"RSS grew {grown} bytes; bound {bound:.0f} (file {file_size}, kv {m['kv_bytes']})"
    )
