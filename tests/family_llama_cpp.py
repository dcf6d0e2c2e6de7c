"""llama.cpp (llama-cpp-python, built by ``../shared/peers/llama-cpp.sh`` with
``LLAMA_CPP_PY_VERSION=0.3.36``) on the family GGUFs of ``family_models.py``: the independent
reference for GGUF files; each helper gives ``None`` when llama-cpp-python is not importable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# poot's ggml numerics against llama.cpp on the same GGUF: both keep an f16 KV cache and round
# q and the softmax weights to f16 (``poot-cpu``'s attention/ggml_heads.rs), but poot takes one
# summation order for every step (batch invariance) and scales scores instead of queries, so
# logits differ by a few f16 roundings: bounded relative to the largest logit.
LLAMA_CPP_REL = 5e-4
LLAMA_CPP_ABS = 1e-3


def assert_close_to_llama_cpp(got: np.ndarray, ref: np.ndarray) -> None:
    bound = LLAMA_CPP_REL * float(np.abs(ref).max()) + LLAMA_CPP_ABS
    diff = float(np.abs(got.astype(np.float64) - ref).max())
    assert diff <= bound, f"max |poot - llama.cpp| = {diff:.3g} > {bound:.3g}"


def _llama(path: Path) -> Any:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=256,
        n_batch=256,
        n_threads=1,
        logits_all=True,
        verbose=False,
        seed=0,
    )


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray | None:
    """llama.cpp's logits [T, V] for ``ids`` (one sequence, 1 thread), or None without it."""
    llm = _llama(path)
    if llm is None:
        return None
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def llama_cpp_greedy(path: Path, prompt: list[int], n: int) -> list[int] | None:
    """llama.cpp's ``n`` greedy ids after ``prompt`` (argmax of its logits), or None."""
    got = llama_cpp_greedy_margins(path, prompt, n)
    return None if got is None else got[0]


def llama_cpp_greedy_margins(
    path: Path, prompt: list[int], n: int
) -> tuple[list[int], list[float], list[float]] | None:
    """llama.cpp's greedy ids, the gap between its two best logits at each step, and the
    largest |logit| at each step; or None without llama-cpp-python."""
    llm = _llama(path)
    if llm is None:
        return None
    llm.eval(prompt)
    ids: list[int] = []
    gaps: list[float] = []
    tops: list[float] = []
    for _ in range(n):
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        two = np.sort(row)[-2:]
        ids.append(int(np.argmax(row)))
        gaps.append(float(two[1] - two[0]))
        tops.append(float(np.abs(row).max()))
        llm.eval([ids[-1]])
    llm.close()
    return ids, gaps, tops


def assert_greedy_matches_llama_cpp(got: list[int], path: Path, prompt: list[int]) -> None:
    """``got`` equals llama.cpp's greedy ids up to the first step whose two best logits are
    closer than twice the logit bound (a near-tie either engine may break either way; after
    it the sequences are different texts). Skips without llama-cpp-python."""
    import pytest

    ref = llama_cpp_greedy_margins(path, prompt, len(got))
    if ref is None:
        pytest.skip("llama-cpp-python is not importable (../shared/peers/llama-cpp.sh builds it)")
    ids, gaps, tops = ref
    for i, (a, b) in enumerate(zip(got, ids, strict=True)):
        if a != b:
            tie = 2 * (LLAMA_CPP_REL * tops[i] + LLAMA_CPP_ABS)
            assert gaps[i] <= tie, f"step {i}: {a} vs llama.cpp's {b}, gap {gaps[i]:.3g}"
            return
