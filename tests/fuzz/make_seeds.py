"""Writes the seed corpus in tests/fuzz/corpus (small, made here; rerun to regenerate).

Seeds are tiny valid inputs for each target, built with the reference libraries (``gguf``,
``safetensors``, ``tokenizers``) so the fuzzer starts from real formats.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parent / "corpus"


def _gguf(path: Path, model: str) -> bytes:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "fuzz-seed")
    w.add_uint32("llama.context_length", 64)
    if model == "gpt2":
        toks = ["!", "H", "e", "l", "o", "He", "ll", "Hell", "Hello", "Ġ", "Ġw", "<s>", "</s>"]
        w.add_tokenizer_model("gpt2")
        w.add_string("tokenizer.ggml.pre", "default")
        w.add_token_list(toks)
        w.add_token_types([1] * (len(toks) - 2) + [3, 3])
        w.add_token_merges(["H e", "l l", "He ll", "Hell o", "Ġ w"])
    else:
        toks = ["<unk>", "<s>", "</s>", "\u2581", "\u2581H", "e", "l", "o", "<0x41>"]
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -3.0, -3.0, -9.0])
        w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1, 6])
    w.add_bos_token_id(len(toks) - 2 if model == "gpt2" else 1)
    w.add_tensor("tok_embd.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    w.add_tensor("norm.weight", np.ones(4, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _tokenizer_json() -> bytes:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(["H", "e", "l", "o", "He", "ll", "Hell", "Hello", "Ġ"])}
    tok = Tokenizer(models.BPE(vocab, [("H", "e"), ("l", "l"), ("He", "ll"), ("Hell", "o")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str().encode()


TEMPLATES = {
    "chatml": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "llama2": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] "
    "{{ m['content'] | trim }} [/INST]{% else %}{{ m['content'] }}{% endif %}{% endfor %}",
    "filters": "{% set ns = namespace(n=0) %}{% for m in messages | reverse %}{% set ns.n = "
    "ns.n + 1 %}{{ loop.index }}:{{ m.content | tojson }}{% if loop.last %}{% break %}{% endif %}"
    "{% endfor %}{{ raise_exception('x') if ns.n > 9 }}",
}

SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3},
    {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
]
REGEXES = ["[0-9]{3}-[a-z]+", "(yes|no)", "a*b+c?"]
GRAMMARS = ['start: "yes" | "no"', "start: num+\nnum: /[0-9]/"]

BODIES = [
    (0, {"model": "m", "prompt": "Hello", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9}),
    (0, {"model": "m", "prompt": [1, 2, 3], "logit_bias": {"5": -100}, "stop": ["\n"], "n": 2}),
    (1, {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
         "response_format": {"type": "json_schema",
                             "json_schema": {"name": "a", "schema": SCHEMAS[0]}}}),
    (1, {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
         "presence_penalty": 0.5, "seed": 3, "stream": True}),
]  # fmt: skip


def main() -> None:
    out: dict[str, dict[str, bytes]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["gguf"] = {
            "gpt2-vocab.gguf": _gguf(Path(tmp) / "a.gguf", "gpt2"),
            "spm-vocab.gguf": _gguf(Path(tmp) / "b.gguf", "llama"),
        }
        from safetensors.numpy import save

        out["safetensors"] = {
            "two.safetensors": save(
                {"a": np.zeros((2, 3), np.float32), "b": np.ones(4, np.float16)},
                metadata={"format": "pt"},
            )
        }
    out["tokenizer_json"] = {"bpe.json": _tokenizer_json()}
    out["chat_template"] = {f"{k}.jinja": v.encode() for k, v in TEMPLATES.items()}
    guidance: dict[str, bytes] = {}
    for i, s in enumerate(SCHEMAS):
        guidance[f"schema{i}"] = b"\x00" + json.dumps(s).encode()
    for i, r in enumerate(REGEXES):
        guidance[f"regex{i}"] = b"\x01" + r.encode()
    for i, g in enumerate(GRAMMARS):
        guidance[f"grammar{i}"] = b"\x02" + g.encode()
    out["guidance"] = guidance
    out["http"] = {
        f"body{i}.json": bytes([k]) + json.dumps(b).encode() for i, (k, b) in enumerate(BODIES)
    }
    for target, files in out.items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)


if __name__ == "__main__":
    main()
