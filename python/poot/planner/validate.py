"""``poot validate-hardware``: a conformance subset and micro-benchmarks per device.

For each visible device with a runtime in this build (the CPU; the wgpu adapter the wgpu
runtime opens, in ``validate_wgpu``), it:

1. runs a conformance subset: matmul over F32, F16, Q8_0 and Q4_1 weights, rms_norm, silu, add
   and softmax, each compared with a numpy reference under a stated bound (float weights: 1e-4
   relative; quantized: the weights' exact dequantization with f32 activations, 1e-4 in
   ``exact`` numerics, 2e-2 in ``ggml`` numerics, whose Q8/f16 activations round);
2. measures read bandwidth (a numpy reduction over a buffer well past the caches), host<->device
   transfer (for the CPU a host copy, since it reads host memory in place), matmul throughput
   per weight dtype (one row: weight bytes/s; many rows: flop/s) on the runtime itself, and the
   per-equation dispatch cost (a chain of tiny adds);
3. stores the profile (``profiles.store_profile``) only when every check passed.

For the CPU, (1) compares with numpy and (2) is as above; a wgpu adapter is compared with the CPU
runtime and benchmarked as ``validate_wgpu`` describes. A device without a runtime in this build
(a wgpu adapter in a build without poot-wgpu, a CUDA device) is reported as skipped, not
failed. The command exits non-zero on any failure.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from poot import _native
from poot.config import Settings
from poot.planner.discovery import DeviceInfo, Discovery, discover
from poot.planner.profiles import DeviceProfile, store_profile
from poot.planner.weightfile import write_gguf_arrays, write_gguf_subset

__all__ = ["DeviceReport", "benchmark_cpu", "quantize", "validate_all", "validate_cpu"]

_BOUNDS = {"F32": 1e-4, "F16": 1e-4, "Q8_0": 1e-4, "Q4_1": 1e-4}
_GGML_BOUND = 2e-2


@dataclass
class DeviceReport:
    """One device's validation: checks (name -> error or "ok"), the profile, where stored."""

    device: DeviceInfo
    status: Literal["validated", "failed", "skipped"]
    checks: dict[str, str] = field(default_factory=dict)
    profile: DeviceProfile | None = None
    stored: Path | None = None
    note: str = ""


