"""What the sampling step costs on the default model (SmolLM2-135M-Instruct Q4_1, 2 threads).

Two comparisons of poot against itself, each a group whose ``baseline`` entry is poot without
the feature (the summary table's reference column; the ratio is baseline time / feature time:
1 means free, 0.8 means the feature costs 20%). There is no external peer here: llama.cpp's
sampler runs outside its graph, so its cost is not the same quantity.

- ``full sampling vs greedy``: temperature, top-k, top-p, min-p, repetition/presence/frequency
  penalties, a logit bias and top-5 logprobs, against greedy argmax; 4 sequences, 64 tokens.
- ``guided vs unguided``: a JSON schema (a string of at least 400 characters, so no run ends
  early) against the same sampling without it; 1 and 4 sequences, 64 tokens each.

Every run decodes exactly the same number of tokens (asserted), so tok/s compare directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

THREADS = 2
TOKENS = 64
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 400}},
    "required": ["story"],
}


@pytest.fixture(scope="module")
def llm(default_model_path: Path) -> Any:
    return poot.LLM(str(default_model_path), threads=THREADS, max_model_len=512)


def _prompts(llm: Any, n: int) -> list[str]:
    asks = ["a dragon", "the sea", "a robot", "a city"]
    return [
        llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Tell a story about {asks[i % 4]} as JSON."}],
            add_generation_prompt=True,
        )
        for i in range(n)
    ]


def _run(llm: Any, n: int, params: poot.SamplingParams) -> int:
    outs = llm.generate(_prompts(llm, n), params)
    return sum(len(o.outputs[0].token_ids) for o in outs)


SAMPLED = dict(max_tokens=TOKENS, temperature=0.8, top_p=0.95, seed=1, ignore_eos=True)
FULL = poot.SamplingParams(
    **SAMPLED,
    top_k=50,
    min_p=0.02,
    repetition_penalty=1.1,
    presence_penalty=0.2,
    frequency_penalty=0.1,
    logit_bias={28: 1.0, 30: -1.0},
    logprobs=5,
)
CASES = {
    ("full sampling vs greedy x4", "poot"): (4, FULL),
    ("full sampling vs greedy x4", "baseline"): (
        4,
        poot.SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True),
    ),
    ("guided vs unguided x1", "poot"): (1, poot.SamplingParams(**SAMPLED, json_schema=SCHEMA)),
    ("guided vs unguided x1", "baseline"): (1, poot.SamplingParams(**SAMPLED)),
    ("guided vs unguided x4", "poot"): (4, poot.SamplingParams(**SAMPLED, json_schema=SCHEMA)),
    ("guided vs unguided x4", "baseline"): (4, poot.SamplingParams(**SAMPLED)),
}


@pytest.mark.parametrize(("group", "impl"), list(CASES))
def test_sampling_cost(benchmark: Any, llm: Any, group: str, impl: str) -> None:
    n, params = CASES[(group, impl)]
    benchmark.group = group
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["tokens"] = n * TOKENS
    assert benchmark.pedantic(_run, (llm, n, params), rounds=3, warmup_rounds=1) == n * TOKENS
