"""The prepared-entry cache: compiled step plans kept by step shape, bounded twice.

An entry is one traced and compiled plan for one ``StepShape``. The cache is bounded by entry
count (``max_entries``) and by retained bytes (``max_bytes``), where an entry's bytes are its
plan's ``artifact_bytes`` (what the native ``Plan`` holds: schedule, buffers, generated code).
Past either limit a new entry is evicted for (``policy="evict"``: least recently used first) or
refused (``policy="refuse"``: ``PreparedEntryLimitError``). An entry larger than ``max_bytes`` on
its own is refused under either policy. Hits, misses, evictions and refusals are counted.

Invariants:
    - ``len(cache) <= max_entries`` and ``cache.bytes <= max_bytes`` at all times.
    - A refused entry is not kept and leaves the cache as it was.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, Literal, Protocol, TypeVar

from poot.errors import ConfigError, PreparedEntryLimitError

__all__ = ["PreparedCache", "PreparedPolicy"]

PreparedPolicy = Literal["evict", "refuse"]


class _Sized(Protocol):
    @property
    def artifact_bytes(self) -> int: ...


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=_Sized)


class PreparedCache(Generic[K, V]):
    """An LRU of prepared entries bounded by count and bytes.

    Args:
        max_entries: most entries kept (>= 1).
        max_bytes: most bytes kept, summed over entries' ``artifact_bytes`` (>= 1).
        policy: ``"evict"`` (drop least recently used) or ``"refuse"`` (raise) when full.

    Raises:
        ConfigError: a limit is below 1 or the policy is unknown.
    """

    def __init__(self, max_entries: int, max_bytes: int, policy: PreparedPolicy = "evict") -> None:
        if max_entries < 1:
            raise ConfigError(f"max_prepared_entries must be >= 1, got {max_entries}")
        if max_bytes < 1:
            raise ConfigError(f"max_prepared_bytes must be >= 1, got {max_bytes}")
        if policy not in ("evict", "refuse"):
            raise ConfigError(f"prepared_policy must be 'evict' or 'refuse', got {policy!r}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.policy: PreparedPolicy = policy
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.refusals = 0
        # Told each evicted key (a holder of the same entries elsewhere drops it too).
        self.on_evict: Callable[[K], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[K]:
        """Keys held, least recently used first."""
        return list(self._entries)

    def get_or_prepare(self, key: K, prepare: Callable[[K], V]) -> V:
        """The entry for ``key``; on a miss ``prepare(key)`` makes it and it is admitted.

        Raises:
            PreparedEntryLimitError: the entry does not fit (see the module doc); not kept.
        """
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry
        self.misses += 1
        if self.policy == "refuse" and len(self._entries) + 1 > self.max_entries:
            self._refuse("entries", self.max_entries, len(self._entries) + 1)
        entry = prepare(key)
        size = int(entry.artifact_bytes)
        if size > self.max_bytes:
            self._refuse("bytes", self.max_bytes, size)
        if self.policy == "refuse" and self.bytes + size > self.max_bytes:
            self._refuse("bytes", self.max_bytes, self.bytes + size)
        while self._entries and (
            len(self._entries) + 1 > self.max_entries or self.bytes + size > self.max_bytes
        ):
            gone, old = self._entries.popitem(last=False)
            self.bytes -= int(old.artifact_bytes)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(gone)
        self._entries[key] = entry
        self.bytes += size
        return entry

    def touch(self, key: K, hits: int = 1) -> None:
        """Records ``hits`` uses of a held entry made elsewhere (it becomes the most recent);
        nothing when ``key`` is not held."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += hits

    def _refuse(self, resource: str, limit: int, total: int) -> None:
        self.refusals += 1
        raise PreparedEntryLimitError(
            f"prepared entry refused: {resource} would be {total}, past the limit of {limit} "
            f"(max_prepared_{resource}); raise the limit or use prepared_policy='evict'",
            resource=resource,
            limit=limit,
            total=total,
        )

    def stats(self) -> dict[str, int]:
        """``prepared_entries``, ``prepared_bytes``, ``prepared_hits``, ``prepared_misses``,
        ``prepared_evictions`` and ``prepared_refusals``."""
        return {
            "prepared_entries": len(self._entries),
            "prepared_bytes": self.bytes,
            "prepared_hits": self.hits,
            "prepared_misses": self.misses,
            "prepared_evictions": self.evictions,
            "prepared_refusals": self.refusals,
        }
