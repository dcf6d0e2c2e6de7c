"""``poot validate-hardware`` on a wgpu adapter: conformance against the CPU, then benchmarks.

The wgpu runtime opens one adapter (the first, high performance preferred); that adapter is the
one validated, and any other wgpu adapter is reported skipped, naming which one runs.

1. Conformance subset: the same graphs and inputs run on the adapter and on the CPU runtime in
   the same numerics, compared elementwise as ``|wgpu - cpu| <= atol + rtol * |cpu|``. Bounds
   (poot-wgpu's own conformance suite states why): matmul in ``exact`` numerics over F32, F16,
   Q8_0 and Q4_1 weights, atol 2e-4 / rtol 1e-5 (K products summed in another order); matmul in
   ``ggml`` numerics over Q8_0 and Q4_1 (integer block dots, only ``fma`` fusion differs),
   atol 1e-4 / rtol 1e-5; rms_norm, silu, add and softmax atol 1e-6 / rtol 1e-5.
2. Micro-benchmarks, each the best of a few runs (lavapipe is slow: the buffers are a few MiB,
   the whole validation takes seconds):
   - matmul throughput per stored dtype, in the numerics a checkpoint of that dtype runs in:
     one row over a weight resident on the device (weight bytes/s, less the fixed cost of a
     tiny matmul) and 64 rows (flop/s);
   - read bandwidth: the F32 one-row matmul's rate, the plainest full read of device memory;
   - host<->device transfer: a run of ``add(x, x)`` over a few MiB ``x`` (upload, the add, read
     back) less a tiny run's time, as 2 bytes moved per input byte over the seconds: it
     includes the add's own pass, so the link rate is, if anything, underestimated;
     ``link_latency_s``, charged per transfer, is half a tiny run's time (submit, wait, read
     back) less its one dispatch;
   - the per-equation dispatch cost (a chain of tiny adds) and the per-matmul fixed cost (16
     small matmuls in one run, less the run's cost, their dispatches and weight bytes).
3. The profile is returned only when every check passed (``validate.validate_all`` stores it).

A software adapter (lavapipe) runs on the CPU's cores: its profile says ``software`` and counts
those cores, so the cost model charges its contention with the CPU.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from poot import _native
from poot.planner.discovery import DeviceInfo
from poot.planner.profiles import DeviceProfile
from poot.planner.validate import (
    _BOUNDS,
    DeviceReport,
    _Bench,
    _numerics,
    _tiled_weights,
    _time_matmul,
)

__all__ = ["BOUNDS", "benchmark_wgpu", "conformance_wgpu", "validate_wgpu", "vulkan_note"]

Numerics = Literal["exact", "ggml"]
Api = Literal["wgpu", "vulkan"]
AnyRuntime = _native.CpuRuntime | _native.WgpuRuntime

# (atol, rtol) per check; see the module docs for why each is what it is.
BOUNDS: dict[str, tuple[float, float]] = {
    "matmul F32 exact": (2e-4, 1e-5),
    "matmul F16 exact": (2e-4, 1e-5),
    "matmul Q8_0 exact": (2e-4, 1e-5),
    "matmul Q4_1 exact": (2e-4, 1e-5),
    "matmul Q8_0 ggml": (1e-4, 1e-5),
    "matmul Q4_1 ggml": (1e-4, 1e-5),
    "rms_norm": (1e-6, 1e-5),
    "silu": (1e-6, 1e-5),
    "add": (1e-6, 1e-5),
    "softmax": (1e-6, 1e-5),
}
_WGPU_TIMEOUT_S = 120.0


def _open(numerics: Numerics, api: Api = "wgpu") -> _native.WgpuRuntime:
    return _native.WgpuRuntime(_WGPU_TIMEOUT_S, numerics=numerics, api=api)


def _api(info: DeviceInfo) -> Api:
    """The runtime API a device of discovery runs on: raw Vulkan for ``vulkan:N``."""
    return "vulkan" if info.kind == "vulkan" else "wgpu"


def _run_graph(
    rt: AnyRuntime,
    weights: _native.Weights,
    rows: int,
    cols: int,
    body: Callable[[_native.Tracer, _native.Value], _native.Value],
    x: npt.NDArray[np.float32],
    repeat: int = 0,
) -> tuple[npt.NDArray[Any], float]:
    """``body`` over an input ``x`` [rows, cols] on ``rt``: the output and the best seconds of
    ``repeat`` further runs (inf when 0)."""
    t = _native.Tracer(weights, rows, _native.TraceLimits(max_tokens=max(rows, 1)))
    t.output("y", body(t, t.input("x", "f32", [rows, cols])))
    plan = rt.prepare(t.finish(), weights)
    out = rt.run(plan, {"x": x}, _WGPU_TIMEOUT_S)["y"]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        rt.run(plan, {"x": x}, _WGPU_TIMEOUT_S)
        best = min(best, time.perf_counter() - t0)
    return out, best


def _check(got: npt.NDArray[Any], want: npt.NDArray[Any], bound: tuple[float, float]) -> str:
    atol, rtol = bound
    excess = np.abs(got - want) - (atol + rtol * np.abs(want))
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if not np.all(np.isfinite(got)):
        return "non-finite output"
    worst = float(excess.max())
    if worst > 0:
        err = float(np.abs(got - want).max())
        return f"max |wgpu - cpu| {err:.2e} exceeds atol {atol:g} + rtol {rtol:g} * |cpu|"
    return "ok"


def conformance_wgpu(folder: Path, rng: np.random.Generator, api: Api = "wgpu") -> dict[str, str]:
    """The conformance subset (see the module docs) on the runtime of ``api`` (``"wgpu"`` or
    raw ``"vulkan"``): check name -> ``"ok"`` or the error."""
    bench = _Bench(folder, 256, 64, rng)
    rows = 4
    x = rng.standard_normal((rows, bench.k), dtype=np.float32)
    checks: dict[str, str] = {}
    runtimes: dict[Numerics, tuple[AnyRuntime, AnyRuntime]] = {
        n: (_open(n, api), _native.CpuRuntime(1, n)) for n in ("exact", "ggml")
    }
    for name in BOUNDS:
        if not name.startswith("matmul "):
            continue
        _, dt, numerics = name.split()
        gpu, cpu = runtimes[numerics]  # type: ignore[index]

        def body(t: _native.Tracer, v: _native.Value, d: str = dt) -> _native.Value:
            return t.matmul(v, t.weight(f"w.{d}"))

        got, _ = _run_graph(gpu, bench.weights, rows, bench.k, body, x)
        want, _ = _run_graph(cpu, bench.weights, rows, bench.k, body, x)
        checks[name] = _check(got, want, BOUNDS[name])
    gpu, cpu = runtimes["exact"]
    ops: dict[str, Callable[[_native.Tracer, _native.Value], _native.Value]] = {
        "rms_norm": lambda t, v: t.rms_norm(v, t.weight("g"), 1e-5),
        "silu": lambda t, v: t.silu(v),
        "add": lambda t, v: t.add(v, v),
        "softmax": lambda t, v: t.softmax(v),
    }
    for name, op in ops.items():
        got, _ = _run_graph(gpu, bench.weights, rows, bench.k, op, x)
        want, _ = _run_graph(cpu, bench.weights, rows, bench.k, op, x)
        checks[name] = _check(got, want, BOUNDS[name])
    return checks


def _chain(t: _native.Tracer, v: _native.Value, n: int) -> _native.Value:
    for _ in range(n):
        v = t.add(v, v)
    return v


def _matmul_fixed(
    rt: _native.WgpuRuntime, w: _native.Weights, dispatch: float, run_s: float, read_s: float
) -> float:
    """Seconds a matmul costs beyond its dispatch and its weight bytes: a graph of 16 one-row
    matmuls over the same small F32 weight, summed by 15 adds, less the run's own cost, the
    31 dispatches and 16 weight reads (``read_s`` each), per matmul. Many matmuls in one run
    average out the noise of a difference of two short timings."""
    n = 16

    def body(t: _native.Tracer, v: _native.Value) -> _native.Value:
        weight = t.weight("small.F32")
        acc = t.matmul(v, weight)
        for _ in range(n - 1):
            acc = t.add(acc, t.matmul(v, weight))
        return acc

    _, total = _run_graph(rt, w, 1, 256, body, np.ones((1, 256), np.float32), 15)
    return max(0.0, (total - run_s - (2 * n - 1) * dispatch) / n - read_s)


def benchmark_wgpu(info: DeviceInfo, *, quick: bool = False) -> DeviceProfile:
    """Measures the adapter's profile (see the module docs); ``quick`` halves the buffers."""
    rng = np.random.default_rng(0)
    size = (4 if quick else 8) << 20
    gemv: dict[str, float] = {}
    gemm: dict[str, float] = {}
    runtimes = {n: _open(n, _api(info)) for n in ("exact", "ggml")}
    with tempfile.TemporaryDirectory(prefix="poot-validate-wgpu-") as tmp:
        w = _tiled_weights(Path(tmp), 1024, size, rng)
        sizes = {t.name: t.nbytes for t in _native.GgufFile(Path(tmp) / "bench-big.gguf").tensors()}
        for dt in _BOUNDS:
            rt = runtimes[_numerics(dt)]
            small, _, _ = _time_matmul(rt, w, f"small.{dt}", 1, 5)
            s1, _, _ = _time_matmul(rt, w, f"big.{dt}", 1, 3)
            gemv[dt] = sizes[f"big.{dt}"] / max(1e-9, s1 - small)
            s64, n, k = _time_matmul(rt, w, f"small.{dt}", 64, 3)
            gemm[dt] = 2 * 64 * n * k / s64
        rt = runtimes["exact"]
        tiny = np.ones((1, 256), np.float32)
        _, run_s = _run_graph(rt, w, 1, 256, lambda t, v: t.add(v, v), tiny, 30)
        chain = 64
        _, chain_s = _run_graph(rt, w, 1, 256, lambda t, v: _chain(t, v, chain), tiny, 30)
        dispatch = max(0.0, chain_s - run_s) / chain
        matmul_s = _matmul_fixed(rt, w, dispatch, run_s, sizes["small.F32"] / gemv["F32"])
        rows = size // (4 * 1024)
        big = np.ones((rows, 1024), np.float32)
        _, moved_s = _run_graph(rt, w, rows, 1024, lambda t, v: t.add(v, v), big, 3)
    link_bw = 2 * big.nbytes / max(1e-9, moved_s - run_s)
    # The cost model charges a latency per transfer (inputs in, outputs out) and a dispatch per
    # equation: a tiny run is two transfers and one dispatch.
    latency = max(0.0, run_s - dispatch) / 2
    cores = info.cores or (len(os.sched_getaffinity(0)) if info.software else 0)
    memory = info.memory_bytes
    if not memory and info.software:
        from poot.planner.discovery import cpu_info

        memory = cpu_info().memory_bytes  # a software adapter's memory is host RAM
    return DeviceProfile(
        key=info.key, kind=info.kind, name=info.name, vendor=info.vendor, driver=info.driver,
        memory_bytes=memory, read_bw=gemv["F32"], gemv_bw=gemv, gemm_flops=gemm,
        dispatch_s=dispatch, matmul_s=matmul_s,
        cores=cores, link_bw=link_bw, link_latency_s=latency, software=info.software,
        source="measured", poot_version=_native.__version__,
    )  # fmt: skip


