"""Shared test data for the checkpoint tests: the real checkpoints' expected hyperparameters
and skip markers for a native module built without a format."""

from __future__ import annotations

import pytest

from poot.checkpoints import ModelHParams

STORIES_GGUFS = [
    "stories260K-f32.gguf",
    "stories260K-F16.gguf",
    "stories260K-Q8_0.gguf",
    "stories260K-Q4_0.gguf",
]

STORIES_HPARAMS = ModelHParams(
    architecture="llama",
    vocab_size=512,
    context_length=512,
    hidden_size=64,
    n_layers=5,
    n_heads=8,
    n_kv_heads=4,
    intermediate_size=172,
    head_dim=8,
    rope_theta=10000.0,
    rope_dim=8,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_scaling=None,
    bos_token_id=1,
    eos_token_ids=(2,),
)

SMOLLM2_HPARAMS = ModelHParams(
    architecture="llama",
    vocab_size=49152,
    context_length=8192,
    hidden_size=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    intermediate_size=1536,
    head_dim=64,
    rope_theta=100000.0,
    rope_dim=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_scaling=None,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def _native_has(name: str) -> bool:
    from poot import _native

    return hasattr(_native, name)


needs_gguf = pytest.mark.skipif(
    not _native_has("GgufFile"), reason="poot._native has no GgufFile yet (rebuild the extension)"
)
needs_safetensors = pytest.mark.skipif(
    not _native_has("SafetensorsModel"),
    reason="poot._native has no SafetensorsModel yet (rebuild the extension)",
)
