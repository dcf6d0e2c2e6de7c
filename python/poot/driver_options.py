"""``poot.DriverOptions``: the batch settings of the driver (scheduler, KV pool, plan cache).

Library callers build one and pass it as ``LLM(model, driver=DriverOptions(...))``; the
matching ``LLM`` keywords still work and override the options' fields. The server path reads no
batch settings: ``DriverOptions.fit`` sizes the KV pool and the rows to the memory left free
after the weights, keeping a stated reserve. ``LLM`` logs one line at start (logger ``"poot"``)
with what it chose: rows, step tokens, blocks and KV bytes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from poot.errors import ConfigError
from poot.kv_windows import KvWindows
from poot.prepared import PreparedPolicy

__all__ = ["DriverOptions", "kv_block_bytes", "kv_pool_bytes"]

logger = logging.getLogger("poot")

# Default KV pool: room for this many bytes (at least one full-length sequence).
DEFAULT_KV_BYTES = 256 << 20


class KvShape(Protocol):
    """The hyperparameters that size the KV cache (``ModelHParams`` has them)."""

    @property
    def n_layers(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def context_length(self) -> int: ...


def kv_block_bytes(hparams: KvShape, block_size: int, entry_bytes: int = 4) -> int:
    """Bytes of one KV block: K and V for ``block_size`` tokens over every layer and KV head.

    ``entry_bytes`` is 4 for an f32 cache (``"exact"``) and 2 for f16 (``"ggml"``).
    """
    return 2 * entry_bytes * hparams.n_layers * hparams.n_kv_heads * hparams.head_dim * block_size


def kv_pool_bytes(
    hparams: KvShape,
    block_size: int,
    entry_bytes: int,
    pool_blocks: int,
    windowed_layers: int = 0,
    window_pool_blocks: int = 0,
) -> int:
    """Bytes of a runtime's KV pool: ``pool_blocks`` blocks (``Scheduler.pool_blocks``, the
    null block included) for every layer, but ``window_pool_blocks`` for the
    ``windowed_layers`` of a window group (``Scheduler.window_pool_blocks``)."""
    per_layer_block = 2 * entry_bytes * hparams.n_kv_heads * hparams.head_dim * block_size
    global_layers = hparams.n_layers - windowed_layers
    blocks = global_layers * pool_blocks + windowed_layers * window_pool_blocks
    return blocks * per_layer_block


@dataclass(frozen=True)
class _PoolCost:
    """What the KV pool costs for one model: ``block_bytes`` per block of the scheduler's
    pool (every layer, or the global layers of a window group), ``seq_blocks`` of them for one
    ``max_model_len`` sequence (only its window's when every layer is windowed), and for a
    window group ``window_block_bytes`` per block of its own pool, ``window_row_blocks`` of
    them per row."""

    block_bytes: int
    seq_blocks: int
    window_block_bytes: int = 0
    window_row_blocks: int = 0

    @property
    def window_row_bytes(self) -> int:
        return self.window_row_blocks * self.window_block_bytes


def _pool_cost(
    hparams: KvShape,
    block_size: int,
    entry_bytes: int,
    seq_len: int,
    step_tokens: int,
    windows: KvWindows | None,
) -> _PoolCost:
    layer_block = kv_block_bytes(hparams, block_size, entry_bytes) // hparams.n_layers
    seq_blocks = -(-seq_len // block_size)
    if windows is None:
        return _PoolCost(hparams.n_layers * layer_block, seq_blocks)
    span = windows.span_blocks(step_tokens, block_size)
    if not windows.grouped:
        return _PoolCost(hparams.n_layers * layer_block, min(seq_blocks, span))
    global_layers = hparams.n_layers - windows.windowed_layers
    return _PoolCost(
        global_layers * layer_block, seq_blocks, windows.windowed_layers * layer_block, span
    )


@dataclass(frozen=True)
class DriverOptions:
    """Batch settings of an ``LLM``'s driver.

    Attributes:
        max_num_seqs: most rows (sequences) in one step.
        max_step_tokens: most tokens batched in one step (also the prefill chunk size).
        block_size: tokens per KV block.
        num_blocks: usable KV blocks in the pool (None: enough for 256 MiB of KV, at least one
            ``max_model_len`` sequence, at most ``max_num_seqs`` of them).
        enable_prefix_caching: reuse cached KV blocks of shared prompt prefixes.
        max_prepared_entries, max_prepared_bytes: bounds of the prepared step-plan cache.
        prepared_policy: ``"evict"`` the least recently used entry, or ``"refuse"`` a new one.

    Raises:
        ConfigError: a setting is out of range (at construction).
    """

    max_num_seqs: int = 8
    max_step_tokens: int = 256
    block_size: int = 16
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    max_prepared_entries: int = 64
    max_prepared_bytes: int = 1 << 30
    prepared_policy: PreparedPolicy = "evict"

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "max_step_tokens",
            "block_size",
            "max_prepared_entries",
            "max_prepared_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        nb = self.num_blocks
        if nb is not None and (isinstance(nb, bool) or not isinstance(nb, int) or nb < 1):
            raise ConfigError(f"num_blocks must be an int >= 1 or None, got {nb!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigError(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}"
            )
        if self.prepared_policy not in ("evict", "refuse"):
            raise ConfigError(
                f'prepared_policy must be "evict" or "refuse", got {self.prepared_policy!r}'
            )

    def with_overrides(self, **overrides: Any) -> DriverOptions:
        """A copy with every override that is not None applied (validated again)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self

    @classmethod
    def fit(
        cls,
        hparams: KvShape,
        free_bytes: int,
        reserve_fraction: float = 0.1,
        *,
        max_model_len: int | None = None,
        entry_bytes: int = 4,
        block_size: int = 16,
        max_step_tokens: int = 256,
        max_rows: int = 256,
        windows: KvWindows | None = None,
        **options: Any,
    ) -> DriverOptions:
        """Options sized to ``free_bytes`` (memory free after the weights).

        ``reserve_fraction`` of it is kept back (activations, scratch); the rest becomes KV
        blocks. Rows are as many full ``max_model_len`` sequences as that memory holds,
        capped by ``max_rows`` and ``max_step_tokens``; what the rows leave goes to more
        blocks (the prefix cache's room). Without windows ``num_blocks = floor(free_bytes *
        (1 - reserve_fraction) / block_bytes)``. ``windows`` (``poot.kv_windows.kv_windows``
        of the model) counts what sliding windows save: with every layer windowed a sequence
        holds only its window's blocks; with a window group the scheduler's blocks cover the
        global layers only and each row costs its window's blocks in the group's own pool.
        ``max_model_len`` defaults to the model's context. Other ``DriverOptions`` fields pass
        through ``options``.

        Raises:
            ConfigError: the reserve is out of [0, 1), or the memory left does not hold one
                ``max_model_len`` sequence.
        """
        if not 0.0 <= reserve_fraction < 1.0:
            raise ConfigError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
        if block_size < 1 or max_rows < 1:
            raise ConfigError("block_size and max_rows must be >= 1")
        seq_len = hparams.context_length if max_model_len is None else max_model_len
        cost = _pool_cost(hparams, block_size, entry_bytes, seq_len, max_step_tokens, windows)
        usable = int(free_bytes * (1.0 - reserve_fraction))
        # A window group's pool also holds its null block.
        room = usable - cost.window_block_bytes
        row_bytes = cost.seq_blocks * cost.block_bytes + cost.window_row_bytes
        if room < row_bytes:
            group = (
                f" and {cost.window_row_blocks} windowed blocks of {cost.window_block_bytes} bytes"
                if cost.window_row_blocks
                else ""
            )
            raise ConfigError(
                f"{free_bytes} free bytes less a {reserve_fraction:.0%} reserve hold "
                f"{usable // cost.block_bytes} KV blocks of {cost.block_bytes} bytes; one "
                f"sequence of {seq_len} tokens needs {cost.seq_blocks}{group}"
            )
        rows = max(1, min(room // row_bytes, max_rows, max_step_tokens))
        num_blocks = (room - rows * cost.window_row_bytes) // cost.block_bytes
        return cls(
            max_num_seqs=rows,
            max_step_tokens=max_step_tokens,
            block_size=block_size,
            num_blocks=num_blocks,
            **options,
        )

    def resolve(
        self,
        hparams: KvShape,
        max_model_len: int,
        entry_bytes: int,
        windows: KvWindows | None = None,
    ) -> DriverOptions:
        """These options with ``num_blocks`` filled in (the default pool when None): room for
        ``max_num_seqs`` sequences of ``max_model_len`` within 256 MiB (at least one), counting
        what ``windows`` saves as ``fit`` does."""
        if self.num_blocks is not None:
            return self
        cost = self._cost(hparams, max_model_len, entry_bytes, windows)
        rows = min(self.max_num_seqs, self.max_step_tokens)
        group_bytes = (rows * cost.window_row_blocks + 1) * cost.window_block_bytes
        room = max(0, DEFAULT_KV_BYTES - group_bytes)
        num_blocks = max(
            cost.seq_blocks,
            min(room // cost.block_bytes, cost.seq_blocks * self.max_num_seqs),
        )
        return dataclasses.replace(self, num_blocks=num_blocks)

    def _cost(
        self, hparams: KvShape, max_model_len: int, entry_bytes: int, windows: KvWindows | None
    ) -> _PoolCost:
        return _pool_cost(
            hparams, self.block_size, entry_bytes, max_model_len, self.max_step_tokens, windows
        )

    def log_line(self, hparams: KvShape, entry_bytes: int, windows: KvWindows | None = None) -> str:
        """The one line ``LLM`` logs at start: what the driver chose (``kv_bytes``: the
        usable blocks of every pool)."""
        blocks = self.num_blocks or 0
        cost = self._cost(hparams, hparams.context_length, entry_bytes, windows)
        rows = min(self.max_num_seqs, self.max_step_tokens)
        group_blocks = min(rows * cost.window_row_blocks, blocks)
        kv = blocks * cost.block_bytes + group_blocks * cost.window_block_bytes
        return (
            f"driver: rows={self.max_num_seqs} step_tokens={self.max_step_tokens} "
            f"blocks={blocks} block_size={self.block_size} kv_bytes={kv} "
            f"({kv / (1 << 20):.1f} MiB) prefix_caching={self.enable_prefix_caching}"
        )