def quantize(w: npt.NDArray[np.float32], dtype: str) -> tuple[bytes, npt.NDArray[np.float32]]:
    """``w`` [out, in] stored as ``dtype`` (F32, F16, Q8_0, Q4_1) and its exact dequantization."""
    if dtype == "F32":
        return w.astype(np.float32).tobytes(), w.astype(np.float32)
    if dtype == "F16":
        h = w.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    blocks = w.reshape(-1, 32)
    if dtype == "Q8_0":
        d = (np.abs(blocks).max(axis=1) / 127).astype(np.float16)
        df = d.astype(np.float32)[:, None]
        q = np.round(np.divide(blocks, df, out=np.zeros_like(blocks), where=df != 0))
        q = q.clip(-127, 127).astype(np.int8)
        raw = np.zeros((len(blocks), 34), np.uint8)
        raw[:, :2] = d.view(np.uint8).reshape(-1, 2)
        raw[:, 2:] = q.view(np.uint8)
        return raw.tobytes(), (q.astype(np.float32) * df).reshape(w.shape)
    if dtype == "Q4_1":
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        d = ((hi - lo) / 15).astype(np.float16)
        m = lo.astype(np.float16)
        df, mf = d.astype(np.float32)[:, None], m.astype(np.float32)[:, None]
        q = np.round(np.divide(blocks - mf, df, out=np.zeros_like(blocks), where=df != 0))
        q = q.clip(0, 15).astype(np.uint8)
        raw = np.zeros((len(blocks), 20), np.uint8)
        raw[:, :2] = d.view(np.uint8).reshape(-1, 2)
        raw[:, 2:4] = m.view(np.uint8).reshape(-1, 2)
        raw[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
        return raw.tobytes(), (q.astype(np.float32) * df + mf).reshape(w.shape)
    raise ValueError(f"no quantizer for {dtype}")


def _numerics(dtype: str) -> Literal["ggml", "exact"]:
    # What LLM(numerics="auto") picks for a checkpoint stored in this dtype.
    return "exact" if dtype in ("F32", "F16", "BF16") else "ggml"


class _Bench:
    """Weights for the checks and benchmarks, in one temporary GGUF."""

    def __init__(self, folder: Path, k: int, n: int, rng: np.random.Generator) -> None:
        self.k, self.n = k, n
        self.ref: dict[str, npt.NDArray[Any]] = {}
        entries: list[tuple[str, str, tuple[int, ...], bytes]] = []
        for dt in _BOUNDS:
            w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
            raw, deq = quantize(w, dt)
            self.ref[f"w.{dt}"] = deq
            entries.append((f"w.{dt}", dt, (n, k), raw))
        g = np.abs(rng.standard_normal(k, dtype=np.float32)) + 0.5
        self.ref["g"] = g
        entries.append(("g", "F32", (k,), g.tobytes()))
        path = folder / "bench.gguf"
        write_gguf_arrays(entries, path)
        self.weights = _native.Weights(_native.GgufFile(path))
        self.sizes = {e[0]: len(e[3]) for e in entries}

    def run(
        self,
        rt: _native.CpuRuntime | _native.WgpuRuntime,
        rows: int,
        body: Callable[[_native.Tracer, _native.Value], _native.Value],
        x: npt.NDArray[np.float32],
        repeat: int = 1,
    ) -> tuple[npt.NDArray[Any], float]:
        t = _native.Tracer(self.weights, rows, _native.TraceLimits(max_tokens=max(rows, 1)))
        xv = t.input("x", "f32", [rows, self.k])
        t.output("y", body(t, xv))
        plan = rt.prepare(t.finish(), self.weights)
        out = rt.run(plan, {"x": x})["y"]
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            rt.run(plan, {"x": x})
            best = min(best, time.perf_counter() - t0)
        return out, best


def _rel(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    return float(np.abs(a - b).max() / max(1e-30, float(np.abs(b).max())))


def _conformance(bench: _Bench, threads: int | None, rng: np.random.Generator) -> dict[str, str]:
    checks: dict[str, str] = {}
    rows = 4
    x = rng.standard_normal((rows, bench.k), dtype=np.float32)
    for dt in _BOUNDS:
        for numerics in ("exact", "ggml"):
            rt = _native.CpuRuntime(threads, numerics)  # type: ignore[arg-type]

            def body(t: _native.Tracer, v: _native.Value, d: str = dt) -> _native.Value:
                return t.matmul(v, t.weight(f"w.{d}"))

            got, _ = bench.run(rt, rows, body, x)
            want = x.astype(np.float64) @ bench.ref[f"w.{dt}"].T.astype(np.float64)
            bound = 1e-4 if numerics == "exact" or dt == "F32" else _GGML_BOUND
            err = _rel(got, want)
            checks[f"matmul {dt} {numerics}"] = (
                "ok" if err <= bound else f"error {err:.2e} > {bound}"
            )
    rt = _native.CpuRuntime(threads, "exact")
    g = bench.ref["g"]
    ops: dict[str, tuple[Callable[..., Any], npt.NDArray[Any]]] = {
        "rms_norm": (
            lambda t, v: t.rms_norm(v, t.weight("g"), 1e-5),
            x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5) * g,
        ),
        "silu": (lambda t, v: t.silu(v), x / (1 + np.exp(-x.astype(np.float64)))),
        "add": (lambda t, v: t.add(v, v), 2 * x),
        "softmax": (
            lambda t, v: t.softmax(v),
            np.exp(x - x.max(axis=1, keepdims=True))
            / np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True),
        ),
    }
    for name, (body, want) in ops.items():
        got, _ = bench.run(rt, rows, body, x)
        err = _rel(got, np.asarray(want))
        checks[name] = "ok" if err <= 1e-4 else f"error {err:.2e} > 1e-4"
    return checks


