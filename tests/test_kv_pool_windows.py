"""The KV pool's size counts what sliding windows save (``DriverOptions.fit`` / ``resolve``
with ``poot.kv_windows.KvWindows``).

A window group (Gemma 2 and 3) keeps every position only for its global layers: the
scheduler's blocks cost the global layers' bytes, and each row costs its window's blocks in the
windowed group's own pool. With every layer windowed (Mistral's sliding window) a sequence
holds only its window's blocks. So for the same memory budget a windowed model gets more
blocks (a window group) or more rows (every layer windowed), and a request that does not fit
without the saving runs. Checked on the arithmetic (Gemma 3 1B's shape), against the
scheduler's own window pool and the runtime's own ``kv_bytes``, and on the random-weight
Gemma 3 and Mistral checkpoints of ``tests/family_models.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from family_reference import reference_greedy

import poot
import poot.llm
from poot import _native
from poot.driver_options import DriverOptions, kv_block_bytes, kv_pool_bytes
from poot.errors import ConfigError
from poot.kv_windows import KvWindows, kv_windows, window_span_blocks

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
MIB = 1 << 20


@dataclass(frozen=True)
class _Shape:
    """Gemma 3 1B's KV shape (26 layers, one KV head of 256) at 32768 positions."""

    n_layers: int = 26
    n_kv_heads: int = 1
    head_dim: int = 256
    context_length: int = 32768


GROUP = KvWindows(window=512, windowed_layers=22, grouped=True)
EVERY = KvWindows(window=512, windowed_layers=26, grouped=False)


def _scheduler(opts: DriverOptions, max_model_len: int, **windows: int) -> Any:
    assert opts.num_blocks is not None
    return _native.Scheduler(
        max_num_seqs=min(opts.max_num_seqs, opts.max_step_tokens),
        max_batched_tokens=opts.max_step_tokens,
        max_step_tokens=opts.max_step_tokens,
        max_model_len=max_model_len,
        block_size=opts.block_size,
        num_blocks=opts.num_blocks,
        **windows,
    )


def test_the_span_is_the_scheduler_s() -> None:
    for window, step, block, rows in [(512, 256, 16, 8), (6, 4, 4, 1), (7, 4, 4, 2), (5, 3, 8, 3)]:
        opts = DriverOptions(
            max_num_seqs=rows, max_step_tokens=step, block_size=block, num_blocks=10_000
        )
        s = _scheduler(opts, 4096, window_group=window)
        assert s.window_pool_blocks == rows * window_span_blocks(window, step, block) + 1


def test_fit_gives_a_window_group_the_blocks_its_global_layers_leave() -> None:
    shape, budget = _Shape(), 1 << 30
    plain = DriverOptions.fit(shape, budget, 0.0, entry_bytes=2, max_rows=4)
    grouped = DriverOptions.fit(shape, budget, 0.0, entry_bytes=2, max_rows=4, windows=GROUP)
    assert plain.num_blocks is not None and grouped.num_blocks is not None
    # 1 GiB of f16 KV: one table for every layer holds 2520 blocks of 16, one 32k sequence
    # (2048 blocks); the global layers' 4 hold 7 such sequences beside their windows.
    assert (plain.num_blocks, plain.max_num_seqs) == (2520, 1)
    assert grouped.max_num_seqs == 4 and grouped.num_blocks > 4 * 2048
    # What the runtime then allocates (the scheduler's window pool, both null blocks) fits.
    s = _scheduler(grouped, 8192, window_group=512)
    used = kv_pool_bytes(shape, 16, 2, s.pool_blocks, 22, s.window_pool_blocks)
    block = kv_block_bytes(shape, 16, 2) * 4 // 26
    assert budget - block < used <= budget + block


def test_fit_gives_every_layer_windowed_the_rows_its_windows_leave() -> None:
    shape = _Shape()
    budget = 64 * MIB
    with pytest.raises(ConfigError, match="needs 2048"):
        DriverOptions.fit(shape, budget, 0.0, entry_bytes=2)
    opts = DriverOptions.fit(shape, budget, 0.0, entry_bytes=2, windows=EVERY)
    # A row holds at most ceil((511 + 256) / 16) + 1 = 49 blocks of 416 KiB.
    assert opts.num_blocks == budget // kv_block_bytes(shape, 16, 2) == 157
    assert opts.max_num_seqs == 157 // 49 == 3


def test_fit_still_refuses_what_no_saving_fits() -> None:
    with pytest.raises(ConfigError, match="windowed blocks"):
        DriverOptions.fit(_Shape(), 100 * MIB, 0.0, entry_bytes=2, windows=GROUP)


