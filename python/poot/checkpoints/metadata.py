"""``GgufMetadata``: a GGUF file's key/value metadata as a read-only mapping.

Scalars, strings and short arrays are converted to Python objects once, when the file is
opened. Long arrays (a tokenizer's tokens, scores, token types and merges: tens of thousands of
entries each) stay in the native file and are converted only when read, so an opened or loaded
model holds no Python copy of its vocabulary (about 10 MiB of objects for 50k tokens and merges).

Invariants:
    - Keys iterate in file order, and ``m[key] == GgufFile.get(key)`` for every key.
    - A long array is never cached: each read converts it again and returns a list the caller
      owns, which is freed when the caller drops it.
    - ``array_len`` answers without converting the array.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from poot._native import GgufFile

__all__ = ["LAZY_ARRAY_LEN", "GgufMetadata", "metadata_array_len"]

# Arrays longer than this are converted on access only. Short arrays (EOS id lists, per-layer
# head counts) stay eager; every vocabulary-sized one is far above it.
LAZY_ARRAY_LEN = 1024


class GgufMetadata(Mapping[str, Any]):
    """The metadata of one opened GGUF file.

    Args:
        gguf: the opened file.
        lazy_array_len: arrays with more entries than this are converted on each access.
    """

    def __init__(self, gguf: GgufFile, *, lazy_array_len: int = LAZY_ARRAY_LEN) -> None:
        self._gguf = gguf
        self._eager: dict[str, Any] = gguf.metadata(max_array_len=lazy_array_len)
        self._keys: tuple[str, ...] = tuple(gguf.keys())
        self._lazy = frozenset(k for k in self._keys if k not in self._eager)

    def __getitem__(self, key: str) -> Any:
        try:
            return self._eager[key]
        except KeyError:
            if key not in self._lazy:
                raise
        return self._gguf.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._eager or key in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        lazy = ", ".join(
            f"{k}: <{self.array_len(k)} entries>" for k in self._keys if k in self._lazy
        )
        return f"GgufMetadata({len(self._eager)} values; {lazy or 'no long arrays'})"

    @property
    def file(self) -> GgufFile:
        """The opened file the values come from."""
        return self._gguf

    @property
    def lazy_keys(self) -> frozenset[str]:
        """The keys whose arrays are converted on access."""
        return self._lazy

    def array_len(self, key: str) -> int | None:
        """Entries of the array under ``key``; None when absent or not an array."""
        if key in self._lazy:
            return self._gguf.array_len(key)
        value = self._eager.get(key)
        return len(value) if isinstance(value, list) else None


def metadata_array_len(metadata: Mapping[str, Any], key: str) -> int | None:
    """Entries of the array under ``key`` in any metadata mapping, converting nothing when it
    is a ``GgufMetadata``; None when absent or not an array."""
    if isinstance(metadata, GgufMetadata):
        return metadata.array_len(key)
    value = metadata.get(key)
    return len(value) if isinstance(value, list | tuple) else None
