"""Synthetic device profiles and model stats for the planner tests (no device needed)."""

from __future__ import annotations

from pathlib import Path

from poot.planner.graphstats import ModelStats, Workload, model_stats
from poot.planner.profiles import DeviceProfile, HostProfile

GB = 1_000_000_000
DTYPES = ("F32", "F16", "Q8_0", "Q4_0")


def flat(v: float) -> dict[str, float]:
    return dict.fromkeys(DTYPES, v)


def cpu(memory: int = 64 * GB) -> DeviceProfile:
    return DeviceProfile(
        key="cpu", kind="cpu", name="synthetic CPU", vendor="cpu", memory_bytes=memory,
        read_bw=50e9, gemv_bw=flat(40e9), gemm_flops=flat(1e12), dispatch_s=2e-6,
        matmul_s=5e-6,
    )  # fmt: skip


def gpu(
    key: str = "cuda:0", memory: int = 24 * GB, peer: dict[str, float] | None = None
) -> DeviceProfile:
    return DeviceProfile(
        key=key, kind="cuda", name=f"synthetic GPU {key}", vendor="nvidia", memory_bytes=memory,
        read_bw=900e9, gemv_bw=flat(800e9), gemm_flops=flat(50e12), dispatch_s=1e-6,
        link_bw=16e9, link_latency_s=10e-6, peer_bw=dict(peer or {}), source="measured",
    )  # fmt: skip


def lavapipe() -> DeviceProfile:
    """A software Vulkan adapter: runs on the CPU's cores, slower than them, sharing them."""
    return DeviceProfile(
        key="wgpu:0", kind="wgpu", name="llvmpipe (LLVM 15.0.6, 256 bits)", vendor="mesa",
        memory_bytes=16 * GB, read_bw=20e9, gemv_bw=flat(8e9), gemm_flops=flat(2e11),
        dispatch_s=30e-6, link_bw=10e9, link_latency_s=20e-6, software=True, source="measured",
    )  # fmt: skip


def host() -> HostProfile:
    return HostProfile(memory_bytes=64 * GB, disk_read_bw=2e9, copy_bw=20e9)


def scaled_stats(gguf: Path, total: int, workload: Workload | None = None) -> ModelStats:
    """stories260K's real step graph with its weights scaled to ``total`` bytes (a 7B-sized
    model with a real layer structure; decode cost is bound by weight bytes)."""
    from poot import _native
    from poot.checkpoints import resolve_model_files
    from poot.models import model_definition

    files = resolve_model_files(gguf)
    sizes = {t.name: t.nbytes for t in files.tensors()}
    factor = total / sum(sizes.values())
    sizes = {k: int(v * factor) for k, v in sizes.items()}
    assert files.gguf is not None
    return model_stats(
        model_definition(files), _native.Weights(files.gguf), sizes, workload or Workload()
    )


def kv_bytes(gguf: Path, workload: Workload | None = None) -> int:
    """The KV pool bytes the planner keeps for ``gguf`` under ``workload`` (default: one row,
    context 256): a device budget holds them on top of the weights it streams."""
    from poot import _native
    from poot.checkpoints import resolve_model_files
    from poot.models import model_definition

    files = resolve_model_files(gguf)
    sizes = {t.name: t.nbytes for t in files.tensors()}
    assert files.gguf is not None
    stats = model_stats(
        model_definition(files), _native.Weights(files.gguf), sizes, workload or Workload()
    )
    return stats.kv_of(0, len(stats.units))


def llm_kv_bytes(gguf: Path) -> int:
    """The KV pool a default ``poot.LLM`` of ``gguf`` keeps on the CPU (its blocks, one more for
    the null block, f16 entries in ggml numerics): what a compiled LLM's device budget holds
    besides weights."""
    import poot

    llm = poot.LLM(gguf)
    layers, heads, dim = llm.definition.kv_shape
    entry = 2 if llm.numerics == "ggml" else 4
    return llm.runner.pool_blocks * llm.block_size * layers * 2 * heads * dim * entry
