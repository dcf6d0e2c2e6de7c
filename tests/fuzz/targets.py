"""Fuzz targets over poot's entry points for outside input, shared by the fuzzer and the tests.

Each ``Target`` turns one input (bytes) into a call of a real entry point and names the
exceptions that count as a correct refusal (poot's typed errors, pydantic's ValidationError
for request bodies). Anything else escaping ``check`` is a finding: a crash (an untyped
exception, a Rust panic surfacing as ``PanicException``), and, under the fuzzer, a hang or an
out-of-memory. ``tests/fuzz/run.py`` drives a target with atheris (libFuzzer);
``tests/test_fuzz_regressions.py`` replays the kept corpus and every crash reproducer through
``check`` on every test run, without atheris.

Targets:

- ``gguf``: a GGUF file (``_native.GgufFile``: header, metadata, tensor infos), then its
  tokenizer rebuilt from the metadata where the header parsed; an input that is not a GGUF
  file is spliced into a seed (``_splice``);
- ``safetensors``: a safetensors file (``_native.SafetensorsFile``: the JSON header), spliced
  the same way;
- ``tokenizer_json``: a Hugging Face ``tokenizer.json`` (``tokenizer_from_hf_dir``), then an
  encode and decode;
- ``chat_template``: a Jinja chat template rendered over a fixed conversation;
- ``guidance``: a JSON schema, regex or Lark grammar (first byte picks) compiled by
  ``guidance.validate`` as ``SamplingParams`` carries it;
- ``http``: a completions or chat body (first byte picks) through the server's request models
  and on to ``SamplingParams``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FUZZ_DIR = Path(__file__).resolve().parent
CORPUS = FUZZ_DIR / "corpus"
CRASHES = FUZZ_DIR / "crashes"


@dataclass(frozen=True)
class Target:
    """One fuzz target: ``run(data)`` calls the entry point; ``allowed()`` the refusals."""

    name: str
    run: Callable[[bytes], None]
    allowed: Callable[[], tuple[type[BaseException], ...]]


_scratch = Path(tempfile.mkdtemp(prefix="poot-fuzz-"))
atexit.register(shutil.rmtree, _scratch, True)


def _file(name: str, data: bytes) -> Path:
    path = _scratch / name
    path.write_bytes(data)
    return path


def _poot_errors() -> tuple[type[BaseException], ...]:
    from poot.errors import PootError

    return (PootError,)


def _splice(name: str, data: bytes, is_raw: Callable[[bytes], bool]) -> bytes:
    """The input as a file when it already looks like one; else a mutation of a seed.

    The Rust parsers are not instrumented, so coverage cannot steer the fuzzer into a binary
    header; here an input that is not a file picks a seed (``data[0]``), an offset in it
    (``data[1:3]``, little-endian) and overwrites the seed there with the rest, truncating the
    result when ``data[3]`` is odd. Every input then exercises a nearly valid header.
    """
    if is_raw(data) or len(data) < 4:
        return data
    seeds = _seeds(name)
    seed = bytearray(seeds[data[0] % len(seeds)])
    at = int.from_bytes(data[1:3], "little") % max(1, len(seed))
    patch = data[4:]
    seed[at : at + len(patch)] = patch
    if data[3] % 2:
        del seed[at + len(patch) :]
    return bytes(seed)


_SEED_CACHE: dict[str, list[bytes]] = {}


def _seeds(name: str) -> list[bytes]:
    if name not in _SEED_CACHE:
        files = sorted((CORPUS / name).iterdir()) if (CORPUS / name).is_dir() else []
        _SEED_CACHE[name] = [p.read_bytes() for p in files if p.is_file()] or [b""]
    return _SEED_CACHE[name]


def _run_gguf(data: bytes) -> None:
    from poot import _native
    from poot.tokenizer import tokenizer_from_gguf_metadata

    data = _splice("gguf", data, lambda d: d.startswith(b"GGUF"))
    f = _native.GgufFile(_file("x.gguf", data))
    f.tensors()
    meta = f.metadata()
    if "tokenizer.ggml.model" in meta:
        tok = tokenizer_from_gguf_metadata(meta, source="fuzz")
        tok.decode(tok.encode("Hello world! 123", add_special_tokens=True))


def _run_safetensors(data: bytes) -> None:
    from poot import _native

    data = _splice("safetensors", data, lambda d: d[8:9] == b"{")
    f = _native.SafetensorsFile(_file("x.safetensors", data))
    f.tensors()


def _run_tokenizer_json(data: bytes) -> None:
    from poot.tokenizer import tokenizer_from_hf_dir

    path = _file("tokenizer.json", data)
    tok = tokenizer_from_hf_dir(
        _scratch, tokenizer_json=path, tokenizer_config={}, generation_config={}, config={}
    )
    tok.decode(tok.encode("Hello world! 123"))


_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <|im_end|> {{ 7*7 }}"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]


def _run_chat_template(data: bytes) -> None:
    from poot.tokenizer.chat import render_chat_template

    template = data.decode("utf-8", errors="replace")
    render_chat_template(template, _MESSAGES, special_tokens={"bos_token": "<s>"})


def _chat_allowed() -> tuple[type[BaseException], ...]:
    from poot.errors import ChatTemplateError

    return (ChatTemplateError,)


def _run_guidance(data: bytes) -> None:
    import json

    from poot import guidance
    from poot.sampling import SamplingParams

    if not data:
        return
    text = data[1:].decode("utf-8", errors="replace")
    kind = data[0] % 3
    if kind == 0:
        try:
            schema: Any = json.loads(text)
        except ValueError:
            return  # not JSON: the request models refuse it before SamplingParams
        params = SamplingParams(json_schema=schema)
    elif kind == 1:
        params = SamplingParams(regex=text)
    else:
        params = SamplingParams(grammar=text)
    guidance.validate(params)


def _run_http(data: bytes) -> None:
    from poot.sampling import SamplingParams
    from poot.server import params as server_params
    from poot.server.protocol import ChatCompletionRequest, CompletionRequest

    if not data:
        return
    body = data[1:]
    model = CompletionRequest if data[0] % 2 == 0 else ChatCompletionRequest
    req = model.model_validate_json(body)
    opts = server_params._options(req, 49152)
    SamplingParams(max_tokens=16, **opts)


def _http_allowed() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from poot.errors import PootError
    from poot.server.errors import APIError

    return (ValidationError, APIError, PootError)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("gguf", _run_gguf, _poot_errors),
        Target("safetensors", _run_safetensors, _poot_errors),
        Target("tokenizer_json", _run_tokenizer_json, _poot_errors),
        Target("chat_template", _run_chat_template, _chat_allowed),
        Target("guidance", _run_guidance, _poot_errors),
        Target("http", _run_http, _http_allowed),
    )
}


def check(target: Target, data: bytes) -> None:
    """Runs one input; returns on success or an allowed refusal, raises on a finding."""
    try:
        target.run(data)
    except target.allowed():
        pass


def inputs(name: str) -> list[Path]:
    """The kept corpus and crash reproducers of a target (sorted: a stable test order)."""
    found: list[Path] = []
    for folder in (CORPUS / name, CRASHES / name):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.is_file() and p.name != "README")
    return found


def scratch_dir() -> str:
    """Where targets write their temporary files (removed at exit)."""
    return os.fspath(_scratch)
