"""Device discovery: what this machine shows, without running anything on it.

Discovery is not validation. A device found here is *visible*; it becomes *validated* only when
``poot validate-hardware`` ran the conformance subset and the micro-benchmarks on it and stored
a profile (``poot.planner.profiles``). The planner places work only on validated devices, or on
the CPU with an estimated profile, and says so (``CompiledModel.explain``).

Sources, each optional (a missing tool is reported, never raised):
    - CPU: ``/proc/cpuinfo`` (model, SIMD and matrix flags), ``os.sched_getaffinity`` (usable
      cores), ``/proc/meminfo`` (total and available memory).
    - wgpu adapters: the wgpu runtime when this build has one (``poot._native.wgpu_adapters``),
      otherwise ``vulkaninfo --summary``; adapters are then visible but cannot be validated.
    - raw Vulkan devices (``vulkan:N``, the same kernels through ash; not production): the
      runtime's own list (``poot._native.vulkan_devices``), empty in a build without it.
    - CUDA: the CUDA runtime's own driver queries (``_native.cuda_devices``), else
      ``nvidia-smi``; the absence of both is reported as "no driver".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from poot.host_memory import host_memory

__all__ = ["DeviceInfo", "Discovery", "discover"]

# SIMD and matrix features worth naming (x86 and Arm flag spellings in /proc/cpuinfo).
_FEATURES = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
    "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "asimddp", "sve", "sve2",
    "i8mm", "bf16", "sme",
)  # fmt: skip
_TOOL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DeviceInfo:
    """One visible device.

    Attributes:
        key: a stable key, e.g. ``"cpu"``, ``"wgpu:0"``, ``"cuda:0"``.
        kind: ``"cpu"``, ``"wgpu"``, ``"vulkan"`` or ``"cuda"``.
        name: the device's own name.
        vendor: its vendor (``"cpu"`` for the host).
        driver: driver name and version, or ``""``.
        memory_bytes: memory the device can hold weights in (host RAM for the CPU).
        cores: compute units where known (CPU cores in this process's affinity).
        features: SIMD/matrix features (CPU) or adapter traits (``"software"``).
        limits: adapter limits where known (e.g. ``max_buffer_size``).
        software: a software rasterizer (lavapipe/llvmpipe) that runs on the CPU's own cores.
    """

    key: str
    kind: str
    name: str
    vendor: str
    driver: str = ""
    memory_bytes: int = 0
    cores: int = 0
    features: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    software: bool = False

    @property
    def identity(self) -> str:
        """Device, driver: what a stored profile is keyed by (with poot's version)."""
        return f"{self.kind}|{self.name}|{self.driver}"


@dataclass(frozen=True)
class Discovery:
    """Everything discovery found, and what it could not look at.

    Attributes:
        devices: visible devices, the CPU first.
        notes: per source, why it found nothing (e.g. ``{"cuda": "no driver (nvidia-smi ...)"}``).
        host_memory_bytes: total host memory.
        host_available_bytes: host memory available now.
    """

    devices: tuple[DeviceInfo, ...]
    notes: dict[str, str]
    host_memory_bytes: int
    host_available_bytes: int

    def get(self, key: str) -> DeviceInfo | None:
        """The device with ``key``, or None."""
        return next((d for d in self.devices if d.key == key), None)


def _meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(total, available) host bytes, both bounded by the process's memory cgroup: inside a
    container /proc/meminfo describes the whole host (``poot.host_memory``)."""
    total = 0
    try:
        for line in path.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == "MemTotal" and rest.split():
                total = int(rest.split()[0]) * 1024
                break
    except (OSError, ValueError):
        pass
    mem = host_memory(meminfo=path)
    if mem.cgroup_limit is not None:
        total = min(total, mem.cgroup_limit) if total else mem.cgroup_limit
    return total, mem.available or total


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> DeviceInfo:
    """The host CPU as a device: model name, usable cores, features, host memory."""
    name, flags = "unknown CPU", set[str]()
    try:
        for line in cpuinfo.read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "Model", "cpu model") and name == "unknown CPU":
                name = v.strip()
            elif k in ("flags", "Features") and not flags:
                flags = set(v.split())
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    total, _ = _meminfo()
    feats = tuple(f for f in _FEATURES if f in flags)
    return DeviceInfo("cpu", "cpu", name, "cpu", "", total, cores, feats)


def _run(argv: list[str]) -> tuple[str | None, str]:
    """stdout of a tool, or (None, why not)."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} not found"
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")  # vulkaninfo complains (harmlessly) without it
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{argv[0]} failed: {e}"
    if p.returncode != 0:
        return None, f"{argv[0]} exited {p.returncode}: {p.stderr.strip()[:200]}"
    return p.stdout, ""


_SOFTWARE = re.compile(r"llvmpipe|lavapipe|swiftshader|softpipe", re.I)
_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel", "0x10005": "mesa",
            "0x13b5": "arm", "0x5143": "qualcomm", "0x106b": "apple"}  # fmt: skip


def parse_vulkaninfo_summary(text: str) -> list[DeviceInfo]:
    """Adapters from ``vulkaninfo --summary`` output (the ``GPUn:`` blocks)."""
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        if re.match(r"^GPU\d+:", line.strip()):
            blocks.append({})
        elif blocks and "=" in line:
            k, _, v = line.partition("=")
            blocks[-1][k.strip()] = v.strip()
    out = []
    for i, b in enumerate(blocks):
        name = b.get("deviceName", f"adapter {i}")
        software = bool(_SOFTWARE.search(name)) or b.get("deviceType", "").endswith("_CPU")
        vendor = _VENDORS.get(b.get("vendorID", "").lower(), b.get("vendorID", "unknown"))
        driver = " ".join(x for x in (b.get("driverName", ""), b.get("driverInfo", "")) if x)
        feats = ("software",) if software else ()
        out.append(DeviceInfo(f"wgpu:{i}", "wgpu", name, vendor, driver, 0, 0, feats, {}, software))
    return out


def _vendor_of(name: str, driver: str) -> str:
    # The runtime's adapter list has no vendor id; its names and drivers say enough.
    text = f"{name} {driver}".lower()
    for word, vendor in (("mesa", "mesa"), ("nvidia", "nvidia"), ("radeon", "amd"),
                         ("amd", "amd"), ("intel", "intel"), ("apple", "apple")):  # fmt: skip
        if word in text:
            return vendor
    return "unknown"


def wgpu_adapters() -> tuple[list[DeviceInfo], str]:
    """wgpu adapters: from the wgpu runtime when built in, else from vulkaninfo."""
    from poot import _native

    adapters = getattr(_native, "wgpu_adapters", None)
    if callable(adapters):  # the wgpu backend is built in: it lists the adapters itself
        found = []
        for i, a in enumerate(adapters()):
            name = str(a.get("name", f"adapter {i}"))
            sw = bool(_SOFTWARE.search(name)) or a.get("device_type") == "Cpu"
            limits = {k: int(v) for k, v in dict(a.get("limits", {})).items()}
            # A software adapter's memory is host RAM; a GPU's is unknown here (0).
            memory = _meminfo()[0] if sw else int(limits.get("max_buffer_size", 0))
            found.append(
                DeviceInfo(f"wgpu:{i}", "wgpu", name, _vendor_of(name, str(a.get("driver", ""))),
                           str(a.get("driver", "")), memory, 0, ("software",) if sw else (),
                           limits, sw)
            )  # fmt: skip
        return found, ""
    text, why = _run(["vulkaninfo", "--summary"])
    if text is None:
        return [], f"no wgpu runtime in this build; {why}"
    found = parse_vulkaninfo_summary(text)
    note = "no wgpu runtime in this build: adapters listed from vulkaninfo, not validatable"
    return found, note if found else f"{note}; none found"


def vulkan_devices() -> tuple[list[DeviceInfo], str]:
    """Raw Vulkan devices (best first, as the raw Vulkan runtime opens them); a note where
    there are none (no device, or a build without the ``vulkan`` feature)."""
    from poot import _native

    listed = getattr(_native, "vulkan_devices", None)
    found = []
    for i, a in enumerate(listed() if callable(listed) else []):
        name = str(a.get("name", f"device {i}"))
        sw = bool(_SOFTWARE.search(name)) or a.get("device_type") == "Cpu"
        limits = {"max_storage_buffer_range": int(a.get("max_storage_buffer_range", 0))}
        feats = tuple(f"subgroup_{op}" for op in a.get("subgroup_ops", ()))
        if a.get("cooperative_matrix"):
            feats += ("cooperative_matrix",)
        found.append(
            DeviceInfo(f"vulkan:{i}", "vulkan", name, _vendor_of(name, str(a.get("driver", ""))),
                       str(a.get("driver", "")), _meminfo()[0] if sw else 0, 0,
                       (("software",) if sw else ()) + feats, limits, sw)
        )  # fmt: skip
    return found, "" if found else "no raw Vulkan device (or a build without the vulkan feature)"


def cuda_devices() -> tuple[list[DeviceInfo], str]:
    """CUDA devices: from the CUDA runtime's driver queries when built in (name, compute
    capability as a feature ``sm_XY``, multiprocessors as cores, memory, driver version), else
    from ``nvidia-smi``; none with a note where there is no driver."""
    from poot import _native

    listed = getattr(_native, "cuda_devices", None)
    found = listed() if callable(listed) else []
    if found:
        out = []
        for d in found:
            major, minor = str(d["compute_capability"]).split(".")
            version = int(d["driver_version"])  # e.g. 13000 for CUDA 13.0
            out.append(
                DeviceInfo(
                    f"cuda:{d['ordinal']}",
                    "cuda",
                    str(d["name"]),
                    "nvidia",
                    f"CUDA {version // 1000}.{version % 1000 // 10}",
                    int(d["total_memory"]),
                    cores=int(d["multiprocessors"]),
                    features=(f"sm_{major}{minor}",),
                )
            )
        return out, ""
    text, why = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        ]
    )
    if text is None:
        return [], f"no driver ({why})"
    out = []
    for i, line in enumerate(x for x in text.splitlines() if x.strip()):
        name, mem, drv = (p.strip() for p in line.split(","))
        out.append(DeviceInfo(f"cuda:{i}", "cuda", name, "nvidia", drv, int(float(mem)) << 20))
    return out, "" if out else "driver present, no devices"


def discover() -> Discovery:
    """Everything visible on this machine (CPU first)."""
    cpu = cpu_info()
    notes: dict[str, str] = {}
    wgpu, note = wgpu_adapters()
    if note:
        notes["wgpu"] = note
    vulkan, note = vulkan_devices()
    if note:
        notes["vulkan"] = note
    cuda, note = cuda_devices()
    if note:
        notes["cuda"] = note
    total, avail = _meminfo()
    return Discovery((cpu, *wgpu, *vulkan, *cuda), notes, total, avail)
