"""Typed errors raised by poot.

Every error poot raises is a ``PootError`` and also subclasses the builtin that fits, so callers
can catch ``ValueError`` for bad input, ``FileNotFoundError`` for a missing model, and so on.
The native module raises these same classes (``poot._native`` looks them up here by name), so a
Rust error keeps its kind and its fields when it crosses into Python.
"""

from __future__ import annotations


class PootError(Exception):
    """Base class of every error poot raises."""


class CheckpointError(PootError):
    """A model could not be resolved or loaded."""


class CheckpointFormatError(CheckpointError, ValueError):
    """A checkpoint file is malformed.

    Attributes:
        kind: what is wrong, e.g. ``"truncated"``, ``"misaligned"``, ``"duplicate_name"``.
        file: the file's path.
        tensor: the tensor concerned, if any.
        field: the header field concerned, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "invalid",
        file: str | None = None,
        tensor: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.file = file
        self.tensor = tensor
        self.field = field


class UnsupportedDTypeError(CheckpointFormatError):
    """A tensor is stored in a dtype poot does not know."""


class ModelNotFoundError(CheckpointError, FileNotFoundError):
    """A model spec names nothing poot can find."""


class OfflineError(CheckpointError, ConnectionError):
    """A model must be downloaded but the network (hub or package index) is unreachable."""


class ChecksumError(CheckpointError, ValueError):
    """A downloaded file does not have the expected sha256."""


class TokenizerError(PootError, ValueError):
    """A tokenizer cannot be built from the given files or metadata."""


class ChatTemplateError(TokenizerError):
    """A chat template is missing or failed to render."""


class ConfigError(PootError, ValueError):
    """A setting (an environment variable poot reads) has an invalid value."""
