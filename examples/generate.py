"""Generate a completion for one prompt.

python examples/generate.py [--model SPEC] [PROMPT]
"""

from __future__ import annotations

import argparse

import poot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("prompt", nargs="?", default="The capital of France is")
    ap.add_argument(
        "--model",
        default=None,
        help="a .gguf, a HF directory, a hub id (default: the default model)",
    )
    args = ap.parse_args()
    llm = poot.LLM(args.model)
    params = poot.SamplingParams(max_tokens=32, temperature=0)
    out = llm.generate(args.prompt, params)[0].outputs[0]
    print(args.prompt + out.text)
    print(f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}]")


if __name__ == "__main__":
    main()
