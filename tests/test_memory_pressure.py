"""poot-serve under memory pressure: a real memory cgroup limits the server (as a container or
pod limit does), the server fits its KV pool to that limit and says so, a request it cannot fit
is refused with the numbers, and a full pool never gets the server OOM-killed.

The cgroup is made under the machine's cgroup mount (v2 or v1); that needs root and a writable
mount. Where this machine gives neither, the real-cgroup tests skip and say so; the parsing
tests over written cgroup trees always run.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_process import CLEAN_EXIT, ServerProcess

from poot.host_memory import host_memory

MIB = 1 << 20
ROOT = Path("/sys/fs/cgroup")


# ---- host_memory over written cgroup trees ---------------------------------------------------


def _meminfo(tmp: Path, avail_kib: int) -> Path:
    p = tmp / "meminfo"
    p.write_text(f"MemTotal: 99999999 kB\nMemFree: 1 kB\nMemAvailable: {avail_kib} kB\n")
    return p


def test_v2_limit_bounds_available_net_of_inactive_cache(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    pod = root / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "kubepods" / "memory.max").write_text("max\n")
    (root / "kubepods" / "memory.current").write_text(f"{900 * MIB}\n")
    (pod / "memory.max").write_text(f"{1024 * MIB}\n")
    (pod / "memory.current").write_text(f"{600 * MIB}\n")
    (pod / "memory.stat").write_text(f"anon 1\ninactive_file {100 * MIB}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1\n")
    mem = host_memory(proc, root, _meminfo(tmp_path, 64 << 20))
    # 1024 MiB limit, 600 MiB used of which 100 MiB is reclaimable cache: 524 MiB left.
    assert mem.cgroup_limit == 1024 * MIB
    assert mem.cgroup_headroom == 524 * MIB
    assert mem.available == 524 * MIB
    assert mem.meminfo_available == (64 << 20) * 1024
    assert "bound by cgroup" in mem.describe()
    assert str(pod) in mem.describe()


def test_v1_tightest_parent_wins_and_unlimited_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    child = root / "memory" / "outer" / "inner"
    child.mkdir(parents=True)
    (child / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (child / "memory.usage_in_bytes").write_text(f"{10 * MIB}\n")
    outer = child.parent
    (outer / "memory.limit_in_bytes").write_text(f"{300 * MIB}\n")
    (outer / "memory.usage_in_bytes").write_text(f"{200 * MIB}\n")
    (outer / "memory.stat").write_text(f"total_inactive_file {20 * MIB}\ncache 5\n")
    proc = tmp_path / "cgroup"
    proc.write_text("5:devices:/\n4:memory:/outer/inner\n0::/\n")
    mem = host_memory(proc, root, _meminfo(tmp_path, 8 << 20))
    assert (mem.cgroup_limit, mem.cgroup_headroom) == (300 * MIB, 120 * MIB)
    assert mem.cgroup_path == str(outer)


def test_namespaced_mount_reads_the_root_files(tmp_path: Path) -> None:
    # In a container the process's cgroup path names the host's hierarchy, which the
    # container's mount does not have: the mount's root is the process's cgroup.
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory\n")
    (root / "memory.max").write_text(f"{2048 * MIB}\n")
    (root / "memory.current").write_text(f"{48 * MIB}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/docker-abc.scope\n")
    mem = host_memory(proc, root, _meminfo(tmp_path, 1 << 30))
    assert mem.cgroup_headroom == 2000 * MIB
    assert mem.available == 2000 * MIB


def test_no_cgroup_and_unreadable_files_fall_back_to_meminfo(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/nowhere\n")
    mem = host_memory(proc, tmp_path / "absent", _meminfo(tmp_path, 1000))
    assert mem.available == mem.meminfo_available == 1000 * 1024
    assert mem.cgroup_limit is None
    assert "no cgroup memory limit" in mem.describe()
    gone = host_memory(tmp_path / "no-cgroup-file", tmp_path, _meminfo(tmp_path, 7))
    assert gone.available == 7 * 1024


def test_meminfo_above_the_limit_is_not_used(tmp_path: Path) -> None:
    """The bug this module fixes: a host with much more memory than the container's limit."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory\n")
    (root / "memory.max").write_text(f"{512 * MIB}\n")
    (root / "memory.current").write_text("0\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    mem = host_memory(proc, root, _meminfo(tmp_path, 256 << 20))  # 256 GiB on the host
    assert mem.available == 512 * MIB


# ---- a real memory cgroup ------------------------------------------------------------------


@dataclass
class Cgroup:
    path: Path
    version: int

    def limit(self, nbytes: int) -> None:
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        (self.path / name).write_text(str(nbytes))

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def peak(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int((self.path / name).read_text())

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def wrapper(self) -> list[str]:
        """A prefix that moves the process into the cgroup, then execs the command."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs)]


def _make_cgroup() -> Cgroup:
    if (ROOT / "cgroup.controllers").exists():
        own = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
        parent = ROOT / own.lstrip("/")
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            raise OSError(f"the memory controller is not delegated to {parent}")
        version = 2
    else:
        parent, version = ROOT / "memory", 1
    path = parent / f"poot-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return Cgroup(path, version)


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    try:
        cg = _make_cgroup()
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup (needs root, a writable cgroup mount): {e}")
    yield cg
    for pid in cg.procs.read_text().split():  # nothing should be left; never leak one
        os.kill(int(pid), 9)
    cg.path.rmdir()


def test_a_process_in_a_real_cgroup_sees_its_limit(cgroup: Cgroup) -> None:
    cgroup.limit(300 * MIB)
    code = "from poot.host_memory import host_memory; m = host_memory()\n"
    code += "print(m.cgroup_limit, m.available)"
    out = subprocess.run(
        [*cgroup.wrapper(), sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[0]) == 300 * MIB
    assert 0 < int(out[1]) < 300 * MIB


def _model_name(srv: ServerProcess) -> str:
    return str(httpx.get(f"{srv.url}/v1/models", timeout=10).json()["data"][0]["id"])


async def _fill(url: str, model: str, n: int) -> list[int]:
    """``n`` concurrent ~200-token prompts, each decoding 24 tokens: more rows than the pool
    holds at once, so the pool is used to its last block and the rest wait."""

    async def one(c: httpx.AsyncClient, i: int) -> int:
        prompt = f"request {i}: " + "the quick brown fox jumps over the lazy dog " * 20
        body = {"model": model, "prompt": prompt, "max_tokens": 24, "ignore_eos": True}
        r = await c.post(f"{url}/v1/completions", json=body, timeout=600)
        return r.status_code

    async with httpx.AsyncClient() as c:
        return list(await asyncio.gather(*(one(c, i) for i in range(n))))


def test_server_fits_its_kv_pool_to_the_cgroup_and_survives_a_full_pool(
    cgroup: Cgroup, default_model_path: Path
) -> None:
    limit = 400 * MIB
    cgroup.limit(limit)
    # A queue that outlasts the run: every request waits for a row rather than timing out.
    args = ["--model", str(default_model_path), "--max-model-len", "256", "--threads", "2"]
    args += ["--queue-timeout", "600"]
    srv = ServerProcess([*args, "--log-level", "info"], prefix=cgroup.wrapper())
    try:
        log = srv.log()
        assert "bound by cgroup" in log, log  # it says where its memory figure came from
        driver = re.search(r"driver: rows=(\d+) .* block_size=(\d+) kv_bytes=(\d+)", log)
        assert driver is not None, log
        rows, block_size, kv_bytes = (int(g) for g in driver.groups())
        assert 0 < kv_bytes < limit // 2, log
        model = _model_name(srv)
        # Over-long: refused with the numbers, before any KV is taken.
        r = httpx.post(
            f"{srv.url}/v1/completions",
            json={"model": model, "prompt": "hi", "max_tokens": 10_000},
            timeout=30,
        )
        assert r.status_code == 400
        assert "256" in r.json()["error"]["message"] and "10001" in r.json()["error"]["message"]
        assert rows * (-(-256 // block_size)) <= srv.metric("poot_kv_blocks_total")
        codes = asyncio.run(_fill(srv.url, model, rows + 4))
        assert codes == [200] * (rows + 4), codes
        assert srv.proc.poll() is None, "the server died under memory pressure"
        assert srv.wait_metric("poot_kv_blocks_used", 0.0) == 0.0
        assert cgroup.oom_kills() == 0
        assert cgroup.peak() < limit
    finally:
        assert srv.stop() in CLEAN_EXIT


def test_server_refuses_to_start_when_one_sequence_cannot_fit(
    cgroup: Cgroup, default_model_path: Path
) -> None:
    cgroup.limit(300 * MIB)
    args = ["--model", str(default_model_path), "--max-model-len", "8192", "--log-level", "info"]
    srv = ServerProcess(args, prefix=cgroup.wrapper(), wait_ready=False)
    try:
        code = srv.proc.wait(timeout=120)
        log = srv.log()
    finally:
        srv.stop()
    assert code == 1, log  # a clean refusal, not a kill by signal
    assert "no room for one sequence's KV cache" in log
    assert "lower --max-model-len" in log
    assert cgroup.oom_kills() == 0
