"""Generation speed on the default model (SmolLM2-135M-Instruct Q4_1) with 2 threads, side by
side with llama.cpp (the ``llama_cpp`` binding of the peer build) when it is importable.

Prefill at 64 and 512 tokens (one sampled token after the prompt) and decode over 128 tokens
from a one-token prompt. No targets here: the CPU performance issue owns speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

THREADS = 2


def _prompt(n: int) -> list[int]:
    # Deterministic ordinary-text ids (not special tokens), BOS first.
    return [1] + [(i * 7919) % 40000 + 1000 for i in range(n - 1)]


@pytest.fixture(scope="module")
def llm(default_model_path: Path) -> Any:
    return poot.LLM(str(default_model_path), threads=THREADS, max_model_len=1024)


@pytest.fixture(scope="module")
def peer(default_model_path: Path) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(
        str(default_model_path), n_threads=THREADS, n_ctx=1024, n_batch=512, verbose=False
    )


def _poot_run(llm: Any, prompt: list[int], max_tokens: int) -> int:
    params = poot.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return len(llm.generate([prompt], params)[0].outputs[0].token_ids)


def _peer_run(peer: Any, prompt: list[int], max_tokens: int) -> int:
    peer.reset()
    out = peer.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
    return int(out["usage"]["completion_tokens"])


CASES = [
    ("prefill 64 tokens", 64, 1),
    ("prefill 512 tokens", 512, 1),
    ("decode 128 tokens", 1, 128),
]


@pytest.mark.parametrize(("group", "n_prompt", "max_tokens"), CASES)
def test_generate_poot(
    benchmark: Any, llm: Any, group: str, n_prompt: int, max_tokens: int
) -> None:
    benchmark.group = group
    benchmark.extra_info["impl"] = "poot"
    benchmark.extra_info["tokens"] = max(n_prompt, max_tokens)
    prompt = _prompt(n_prompt)
    assert benchmark.pedantic(_poot_run, (llm, prompt, max_tokens), rounds=3) == max_tokens


@pytest.mark.parametrize(("group", "n_prompt", "max_tokens"), CASES)
def test_generate_peer(
    benchmark: Any, peer: Any, group: str, n_prompt: int, max_tokens: int
) -> None:
    benchmark.group = group
    benchmark.extra_info["impl"] = "peer"
    benchmark.extra_info["tokens"] = max(n_prompt, max_tokens)
    prompt = _prompt(n_prompt)
    got = benchmark.pedantic(_peer_run, (peer, prompt, max_tokens), rounds=3)
    assert got == max_tokens
