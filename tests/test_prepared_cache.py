"""The prepared-entry cache (``poot.prepared.PreparedCache``): compiled step plans bounded by
entry count and retained bytes (each plan's ``artifact_bytes``), evicting LRU or refusing with
``PreparedEntryLimitError``; and its counters in ``LLM.stats``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from poot import SamplingParams, errors
from poot.prepared import PreparedCache

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
# 11 tokens in steps of at most 8: prefill shapes of 8 and 4 tokens, then 1-token decode steps.
PROMPT = [1, *range(300, 310)]


@dataclass
class Entry:
    artifact_bytes: int


def make(sizes: dict[str, int], made: list[str]) -> Callable[[str], Entry]:
    def prepare(key: str) -> Entry:
        made.append(key)
        return Entry(sizes[key])

    return prepare


def test_counters_and_lru_eviction() -> None:
    made: list[str] = []
    prepare = make({"a": 10, "b": 10, "c": 10}, made)
    cache: PreparedCache[str, Entry] = PreparedCache(2, 100)
    for key in "aabac":
        cache.get_or_prepare(key, prepare)
    # "b" was least recently used when "c" came.
    assert made == ["a", "b", "c"] and cache.keys() == ["a", "c"]
    assert cache.stats() == {
        "prepared_entries": 2,
        "prepared_bytes": 20,
        "prepared_hits": 2,
        "prepared_misses": 3,
        "prepared_evictions": 1,
        "prepared_refusals": 0,
    }


def test_evict_keeps_bytes_within_the_limit() -> None:
    sizes = {"a": 40, "b": 40, "c": 70, "d": 10}
    cache: PreparedCache[str, Entry] = PreparedCache(10, 100)
    for key in "abcdab":
        cache.get_or_prepare(key, make(sizes, []))
        assert cache.bytes <= 100 and cache.bytes == sum(sizes[k] for k in cache.keys())
    assert cache.evictions > 0


def test_refuse_names_the_limit_and_keeps_the_cache() -> None:
    sizes = {"a": 40, "b": 40, "c": 30}
    by_count: PreparedCache[str, Entry] = PreparedCache(2, 1000, "refuse")
    by_count.get_or_prepare("a", make(sizes, []))
    by_count.get_or_prepare("b", make(sizes, []))
    made: list[str] = []
    with pytest.raises(errors.PreparedEntryLimitError) as e:
        by_count.get_or_prepare("c", make(sizes, made))
    assert (e.value.resource, e.value.limit, e.value.total) == ("entries", 2, 3)
    assert made == [] and by_count.keys() == ["a", "b"] and by_count.refusals == 1
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, errors.PootError)

    by_bytes: PreparedCache[str, Entry] = PreparedCache(10, 100, "refuse")
    by_bytes.get_or_prepare("a", make(sizes, []))
    by_bytes.get_or_prepare("b", make(sizes, []))
    with pytest.raises(errors.PreparedEntryLimitError) as e:
        by_bytes.get_or_prepare("c", make(sizes, []))
    assert (e.value.resource, e.value.limit, e.value.total) == ("bytes", 100, 110)
    assert by_bytes.keys() == ["a", "b"] and by_bytes.bytes == 80
    assert by_bytes.get_or_prepare("a", make(sizes, [])).artifact_bytes == 40


def test_an_entry_larger_than_the_byte_limit_is_refused_under_evict() -> None:
    cache: PreparedCache[str, Entry] = PreparedCache(10, 50)
    cache.get_or_prepare("a", make({"a": 20}, []))
    with pytest.raises(errors.PreparedEntryLimitError) as e:
        cache.get_or_prepare("big", make({"big": 51}, []))
    assert (e.value.resource, e.value.total) == ("bytes", 51)
    assert cache.keys() == ["a"]


@pytest.mark.parametrize(
    "kw",
    [{"max_entries": 0, "max_bytes": 1}, {"max_entries": 1, "max_bytes": 0}],
)
def test_bad_limits(kw: dict[str, int]) -> None:
    with pytest.raises(errors.ConfigError):
        PreparedCache(**kw)
    with pytest.raises(errors.ConfigError):
        PreparedCache(1, 1, "drop")  # type: ignore[arg-type]


# ---- through LLM ---------------------------------------------------------------------------


@pytest.fixture
def build(make_llm: Callable[..., Any], stories: Path) -> Callable[..., Any]:
    def b(**kw: Any) -> Any:
        return make_llm(stories / "stories260K-f32.gguf", "cpu", max_step_tokens=8, **kw)

    return b


def test_llm_counts_hits_and_misses(build: Callable[..., Any]) -> None:
    llm = build()
    llm.generate(PROMPT, GREEDY)
    s = llm.stats()
    # Shapes 8, 4 and 1 tokens: three misses; the three later decode steps hit.
    assert (s["prepared_misses"], s["prepared_hits"], s["prepared_entries"]) == (3, 2, 3)
    assert s["prepared_bytes"] == sum(
        llm.runner.plans._entries[k].artifact_bytes for k in llm.runner.cached_plans
    )
    assert s["prepared_bytes"] > 0
    llm.generate(PROMPT, GREEDY)
    s2 = llm.stats()
    assert s2["prepared_misses"] == 3 and s2["prepared_hits"] == 2 + 5
    assert s2["prepared_evictions"] == s2["prepared_refusals"] == 0


def test_llm_evict_keeps_within_limits_and_output(build: Callable[..., Any]) -> None:
    want = build().generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    by_count = build(max_prepared_entries=1)
    assert by_count.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == want
    s = by_count.stats()
    assert s["prepared_entries"] == 1 and s["prepared_evictions"] == 2
    # One plan's bytes: the byte limit then holds one or two entries, never more.
    small = build()
    small.generate(PROMPT, GREEDY)
    biggest = max(small.runner.plans._entries[k].artifact_bytes for k in small.runner.cached_plans)
    by_bytes = build(max_prepared_bytes=biggest + 1)
    assert by_bytes.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == want
    s = by_bytes.stats()
    assert s["prepared_bytes"] <= biggest + 1 and s["prepared_evictions"] > 0
    assert s["used_blocks"] == 0


@pytest.mark.parametrize("by", ["entries", "bytes"])
def test_llm_refuse_raises_and_stays_usable(build: Callable[..., Any], by: str) -> None:
    # Room for exactly the first plan (the 8-token prefill): by count, or by its own bytes
    # (measured, since a plan's bytes follow the graph IR's layout).
    if by == "entries":
        limit = {"max_prepared_entries": 1}
    else:
        probe = build(max_prepared_entries=1)
        probe.generate(PROMPT[:8], SamplingParams(max_tokens=1, temperature=0.0))
        (first,) = probe.runner.cached_plans
        limit = {"max_prepared_bytes": probe.runner.plans._entries[first].artifact_bytes}
    llm = build(prepared_policy="refuse", **limit)
    with pytest.raises(errors.PreparedEntryLimitError) as e:
        llm.generate(PROMPT, GREEDY)
    assert e.value.resource == ("entries" if "max_prepared_entries" in limit else "bytes")
    assert e.value.total > e.value.limit
    s = llm.stats()
    assert s["used_blocks"] == 0 and s["prepared_refusals"] == 1
    assert not llm.scheduler.has_unfinished_requests and not llm.scheduler.step_in_flight
    # The cached 8-token shape still serves: an 8-token prompt and one sampled token.
    out = llm.generate(PROMPT[:8], SamplingParams(max_tokens=1, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 1
    assert llm.stats()["used_blocks"] == 0


def test_llm_bad_prepared_settings(build: Callable[..., Any]) -> None:
    with pytest.raises(errors.ConfigError):
        build(prepared_policy="sometimes")
    with pytest.raises(errors.ConfigError):
        build(max_prepared_entries=0)
