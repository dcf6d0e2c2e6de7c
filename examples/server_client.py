"""Talk to a running poot-serve with the official openai client: a chat completion, streamed,
then a guided one (JSON schema through response_format).

    poot-serve &                                   # in another terminal (or `make run`)
    python examples/server_client.py [--base-url http://127.0.0.1:8000/v1] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="unused", help="the server's --api-key, if it has one")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a very short story."}],
        max_tokens=32,
        temperature=0.7,
        seed=1,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person."}],
        max_tokens=64,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
    )
    print(json.loads(reply.choices[0].message.content or "null"))


if __name__ == "__main__":
    main()
