"""Ray nodes as planner devices: each node's profile and the links between nodes, measured on
the nodes themselves.

``measure_cluster()`` (in a driver joined to a cluster, ``poot.serve.ray.connect``) runs:

- on each alive node, one at a time (so two measurements never share a machine's cores), a
  task pinned to that node (``NodeAffinitySchedulingStrategy``, not soft) that takes the CPU
  as discovery sees it there and its profile: the one ``poot validate-hardware`` stored on
  that node when there is one (same CPU, driver and poot version), else ``validate_cpu`` run
  there (the conformance subset, then the micro-benchmarks; ``quick`` buffers by default). A
  node whose conformance fails is kept out, with the checks that failed;
- for each ordered pair of nodes ``(a, b)``, a task pair moving a buffer: a task on ``a``
  makes it, the driver waits until it exists, then a task on ``b`` times its own
  ``ray.get`` of it: the path a hidden state takes between two segments. A small buffer
  (1 KiB) gives the latency, a large one (``LINK_BYTES``) the bandwidth beyond it; each is the
  best of ``LINK_REPEATS``.

``ClusterProfile.device_profiles()`` turns the nodes into the planner's ``DeviceProfile``s: key
``cpu:<first 8 hex digits of the node id>`` (kind ``cpu``: the KV entry size and the CPU's
rules apply), memory the node's budget (Ray's ``memory`` resource of the node, at most the
memory the node reports, at most ``device_budget_bytes``), ``peer_bw`` to every other node the
measured bandwidth and ``link_latency_s`` the largest latency measured from the node (the cost
model charges a cut ``bytes / peer_bw + max(latency of its two ends)``).

Invariants: nothing here reserves CPUs (the tasks ask for none, so measuring never waits on a
busy node; their numbers are what the node gives beside its other work), and every wait is
bounded by ``timeout_s`` (``RayClusterError`` names the node that did not answer). Ray is
imported only when called.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from poot.planner.profiles import DeviceProfile

__all__ = [
    "LINK_BYTES",
    "ClusterProfile",
    "Link",
    "NodeProfile",
    "measure_cluster",
    "node_key",
    "pinned",
]

LINK_BYTES = 8 << 20
LINK_SMALL = 1 << 10
LINK_REPEATS = 3


def node_key(node_id: str) -> str:
    """The planner's device key of a Ray node (its CPU)."""
    return f"cpu:{node_id[:8]}"


@dataclass(frozen=True)
class NodeProfile:
    """One Ray node as a device.

    Attributes:
        node_id: Ray's node id (hex).
        key: the planner's device key (``node_key``).
        address: the node's IP as Ray advertises it.
        head: the head node.
        cpus: the node's ``CPU`` resource.
        memory_bytes: the node's ``memory`` resource (what the cluster gives work there).
        host_memory_bytes: the memory the node's own discovery reports (cgroup-bounded).
        profile: the measured profile, or None where conformance failed.
        source: ``"stored"`` (``poot validate-hardware`` ran on the node) or ``"measured"``
            (measured now by ``validate_cpu``), ``"failed"``.
        note: the failed checks, where conformance failed.
        measure_s: seconds the profile task took on the node.
    """

    node_id: str
    key: str
    address: str
    head: bool
    cpus: int
    memory_bytes: int
    host_memory_bytes: int
    profile: DeviceProfile | None
    source: str
    note: str = ""
    measure_s: float = 0.0


