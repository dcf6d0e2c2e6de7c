"""Normalized hyperparameters, built from GGUF ``{arch}.*`` metadata or a HF config.json.

Both sources name the same numbers differently; ``ModelHParams`` gives them one set of names so
model definitions never look at the source format. Floats stored as f32 in GGUF (RoPE theta, the
RMSNorm epsilon) are rounded to the shortest decimal that reads back as the same f32, so a GGUF
and the HF directory it was made from give equal values (1e-05, not 9.999999747378752e-06).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from poot.checkpoints.metadata import metadata_array_len
from poot.errors import CheckpointFormatError

# HF model_type / GGUF general.architecture names that are the Llama graph.
_HF_ARCH_ALIASES = {
    "llama": "llama",
    "mistral": "llama",
    "smollm": "llama",
    "gemma3_text": "gemma3",
    "qwen2_moe": "qwen2moe",
}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling, as HF ``rope_scaling`` or GGUF ``{arch}.rope.scaling.*`` states it.

    Attributes:
        type: e.g. ``"linear"``, ``"yarn"``, ``"llama3"``.
        factor: the scaling factor.
        original_context_length: the context the model was trained with, if stated.
        params: every other field of the source, unchanged (e.g. llama3's frequency factors).
    """

    type: str
    factor: float | None = None
    original_context_length: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelHParams:
    """The numbers a model definition needs, under one set of names.

    Attributes:
        architecture: the graph family, e.g. ``"llama"``, ``"qwen2"``.
        vocab_size: rows of the token embedding.
        context_length: the trained context length.
        hidden_size: the model width (GGUF ``embedding_length``).
        n_layers: transformer blocks.
        n_heads: attention (query) heads.
        n_kv_heads: key/value heads (== n_heads without GQA).
        intermediate_size: the FFN width (GGUF ``feed_forward_length``).
        head_dim: per-head width.
        rope_theta: RoPE base frequency.
        rope_dim: how many dims of each head RoPE rotates (== head_dim unless partial).
        rope_scaling: RoPE scaling, or None.
        rms_norm_eps: RMSNorm epsilon.
        tie_word_embeddings: the output projection reuses the token embedding.
        bos_token_id: the beginning-of-sequence token, if known.
        eos_token_ids: every end-of-sequence token, first the primary one.
        layer_windows: per layer, ``0`` (global attention) or the sliding window ``W`` (a token
            at position ``p`` attends to ``p - W + 1 ..= p``); empty when no layer is windowed.
        attn_logit_softcap: attention scores become ``c * tanh(s / c)`` (Gemma 2), or None.
        final_logit_softcap: logits become ``c * tanh(l / c)`` (Gemma 2), or None.
        query_pre_attn_scalar: attention scale is ``query_pre_attn_scalar ** -0.5`` instead of
            ``head_dim ** -0.5`` (Gemma), or None.
        rope_local_theta: RoPE base of the windowed layers when it differs (Gemma 3), or None.
        embedding_scale: the embedding is multiplied by ``sqrt(hidden_size)`` (Gemma).
        n_experts: experts per mixture-of-experts layer (0: a dense model).
        n_experts_used: experts each token is routed to.
        expert_ff: one expert's FFN width (``intermediate_size`` when not stated apart).
        expert_shared_ff: the shared expert's FFN width (Qwen2-MoE; 0: no shared expert).
    """

    architecture: str
    vocab_size: int
    context_length: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int
    rope_theta: float
    rope_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    layer_windows: tuple[int, ...] = ()
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    rope_local_theta: float | None = None
    embedding_scale: bool = False
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ff: int = 0
    expert_shared_ff: int = 0

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window, ``0`` for global attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def embedding_length(self) -> int:
        """GGUF's name for ``hidden_size``."""
        return self.hidden_size

    @property
    def feed_forward_length(self) -> int:
        """GGUF's name for ``intermediate_size``."""
        return self.intermediate_size

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence token, if known."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        out = asdict(self)
        out["eos_token_ids"] = list(self.eos_token_ids)
        out["layer_windows"] = list(self.layer_windows)
        if self.rope_scaling is not None:
            out["rope_scaling"]["params"] = dict(self.rope_scaling.params)
        return out


def f32_shortest(value: float) -> float:
    """The shortest decimal float that rounds to the same f32 as ``value``."""
    try:
        target = struct.pack("<f", value)
    except OverflowError:
        return value
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == target:
            return candidate
    return value


