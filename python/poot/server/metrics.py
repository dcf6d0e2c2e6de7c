"""Prometheus metrics of one server (``GET /metrics``), through ``prometheus_client``.

Each app has its own ``CollectorRegistry`` (two apps in one process never share counters).
Counters and histograms are updated by the routes as requests go; the engine's state (KV blocks,
prepared-entry cache, queue) is read when scraped, so it is never stale and costs nothing
between scrapes.

Outcomes of ``poot_requests_total``: ``ok`` (finished: stop or length), ``cancelled`` (by
``/v1/requests/{id}/cancel``), ``disconnected`` (the client went away), ``timeout``,
``rejected`` (429: the queue was full), ``invalid`` (4xx), ``error`` (5xx, or a completion
that ended with finish_reason ``error``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics", "OUTCOMES"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUTCOMES = ("ok", "cancelled", "disconnected", "timeout", "rejected", "invalid", "error")

# ``*_created`` series (one timestamp per counter) only clutter a scrape; off process-wide.
disable_created_metrics()

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _EngineCollector(Collector):
    """Reads the engine's gauges and counters at scrape time."""

    def __init__(self, read: Callable[[], dict[str, int] | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        s = self._read()
        if s is None:  # the model is still loading
            return
        gauges = {
            "poot_kv_blocks_used": ("KV cache blocks held by requests", "used_blocks"),
            "poot_kv_blocks_total": ("usable KV cache blocks", "num_blocks"),
            "poot_queue_depth": ("requests waiting for a row", "queue_depth"),
            "poot_requests_running": ("requests holding rows", "running"),
            "poot_prepared_entries": ("prepared step plans cached", "prepared_entries"),
        }
        for name, (doc, key) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=s.get(key, 0))
        counters = {
            "poot_prepared_entry_hits": ("prepared step-plan cache hits", "prepared_hits"),
            "poot_prepared_entry_misses": ("prepared step-plan cache misses", "prepared_misses"),
            "poot_prefix_cached_tokens": (
                "prompt tokens taken from the prefix cache",
                "prefill_cached_tokens",
            ),
            "poot_preemptions": ("sequences preempted (recomputed later)", "preemptions"),
            "poot_steps": ("engine steps run", "steps"),
        }
        for name, (doc, key) in counters.items():
            yield CounterMetricFamily(name, doc, value=s.get(key, 0))


class Metrics:
    """The server's metrics; ``render()`` is the body of ``GET /metrics``."""

    def __init__(self, read_engine: Callable[[], dict[str, int] | None]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "poot_requests", "requests by route and outcome", ["route", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("poot_prompt_tokens", "prompt tokens", registry=r)
        self.generated_tokens = Counter("poot_generation_tokens", "generated tokens", registry=r)
        self.ttft = Histogram(
            "poot_time_to_first_token_seconds",
            "time from a request's arrival to its first generated token",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "poot_inter_token_latency_seconds",
            "time between a request's successive generated tokens",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        r.register(_EngineCollector(read_engine))
        for route in ("completions", "chat"):
            for outcome in OUTCOMES:
                self.requests.labels(route, outcome)  # every series exists from the start

    def outcome(self, route: str, outcome: str) -> None:
        self.requests.labels(route, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
