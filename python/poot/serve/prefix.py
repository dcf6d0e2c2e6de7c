"""Prefix keys for routing: a prompt's leading blocks, hashed the way the KV cache does.

The KV cache (``crates/poot-kv/src/hash.rs``) keys each full block by a chained hash: FNV-1a 64
over the model key, the parent block's hash (or a fixed marker for the first block), the
block's length and its items as little-endian words, finished with murmur3's ``fmix64``.
``hash_block`` is that function, bit for bit (``tests/test_ray_prefix.py`` pins it to the Rust
test vector), and ``prefix_hashes`` chains it over a prompt's leading blocks.

The router hashes the prompt's *text*, not its token ids: blocks of ``BLOCK_CHARS`` UTF-8
bytes of the rendered prompt (a completion's prompt, or a chat's messages as role and content
in order). The keys are only ever compared with other keys the router made, never with a
replica's block hashes, so what matters is that two prompts sharing their first ``k`` blocks
of text get the same first ``k`` keys, which text blocks give as tokens would. Tokenizing
instead would need the model's tokenizer (and chat template) in the process that routes, the
ingress, which runs without the model (on a CPU-only head node), and would tokenize every
prompt twice on the path every request takes. ``BLOCK_CHARS`` is 64: about the 16 tokens of a
KV block (``DriverOptions.block_size``) at the 3-4 characters a token holds in English text.

``PrefixTable`` remembers which replicas were sent which leading blocks: a bounded LRU map from
block key to the replicas (most recent last), so a router finds, for a new prompt, the
replicas that were sent its longest already-seen prefix. Invariants: at most ``max_entries``
keys (least recently used dropped first); ``forget(replica)`` removes a replica everywhere;
``match`` and ``record`` cost O(blocks) dictionary operations.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "BLOCK_CHARS",
    "MAX_BLOCKS",
    "PrefixTable",
    "hash_block",
    "prefix_hashes",
    "prompt_text",
]

BLOCK_CHARS = 64
# Keys beyond this many blocks (4 KiB of text) add nothing to where a prompt goes.
MAX_BLOCKS = 64

_MASK = (1 << 64) - 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x00000100000001B3
_FNV_PRIME_4 = pow(_FNV_PRIME, 4, 1 << 64)
_NO_PARENT = 0x9E3779B97F4A7C15


def _fnv1a64(state: int, data: bytes) -> int:
    for b in data:
        state = ((state ^ b) * _FNV_PRIME) & _MASK
    return state


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK
    return h ^ (h >> 33)


def hash_block(parent: int | None, items: Sequence[int], model_key: int = 0) -> int:
    """The chained hash of one block of ``items`` (token ids, or bytes) after ``parent``:
    ``poot_kv::hash::hash_block``."""
    h = _fnv1a64(_FNV_OFFSET, model_key.to_bytes(8, "little"))
    h = _fnv1a64(h, (_NO_PARENT if parent is None else parent).to_bytes(8, "little"))
    h = _fnv1a64(h, len(items).to_bytes(8, "little"))
    for t in items:
        if t < 256:
            # The word's three zero bytes only multiply: (h ^ 0) * P three times is h * P^3.
            h = ((h ^ t) * _FNV_PRIME_4) & _MASK
        else:
            h = _fnv1a64(h, t.to_bytes(4, "little"))
    return _fmix64(h)


def prefix_hashes(
    text: str, *, block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS
) -> list[int]:
    """The chained keys of the full ``block_chars``-byte blocks leading ``text`` (UTF-8), at
    most ``max_blocks`` of them; a trailing partial block has none (as in the KV cache)."""
    data = text.encode("utf-8")
    out: list[int] = []
    parent: int | None = None
    for i in range(min(len(data) // block_chars, max_blocks)):
        parent = hash_block(parent, data[i * block_chars : (i + 1) * block_chars])
        out.append(parent)
    return out


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts: the text ones, in order
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def prompt_text(body: bytes) -> str | None:
    """The text a completion or chat request body starts its prompt with, or None (not JSON,
    no prompt, token-id prompts, several prompts: the router then balances by load alone)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    prompt = obj.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    messages = obj.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                return None
            # Role and content both, each closed by a separator no text holds, so that
            # ("ab", "c") and ("a", "bc") differ, as their rendered templates do.
            parts.append(f"{m.get('role', '')}\x00{_content_text(m.get('content'))}\x00")
        return "".join(parts)
    return None


class PrefixTable:
    """Which replicas were sent which leading blocks (module docs)."""

    def __init__(self, max_entries: int = 1 << 16) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._owners: OrderedDict[int, list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def match(self, hashes: Sequence[int]) -> tuple[int, list[str]]:
        """The number of leading blocks of the longest prefix seen before, and the replicas
        sent it (most recent last); ``(0, [])`` when the first block is new."""
        depth, owners = 0, []
        # Chained keys: block i's key is only present if some prompt had blocks 0..i, so the
        # deepest present key is the longest shared prefix.
        for i in range(len(hashes) - 1, -1, -1):
            found = self._owners.get(hashes[i])
            if found:
                depth, owners = i + 1, list(found)
                break
        return depth, owners

    def record(self, hashes: Iterable[int], replica: str) -> None:
        """Notes that ``replica`` was sent a prompt with these leading blocks."""
        for h in hashes:
            owners = self._owners.get(h)
            if owners is None:
                self._owners[h] = [replica]
            else:
                if replica in owners:
                    owners.remove(replica)
                owners.append(replica)
                self._owners.move_to_end(h)
        while len(self._owners) > self.max_entries:
            self._owners.popitem(last=False)

    def forget(self, replica: str) -> None:
        """Drops ``replica`` (gone: its cache went with it)."""
        for h in [h for h, owners in self._owners.items() if replica in owners]:
            owners = self._owners[h]
            owners.remove(replica)
            if not owners:
                del self._owners[h]
