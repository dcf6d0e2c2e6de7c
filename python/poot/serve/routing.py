"""What the ingress and ``PrefixRouter`` share: the ``Route`` of a call, and the routers of
this process.

Kept out of ``poot.serve.router`` because Serve ships a custom router's module *by value*
(cloudpickle): that module's globals are copies in every process that routes, so a class or a
registry defined there would not be the one the ingress sees. This module is imported by name
everywhere, so ``Route`` is one class and ``replica_ids`` sees every router registered here.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["Route", "register", "replica_ids"]

# "app#deployment" -> the routers of this process for it (one per handle).
_ROUTERS: dict[str, weakref.WeakSet[Any]] = {}


@dataclass(frozen=True)
class Route:
    """What the ingress tells the router about one call (``poot.serve.router``).

    Attributes:
        prefix: the prompt's leading block keys (``poot.serve.prefix``); empty: none.
        pin: a replica's full id: that replica alone while it lives.
    """

    prefix: tuple[int, ...] = ()
    pin: str | None = None


def register(app: str, deployment: str, router: Any) -> None:
    """Notes a router (anything with ``curr_replicas``) of the deployment in this process."""
    _ROUTERS.setdefault(f"{app}#{deployment}", weakref.WeakSet()).add(router)


def replica_ids(app: str, deployment: str) -> list[str]:
    """The replicas (full id strings) this process's routers for the deployment know."""
    ids: set[str] = set()
    for router in list(_ROUTERS.get(f"{app}#{deployment}", ())):
        ids.update(r.to_full_id_str() for r in router.curr_replicas)
    return sorted(ids)
