"""Packed stays packed, for safetensors directories too: resident memory while generating, at
the peak included, stays within BOUND times the file plus the KV pool, for a GPTQ int4
directory, a block-FP8 one and dense BF16/F16 ones of the same shapes (the issue asks 1.15x).

What is counted: everything the model adds to a process that has already run a model; see
``tests/memory_probe.py``. Each directory is measured after a warm-up with a tiny model of the
same layout in the same interpreter, so the fixed per-process costs (the native library's code
pages, 4-6 MB of which fault in on first use and more from the LTO wheel CI builds than from an
editable build; lazily imported modules; the thread pool) are not charged to a 29 MB model as
if they were 0.2x of it. Its weights, its KV pool, its tokenizer (parsed from its own
``tokenizer.json``) and its plans all are.

Why it holds: the CPU runtime's copy of a float matrix (moved to huge pages) releases the file's
pages of that tensor span by span, as the GGUF path does, so the weights never count twice,
even for the moment of the copy; a dense directory is read through the graph's casts (an f32
copy would be 2x). A quantized layer is re-laid once by the store (Q4_Z, F8_S) and once more
8 rows at a time by the runtime (an asymmetric Q4_Z one scale and zero point per row and
group, ``kernels/matmul/repack_zg.rs``: 4.19 bits a weight at group 128), which releases the
store's copy; the sources' mapped pages
are dropped once copied (``crates/poot-runtime/src/gptq_awq.rs``). What loading frees (the
tokenizer's parse, transient buffers) goes back to the OS (``poot.host_memory.trim_heap``).

Generating is checked separately, against the same directory's load: each step shape's plan
used to copy every re-laid tensor under 1 MB as if it were mapped, once more per plan; the store
now says which tensors it holds in its own memory (``WeightStore::mapped``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_probe import describe, measure, needs_proc, write_llama_dir

# Measured after the warm-up (KV pool excluded; loaded / after generating / peak): GPTQ
# 0.88x / 0.89x / 1.02x, FP8 0.97x / 0.97x / 1.07x (1.06x / 1.06x / 1.08x before FP8 kept one
# scale per 128 columns), BF16 0.92x / 0.93x / 0.94x. Without it
# (the imports as the baseline) the same runs read 1.13x / 1.24x / 1.24x for GPTQ: 1.4 MB of
# the native library's pages and 4.4 MB of other libraries' (tokenizers, numpy.random) that a
# first load and a first step fault in, 0.2x of this file.
BOUND = 1.15


@needs_proc
@pytest.mark.parametrize("kind", ["gptq", "fp8", "bf16", "f16"])
def test_resident_memory_is_close_to_the_file_size(tmp_path: Path, kind: str) -> None:
    """Loaded, after generating and at the peak, within 1.15x the file plus the KV pool; the
    FP8 re-lay is 1.03x the FP8 weights (an f32 scale a row per 128 columns; the F8_S blocks
    it is made from, 1.125x, live only while it is made), the grouped Q4_Z one about the int4
    tensors' size at group 128, and a dense directory has no re-lay at all."""
    d = write_llama_dir(tmp_path / "m", kind)
    warm = write_llama_dir(tmp_path / "warm", kind, hidden=256, ffn=512, layers=1)
    m = measure(d, warmup=warm)
    assert m["tokens"] == 8
    file_size = (d / "model.safetensors").stat().st_size
    bound = BOUND * file_size + m["kv_bytes"]
    for phase in ("loaded", "after", "peak"):
        grown = m[phase] - m["base"]
        assert grown <= bound, f"{phase}: RSS grew by {grown} bytes; {describe(m, file_size)}"
    # Generating adds little to what loading holds: no plan copies a weight again (measured:
    # 0.01x-0.02x, the first steps' activations and parked scratch).
    generating = m["after"] - m["loaded"]
    assert generating <= 0.05 * file_size, describe(m, file_size)
