"""Packed stays packed: loading the default model and generating raises resident memory by at
most 1.15x the file size plus the KV pool.

Measured in a fresh interpreter (so other tests' allocations do not count) from /proc's VmRSS,
after the imports and before the model is opened.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = r"""
import json, sys

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

import numpy, tokenizers, jinja2  # imports are not the model's memory
import poot, poot.llm, poot.tokenizer, poot.models

base = rss()
llm = poot.LLM(sys.argv[1], threads=1, max_model_len=512, num_blocks=32)
out = llm.generate(["The capital of France is"], poot.SamplingParams(max_tokens=16, temperature=0))
after = rss()
print(json.dumps({
    "base": base,
    "after": after,
    "kv_bytes": llm.runtime.memory()["kv_bytes"],
    "tokens": len(out[0].outputs[0].token_ids),
}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_resident_memory_is_close_to_the_file_size(default_model_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(default_model_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    assert m["tokens"] == 16
    file_size = default_model_path.stat().st_size
    grown = m["after"] - m["base"]
    bound = 1.15 * file_size + m["kv_bytes"]
    print(
        f"RSS grew {grown / 2**20:.1f} MiB; file {file_size / 2**20:.1f} MiB; "
        f"bound {bound / 2**20:.1f} MiB"
    )
    assert grown <= bound, (
        f"RSS grew {grown} bytes; bound {bound:.0f} (file {file_size}, kv {m['kv_bytes']})"
    )
