"""Packed stays packed: loading the default model and generating raises resident memory by at
most 1.15x the file size plus the KV pool.

Measured by ``tests/memory_probe.py`` (a fresh interpreter, /proc's VmRSS after the imports and
before the model is opened).
"""

from __future__ import annotations

from pathlib import Path

from memory_probe import check_growth, measure, needs_proc


@needs_proc
def test_resident_memory_is_close_to_the_file_size(default_model_path: Path) -> None:
    m = measure(
        default_model_path,
        max_model_len=512,
        num_blocks=32,
        prompt="The capital of France is",
        max_tokens=16,
    )
    assert m["tokens"] == 16
    check_growth(m, default_model_path.stat().st_size)
