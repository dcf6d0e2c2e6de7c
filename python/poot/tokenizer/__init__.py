"""Tokenizers for the models poot runs: ``load_tokenizer(spec) -> Tokenizer``.

A GGUF file's tokenizer is rebuilt from its ``tokenizer.ggml.*`` metadata so that it tokenizes
exactly as llama.cpp does (SentencePiece ``llama`` vocabularies and byte-level BPE ``gpt2``
vocabularies with the pre-tokenizer the file names). A Hugging Face directory's
``tokenizer.json`` goes through the ``tokenizers`` library. Either way the result is a
``Tokenizer`` with ``encode``, ``decode``, ``stream`` and ``apply_chat_template``.

Invariants:
    - Loading reads metadata only (``poot._native.GgufFile``), never tensor data.
    - Unknown tokenizer models and pre-tokenizers are errors (``TokenizerError`` naming what
      is supported), never a silent fallback that would tokenize differently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poot.errors import TokenizerError
from poot.tokenizer.base import Backend, Tokenizer
from poot.tokenizer.gguf_bpe import BpeBackend, bpe_model
from poot.tokenizer.gguf_gemma4 import Gemma4Backend
from poot.tokenizer.gguf_spm import SpmBackend, SpmTable
from poot.tokenizer.gguf_vocab import read_gguf_vocab, tokenizer_model
from poot.tokenizer.hf import HfBackend, chat_templates_from_dir, special_token_strings
from poot.tokenizer.pretokenizers import get_pre_tokenizer, supported_pre_tokenizers
from poot.tokenizer.stream import TokenStream

if TYPE_CHECKING:
    from poot.checkpoints.files import ModelFiles

__all__ = [
    "Tokenizer",
    "TokenStream",
    "load_tokenizer",
    "supported_pre_tokenizers",
    "tokenizer_from_gguf_metadata",
]


def load_tokenizer(spec: ModelFiles | str | os.PathLike[str] | None = None) -> Tokenizer:
    """Loads a model's tokenizer.

    Args:
        spec: a resolved ``ModelFiles``, a ``.gguf`` file, a Hugging Face directory with a
            ``tokenizer.json``, or any model spec ``poot.checkpoints.resolve_model_files``
            accepts (a hub id, ``"default"``, None for the default model).

    Returns:
        The tokenizer.

    Raises:
        TokenizerError: the files hold no usable tokenizer.
        ModelNotFoundError: the spec names nothing poot can find.
    """
    if spec is not None and not isinstance(spec, (str, os.PathLike)):
        return _from_model_files(spec)
    if spec is not None:
        path = Path(spec)
        if path.is_file() and path.suffix.lower() == ".gguf":
            return _from_gguf_path(path)
        if path.is_dir():
            return tokenizer_from_hf_dir(path)
    from poot.checkpoints import resolve_model_files  # lazy: it opens checkpoints natively

    return _from_model_files(resolve_model_files(spec))


def _from_model_files(files: ModelFiles) -> Tokenizer:
    if files.kind == "gguf":
        meta = files.metadata
        if not meta and files.gguf is not None:
            from poot.checkpoints.metadata import GgufMetadata

            meta = GgufMetadata(files.gguf)
        return tokenizer_from_gguf_metadata(meta, source=str(files.path))
    return tokenizer_from_hf_dir(
        Path(files.path),
        tokenizer_json=files.tokenizer_json,
        tokenizer_config=files.tokenizer_config,
        generation_config=files.generation_config,
        config=files.config,
    )


def _from_gguf_path(path: Path) -> Tokenizer:
    from poot import _native
    from poot.checkpoints.metadata import GgufMetadata

    meta = GgufMetadata(_native.GgufFile(str(path)))
    return tokenizer_from_gguf_metadata(meta, source=str(path))


def tokenizer_from_gguf_metadata(
    metadata: Mapping[str, Any], *, source: str = "GGUF metadata"
) -> Tokenizer:
    """Rebuilds a GGUF file's tokenizer from its metadata.

    A byte-level BPE vocabulary goes to the native ``BpeModel`` (read natively, with no Python
    object per token, when ``metadata`` is a ``GgufMetadata``); a SentencePiece one is read
    into Python lists once.

    Args:
        metadata: the file's key/value metadata (arrays as lists): a dict, or the
            ``GgufMetadata`` of an opened file.
        source: a name for messages.

    Raises:
        TokenizerError: the model or pre-tokenizer is unknown, or the vocabulary is malformed.
    """
    get: Callable[[str], Any] = metadata.get
    backend: Backend
    try:
        model = tokenizer_model(get)
        if model == "gpt2":
            pre_name = get("tokenizer.ggml.pre") or "default"
            pre = get_pre_tokenizer(pre_name)
            if pre is None:
                raise TokenizerError(
                    f"unknown pre-tokenizer tokenizer.ggml.pre={pre_name!r}; supported: "
                    + ", ".join(supported_pre_tokenizers())
                )
            bpe = bpe_model(metadata, ignore_merges=pre.ignore_merges)
            vocab = read_gguf_vocab(
                get,
                bpe,
                default_add_bos=pre.add_bos,
                default_bos=pre.default_bos,
                keys=list(metadata),
            )
            backend = BpeBackend(vocab, bpe, pre)
        elif model == "gemma4":
            bpe = bpe_model(metadata, ignore_merges=False)
            vocab = read_gguf_vocab(get, bpe, keys=list(metadata))
            backend = Gemma4Backend(vocab, bpe)
        else:
            spm = SpmTable.from_metadata(get)
            vocab = read_gguf_vocab(get, spm, keys=list(metadata))
            backend = SpmBackend(vocab, spm)
    except TokenizerError as e:
        raise TokenizerError(f"{source}: {e}") from e
    specials: dict[str, Any] = {}
    for name, tid in (
        ("bos_token", vocab.bos_id),
        ("eos_token", vocab.eos_id),
        ("unk_token", vocab.unk_id),
        ("pad_token", vocab.pad_id),
        ("sep_token", vocab.sep_id),
    ):
        if tid is not None:
            specials[name] = backend.id_to_token(tid)
    return Tokenizer(
        backend,
        source=source,
        chat_templates=vocab.chat_templates,
        special_tokens=specials,
        extra_eos_ids=vocab.eog_ids,
    )


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"cannot read {path}: {e}") from e
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def tokenizer_from_hf_dir(
    directory: Path,
    *,
    tokenizer_json: Path | None = None,
    tokenizer_config: Mapping[str, Any] | None = None,
    generation_config: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Tokenizer:
    """Loads a Hugging Face directory's ``tokenizer.json`` and its configs.

    Args:
        directory: the model directory.
        tokenizer_json, tokenizer_config, generation_config, config: already-read files; each
            None is read from ``directory``.

    Raises:
        TokenizerError: there is no tokenizer.json, or a file is malformed.
    """
    directory = Path(directory)
    path = tokenizer_json or directory / "tokenizer.json"
    if not Path(path).is_file():
        raise TokenizerError(
            f"{directory} has no tokenizer.json; poot reads Hugging Face tokenizers in that "
            "format only (convert a SentencePiece tokenizer.model with transformers first)"
        )
    if tokenizer_config is None:
        tokenizer_config = _json_file(directory / "tokenizer_config.json")
    if generation_config is None:
        generation_config = _json_file(directory / "generation_config.json")
    if config is None:
        config = _json_file(directory / "config.json")
    merged = {**_json_file(directory / "special_tokens_map.json"), **tokenizer_config}
    backend = HfBackend(Path(path), merged)
    bos = _ids(config.get("bos_token_id"))
    eos_config = _ids(config.get("eos_token_id"))
    backend.set_fallback_ids(bos[0] if bos else None, eos_config[0] if eos_config else None)
    extra: Iterable[int] = [*eos_config, *_ids(generation_config.get("eos_token_id"))]
    return Tokenizer(
        backend,
        source=str(directory),
        chat_templates=chat_templates_from_dir(directory, merged),
        special_tokens=special_token_strings(merged),
        extra_eos_ids=extra,
    )
