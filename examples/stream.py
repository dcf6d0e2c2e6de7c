"""Print a completion as it is generated, one piece of text at a time.

python examples/stream.py [--model SPEC] [PROMPT]
"""

from __future__ import annotations

import argparse

import poot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("prompt", nargs="?", default="Once upon a time")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    llm = poot.LLM(args.model)
    params = poot.SamplingParams(max_tokens=48, temperature=0.8, top_p=0.95, seed=1)
    print(args.prompt, end="", flush=True)
    for piece in llm.generate_stream(args.prompt, params):
        print(piece, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