def bad_hparams(source: str, key: str, why: str) -> CheckpointFormatError:
    """The error for a missing or malformed hyperparameter ``key`` of ``source``."""
    return CheckpointFormatError(
        f"{source}: {key} {why}", kind="bad_hparams", file=source, field=key
    )


def _int(meta: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = meta.get(key)
    if value is None:
        if default is None:
            raise bad_hparams(source, key, "is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        # GGUF allows a per-layer array for some counts; poot needs one value for all layers.
        if isinstance(value, list | tuple) and value and len(set(value)) == 1:
            return int(value[0])
        raise bad_hparams(source, key, f"must be an integer, got {value!r}")
    if value < 0:
        raise bad_hparams(source, key, f"must not be negative, got {value}")
    return value


def _float(meta: Mapping[str, Any], key: str, source: str, default: float | None = None) -> float:
    value = meta.get(key)
    if value is None:
        if default is None:
            raise bad_hparams(source, key, "is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_hparams(source, key, f"must be a number, got {value!r}")
    return float(value)


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def _check(h: ModelHParams, source: str) -> ModelHParams:
    if h.n_heads == 0 or h.n_kv_heads == 0 or h.n_heads % h.n_kv_heads != 0:
        raise bad_hparams(
            source,
            "head counts",
            f"n_heads={h.n_heads} is not a multiple of n_kv_heads={h.n_kv_heads}",
        )
    for name in ("vocab_size", "hidden_size", "n_layers", "head_dim", "intermediate_size"):
        if getattr(h, name) <= 0:
            raise bad_hparams(source, name, "must be positive")
    if h.layer_windows and len(h.layer_windows) != h.n_layers:
        raise bad_hparams(
            source,
            "layer_windows",
            f"has {len(h.layer_windows)} entries for {h.n_layers} layers",
        )
    for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
        v = getattr(h, name)
        if v is not None and not (v > 0 and v != float("inf")):
            raise bad_hparams(source, name, f"must be positive and finite, got {v}")
    return h


def hparams_from_gguf(
    metadata: Mapping[str, Any], tensor_names: Collection[str], source: str = "gguf"
) -> ModelHParams:
    """Build hyperparameters from GGUF metadata.

    Args:
        metadata: the file's key/value metadata, values as plain Python objects (a dict, or
            a ``GgufMetadata``, whose vocabulary is counted without being converted).
        tensor_names: the names of the file's tensors (a file without ``output.weight`` ties
            the output projection to ``token_embd.weight``).
        source: the file's path, for error messages.
    """
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise bad_hparams(source, "general.architecture", "is missing")
    p = f"{arch}."
    hidden = _int(metadata, p + "embedding_length", source)
    n_heads = _int(metadata, p + "attention.head_count", source)
    n_kv = _int(metadata, p + "attention.head_count_kv", source, default=n_heads)
    head_dim = _int(
        metadata, p + "attention.key_length", source, default=hidden // n_heads if n_heads else 0
    )
    vocab = metadata.get(p + "vocab_size")
    if vocab is None:
        vocab = metadata_array_len(metadata, "tokenizer.ggml.tokens")
        if vocab is None:
            raise bad_hparams(
                source, p + "vocab_size", "is missing and there is no tokenizer.ggml.tokens"
            )
    scaling = None
    stype = metadata.get(p + "rope.scaling.type")
    if isinstance(stype, str) and stype != "none":
        factor = metadata.get(p + "rope.scaling.factor")
        orig = metadata.get(p + "rope.scaling.original_context_length")
        prefix = p + "rope.scaling."
        params = {
            k[len(prefix) :]: metadata[k]
            for k in metadata
            if k.startswith(prefix)
            and k[len(prefix) :] not in ("type", "factor", "original_context_length")
        }
        scaling = RopeScaling(
            type=stype,
            factor=f32_shortest(float(factor)) if isinstance(factor, int | float) else None,
            original_context_length=int(orig) if isinstance(orig, int) else None,
            params=params,
        )
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    h = ModelHParams(
        architecture=arch,
        vocab_size=_int({"v": vocab}, "v", source),
        context_length=_int(metadata, p + "context_length", source),
        hidden_size=hidden,
        n_layers=_int(metadata, p + "block_count", source),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        intermediate_size=_int(metadata, p + "feed_forward_length", source),
        head_dim=head_dim,
        rope_theta=f32_shortest(_float(metadata, p + "rope.freq_base", source, 10000.0)),
        rope_dim=_int(metadata, p + "rope.dimension_count", source, default=head_dim),
        rms_norm_eps=f32_shortest(
            _float(metadata, p + "attention.layer_norm_rms_epsilon", source, 1e-5)
        ),
        tie_word_embeddings="output.weight" not in tensor_names,
        rope_scaling=scaling,
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=_eos_ids(metadata.get("tokenizer.ggml.eos_token_id")),
    )
    from poot.checkpoints.family_hparams import family_fields_gguf

    extra = family_fields_gguf(arch, metadata, h.n_layers, hidden, n_heads, head_dim, source)
    return _check(replace(h, **extra), source)


def hparams_from_hf_config(
    config: Mapping[str, Any],
    generation_config: Mapping[str, Any] | None = None,
    source: str = "config.json",
) -> ModelHParams:
    """Build hyperparameters from a HF config.json (and generation_config.json for token ids).

    Missing optional fields take the defaults ``transformers`` gives them for Llama.
    """
    # Multimodal configs nest the language model's numbers under text_config.
    cfg: Mapping[str, Any] = config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg, **cfg["text_config"]}
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise bad_hparams(source, "model_type", "is missing")
    arch = _HF_ARCH_ALIASES.get(model_type, model_type)
    hidden = _int(cfg, "hidden_size", source)
    n_heads = _int(cfg, "num_attention_heads", source)
    n_kv = _int(cfg, "num_key_value_heads", source, default=n_heads)
    head_dim = _int(cfg, "head_dim", source, default=hidden // n_heads if n_heads else 0)
    scaling = None
    # transformers v5 moves rope_theta and the scaling into one rope_parameters dict.
    rope_params = cfg.get("rope_parameters")
    if isinstance(rope_params, Mapping):
        cfg = {**cfg, "rope_theta": cfg.get("rope_theta", rope_params.get("rope_theta"))}
    raw = cfg.get("rope_scaling") or rope_params
    if isinstance(raw, Mapping):
        stype = raw.get("rope_type", raw.get("type"))
        if isinstance(stype, str) and stype != "default":
            factor = raw.get("factor")
            # Phi-3 states the pretrained context at the top level, not in rope_scaling.
            orig = raw.get(
                "original_max_position_embeddings", cfg.get("original_max_position_embeddings")
            )
            scaling = RopeScaling(
                type=stype,
                factor=float(factor) if isinstance(factor, int | float) else None,
                original_context_length=int(orig) if isinstance(orig, int) else None,
                params={
                    k: v
                    for k, v in raw.items()
                    if k
                    not in (
                        "rope_type",
                        "type",
                        "factor",
                        "rope_theta",
                        "original_max_position_embeddings",
                    )
                },
            )
    gen = generation_config or {}
    bos = cfg.get("bos_token_id", gen.get("bos_token_id"))
    eos = cfg.get("eos_token_id")
    gen_eos = gen.get("eos_token_id")
    eos_ids = _eos_ids(eos)
    # generation_config often lists extra stop ids (e.g. <|eot_id|>); keep config's first.
    eos_ids = eos_ids + tuple(i for i in _eos_ids(gen_eos) if i not in eos_ids)
    partial = cfg.get("partial_rotary_factor")
    rope_dim = int(head_dim * float(partial)) if isinstance(partial, int | float) else head_dim
    h = ModelHParams(
        architecture=arch,
        vocab_size=_int(cfg, "vocab_size", source),
        context_length=_int(cfg, "max_position_embeddings", source),
        hidden_size=hidden,
        n_layers=_int(cfg, "num_hidden_layers", source),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        intermediate_size=_int(cfg, "intermediate_size", source),
        head_dim=head_dim,
        rope_theta=_float(cfg, "rope_theta", source, 10000.0),
        rope_dim=rope_dim,
        rms_norm_eps=_float(cfg, "rms_norm_eps", source, 1e-6),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_scaling=scaling,
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        eos_token_ids=eos_ids,
    )
    from poot.checkpoints.family_hparams import family_fields_hf

    extra = family_fields_hf(cfg, model_type, h.n_layers, source)
    return _check(replace(h, **extra), source)
