"""``PrefixRouter``: Ray Serve's request-router extension point, routing by prompt prefix.

Serve calls ``choose_replicas`` in the caller's process (the ingress, through its
``DeploymentHandle``) with each pending request; it returns ranks of replicas, and Serve sends
the request to the least-loaded replica of the first rank that has room
(``max_ongoing_requests``), probing queue lengths itself. The ingress passes a ``Route`` as the
``route`` keyword of each call; this router reads it:

- ``pin``: a replica id (cancel, per-replica health and metrics): that replica alone while it
  lives; gone, any replica (a cancel then answers 404: its request died with its replica).
- ``prefix``: the prompt's leading block keys (``poot.serve.prefix``): the replicas that were
  sent the longest of those prefixes come first, unless they are busy (``busy_requests`` or
  more ongoing requests beyond the least-loaded replica's): then, like a request with no
  prefix seen before, the least-loaded replica of all. After routing, the request's blocks
  are recorded against its replica.

Each process that routes keeps its own ``PrefixTable`` (no shared actor on the request path);
with one ingress replica that is one table. Replicas that die are forgotten. Every router of a
deployment in this process is registered (``poot.serve.routing``, with ``Route``: Serve ships
this module by value, so nothing shared may live here), so the ingress can list the live
replicas for per-replica health and metrics.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from poot.serve import routing
from poot.serve.prefix import PrefixTable

__all__ = ["PrefixRouter", "RoundRobinRouter"]


@dataclass
class _Counts:
    by_prefix: int = 0
    by_load: int = 0
    pinned: int = 0


def _route(pending: PendingRequest | None) -> routing.Route | None:
    if pending is None:
        return None
    route = pending.kwargs.get("route")
    return route if isinstance(route, routing.Route) else None


class PrefixRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Prefix-affine routing with a least-loaded fallback (module docs)."""

    def initialize_state(
        self, busy_requests: int = 8, max_entries: int = 1 << 16, **_: Any
    ) -> None:
        """``request_router_kwargs``: ``busy_requests``, how many more ongoing requests than
        the least-loaded replica make a replica busy; ``max_entries``, the prefix table's
        bound."""
        if busy_requests < 1:
            raise ValueError(f"busy_requests must be >= 1, got {busy_requests}")
        self._busy = busy_requests
        self._table = PrefixTable(max_entries)
        self.counts = _Counts()
        routing.register(self._deployment_id.app_name, self._deployment_id.name, self)

    async def _queue_lens(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int]:
        lens: dict[ReplicaID, int] = {}
        unknown = []
        for r in replicas:
            n = self._replica_queue_len_cache.get(r.replica_id)
            if n is None:
                unknown.append(r)
            else:
                lens[r.replica_id] = n
        if unknown:
            for r, n in await self._probe_queue_lens(unknown, 0):
                if n is not None:
                    lens[r.replica_id] = n
        return lens

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        route = _route(pending_request)
        everyone = list(candidate_replicas)
        random.shuffle(everyone)  # equal loads: spread new prefixes instead of piling up
        if route is None:
            return [everyone]
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        if route.pin is not None:
            pinned = by_id.get(route.pin)
            if pinned is not None:
                self.counts.pinned += 1
                return [[pinned]]
            return [everyone]
        if route.prefix:
            _, owners = self._table.match(route.prefix)
            preferred = [by_id[o] for o in reversed(owners) if o in by_id]
            if preferred:
                # Busy is relative, as in SGLang's cache-aware router: an absolute bound
                # spilled a shared prefix whenever the whole deployment was loaded (8 clients
                # on 2 replicas sit at 4 each), which threw its cache hits away for nothing.
                lens = await self._queue_lens(everyone)
                least = min((lens.get(r.replica_id, 0) for r in everyone), default=0)
                free = [r for r in preferred if lens.get(r.replica_id, 0) < least + self._busy]
                if free:
                    self.counts.by_prefix += 1
                    rest = [r for r in everyone if r not in free]
                    return [free, rest] if rest else [free]
        self.counts.by_load += 1
        return [everyone]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        route = _route(pending_request)
        if route is not None and route.prefix and route.pin is None:
            self._table.record(route.prefix, replica_id.to_full_id_str())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._table.forget(replica_id.to_full_id_str())

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = set(self._replica_id_set)
        super().update_replicas(replicas)
        for gone in before - set(self._replica_id_set):
            self._table.forget(gone.to_full_id_str())


class RoundRobinRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """The baseline ``benches/bench_ray_routing.py`` compares with: each call to the next
    replica in turn, whatever its prompt (the next but one when that one is full); pins are
    honoured as by ``PrefixRouter``."""

    def initialize_state(self, **_: Any) -> None:
        self._turn = 0
        routing.register(self._deployment_id.app_name, self._deployment_id.name, self)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.to_full_id_str())
        if not ordered:
            return []
        route = _route(pending_request)
        if route is not None and route.pin is not None:
            pinned = [r for r in ordered if r.replica_id.to_full_id_str() == route.pin]
            if pinned:
                return [pinned]
        turn = ordered[self._turn % len(ordered)]
        self._turn += 1
        return [[turn], ordered]
