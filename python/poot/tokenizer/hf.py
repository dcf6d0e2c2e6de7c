"""Hugging Face tokenizers: ``tokenizer.json`` through the ``tokenizers`` library.

The directory's ``tokenizer_config.json`` supplies the special-token strings, the chat template
(unless ``chat_template.jinja`` or ``chat_template.json`` holds it, as newer checkpoints do) and
``clean_up_tokenization_spaces``; ``generation_config.json`` supplies extra end-of-generation
ids.

Invariants:
    - Encoding and decoding are the ``tokenizers`` object's own; nothing is re-implemented,
      so results equal ``transformers``' fast tokenizer for the same files.
    - Space clean-up follows transformers' ``clean_up_tokenization`` and is off unless the
      config turns it on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HfTokenizer

from poot.errors import TokenizerError
from poot.tokenizer.base import Backend
from poot.tokenizer.stream import DecodeStream, TokenStream

__all__ = ["HfBackend", "chat_templates_from_dir", "special_token_strings"]

_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _token_string(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def special_token_strings(tokenizer_config: Mapping[str, Any]) -> dict[str, Any]:
    """``bos_token``, ``eos_token``, ... from a tokenizer config, as strings.

    ``additional_special_tokens`` comes back as a list of strings.
    """
    out: dict[str, Any] = {}
    for key in _SPECIAL_KEYS:
        text = _token_string(tokenizer_config.get(key))
        if text is not None:
            out[key] = text
    extra = tokenizer_config.get("additional_special_tokens")
    if isinstance(extra, list):
        texts = [t for t in (_token_string(x) for x in extra) if t is not None]
        if texts:
            out["additional_special_tokens"] = texts
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} does not hold a JSON object")
    return data


def _templates_from_value(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):  # [{"name": "default", "template": "..."}, ...]
        return {
            str(t["name"]): str(t["template"])
            for t in value
            if isinstance(t, Mapping) and "name" in t and "template" in t
        }
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}
    return {}


def chat_templates_from_dir(directory: Path, tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The chat templates of a Hugging Face directory, by name.

    ``chat_template.jinja`` (and ``additional_chat_templates/*.jinja``) win over
    ``chat_template.json``, which wins over ``tokenizer_config.json``, as in transformers.
    """
    templates = _templates_from_value(tokenizer_config.get("chat_template"))
    json_file = directory / "chat_template.json"
    if json_file.is_file():
        templates.update(_templates_from_value(_read_json(json_file).get("chat_template")))
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        templates["default"] = jinja_file.read_text(encoding="utf-8")
    extra_dir = directory / "additional_chat_templates"
    if extra_dir.is_dir():
        for f in sorted(extra_dir.glob("*.jinja")):
            templates[f.stem] = f.read_text(encoding="utf-8")
    return templates


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``."""
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


class HfBackend(Backend):
    """A ``tokenizer.json`` loaded with the ``tokenizers`` library."""

    kind = "hf-tokenizer.json"

    def __init__(self, path: Path, tokenizer_config: Mapping[str, Any]) -> None:
        try:
            self._tk = HfTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception on malformed files
            raise TokenizerError(f"cannot load {path}: {e}") from e
        except BaseException as e:  # some malformed files panic in its Rust (found by fuzzing)
            if type(e).__name__ != "PanicException":
                raise
            raise TokenizerError(f"cannot load {path}: the tokenizers library panicked: {e}") from e
        self._tk_plain: HfTokenizer | None = None
        self._clean_up = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))
        strings = special_token_strings(tokenizer_config)
        self._bos_id = self._id_of(_token_string(strings.get("bos_token")))
        self._eos_id = self._id_of(_token_string(strings.get("eos_token")))
        self._specials = frozenset(
            int(i) for i, t in self._tk.get_added_tokens_decoder().items() if t.special
        )
        self._add_bos = self._bos_id is not None and self._bos_id in self._tk.encode("").ids

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tk.token_to_id(token)

    def set_fallback_ids(self, bos_id: int | None, eos_id: int | None) -> None:
        """Uses config.json's ids where tokenizer_config.json names no BOS/EOS token."""
        if self._bos_id is None and bos_id is not None:
            self._bos_id = bos_id
            self._add_bos = bos_id in self._tk.encode("").ids
        if self._eos_id is None and eos_id is not None:
            self._eos_id = eos_id

    @property
    def vocab_size(self) -> int:
        return int(self._tk.get_vocab_size(with_added_tokens=True))

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool) -> list[int]:
        tk = self._tk if parse_special else self._plain()
        return list(tk.encode(text, add_special_tokens=add_special_tokens).ids)

    def _plain(self) -> HfTokenizer:
        # A second copy that tokenizes special tokens as text; the flag lives on the object, so
        # flipping it on the shared one would race with other threads' encodes.
        if self._tk_plain is None:
            plain = HfTokenizer.from_str(self._tk.to_str())
            plain.encode_special_tokens = True
            self._tk_plain = plain
        return self._tk_plain

    def decode(self, ids: Sequence[int], skip_special_tokens: bool, clean_up: bool | None) -> str:
        n = self.vocab_size
        for i in ids:
            if not 0 <= int(i) < n:
                raise TokenizerError(f"token id {i} is out of range [0, {n})")
        text = str(self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))
        if self._clean_up if clean_up is None else clean_up:
            text = clean_up_tokenization(text)
        return text

    def stream(self, skip_special_tokens: bool, context: Sequence[int]) -> TokenStream:
        return DecodeStream(
            lambda ids: str(self._tk.decode(ids, skip_special_tokens=skip_special_tokens)),
            context=context,
        )

    def id_to_token(self, token_id: int) -> str | None:
        token = self._tk.id_to_token(token_id)
        return None if token is None else str(token)

    def token_to_id(self, token: str) -> int | None:
        tid = self._tk.token_to_id(token)
        return None if tid is None else int(tid)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._specials

    def tokenizer_json(self) -> str | None:
        return str(self._tk.to_str())
