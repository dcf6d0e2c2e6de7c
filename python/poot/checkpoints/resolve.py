"""Resolve a model spec (path, hub id or "default") to opened ``ModelFiles``.

Every command that takes a model goes through ``resolve_model_files``. The order is fixed: the
default model; then anything that exists on disk (a local path always wins over a hub id of the
same spelling); then a hub id; anything else is a ``ModelNotFoundError`` that lists the forms.
"""

from __future__ import annotations

import os
from pathlib import Path

from poot.checkpoints.default import DEFAULT_MODEL, pull
from poot.checkpoints.files import ModelFiles, open_gguf, open_hf_dir
from poot.checkpoints.hub import download_snapshot, parse_hub_id
from poot.config import Settings
from poot.errors import CheckpointFormatError, ModelNotFoundError

DEFAULT_SPEC = "default"

SPEC_FORMS = (
    "a model spec is a .gguf file, a Hugging Face model directory (config.json + "
    "*.safetensors), a Hugging Face hub id such as HuggingFaceTB/SmolLM2-135M-Instruct "
    f"(optionally @revision), or {DEFAULT_SPEC!r} (or nothing) for the default model, "
    f"{DEFAULT_MODEL.name}"
)

_GGUF_MAGIC = b"GGUF"


def _not_found(spec: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"cannot resolve model {spec!r}: {why}; {SPEC_FORMS}")


def _looks_like_path(spec: str) -> bool:
    return (
        spec.startswith(("/", ".", "~"))
        or "\\" in spec
        or spec.count("/") > 1
        or spec.lower().endswith((".gguf", ".safetensors", ".json", ".bin"))
    )


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def resolve_model_files(
    spec: str | os.PathLike[str] | None = None,
    *,
    settings: Settings | None = None,
    progress: bool = True,
) -> ModelFiles:
    """Resolve ``spec`` to a model's files and open their headers.

    Args:
        spec: a .gguf path; a Hugging Face directory; a hub id (``owner/name[@revision]``);
            or None / ``"default"`` for the default model (pulled into the cache if absent).
        settings: cache and network settings (default: ``Settings.from_env()``).
        progress: show progress bars while downloading.

    Raises:
        ModelNotFoundError: nothing matches ``spec``.
        OfflineError: the model must be downloaded and the network is unreachable.
        CheckpointFormatError: the files exist but are malformed or incomplete.
    """
    settings = settings or Settings.from_env()
    if spec is None or spec == DEFAULT_SPEC:
        path = pull(DEFAULT_MODEL, settings, progress=progress)
        return open_gguf(path, DEFAULT_SPEC)

    text = os.fspath(spec)
    if not text.strip():
        raise _not_found(text, "the spec is empty")
    path = Path(text).expanduser()
    if path.is_file():
        if _is_gguf(path):
            return open_gguf(path, text)
        if path.name == "config.json":
            return open_hf_dir(path.parent, text)
        raise _not_found(text, "the file is not GGUF (for a Hugging Face model pass its directory)")
    if path.is_dir():
        if (path / "config.json").is_file():
            return open_hf_dir(path, text)
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f" (it has {', '.join(ggufs[:5])}: pass one of them)" if ggufs else ""
        raise _not_found(text, f"the directory has no config.json{hint}")
    if path.exists():
        raise _not_found(text, "not a regular file or directory")

    if not _looks_like_path(text) and (hub := parse_hub_id(text)) is not None:
        repo_id, revision = hub
        directory = download_snapshot(repo_id, revision, settings)
        if not (directory / "config.json").is_file():
            raise CheckpointFormatError(
                f"hub repo {repo_id} has no config.json (a GGUF-only repo? download the .gguf "
                "and pass its path)",
                kind="missing_config",
                file=str(directory),
            )
        return open_hf_dir(directory, text)
    raise _not_found(
        text,
        "no such file or directory"
        if _looks_like_path(text)
        else "not a path, a hub id or 'default'",
    )
