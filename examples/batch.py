"""Generate for several prompts at once: they share every step (continuous batching).

python examples/batch.py [--model SPEC]
"""

from __future__ import annotations

import argparse

import poot

PROMPTS = ["Once upon a time", "The little dog", "In the morning", "She saw a"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    llm = poot.LLM(args.model)
    # One SamplingParams per prompt: each request keeps its own seed and settings.
    params = [
        poot.SamplingParams(max_tokens=24, temperature=0.7, seed=i) for i in range(len(PROMPTS))
    ]
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        print(f"{prompt!r} -> {out.outputs[0].text!r}")
    print(llm.stats())


if __name__ == "__main__":
    main()