def vulkan_note(adapter: dict[str, Any]) -> str:
    """What a raw Vulkan runtime uses of its device (its ``adapter`` settings), for the report:
    empty for a wgpu runtime."""
    if adapter.get("api") != "vulkan":
        return ""
    lo, hi = adapter.get("subgroup_size_range", (0, 0))
    if adapter.get("subgroup_matvec"):
        matvec = f"matmul rows reduced by subgroup shuffles (subgroups of {lo}..{hi} lanes)"
    else:
        matvec = "matmul rows reduced in workgroup memory (no usable subgroup shuffles)"
    memory = (
        "weights and KV in device-local memory behind staged copies"
        if adapter.get("staging")
        else "weights and KV in mapped memory"
    )
    coop = "no cooperative matrix"
    if adapter.get("cooperative_matrix"):
        coop = "cooperative matrix offered, unused"
    return f"kernels: {matvec}; {memory}; {coop}"


def validate_wgpu(info: DeviceInfo, *, quick: bool = False) -> DeviceReport:
    """Conformance, then benchmarks, on ``info`` if it is the adapter the wgpu runtime opens
    (skipped otherwise); the profile only when every check passed."""
    opened = _open("exact", _api(info)).adapter
    if opened.get("name") != info.name:
        why = f"the {_api(info)} runtime opens {opened.get('name')!r}, not this adapter"
        return DeviceReport(info, "skipped", note=why)
    note = vulkan_note(opened)
    with tempfile.TemporaryDirectory(prefix="poot-validate-wgpu-") as tmp:
        checks = conformance_wgpu(Path(tmp), np.random.default_rng(1), _api(info))
    if any(v != "ok" for v in checks.values()):
        return DeviceReport(info, "failed", checks, note=note)
    profile = benchmark_wgpu(info, quick=quick)
    checks["benchmarks"] = "ok"
    return DeviceReport(info, "validated", checks, profile, note=note)