@dataclass(frozen=True)
class Link:
    """The measured link from node ``a`` to node ``b`` (device keys)."""

    a: str
    b: str
    bandwidth: float
    latency_s: float

    def cost_s(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` over the link."""
        return nbytes / self.bandwidth + self.latency_s


@dataclass
class ClusterProfile:
    """The nodes and links of a cluster, as measured (see the module docs)."""

    nodes: tuple[NodeProfile, ...]
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    address: str = ""

    def node(self, key: str) -> NodeProfile:
        return next(n for n in self.nodes if n.key == key)

    def budget(self, node: NodeProfile, device_budget_bytes: int | None = None) -> int:
        """Bytes of weights and KV the planner may place on ``node``."""
        b = node.memory_bytes
        if node.host_memory_bytes > 0:
            b = min(b, node.host_memory_bytes)
        if device_budget_bytes is not None:
            b = min(b, device_budget_bytes)
        return b

    def device_profiles(
        self, device_budget_bytes: int | None = None
    ) -> tuple[dict[str, DeviceProfile], dict[str, str]]:
        """The nodes as planner profiles, and why each node left out is (module docs)."""
        profiles: dict[str, DeviceProfile] = {}
        dropped: dict[str, str] = {}
        for n in self.nodes:
            if n.profile is None:
                dropped[n.key] = f"node {n.address}: conformance failed on the node ({n.note})"
                continue
            peers = {b: x.bandwidth for (a, b), x in self.links.items() if a == n.key}
            lat = max((x.latency_s for (a, _), x in self.links.items() if a == n.key), default=0.0)
            profiles[n.key] = replace(
                n.profile,
                key=n.key,
                name=f"{n.profile.name} on node {n.address}" + (" (head)" if n.head else ""),
                memory_bytes=self.budget(n, device_budget_bytes),
                peer_bw=peers,
                link_latency_s=lat,
                link_bw=0.0,
            )
        return profiles, dropped


def pinned(node_id: str) -> Any:
    """Ray's scheduling strategy that runs a task or actor on ``node_id`` only."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def _profile_on_node(threads: int | None, quick: bool) -> dict[str, Any]:
    """Runs on the node: its CPU, and its stored or freshly measured profile."""
    from poot import _native
    from poot.planner.discovery import cpu_info
    from poot.planner.profiles import load_profile
    from poot.planner.validate import validate_cpu

    t0 = time.perf_counter()
    info = cpu_info()
    stored = load_profile(info, _native.__version__)
    if stored is not None:
        out: dict[str, Any] = {"profile": stored, "source": "stored", "note": ""}
    else:
        report = validate_cpu(info, threads=threads, quick=quick)
        failed = {k: v for k, v in report.checks.items() if v != "ok"}
        out = {
            "profile": report.profile,
            "source": "measured" if report.profile is not None else "failed",
            "note": "; ".join(f"{k}: {v}" for k, v in failed.items()),
        }
    out.update(memory=info.memory_bytes, seconds=time.perf_counter() - t0)
    return out


def _make_buffer(nbytes: int) -> Any:
    import numpy as np

    return np.ones(nbytes, np.uint8)


def _fetch(refs: list[Any], timeout_s: float) -> float:
    """Runs on the receiving node: seconds its ``ray.get`` of the buffer took."""
    import ray

    t0 = time.perf_counter()
    ray.get(refs[0], timeout=timeout_s)
    return time.perf_counter() - t0


def _get(ref: Any, timeout_s: float, what: str) -> Any:
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    from poot.serve.ray import RayClusterError

    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        raise RayClusterError(f"{what} did not finish within {timeout_s:.0f} s") from None
    except RayError as e:
        raise RayClusterError(f"{what} failed: {e}") from None


def _measure_link(a: NodeProfile, b: NodeProfile, timeout_s: float) -> Link:
    import ray

    from poot.serve.ray import RayClusterError

    make = ray.remote(num_cpus=0, scheduling_strategy=pinned(a.node_id))(_make_buffer)
    fetch = ray.remote(num_cpus=0, scheduling_strategy=pinned(b.node_id))(_fetch)
    best: dict[int, float] = {}
    for nbytes in (LINK_SMALL, LINK_BYTES):
        for _ in range(LINK_REPEATS):
            ref = make.remote(nbytes)
            ready, _ = ray.wait([ref], timeout=timeout_s)
            if not ready:
                raise RayClusterError(f"node {a.address} ({a.key}) made no buffer in time")
            s = _get(fetch.remote([ref], timeout_s), timeout_s, f"fetching on {b.key} from {a.key}")
            best[nbytes] = min(best.get(nbytes, float("inf")), float(s))
            del ref
    extra = max(best[LINK_BYTES] - best[LINK_SMALL], 1e-9)
    return Link(a.key, b.key, (LINK_BYTES - LINK_SMALL) / extra, best[LINK_SMALL])


def measure_cluster(
    *,
    threads: int | None = None,
    quick: bool = True,
    timeout_s: float = 600.0,
    known: ClusterProfile | None = None,
) -> ClusterProfile:
    """Measures every alive node and every link between them (module docs).

    Args:
        known: an earlier measurement: its nodes still alive keep their profiles (links are
            measured again).
        threads: CPU threads the profile measures with (None: the node's ``CPU`` resource,
            which is what a segment's actor runs with by default).
        quick: smaller benchmark buffers where a node has no stored profile.
        timeout_s: the bound on each node's profile task and each transfer.

    Raises:
        RayNotInstalledError: Ray is not installed.
        RayClusterError: not joined to a cluster, no alive node, or a node did not answer.
    """
    from poot.serve.ray import RayClusterError, _require_ray

    _require_ray()
    import ray

    if not ray.is_initialized():
        raise RayClusterError("not joined to a Ray cluster (poot.serve.ray.connect first)")
    found = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        found.append((n, res))
    if not found:
        raise RayClusterError("the Ray cluster has no alive node")
    # The head first, then by address and id: stable keys in a stable order.
    found.sort(key=lambda x: ("node:__internal_head__" not in x[1], x[0]["NodeManagerAddress"],
                              x[0]["NodeID"]))  # fmt: skip
    nodes = []
    for n, res in found:
        node_id, cpus = str(n["NodeID"]), max(1, int(res.get("CPU", 1)))
        same = [x for x in (known.nodes if known else ()) if x.node_id == node_id]
        if same:
            nodes.append(same[0])
            continue
        task = ray.remote(num_cpus=0, scheduling_strategy=pinned(node_id))(_profile_on_node)
        where = f"the profile task on node {n['NodeManagerAddress']} ({node_key(node_id)})"
        got = _get(task.remote(threads or cpus, quick), timeout_s, where)
        nodes.append(
            NodeProfile(
                node_id,
                node_key(node_id),
                str(n["NodeManagerAddress"]),
                "node:__internal_head__" in res,
                cpus,
                int(res.get("memory", 0)),
                int(got["memory"]),
                got["profile"],
                got["source"],
                got["note"],
                float(got["seconds"]),
            )  # fmt: skip
        )
    links = {}
    for a in nodes:
        for b in nodes:
            if a is not b:
                links[(a.key, b.key)] = _measure_link(a, b, timeout_s)
    address = ray.get_runtime_context().gcs_address
    return ClusterProfile(tuple(nodes), links, str(address))
