"""``load_llm``: the server's model, its batch fitted to the memory that is free.

The server does not ask for rows or a KV size: ``DriverOptions.fit`` turns the bytes the KV
pool may take into KV blocks and rows (as many full ``max_model_len`` sequences as the pool
holds, at most ``MAX_ROWS``). Those bytes are, after the weights:

- with ``--device-budget``: what the weights leave of it, or a quarter of it when they do
  not fit (the planner then streams them through the rest);
- on the CPU: half of the memory the process may still take (``host_memory``: MemAvailable,
  bounded by the memory limit of the cgroup it runs in, so a container's limit counts, not
  the host's memory): the host's memory is everyone's, and the pool's pages are only touched
  as KV is written;
- on CUDA: 90% of the device's memory (as vLLM's ``gpu_memory_utilization``), and never
  more than the driver says is free now (another process's allocations are not ours);
- on wgpu (and raw Vulkan), whose adapters do not say how much memory they have free: 1 GiB.

``fit`` keeps 10% of it back (activations, scratch), and the pool never holds more than the
rows can use, nor more than the 8 GiB the runtimes allocate (``RUNTIME_KV_LIMIT``).
``POOT_SERVE_MAX_ROWS`` (read by the command line into ``ServerConfig.max_rows``) caps the
rows further: tests that need exactly one row use it.

Kept apart from the web stack (no Starlette import), so ``poot-serve`` can start loading the
model on its own thread while uvicorn and Starlette are still being imported.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from poot import _native
from poot.checkpoints import resolve_model_files
from poot.driver_options import DriverOptions, kv_block_bytes
from poot.errors import ConfigError
from poot.host_memory import host_memory
from poot.kv_windows import kv_windows
from poot.llm import LLM
from poot.models import model_definition
from poot.numerics import numerics_for
from poot.server.config import ServerConfig

if TYPE_CHECKING:
    from poot.planner.compiled import CompileConfig

__all__ = ["MAX_ROWS", "RUNTIME_KV_LIMIT", "cuda_kv_bytes", "kv_bytes_free", "load_llm"]

# Rows of one step, at most: DriverOptions' default step budget, which also caps them.
MAX_ROWS = 256
_RESERVE = 0.1
_WGPU_KV_BYTES = 1 << 30
_CUDA_SHARE = 0.9
# The most KV pool every runtime allocates (``max_kv_bytes`` of poot-cpu, poot-wgpu and
# poot-cuda); a bigger one is refused at load.
RUNTIME_KV_LIMIT = 8 << 30

logger = logging.getLogger("poot.server")


def cuda_kv_bytes(weight_bytes: int, free: int, total: int) -> int:
    """The KV pool's share of a CUDA device: 90% of its memory (vLLM's
    ``gpu_memory_utilization``), but never more than is free now, since another process's
    allocations are not ours to take; less the weights, which are not uploaded yet."""
    return max(min(int(total * _CUDA_SHARE), free) - weight_bytes, 0)


def kv_bytes_free(config: ServerConfig, weight_bytes: int) -> int:
    """The bytes the KV pool may come from, before ``fit``'s reserve (module docs)."""
    budget = config.device_budget_bytes
    if budget is not None:
        left = budget - weight_bytes
        return left if left >= budget // 4 else budget // 4
    if config.backend == "cuda":
        return cuda_kv_bytes(weight_bytes, *_native.cuda_memory(0))
    if config.backend in ("wgpu", "vulkan"):
        return _WGPU_KV_BYTES
    memory = host_memory()
    logger.info("host memory: %s", memory.describe())
    available = memory.available
    if available <= 0:  # not known here: what the server took before it fitted itself
        return _WGPU_KV_BYTES
    return max(available - weight_bytes, 0) // 2


def _compile_config(config: ServerConfig) -> CompileConfig | None:
    """The planner's settings when a budget asks for planning (else None: all resident)."""
    if config.device_budget_bytes is None and config.host_budget_bytes is None:
        return None
    from poot.planner.compiled import CompileConfig

    return CompileConfig(
        device_budget_bytes=config.device_budget_bytes,
        host_budget_bytes=config.host_budget_bytes,
        spill_dir=config.spill_dir,
        stall_timeout_s=config.stall_timeout_s,
    )


def load_llm(config: ServerConfig) -> LLM:
    """Resolves (pulling the default model if needed) and loads the model, its rows and KV
    pool fitted to the memory free after the weights (module docs); with progress bars where
    ``config.progress``. With a device or host budget the model is planned under it
    (``poot.CompileConfig``), and the planner streams the weights that do not fit (through
    ``config.spill_dir``).

    Raises:
        PootError: the model cannot be found or loaded, or the memory does not hold one
            sequence.
    """
    files = resolve_model_files(config.model, progress=config.progress)
    h = files.hparams
    max_model_len = config.max_model_len or min(h.context_length, 4096)
    runtime_kind = (
        _native.CudaRuntime
        if config.backend == "cuda"
        else _native.WgpuRuntime
        if config.backend in ("wgpu", "vulkan")
        else _native.CpuRuntime
    )
    numerics = "exact" if config.backend == "cuda" else numerics_for("auto", files)
    entry_bytes = runtime_kind.kv_entry_bytes_for(numerics)
    block_size = DriverOptions().block_size
    max_rows = min(config.max_rows or MAX_ROWS, MAX_ROWS)
    free = kv_bytes_free(config, files.total_bytes)
    # What sliding windows save (a planner placement keeps one table for every layer).
    windows = kv_windows(model_definition(files))
    if windows is not None and windows.grouped and _compile_config(config) is not None:
        windows = None
    # No more than ``max_rows`` full-length sequences can use the pool. fit keeps ``_RESERVE``
    # of what it is given back, so the ceiling is scaled up, plus a block against rounding.
    block_bytes = kv_block_bytes(h, block_size, entry_bytes)
    blocks = max_rows * -(-max_model_len // block_size)
    ceiling = int(blocks * block_bytes / (1 - _RESERVE)) + block_bytes
    # Nor more than the runtimes allocate (the pool holds one more block, the null block).
    limit = int((RUNTIME_KV_LIMIT - block_bytes) / (1 - _RESERVE))
    try:
        opts = DriverOptions.fit(
            h,
            min(free, ceiling, limit),
            _RESERVE,
            max_model_len=max_model_len,
            entry_bytes=entry_bytes,
            block_size=block_size,
            max_rows=max_rows,
            windows=windows,
        )
    except ConfigError as e:
        where = "--device-budget" if config.device_budget_bytes is not None else "free memory"
        raise ConfigError(
            f"no room for one sequence's KV cache in the {where} left after the weights: {e}; "
            "lower --max-model-len"
            + (" or raise --device-budget" if config.device_budget_bytes is not None else "")
        ) from None
    llm = LLM(
        str(files.path),
        threads=config.threads,
        max_model_len=max_model_len,
        driver=opts,
        timeout_s=config.step_timeout_s,
        backend="cuda"
        if config.backend == "cuda"
        else "wgpu"
        if config.backend == "wgpu"
        else "vulkan"
        if config.backend == "vulkan"
        else "cpu",
        progress=config.progress,
        config=_compile_config(config),
    )
    if llm.compiled is not None:
        c = llm.compiled
        how = "resident (direct)" if c.direct else "streamed" if c.streams else "split"
        logger.info("planned under the budgets: weights %s, spill dir %s", how, c.spill_dir)
    if config.chat_template is not None:
        llm.tokenizer.chat_templates["default"] = config.chat_template
    return llm
