"""Running a placed graph's nodes: one worker thread per device, each node as soon as the nodes
it reads are done, so independent branches on different devices run at the same time.

Invariants: a device runs its nodes one at a time in insertion order (a runtime is never
entered by two nodes of one call at once); a node starts only after every node it depends on
has finished, so a join waits on all its branches; the schedule cannot deadlock, because
insertion order is topological (the unfinished node of lowest index has its dependencies
done and is first in its device's queue). The native runs release the GIL (``without_gil``
in the bindings), so two devices' runs overlap in real time, not only in Python's threads.
With one device, or ``concurrent=False``, the nodes run in insertion order on the caller's
thread. A node that fails fails the nodes after it that read it; the others still run, and
the call raises the failure of the lowest node index once every node has settled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["run_nodes"]


def run_nodes(
    devices: Sequence[str],
    deps: Sequence[set[int]],
    run: Callable[[int], None],
    *,
    concurrent: bool = True,
) -> None:
    """Runs ``run(i)`` for every node ``i`` (see the module docs).

    Args:
        devices: each node's device key.
        deps: each node's dependencies, indices of earlier nodes.
        run: runs one node; its exception fails the call.
        concurrent: run different devices' nodes in parallel.
    """
    if not concurrent or len(set(devices)) < 2:
        for i in range(len(devices)):
            run(i)
        return
    pools = {
        d: ThreadPoolExecutor(1, thread_name_prefix=f"poot-node-{d}")
        for d in dict.fromkeys(devices)
    }
    futures: list[Future[None]] = []

    def node(i: int) -> None:
        for j in sorted(deps[i]):
            futures[j].result()  # a dependency's failure fails this node too
        run(i)

    try:
        for i, d in enumerate(devices):
            futures.append(pools[d].submit(node, i))
        wait(futures)
    finally:
        for p in pools.values():
            p.shutdown(wait=True)
    for f in futures:
        f.result()  # the lowest failed index first
