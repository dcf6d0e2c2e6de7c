"""Per-family hyperparameters beyond the Llama set: attention windows, soft-capping, scales.

``family_fields_gguf`` and ``family_fields_hf`` read them from GGUF ``{arch}.*`` metadata and
from config.json; both return keyword arguments for ``ModelHParams`` (empty for a family that
needs none), so the two sources of one model give equal hyperparameters.

Invariants: ``layer_windows`` is empty (no windowed layer) or has one entry per layer, ``0``
for a global layer and ``W > 0`` for a layer whose token at position ``p`` attends to positions
``p - W + 1 ..= p`` (llama.cpp's and transformers' "standard" sliding window). The per-layer
pattern follows the reference each source is read by: GGUF files the way llama.cpp lays them out
(``{arch}.attention.sliding_window_pattern`` when present, else the family's fixed pattern),
config.json the way ``transformers`` does (``layer_types`` when present, else the family rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from poot.checkpoints.hparams import bad_hparams, f32_shortest

# Gemma 2 alternates windowed (even) and global (odd) layers; Gemma 3 makes every sixth layer
# global. llama.cpp: set_swa_pattern(2) / (6); transformers: layer_idx % 2 == 0 /
# (layer_idx + 1) % 6 != 0. Both say the same thing.
_GEMMA_PATTERN = {"gemma2": 2, "gemma3": 6}
# llama.cpp's Gemma model sizes that scale queries by hidden_size / n_heads rather than head_dim
# (the 27B models), keyed by block count.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _pattern(n_layers: int, every: int, window: int) -> tuple[int, ...]:
    return tuple(window if (i % every) < every - 1 else 0 for i in range(n_layers))


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _window(value: Any, source: str, key: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_hparams(source, key, f"must be a non-negative integer, got {value!r}")
    return value


def family_fields_gguf(
    arch: str,
    meta: Mapping[str, Any],
    n_layers: int,
    hidden: int,
    n_heads: int,
    head_dim: int,
    source: str,
) -> dict[str, Any]:
    """The family fields a GGUF states (keyword arguments of ``ModelHParams``)."""
    p = f"{arch}."
    out: dict[str, Any] = {}
    window = _window(
        meta.get(p + "attention.sliding_window"), source, p + "attention.sliding_window"
    )
    if arch in _GEMMA_PATTERN:
        if arch == "gemma2" and window == 0:
            window = 4096  # llama.cpp's default for Gemma 2
        per_layer = meta.get(p + "attention.sliding_window_pattern")
        if isinstance(per_layer, list | tuple) and len(per_layer) == n_layers:
            out["layer_windows"] = tuple(window if bool(x) else 0 for x in per_layer)
        elif window:
            every = per_layer if isinstance(per_layer, int) and per_layer > 0 else None
            out["layer_windows"] = _pattern(n_layers, every or _GEMMA_PATTERN[arch], window)
        qpas = hidden / n_heads if n_layers == _GEMMA_27B_LAYERS[arch] else float(head_dim)
        out["query_pre_attn_scalar"] = qpas
        out["embedding_scale"] = True
        if arch == "gemma2":
            out["attn_logit_softcap"] = f32_shortest(
                _num(meta.get(p + "attn_logit_softcapping")) or 50.0
            )
            out["final_logit_softcap"] = f32_shortest(
                _num(meta.get(p + "final_logit_softcapping")) or 30.0
            )
        else:
            cap = _num(meta.get(p + "final_logit_softcapping"))
            out["final_logit_softcap"] = f32_shortest(cap) if cap else None
        base_swa = _num(meta.get(p + "rope.freq_base_swa"))
        if arch == "gemma3":
            # llama.cpp's default local base for Gemma 3 when the file does not state one.
            out["rope_local_theta"] = f32_shortest(base_swa) if base_swa else 10000.0
        elif base_swa:
            out["rope_local_theta"] = f32_shortest(base_swa)
    elif arch in ("llama", "mistral") and window:
        # Mistral 7B v0.1 and the like: every layer windowed. (Qwen2/3 configs state a window
        # they do not use, use_sliding_window false, so a GGUF's key is not trusted for them.)
        out["layer_windows"] = (window,) * n_layers
    experts = meta.get(p + "expert_count")
    if isinstance(experts, int) and experts > 0:
        used = meta.get(p + "expert_used_count")
        if not isinstance(used, int) or not 0 < used <= experts:
            raise bad_hparams(source, p + "expert_used_count", f"must be in 1..={experts}")
        ff = meta.get(p + "expert_feed_forward_length", meta.get(p + "feed_forward_length"))
        out["n_experts"], out["n_experts_used"] = experts, used
        out["expert_ff"] = int(ff) if isinstance(ff, int) else 0
        shared = meta.get(p + "expert_shared_feed_forward_length")
        out["expert_shared_ff"] = int(shared) if isinstance(shared, int) else 0
    # phi3: llama.cpp disables Phi-3's window (ggml-org/llama.cpp#13676); a GGUF is run as
    # llama.cpp runs it, so the window is not read here.
    return out


def _hf_layer_windows(
    cfg: Mapping[str, Any], model_type: str, n_layers: int, source: str
) -> tuple[int, ...]:
    window = _window(cfg.get("sliding_window"), source, "sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n_layers:
            raise bad_hparams(
                source, "layer_types", f"has {len(types)} entries for {n_layers} layers"
            )
        if not window and "sliding_attention" in types:
            raise bad_hparams(
                source, "sliding_window", "is missing but layer_types has sliding layers"
            )
        return tuple(window if t == "sliding_attention" else 0 for t in types)
    if not window:
        return ()
    if model_type == "gemma2":
        return _pattern(n_layers, 2, window)
    if model_type.startswith("gemma3"):
        every = cfg.get("sliding_window_pattern")
        return _pattern(n_layers, every if isinstance(every, int) and every > 0 else 6, window)
    if model_type in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window", False):
            return ()
        # transformers: layers from max_window_layers on are windowed.
        first = cfg.get("max_window_layers", n_layers)
        first = first if isinstance(first, int) else n_layers
        return tuple(window if i >= first else 0 for i in range(n_layers))
    if model_type in ("mistral", "phi3"):
        return (window,) * n_layers
    return ()


def family_fields_hf(
    cfg: Mapping[str, Any], model_type: str, n_layers: int, source: str
) -> dict[str, Any]:
    """The family fields a config.json states (keyword arguments of ``ModelHParams``)."""
    out: dict[str, Any] = {}
    windows = _hf_layer_windows(cfg, model_type, n_layers, source)
    if windows:
        out["layer_windows"] = windows
    out.update(_hf_experts(cfg, source))
    if model_type.startswith("gemma"):
        out["embedding_scale"] = True
        qpas = _num(cfg.get("query_pre_attn_scalar"))
        if qpas is not None:
            out["query_pre_attn_scalar"] = qpas
        for key, field in (
            ("attn_logit_softcapping", "attn_logit_softcap"),
            ("final_logit_softcapping", "final_logit_softcap"),
        ):
            cap = _num(cfg.get(key))
            if cap:
                out[field] = cap
        local = _num(cfg.get("rope_local_base_freq"))
        if local:
            out["rope_local_theta"] = local
    return out


def _hf_experts(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The MoE fields of a config.json (Mixtral's ``num_local_experts``, the Qwen MoEs' and
    OLMoE's ``num_experts``), the same values the GGUF converter writes as ``{arch}.expert_*``."""
    key = "num_local_experts" if "num_local_experts" in cfg else "num_experts"
    experts = cfg.get(key)
    if isinstance(experts, bool) or not isinstance(experts, int) or experts <= 0:
        return {}
    used = cfg.get("num_experts_per_tok")
    if isinstance(used, bool) or not isinstance(used, int) or not 0 < used <= experts:
        raise bad_hparams(source, "num_experts_per_tok", f"must be in 1..={experts}")
    ff = cfg.get("moe_intermediate_size", cfg.get("intermediate_size"))
    shared = cfg.get("shared_expert_intermediate_size")
    return {
        "n_experts": experts,
        "n_experts_used": used,
        "expert_ff": int(ff) if isinstance(ff, int) else 0,
        "expert_shared_ff": int(shared) if isinstance(shared, int) else 0,
    }
