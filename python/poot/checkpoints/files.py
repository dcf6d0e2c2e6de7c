"""``ModelFiles``: one resolved checkpoint, opened but not loaded.

Opening a GGUF file or a safetensors set maps it and parses its header in the native module;
no tensor data is read. Everything a later stage needs to decide how to load the model (the
normalized hyperparameters, the tensor table, the tokenizer files) is here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from poot import _native
from poot.checkpoints.hparams import ModelHParams, hparams_from_gguf, hparams_from_hf_config
from poot.checkpoints.metadata import GgufMetadata, metadata_array_len
from poot.checkpoints.quantized import QuantLayout, quant_layout
from poot.errors import CheckpointFormatError

if TYPE_CHECKING:
    from poot._native import GgufFile, SafetensorsModel, TensorInfo

ModelKind = Literal["gguf", "hf"]

SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass(eq=False)
class ModelFiles:
    """A resolved model: its files, headers and normalized hyperparameters.

    Attributes:
        spec: the spec as the caller gave it (``"default"`` for the default model).
        kind: ``"gguf"`` for one GGUF file, ``"hf"`` for a Hugging Face directory.
        path: the .gguf file, or the HF directory.
        hparams: the normalized hyperparameters.
        gguf: the opened GGUF file (kind ``"gguf"``), else None.
        safetensors: the opened safetensors set (kind ``"hf"``), else None.
        metadata: the GGUF key/value metadata (a ``GgufMetadata``: vocabulary-sized arrays
            are converted only when read); ``{}`` for a HF directory.
        config: config.json; ``{}`` for a GGUF file.
        tokenizer_json: tokenizer.json if the directory has one.
        tokenizer_config: tokenizer_config.json, or ``{}``.
        generation_config: generation_config.json, or ``{}``.
        quantization: the GPTQ/AWQ layout of a quantized HF directory (its int4 layers are
            re-laid when ``Weights`` is built), else None.
    """

    spec: str
    kind: ModelKind
    path: Path
    hparams: ModelHParams
    gguf: GgufFile | None = None
    safetensors: SafetensorsModel | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    tokenizer_json: Path | None = None
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    quantization: QuantLayout | None = None

    def tensors(self) -> list[TensorInfo]:
        """Every stored tensor, in file order."""
        return list(self._tensors)

    @cached_property
    def _tensors(self) -> tuple[TensorInfo, ...]:
        if self.gguf is not None:
            return tuple(self.gguf.tensors())
        if self.safetensors is not None:
            return tuple(self.safetensors.tensors())
        return ()

    @cached_property
    def total_bytes(self) -> int:
        """Bytes of tensor data, summed over every tensor."""
        return sum(int(t.nbytes) for t in self._tensors)

    @property
    def weight_files(self) -> list[Path]:
        """The files that hold tensor data."""
        if self.safetensors is not None:
            return [Path(f) for f in self.safetensors.files]
        return [self.path]

    @cached_property
    def chat_template(self) -> str | None:
        """The chat template (jinja source) shipped with the model, if any."""
        if self.kind == "gguf":
            tpl = self.metadata.get("tokenizer.chat_template")
            return tpl if isinstance(tpl, str) and tpl else None
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        tpl = self.tokenizer_config.get("chat_template")
        if isinstance(tpl, str) and tpl:
            return tpl
        if isinstance(tpl, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
            chosen = named.get("default") or next(iter(named.values()), None)
            return chosen if isinstance(chosen, str) else None
        return None

    def tokenizer_summary(self) -> dict[str, Any]:
        """Where the tokenizer comes from and what kind it is (for ``poot inspect``)."""
        if self.kind == "gguf":
            return {
                "source": "gguf",
                "model": self.metadata.get("tokenizer.ggml.model"),
                "pre": self.metadata.get("tokenizer.ggml.pre"),
                "n_tokens": metadata_array_len(self.metadata, "tokenizer.ggml.tokens"),
            }
        out: dict[str, Any] = {"source": None, "model": None, "pre": None, "n_tokens": None}
        if self.tokenizer_json is not None:
            out["source"] = "tokenizer.json"
            try:
                tj = json.loads(self.tokenizer_json.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                tj = {}
            model = tj.get("model") if isinstance(tj, dict) else None
            if isinstance(model, dict):
                out["model"] = model.get("type")
                vocab = model.get("vocab")
                if isinstance(vocab, dict | list):
                    added = tj.get("added_tokens") or []
                    extra = {a.get("id") for a in added if isinstance(a, dict)}
                    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
                    out["n_tokens"] = len(ids | extra)
            pre = tj.get("pre_tokenizer") if isinstance(tj, dict) else None
            if isinstance(pre, dict):
                out["pre"] = pre.get("type")
        elif (self.path / "tokenizer.model").is_file():
            out["source"] = "tokenizer.model"
            out["model"] = "sentencepiece"
        cls = self.tokenizer_config.get("tokenizer_class")
        if cls:
            out["class"] = cls
        return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CheckpointFormatError(
            f"{path}: not valid JSON ({e})", kind="bad_json", file=str(path)
        ) from None
    if not isinstance(value, dict):
        raise CheckpointFormatError(
            f"{path}: expected a JSON object", kind="bad_json", file=str(path)
        )
    return value


def _read_optional_json(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def open_gguf(path: Path, spec: str) -> ModelFiles:
    """Open one GGUF file (header and metadata only)."""
    gguf = _native.GgufFile(str(path))
    metadata = GgufMetadata(gguf)
    names = {t.name for t in gguf.tensors()}
    hparams = hparams_from_gguf(metadata, names, source=str(path))
    return ModelFiles(
        spec=spec, kind="gguf", path=path, hparams=hparams, gguf=gguf, metadata=metadata
    )


def safetensors_source(directory: Path) -> Path:
    """The index (sharded) or the directory (single or unindexed files) to open.

    Raises:
        CheckpointFormatError: the directory holds no safetensors weights.
    """
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        return index
    if any(directory.glob("*.safetensors")):
        return directory
    others = sorted(
        p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".gguf")
    )
    hint = f" (found {', '.join(others)}; poot reads only safetensors here)" if others else ""
    raise CheckpointFormatError(
        f"{directory}: no *.safetensors weights{hint}", kind="missing_weights", file=str(directory)
    )


def open_hf_dir(directory: Path, spec: str) -> ModelFiles:
    """Open a Hugging Face model directory: config.json, safetensors, tokenizer files."""
    config = _read_json(directory / "config.json")
    generation_config = _read_optional_json(directory / "generation_config.json")
    hparams = hparams_from_hf_config(
        config, generation_config, source=str(directory / "config.json")
    )
    # Decided from the config alone, so an unsupported layout is refused before any weight.
    quantization = quant_layout(config, directory)
    st = _native.SafetensorsModel(
        str(safetensors_source(directory)),
        packed=quantization.native if quantization is not None else None,
    )
    tokenizer_json = directory / "tokenizer.json"
    return ModelFiles(
        spec=spec,
        kind="hf",
        path=directory,
        hparams=hparams,
        safetensors=st,
        config=config,
        tokenizer_json=tokenizer_json if tokenizer_json.is_file() else None,
        tokenizer_config=_read_optional_json(directory / "tokenizer_config.json"),
        generation_config=generation_config,
        quantization=quantization,
    )
