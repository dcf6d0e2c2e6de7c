"""Resolve a model spec to files, and describe what those files hold.

``resolve_model_files(spec)`` is the one entry point every command uses; see
``poot.checkpoints.resolve`` for the accepted specs and ``poot.checkpoints.default`` for the default
model.
"""

from poot.checkpoints.default import DEFAULT_MODEL, WheelModel, cached_model, pull
from poot.checkpoints.files import ModelFiles, ModelKind
from poot.checkpoints.hparams import (
    ModelHParams,
    RopeScaling,
    hparams_from_gguf,
    hparams_from_hf_config,
)
from poot.checkpoints.resolve import DEFAULT_SPEC, SPEC_FORMS, resolve_model_files

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SPEC",
    "SPEC_FORMS",
    "ModelFiles",
    "ModelHParams",
    "ModelKind",
    "RopeScaling",
    "WheelModel",
    "cached_model",
    "hparams_from_gguf",
    "hparams_from_hf_config",
    "pull",
    "resolve_model_files",
]
