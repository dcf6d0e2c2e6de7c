"""Aggregate decode throughput at 1, 4 and 16 concurrent sequences on the default model
(SmolLM2-135M-Instruct Q4_1) with 2 threads: ``LLM.generate`` over N different prompts, each
decoding 32 tokens greedily (``ignore_eos``), so one round is N * 32 decode tokens.

Peer: llama.cpp's batched decoding is not reachable through the ``llama_cpp`` binding in a
simple way (one ``Llama`` decodes one sequence), so where ``llama_cpp`` is importable the peer
has an entry only for N=1 (``create_completion``). Batched peer numbers need llama.cpp's
``llama-batched-bench`` tool, which the peer build does not include.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

THREADS = 2
MAX_TOKENS = 32
SIZES = [1, 4, 16]


def _prompt(i: int, n: int = 8) -> list[int]:
    # Deterministic, different ordinary-text ids per sequence, BOS first.
    return [1] + [((i + 1) * 7919 + j * 104729) % 40000 + 1000 for j in range(n - 1)]


@pytest.fixture(scope="module")
def llm(default_model_path: Path) -> Any:
    return poot.LLM(
        str(default_model_path),
        threads=THREADS,
        max_model_len=256,
        driver=poot.DriverOptions(max_num_seqs=max(SIZES)),
    )


@pytest.fixture(scope="module")
def peer(default_model_path: Path) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(
        str(default_model_path), n_threads=THREADS, n_ctx=256, n_batch=256, verbose=False
    )


def _poot_run(llm: Any, n: int) -> int:
    params = poot.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([_prompt(i) for i in range(n)], params)
    return sum(len(o.outputs[0].token_ids) for o in outs)


def _peer_run(peer: Any) -> int:
    peer.reset()
    out = peer.create_completion(_prompt(0), max_tokens=MAX_TOKENS, temperature=0.0)
    return int(out["usage"]["completion_tokens"])


@pytest.mark.parametrize("n", SIZES)
def test_batch_decode_poot(benchmark: Any, llm: Any, n: int) -> None:
    benchmark.group = f"decode x{n}"
    benchmark.extra_info["impl"] = "poot"
    benchmark.extra_info["tokens"] = n * MAX_TOKENS
    assert benchmark.pedantic(_poot_run, (llm, n), rounds=3) == n * MAX_TOKENS


def test_batch_decode_peer(benchmark: Any, peer: Any) -> None:
    benchmark.group = "decode x1"
    benchmark.extra_info["impl"] = "peer"
    benchmark.extra_info["tokens"] = MAX_TOKENS
    assert benchmark.pedantic(_peer_run, (peer,), rounds=3) == MAX_TOKENS
