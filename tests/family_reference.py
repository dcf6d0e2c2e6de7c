"""The float64 reference forward pass of the random-weight family checkpoints
(``family_models.py``), written from transformers' modeling code for each family: tests only,
the fallback reference where torch cannot be installed."""

from __future__ import annotations

import math

import numpy as np
from family_models import FAMILIES, head_dim, is_gemma, longrope, moe_hf_names, n_experts


def _rms(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (1.0 + w) if gemma else y * w


def _rope(
    x: np.ndarray,
    pos: np.ndarray,
    theta: float,
    rot: int,
    ext: tuple[np.ndarray, float] | None = None,
) -> np.ndarray:
    """rotate_half RoPE of the first ``rot`` dims of x [T, H, Dh]; ``ext``: LongRoPE's
    (ext_factors, attention_factor)."""
    half = rot // 2
    base = theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    inv = 1.0 / (base * ext[0]) if ext is not None else 1.0 / base
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    m = ext[1] if ext is not None else 1.0
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :] * m
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :] * m
    xr, rest = x[..., :rot], x[..., rot:]
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    return np.concatenate([xr * cos + rotated * sin, rest], axis=-1)


def layer_window(family: str, i: int) -> int:
    """Layer i's sliding window as transformers applies it (0: global)."""
    cfg = FAMILIES[family]
    w = int(cfg.get("sliding_window") or 0)
    if family == "gemma2":
        return w if i % 2 == 0 else 0
    if family == "gemma3":
        return w if cfg["layer_types"][i] == "sliding_attention" else 0
    return w


def reference_logits(
    family: str, w: dict[str, np.ndarray], ids: list[int], long_rope: bool = False
) -> np.ndarray:
    """All positions' logits [T, V] in float64 (``long_rope``: LongRoPE's long factors)."""
    cfg = FAMILIES[family]
    g = is_gemma(family)
    eps = cfg["rms_norm_eps"]
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    t, hd = len(ids), head_dim(cfg)
    h, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    f = cfg["intermediate_size"]
    pos = np.arange(t)
    x = w64["model.embed_tokens.weight"][ids]
    if g:
        x = x * math.sqrt(cfg["hidden_size"])
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    scale = cfg.get("query_pre_attn_scalar", hd) ** -0.5
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms(x, w64[p + "input_layernorm.weight"], eps, g)
        if family.startswith("phi3"):
            qkv = a @ w64[p + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [h * hd, (h + hkv) * hd], axis=-1)
        else:
            q = a @ w64[p + "self_attn.q_proj.weight"].T
            k = a @ w64[p + "self_attn.k_proj.weight"].T
            v = a @ w64[p + "self_attn.v_proj.weight"].T
        if family == "olmoe":  # full-width q/k norms, before the heads are split
            q = _rms(q, w64[p + "self_attn.q_norm.weight"], eps, g)
            k = _rms(k, w64[p + "self_attn.k_norm.weight"], eps, g)
        q, k, v = q.reshape(t, h, hd), k.reshape(t, hkv, hd), v.reshape(t, hkv, hd)
        if p + "self_attn.q_norm.weight" in w64 and family != "olmoe":
            q = _rms(q, w64[p + "self_attn.q_norm.weight"], eps, g)
            k = _rms(k, w64[p + "self_attn.k_norm.weight"], eps, g)
        win = layer_window(family, i)
        theta = cfg["rope_theta"]
        if family == "gemma3" and win:
            theta = cfg["rope_local_base_freq"]
        ext = longrope(family, long_rope)
        q, k = _rope(q, pos, theta, rot, ext), _rope(k, pos, theta, rot, ext)
        k, v = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * scale
        cap = cfg.get("attn_logit_softcapping")
        if cap:
            s = np.tanh(s / cap) * cap
        dist = pos[:, None] - pos[None, :]
        allowed = dist >= 0
        if win:
            allowed &= dist < win
        s = np.where(allowed[None], s, -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        att = np.einsum("hts,shd->thd", e / e.sum(axis=-1, keepdims=True), v).reshape(t, h * hd)
        o = att @ w64[p + "self_attn.o_proj.weight"].T
        if g:
            o = _rms(o, w64[p + "post_attention_layernorm.weight"], eps, g)
            x = x + o
            m = _rms(x, w64[p + "pre_feedforward_layernorm.weight"], eps, g)
        else:
            x = x + o
            m = _rms(x, w64[p + "post_attention_layernorm.weight"], eps, g)
        if n_experts(family):
            x = x + _moe(family, w64, p, m)
            continue
        if family.startswith("phi3"):
            gate, up = np.split(m @ w64[p + "mlp.gate_up_proj.weight"].T, [f], axis=-1)
        else:
            gate = m @ w64[p + "mlp.gate_proj.weight"].T
            up = m @ w64[p + "mlp.up_proj.weight"].T
        if g:
            act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
        else:
            act = gate / (1.0 + np.exp(-gate))
        y = (act * up) @ w64[p + "mlp.down_proj.weight"].T
        if g:
            y = _rms(y, w64[p + "post_feedforward_layernorm.weight"], eps, g)
        x = x + y
    x = _rms(x, w64["model.norm.weight"], eps, g)
    head = w64.get("lm_head.weight", w64["model.embed_tokens.weight"])
    logits = x @ head.T
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = np.tanh(logits / cap) * cap
    return logits


def _moe(family: str, w64: dict[str, np.ndarray], p: str, m: np.ndarray) -> np.ndarray:
    """transformers' Mixtral / Qwen3-MoE / OLMoE block: softmax router, top-k, weights
    renormalised unless ``norm_topk_prob`` is false (OLMoE)."""
    k = FAMILIES[family]["num_experts_per_tok"]
    router, ex = moe_hf_names(family)
    logits = m @ w64[p + router].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(m)
    for t in range(m.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:k]
        wts = probs[t, top]
        if FAMILIES[family].get("norm_topk_prob", True):
            wts = wts / wts.sum()
        for e, wt in zip(top, wts, strict=True):
            g = m[t] @ w64[p + ex["gate"].format(j=e)].T
            u = m[t] @ w64[p + ex["up"].format(j=e)].T
            out[t] += wt * ((g / (1.0 + np.exp(-g)) * u) @ w64[p + ex["down"].format(j=e)].T)
    return out


def reference_greedy(
    family: str, w: dict[str, np.ndarray], prompt: list[int], n: int, long_rope: bool = False
) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(reference_logits(family, w, ids, long_rope)[-1])))
    return ids[len(prompt) :]
