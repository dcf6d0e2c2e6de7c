"""Every forced CPU kernel path (``POOT_CPU_ISA``) gives the default path's logits to the bit.

The ggml-numerics kernels are built so that scalar, AVX2, AVX-512 and AMX code compute the same
float steps (integer dots are exact), and the Rust tests check this kernel by kernel; this
checks it end to end on the default model (SmolLM2-135M Q4_1: integer matvecs, the Q8_0 LM
head, f16-KV attention, ggml's RoPE and SiLU), prefill and decode, in subprocesses because the
path is chosen once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_SCRIPT = """
import sys, numpy as np, poot
llm = poot.LLM(sys.argv[1], threads=2, numerics="ggml", max_model_len=256)
ids = [1] + [(i * 7919) % 40000 + 1000 for i in range(11)]
first = llm.logits(ids)
second = llm.logits(ids + [int(first.argmax())])
np.save(sys.argv[2], np.stack([first, second]))
"""


def _logits(model: Path, isa: str | None, out: Path) -> np.ndarray:
    env = dict(os.environ)
    env.pop("POOT_CPU_ISA", None)
    if isa is not None:
        env["POOT_CPU_ISA"] = isa
    subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(model), str(out)], env=env, check=True, timeout=600
    )
    return np.load(out)


def _cpu_has(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


_NEEDS = {"avx2": "avx2", "avx512": "avx512f"}


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_forced_paths_match_the_default_bit_for_bit(
    default_model_path: Path, tmp_path: Path, isa: str
) -> None:
    # On an AMX machine the default path is `amx` (tiles for the prefill's integer matmuls), so
    # `avx512` checks those against AVX-512's registers.
    if isa in _NEEDS and not _cpu_has(_NEEDS[isa]):
        pytest.skip(f"this CPU has no {_NEEDS[isa]}")
    want = _logits(default_model_path, None, tmp_path / "default.npy")
    got = _logits(default_model_path, isa, tmp_path / f"{isa}.npy")
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)