def test_the_default_pool_counts_the_group() -> None:
    shape, opts = _Shape(), DriverOptions()
    plain = opts.resolve(shape, 8192, 2)
    grouped = opts.resolve(shape, 8192, 2, GROUP)
    # 256 MiB of every layer: 630 blocks; of the 4 global layers, beside 8 rows of windows:
    # 1934 (at 32768 positions both are one sequence's 2048: its windows need 263 MiB).
    assert (plain.num_blocks, grouped.num_blocks) == (630, 1934)
    assert opts.resolve(shape, 32768, 2, GROUP).num_blocks == 2048
    # The default 8 rows of windows (393 blocks with the null block) and the global blocks
    # stay within the 256 MiB default.
    s = _scheduler(grouped, 8192, window_group=512)
    assert s.window_pool_blocks == 393
    assert kv_pool_bytes(shape, 16, 2, grouped.num_blocks, 22, 393) <= 256 * MIB
    # The log line states what the pools hold.
    line = grouped.log_line(shape, 2, GROUP)
    kv = grouped.num_blocks * 4 * 16 * 1024 + 392 * 22 * 16 * 1024
    assert f"blocks={grouped.num_blocks} " in line and f"kv_bytes={kv} " in line


def _definition(path: str) -> Any:
    from poot.checkpoints import resolve_model_files
    from poot.models import model_definition

    return model_definition(resolve_model_files(path))


def test_the_window_kinds_of_the_families(family_checkpoints: Any) -> None:
    for family, want in [
        ("gemma3", KvWindows(6, 2, grouped=True)),
        ("mistral", KvWindows(5, 2, grouped=False)),
        ("qwen3", None),
    ]:
        assert kv_windows(_definition(str(family_checkpoints(family)["gguf"]))) == want, family


def _least_budgets(h: Any, w: KvWindows, max_model_len: int, **kw: Any) -> tuple[int, int]:
    """The least bytes ``fit`` accepts for one ``max_model_len`` sequence without windows,
    and with them."""

    def need(windows: KvWindows | None) -> int:
        lo, hi = 1, 1 << 30
        while lo < hi:  # the least budget fit accepts
            mid = (lo + hi) // 2
            try:
                DriverOptions.fit(h, mid, 0.0, max_model_len=max_model_len, windows=windows, **kw)
                hi = mid
            except ConfigError:
                lo = mid + 1
        return lo

    return need(None), need(w)


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_a_long_generation_fits_only_with_the_saving(family_checkpoints: Any, family: str) -> None:
    m = family_checkpoints(family)
    path = str(m["gguf"])
    definition = _definition(path)
    h, windows = definition.hparams, kv_windows(definition)
    assert windows is not None
    kw: dict[str, Any] = {"block_size": 4, "max_step_tokens": 4, "entry_bytes": 4}
    plain_need, budget = _least_budgets(h, windows, 64, **kw)
    assert budget < plain_need
    with pytest.raises(ConfigError, match="needs 16"):
        DriverOptions.fit(h, budget, 0.0, max_model_len=64, **kw)
    opts = DriverOptions.fit(h, budget, 0.0, max_model_len=64, windows=windows, **kw)
    llm = poot.LLM(path, threads=1, numerics="exact", max_model_len=64, driver=opts)
    assert llm.runtime.memory()["kv_bytes"] <= budget + kv_block_bytes(h, 4, 4)
    n = 64 - len(PROMPT)
    params = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(family, m["weights"], PROMPT, n)
    assert llm.scheduler.used_blocks == 0


def test_the_llm_default_pool_counts_the_group(
    family_checkpoints: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 64 rows of 1024 positions: more than 256 MiB of every layer (2730 blocks), within it
    # for the global layer beside the rows' windows.
    path = str(family_checkpoints("gemma3")["gguf"])
    kw: dict[str, Any] = {"threads": 1, "numerics": "exact", "max_model_len": 1024}
    grouped = poot.LLM(path, max_num_seqs=64, **kw)
    monkeypatch.setattr(poot.llm, "kv_windows", lambda definition: None)
    plain = poot.LLM(path, max_num_seqs=64, **kw)
    assert plain.driver.num_blocks == 2730
    assert grouped.driver.num_blocks is not None and plain.driver.num_blocks is not None
    assert grouped.driver.num_blocks > plain.driver.num_blocks
    assert grouped.runtime.memory()["kv_bytes"] <= 256 * MIB
