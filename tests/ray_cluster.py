"""A real local Ray cluster on loopback, for tests (``test_ray_serve``, ``test_ray_nodes``).

``local_cluster(nodes)`` starts a head and further nodes with ``ray start --block``, each with
its own CPU and memory resources, and joins it as this process's driver. Every Ray process and
every address it advertises is loopback: ``--node-ip-address=127.0.0.2`` (Ray 2.60's ``ray
start`` replaces 127.0.0.1 with the machine's routable address on Linux; 127.0.0.2 is loopback
too and kept), ``RAY_TMPDIR`` and ``--temp-dir`` under a fresh temporary folder (nothing in the
user's ``/tmp/ray``), no ``RAY_*`` variable of the caller's inherited, and token auth off
(``RAY_AUTH_MODE=disabled``: nothing read from or written to ``~/.ray``). ``Cluster.add_node``
starts one more node; ``Cluster.kill_node`` ends one (a node lost). Teardown ends each
``ray start --block`` process group it started, then any process of the cluster that left
them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NODE_IP = "127.0.0.2"


@dataclass(frozen=True)
class NodeSpec:
    """One node's resources (``memory``: Ray's ``memory`` resource, bytes)."""

    num_cpus: int = 1
    memory: int = 1 << 30
    object_store_memory: int = 200 * 10**6


@dataclass
class Cluster:
    address: str
    env: dict[str, str]
    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def add_node(self, spec: NodeSpec) -> str:
        """Starts one more node; returns its Ray node id once it has joined."""
        import ray

        before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        self.procs.append(_start(self.root, self.env, [f"--address={self.address}"], spec))
        end = time.monotonic() + 120
        while True:
            new = {n["NodeID"] for n in ray.nodes() if n["Alive"]} - before
            if new:
                return new.pop()
            assert time.monotonic() < end, "the new Ray node did not join"
            assert self.procs[-1].poll() is None, "ray start exited"
            time.sleep(0.5)

    def kill_node(self, index: int) -> None:
        """Ends node ``index`` (in start order, the head is 0) and every process it started:
        the node is lost, as a crashed machine would be."""
        p = self.procs[index]
        pids = _children(p.pid)
        for pid in [p.pid, *pids]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc's parent links)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.extend(kids)
        todo.extend(kids)
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head did not listen on {host}:{port} within {timeout_s} s")


def _started_here(root: Path) -> list[int]:
    """Processes of this cluster that left its process groups (Ray starts some actors, such
    as Serve's controller, in sessions of their own): those whose RAY_TMPDIR is ``root``."""
    mark = f"RAY_TMPDIR={root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def _stop(procs: list[subprocess.Popen[bytes]], root: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        end = time.monotonic() + 10
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            time.sleep(0.1)
    for pid in _started_here(root):
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _start(
    root: Path, env: dict[str, str], args: list[str], spec: NodeSpec
) -> subprocess.Popen[bytes]:
    ray_cli = str(Path(sys.executable).parent / "ray")
    common = [
        "--block",
        f"--node-ip-address={NODE_IP}",
        f"--num-cpus={spec.num_cpus}",
        f"--memory={spec.memory}",
        f"--object-store-memory={spec.object_store_memory}",
        f"--temp-dir={root}",
        "--disable-usage-stats",
    ]
    n = len(list(root.glob("node*.log")))
    with open(root / f"node{n}.log", "wb") as log:
        return subprocess.Popen(
            [ray_cli, "start", *args, *common],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, ended at teardown
        )


@contextlib.contextmanager
def local_cluster(nodes: Sequence[NodeSpec]) -> Iterator[Cluster]:
    """A head (``nodes[0]``) and the other nodes, joined by this process (module docs)."""
    import ray

    # A short path: Ray's unix sockets live under it (108 bytes at most).
    root = Path(tempfile.mkdtemp(prefix="poot-ray-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # RAY_AUTH_MODE explicit: a token a local ray.init() left in ~/.ray would otherwise turn
    # token auth on for the nodes and not for the drivers.
    ray_env = {"RAY_TMPDIR": str(root), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.update(ray_env)
    port = _free_port()
    address = f"{NODE_IP}:{port}"
    cluster = Cluster(address, {**env, "RAY_ADDRESS": address}, root)
    saved = {k: os.environ.get(k) for k in ray_env}
    try:
        head = ["--head", f"--port={port}", "--include-dashboard=false"]
        cluster.procs.append(_start(root, env, head, nodes[0]))
        _wait_port(NODE_IP, port, cluster.procs[0], 120)
        for spec in nodes[1:]:
            cluster.procs.append(_start(root, env, [f"--address={address}"], spec))
        os.environ.update(ray_env)
        ray.init(address=address, _node_ip_address=NODE_IP, log_to_driver=False)
        end = time.monotonic() + 120
        while sum(n["Alive"] for n in ray.nodes()) < len(nodes):
            assert time.monotonic() < end, "the other Ray nodes did not join"
            time.sleep(0.5)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        _stop(cluster.procs, root)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)