def _tiled_weights(folder: Path, k: int, target: int, rng: np.random.Generator) -> _native.Weights:
    """Per dtype a [n, k] weight of about ``target`` bytes (a quantized block of rows, tiled:
    the values do not matter for speed, only that they are finite), a [1024, k] one and a
    tiny one."""
    entries = []
    for dt in _BOUNDS:
        raw, _ = quantize(rng.standard_normal((64, k), dtype=np.float32) * 0.05, dt)
        reps = max(1, target // len(raw))
        entries.append((f"big.{dt}", dt, (64 * reps, k), raw * reps))
        small, _ = quantize(rng.standard_normal((64, 256), dtype=np.float32) * 0.05, dt)
        entries.append((f"small.{dt}", dt, (64, 256), small))
        # For the 64-row throughput: big enough that fixed costs vanish, small enough to stay
        # in cache (a prefill's arithmetic, not its memory traffic).
        entries.append((f"mid.{dt}", dt, (1024, k), raw * 16))
        # For the one-row rate: distinct [k, k] matrices, as many as ``target`` bytes hold,
        # run as one chain (see ``_time_chain``).
        square, _ = quantize(rng.standard_normal((64, k), dtype=np.float32) * 0.05, dt)
        for i in range(max(2, target // (len(square) * (k // 64)))):
            entries.append((f"chain{i}.{dt}", dt, (k, k), square * (k // 64)))
    path = folder / "bench-big.gguf"
    write_gguf_arrays(entries, path)
    return _native.Weights(_native.GgufFile(path))


def _time_matmul(
    rt: _native.CpuRuntime | _native.WgpuRuntime,
    w: _native.Weights,
    name: str,
    rows: int,
    repeat: int,
) -> tuple[float, int, int]:
    """Best seconds of ``rows`` x ``name``; with the weight's out and in sizes."""
    described = w.describe(name)
    assert described is not None
    n, k = described[1]
    t = _native.Tracer(w, rows, _native.TraceLimits(max_tokens=max(rows, 1)))
    t.output("y", t.matmul(t.input("x", "f32", [rows, k]), t.weight(name)))
    plan = rt.prepare(t.finish(), w)
    x = {"x": np.full((rows, k), 0.5, np.float32)}
    t0 = time.perf_counter()
    rt.run(plan, x)
    best = time.perf_counter() - t0 if repeat == 0 else float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        rt.run(plan, x)
        best = min(best, time.perf_counter() - t0)
    return best, n, k


def _time_chain(
    rt: _native.CpuRuntime, w: _native.Weights, dt: str, sizes: dict[str, int]
) -> tuple[float, int, int]:
    """Best seconds of one row through every ``chain*.{dt}`` matrix in turn, in one run: a
    step's matmuls stream many distinct, mid-sized weights from memory, each paying the
    prefetchers' ramp (a single big matrix would hide that); with the bytes and the count."""
    names = [t for t in sizes if t.startswith("chain") and t.endswith(f".{dt}")]
    described = w.describe(names[0])
    assert described is not None
    k = described[1][1]
    t = _native.Tracer(w, 1)
    v = t.input("x", "f32", [1, k])
    for name in names:
        v = t.matmul(v, t.weight(name))
    t.output("y", v)
    plan = rt.prepare(t.finish(), w)
    x = {"x": np.full((1, k), 0.01, np.float32)}
    rt.run(plan, x)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        rt.run(plan, x)
        best = min(best, time.perf_counter() - t0)
    nbytes = sum(sizes[n] for n in names)
    return best, nbytes, len(names)


def _time_staging(source: Path, folder: Path) -> float:
    """Bytes/s of staging a chunk the way ``streaming`` does (``write_gguf_subset`` from a
    mapped checkpoint into a buffer file), best of three, on the benchmark's big weights."""
    tensors = [t for t in _native.GgufFile(source).tensors() if t.name.startswith("big.")]
    dest = folder / "stage.gguf"
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        n = write_gguf_subset(tensors, dest)
        best = min(best, time.perf_counter() - t0)
        dest.unlink()
    return n / best


def _time_stage_fixed(source: Path, folder: Path) -> float:
    """Best seconds of staging a buffer file of one small tensor (8.5 KiB), the per-chunk
    fixed cost (create, header, close) that a small layer's chunk pays on top of its bytes."""
    tensor = next(t for t in _native.GgufFile(source).tensors() if t.name == "small.Q8_0")
    dest = folder / "stage-small.gguf"
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        write_gguf_subset([tensor], dest)
        best = min(best, time.perf_counter() - t0)
        dest.unlink()
    return best


def _time_overlap(
    source: Path, folder: Path, rt: _native.CpuRuntime, w: _native.Weights, alone: float
) -> tuple[float, float]:
    """(compute, staging) slowdowns while both run at once, as a streamed step overlaps them:
    a loader thread stages the big weights over and over while the runtime runs the one-row
    Q8_0 matmul (``alone`` seconds by itself); each side's median time beside the other over
    its best time alone."""
    import threading

    tensors = [t for t in _native.GgufFile(source).tensors() if t.name.startswith("big.")]
    dest = folder / "stage-overlap.gguf"
    stage_alone = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        write_gguf_subset(tensors, dest)
        stage_alone = min(stage_alone, time.perf_counter() - t0)
    stop = threading.Event()
    staged: list[float] = []

    def loader() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            write_gguf_subset(tensors, dest)
            staged.append(time.perf_counter() - t0)

    thread = threading.Thread(target=loader, name="poot-validate-loader")
    thread.start()
    try:
        computed = [_time_matmul(rt, w, "big.Q8_0", 1, 0)[0] for _ in range(9)]
        while len(staged) < 3 and thread.is_alive():
            _time_matmul(rt, w, "big.Q8_0", 1, 0)  # keep computing beside the loader
    finally:
        stop.set()
        thread.join()
    dest.unlink(missing_ok=True)
    # Medians, not bests: the cost is a thread now and then descheduled for a whole time slice
    # while every other thread of the pool waits for it, which a best-of hides.
    return float(np.median(computed)) / alone, float(np.median(staged)) / stage_alone


def _time_fresh_map(
    source: Path, folder: Path, threads: int | None, gemv: dict[str, float]
) -> float:
    """Bytes/s of the extra cost of a matmul's first pass over a freshly staged buffer (page
    faults mapping it), over the warm rate; ``streaming`` pays it for every chunk it stages."""
    tensor = next(t for t in _native.GgufFile(source).tensors() if t.name == "big.Q8_0")
    rt = _native.CpuRuntime(threads, "ggml")
    extra = float("inf")
    for i in range(3):
        dest = folder / f"fresh{i}.gguf"
        write_gguf_subset([tensor], dest)
        w = _native.Weights(_native.GgufFile(dest))
        first, _, _ = _time_matmul(rt, w, "big.Q8_0", 1, 0)
        extra = min(extra, first - tensor.nbytes / gemv["Q8_0"])
        del w
        dest.unlink()
    return tensor.nbytes / max(extra, 1e-6)


def _time_segment_start(folder: Path, rng: np.random.Generator) -> float:
    """Best seconds to start and run a streamed chunk's fixed work, as ``streaming`` does: open
    the buffer file as ``Weights``, trace a layer-sized graph (7 matmuls, 24 more equations),
    compile it and run it once (the run's fixed cost; the matmuls here are tiny)."""
    entries = []
    for i in range(7):
        raw, _ = quantize(rng.standard_normal((64, 64), dtype=np.float32), "Q8_0")
        entries.append((f"w{i}", "Q8_0", (64, 64), raw))
    path = folder / "segment.gguf"
    write_gguf_arrays(entries, path)
    rt = _native.CpuRuntime(None, "exact")
    x = {"x": np.ones((1, 64), np.float32)}
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        w = _native.Weights(_native.GgufFile(path))
        t = _native.Tracer(w, 1)
        v = t.input("x", "f32", [1, 64])
        for i in range(7):
            v = t.matmul(v, t.weight(f"w{i}"))
            for _ in range(3):
                v = t.silu(v)
        t.output("y", v)
        rt.run(rt.prepare(t.finish(), w), x)
        del w, t
        best = min(best, time.perf_counter() - t0)
    return best


def benchmark_cpu(
    info: DeviceInfo, threads: int | None = None, quick: bool = False
) -> DeviceProfile:
    """Measures the CPU's profile (see the module docs); ``quick`` uses smaller buffers.

    Weights for the one-row matmuls are larger than a last-level cache (48 MiB; 16 quick) so
    they measure streaming from memory, as a real model's step does; a tiny matmul gives the
    fixed cost of one matmul (thread wake-up and join, less the run's own cost, measured on a
    one-add graph), charged per matmul by the cost model.
    """
    rng = np.random.default_rng(0)
    size = (16 if quick else 48) << 20
    buf = np.ones(size // 4, np.float32)
    dst = np.empty_like(buf)
    read = copy = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        buf.sum()
        read = min(read, time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.copyto(dst, buf)
        copy = min(copy, time.perf_counter() - t0)
    del dst
    gemv: dict[str, float] = {}
    gemm: dict[str, float] = {}
    fixed = []
    with tempfile.TemporaryDirectory(prefix="poot-validate-") as tmp:
        w = _tiled_weights(Path(tmp), 1024, size, rng)
        sizes = {t.name: t.nbytes for t in _native.GgufFile(Path(tmp) / "bench-big.gguf").tensors()}
        for dt in _BOUNDS:
            rt = _native.CpuRuntime(threads, _numerics(dt))
            small, _, _ = _time_matmul(rt, w, f"small.{dt}", 1, 20)
            fixed.append(small)
            chain, nbytes, count = _time_chain(rt, w, dt, sizes)
            gemv[dt] = nbytes / max(1e-9, chain - count * small)
            s64, n, k = _time_matmul(rt, w, f"mid.{dt}", 64, 5)
            gemm[dt] = 2 * 64 * n * k / s64
        rt = _native.CpuRuntime(threads, "exact")
        t = _native.Tracer(w, 1)
        v = t.input("x", "f32", [1, 256])
        chain = 64
        for _ in range(chain):
            v = t.add(v, v)
        t.output("y", v)
        plan = rt.prepare(t.finish(), w)
        x = {"x": np.ones((1, 256), np.float32)}
        best = float("inf")
        for _ in range(20):
            t0 = time.perf_counter()
            rt.run(plan, x)
            best = min(best, time.perf_counter() - t0)
        dispatch = best / (chain + 2)
        # A run's own cost (entry, inputs, outputs), paid once per step: the one-matmul runs
        # above include it, so it comes off the per-matmul fixed cost.
        t = _native.Tracer(w, 1)
        v = t.input("x", "f32", [1, 256])
        t.output("y", t.add(v, v))
        plan = rt.prepare(t.finish(), w)
        run_s = float("inf")
        for _ in range(50):
            t0 = time.perf_counter()
            rt.run(plan, x)
            run_s = min(run_s, time.perf_counter() - t0)
        segment = _time_segment_start(Path(tmp), rng)
        stage = _time_staging(Path(tmp) / "bench-big.gguf", Path(tmp))
        stage_s = _time_stage_fixed(Path(tmp) / "bench-big.gguf", Path(tmp))
        rt = _native.CpuRuntime(threads, "ggml")
        alone, _, _ = _time_matmul(rt, w, "big.Q8_0", 1, 3)
        overlap = _time_overlap(Path(tmp) / "bench-big.gguf", Path(tmp), rt, w, alone)
        fresh = _time_fresh_map(Path(tmp) / "bench-big.gguf", Path(tmp), threads, gemv)
    matmul_s = max(0.0, float(np.median(fixed)) - run_s)
    return DeviceProfile(
        key=info.key, kind="cpu", name=info.name, vendor="cpu", driver=info.driver,
        memory_bytes=info.memory_bytes, read_bw=buf.nbytes / read, gemv_bw=gemv,
        gemm_flops=gemm, dispatch_s=dispatch, matmul_s=matmul_s, link_bw=0.0,
        segment_s=segment, stage_s=stage_s, stage_bw=stage, overlap_slowdown=overlap,
        cores=info.cores, fresh_map_bw=fresh,
        copy_bw=buf.nbytes / copy, source="measured", poot_version=_native.__version__,
    )  # fmt: skip


def validate_cpu(
    info: DeviceInfo, *, threads: int | None = None, quick: bool = False
) -> DeviceReport:
    """Conformance, then benchmarks, for the CPU; the profile only when all checks pass."""
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="poot-validate-") as tmp:
        bench = _Bench(Path(tmp), 256, 64, rng)
        checks = _conformance(bench, threads, rng)
    if any(v != "ok" for v in checks.values()):
        return DeviceReport(info, "failed", checks)
    profile = benchmark_cpu(info, threads, quick)
    checks["benchmarks"] = "ok"
    return DeviceReport(info, "validated", checks, profile)


def validate_all(
    disc: Discovery | None = None,
    *,
    settings: Settings | None = None,
    store: bool = True,
    quick: bool = False,
    vulkan: bool = False,
) -> list[DeviceReport]:
    """Validates every visible device; stores the profiles of those that pass. Raw Vulkan
    devices (``vulkan:N``, not production) only when ``vulkan``: a stored profile makes them
    eligible for the planner."""
    disc = disc or discover()
    reports = []
    for d in disc.devices:
        if d.kind == "vulkan" and not vulkan:
            why = "raw Vulkan (not production): `poot validate-hardware --vulkan` profiles it"
            reports.append(DeviceReport(d, "skipped", note=why))
            continue
        if d.kind == "cpu" or (d.kind in ("wgpu", "vulkan") and d.kind not in disc.notes):
            try:
                if d.kind == "cpu":
                    r = validate_cpu(d, quick=quick)
                else:
                    from poot.planner.validate_wgpu import validate_wgpu

                    r = validate_wgpu(d, quick=quick)
            except Exception as e:  # noqa: BLE001 - a crash in a check is that device's failure
                r = DeviceReport(d, "failed", {"run": f"{type(e).__name__}: {e}"})
            if r.profile is not None and store:
                r.stored = store_profile(d, r.profile, _native.__version__, settings)
        else:
            why = disc.notes.get(d.kind, "") or f"no {d.kind} runtime in this build"
            r = DeviceReport(d, "skipped", note=why)
        reports.append(r)
    return reports
