"""Generate JSON that is valid under a schema, whatever the model would rather say.

python examples/guided_json.py [--model SPEC]
"""

from __future__ import annotations

import argparse
import json

import poot

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    llm = poot.LLM(args.model)
    params = poot.SamplingParams(max_tokens=64, temperature=0.7, seed=3, json_schema=SCHEMA)
    out = llm.generate("A person, as JSON: ", params)[0].outputs[0]
    person = json.loads(out.text)  # always parses: the schema guided every token
    print(json.dumps(person), f"[finish_reason={out.finish_reason}]")


if __name__ == "__main__":
    main()
