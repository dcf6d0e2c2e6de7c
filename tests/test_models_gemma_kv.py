"""Gemma 2 / 3's interleaved sliding-window and global layers over the paged KV pool.

The design (docs/families.md, "Sliding windows and the paged KV pool"): the layers run as two
KV groups. The global layers' group keeps every position in the ``num_blocks`` pool; the
windowed layers' group has its own pool (``Scheduler.window_pool_blocks``) and block tables
(the step inputs ``window_slot_mapping`` and ``window_block_tables``), and after each step its
blocks wholly behind the window go back to that pool.

Checked here on the random-weight checkpoints of ``tests/family_models.py`` (windows of 6 and
7, blocks of 4 slots, prefill chunks of 4 tokens, so windows cross block and chunk boundaries
many times): a run far past the window gives the float64 full-KV reference's greedy ids and
logits, and the same ids and bit-identical logits as one block table for every layer (the
layout before the groups); the global group holds every block the sequence fills, the
windowed group at most its window's; every block of both groups returns at the end; the
runtime's pool holds the windowed layers' smaller share; a cached prefix is reused when the
windowed group still caches the blocks inside its window and recomputed when it does not.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from family_reference import reference_greedy, reference_logits

import poot
import poot.llm
from poot import _native
from poot.driver_options import DriverOptions, kv_pool_bytes
from poot.errors import ContextLengthError
from poot.llm import kv_group_window, kv_window

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
N = 40
BLOCK = 4
STEP = 4


def _llm(path: str, monkeypatch: pytest.MonkeyPatch | None = None, **kw: Any) -> poot.LLM:
    """An LLM with blocks of 4 and steps of 4 tokens; with ``monkeypatch``, one block table
    for every layer (no window group), as before the groups."""
    kw.setdefault("driver", DriverOptions(block_size=BLOCK, max_step_tokens=STEP, max_num_seqs=1))
    kw.setdefault("numerics", "exact")
    if kw.get("backend", "cpu") == "cpu":
        kw.setdefault("threads", 1)
    if monkeypatch is None:
        return poot.LLM(path, **kw)
    with monkeypatch.context() as m:
        m.setattr(poot.llm, "kv_group_window", lambda definition: None)
        return poot.LLM(path, **kw)


def _run(llm: poot.LLM, prompt: list[int], n: int) -> tuple[list[int], int, int]:
    """Greedy ids of one request stepped by hand, and the most blocks it held at once in
    the global and in the windowed group."""
    params = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    req = llm.make_request(prompt, params)
    core = llm.core
    core.add_request(req)
    peak = peak_window = 0
    while core.has_unfinished():
        core.step()
        peak = max(peak, llm.scheduler.used_blocks)
        peak_window = max(peak_window, llm.scheduler.used_window_blocks)
    # All back once it ends, in both groups.
    assert (llm.scheduler.used_blocks, llm.scheduler.used_window_blocks) == (0, 0)
    return list(req.out), peak, peak_window


def _window_span(w: int) -> int:
    """Most windowed blocks one request holds: the window behind a step, the step, rounding."""
    return math.ceil((w - 1 + STEP) / BLOCK) + 1


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_past_the_window_equals_the_full_kv_reference(family_checkpoints: Any, family: str) -> None:
    m = family_checkpoints(family)
    llm = _llm(str(m["gguf"]))
    windows = llm.definition.hparams.layer_windows
    assert any(w > 0 for w in windows) and any(w == 0 for w in windows)
    assert kv_window(llm.definition) is None
    w = kv_group_window(llm.definition)
    assert w == max(windows)
    assert llm.definition.window_group
    ids, peak, peak_window = _run(llm, PROMPT, N)
    assert ids == reference_greedy(family, m["weights"], PROMPT, N)
    # The global group holds every block the sequence fills; the windowed group its window.
    assert peak == math.ceil((len(PROMPT) + N - 1) / BLOCK)
    assert peak_window <= _window_span(w) < peak
    assert llm.scheduler.window_pool_blocks == _window_span(w) + 1
    # Logits at position 52, eight windows past the start, against the full-KV reference.
    seq = PROMPT + ids[:-1]
    ref = reference_logits(family, m["weights"], seq)[-1]
    np.testing.assert_allclose(llm.logits(seq), ref, rtol=0, atol=2e-4)
    assert (llm.scheduler.used_blocks, llm.scheduler.used_window_blocks) == (0, 0)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_the_window_group_equals_one_table_bit_for_bit(
    family_checkpoints: Any, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The groups change where the windowed layers' KV lives, not what attention reads: the
    same ids, and logits equal bit for bit at every length tried, as one block table."""
    path = str(family_checkpoints(family)["gguf"])
    grouped, single = _llm(path), _llm(path, monkeypatch)
    assert grouped.definition.window_group and not single.definition.window_group
    assert single.scheduler.window_pool_blocks == 0
    ids = _run(grouped, PROMPT, N)[0]
    assert _run(single, PROMPT, N)[0] == ids
    seq = PROMPT + ids[:-1]
    for n in (len(PROMPT), 30, len(seq)):
        np.testing.assert_array_equal(grouped.logits(seq[:n]), single.logits(seq[:n]))


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_the_global_group_still_keeps_every_position(family_checkpoints: Any, family: str) -> None:
    """A pool of 6 blocks of 4 (24 slots) cannot hold 13 + 40 tokens when a global layer
    reads them all: the request is refused up front, not cut short."""
    m = family_checkpoints(family)
    opts = DriverOptions(num_blocks=6, block_size=BLOCK, max_step_tokens=STEP, max_num_seqs=1)
    llm = _llm(str(m["gguf"]), driver=opts)
    params = poot.SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    with pytest.raises(ContextLengthError):
        llm.generate([PROMPT], params)
    assert llm.scheduler.used_blocks == 0


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_the_runtime_pool_holds_the_windowed_layers_share(
    family_checkpoints: Any, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(family_checkpoints(family)["gguf"])
    opts = DriverOptions(num_blocks=40, block_size=BLOCK, max_step_tokens=STEP, max_num_seqs=2)
    grouped, single = _llm(path, driver=opts), _llm(path, monkeypatch, driver=opts)
    h = grouped.definition.hparams
    windowed = sum(1 for i in range(h.n_layers) if h.window(i) > 0)
    assert grouped.definition.kv_windowed_layers == windowed
    s = grouped.scheduler
    assert s.window_pool_blocks == 2 * _window_span(max(h.layer_windows)) + 1
    entry = grouped.runtime.kv_entry_bytes
    want = kv_pool_bytes(h, BLOCK, entry, s.pool_blocks, windowed, s.window_pool_blocks)
    assert grouped.runtime.memory()["kv_bytes"] == want
    assert single.runtime.memory()["kv_bytes"] == kv_pool_bytes(h, BLOCK, entry, 41)
    assert want < single.runtime.memory()["kv_bytes"]


def test_a_cached_prefix_is_reused_while_the_window_is_cached(family_checkpoints: Any) -> None:
    path = str(family_checkpoints("gemma3")["gguf"])
    llm = _llm(path)
    first = _run(llm, PROMPT, 1)[0]
    before = llm.scheduler.stats()["cached_tokens"]
    # 12 tokens looked up (never the last): 3 blocks, whose window (blocks 1 and 2) the
    # windowed group freed at the end of the first request and still caches.
    assert _run(llm, PROMPT, 1)[0] == first
    assert llm.scheduler.stats()["cached_tokens"] - before == 12


def test_a_windowed_group_recomputes_the_window_it_evicted(family_checkpoints: Any) -> None:
    """The windowed group cannot reuse blocks it released and its pool then handed out
    again: a long run cycles its 4 usable blocks, so a second request with the same prompt
    finds the prompt's blocks in the global group but not its window in the windowed one,
    and recomputes the prompt in both. Its tokens are unchanged."""
    m = family_checkpoints("gemma3")
    llm = _llm(str(m["gguf"]))
    assert llm.scheduler.window_pool_blocks == 5
    first = _run(llm, PROMPT, N)[0]
    before = llm.scheduler.stats()["cached_tokens"]
    again = _run(llm, PROMPT, N)[0]
    assert llm.scheduler.stats()["cached_tokens"] - before == 0
    assert again == first == reference_greedy("gemma3", m["weights"], PROMPT, N)


def test_the_window_group_maps_kv_layers(family_checkpoints: Any) -> None:
    """Global layers take the runtime's first KV layers, windowed ones the last."""
    llm = _llm(str(family_checkpoints("gemma3")["gguf"]))
    d = llm.definition
    assert d.hparams.layer_windows == (6, 6, 0)
    assert [d.kv_layer(i) for i in range(3)] == [1, 2, 0]
    assert d.kv_windowed_layers == 2
    mistral = _llm(str(family_checkpoints("mistral")["gguf"]))
    assert kv_group_window(mistral.definition) is None
    with pytest.raises(ValueError, match="window group"):
        mistral.definition.with_window_group()


def test_gemma3_1b_pool_at_32k() -> None:
    """The numbers docs/families.md gives: Gemma 3 1B (26 layers, 4 global, one KV head of
    256, f16 KV, window 512) at 32768 positions, blocks of 16, 256-token steps."""

    class Gemma3_1B:
        n_layers, n_kv_heads, head_dim, context_length = 26, 1, 256, 32768

    mib = 1 << 20

    def pool(max_num_seqs: int) -> tuple[int, int]:
        s = _native.Scheduler(
            max_num_seqs=max_num_seqs,
            max_batched_tokens=256,
            max_step_tokens=256,
            max_model_len=32768,
            block_size=16,
            num_blocks=2048,
            window_group=512,
        )
        assert s.pool_blocks == 2049
        return s.window_pool_blocks, kv_pool_bytes(
            Gemma3_1B(), 16, 2, s.pool_blocks, 22, s.window_pool_blocks
        )

    single = kv_pool_bytes(Gemma3_1B(), 16, 2, 2049)
    assert round(single / mib, 1) == 832.4
    # One sequence: the windowed layers keep 50 blocks (784 positions and the null block).
    assert pool(1) == (50, 4 * 2049 * 16 * 1024 + 22 * 50 * 16 * 1024)
    assert pool(1)[1] / mib == 145.25
    # Eight sequences (the default rows): 8 * 49 + 1 windowed blocks.
    assert pool(8)[0] == 393
    assert round(pool(8)[1] / mib, 1) == 263.2
