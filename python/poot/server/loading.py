"""``load_llm``: the server's model, sized to the memory that is free.

Kept apart from the web stack (no Starlette import), so ``poot-serve`` can start loading the
model on its own thread while uvicorn and Starlette are still being imported.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from poot.checkpoints import resolve_model_files
from poot.driver_options import DriverOptions, kv_block_bytes
from poot.llm import LLM
from poot.numerics import numerics_for
from poot.server.config import ServerConfig

if TYPE_CHECKING:
    from poot.planner.compiled import CompileConfig

__all__ = ["load_llm"]

logger = logging.getLogger("poot.server")


def _available_bytes() -> int:
    """Memory the OS can give without swapping (MemAvailable), or 0 where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


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
    """Resolves (pulling the default model if needed) and loads the model, its KV pool sized by
    ``DriverOptions.fit`` to the memory free after the weights, capped by
    ``config.kv_cache_bytes``; with progress bars where ``config.progress``. With a device or
    host budget the model is planned under it (``poot.CompileConfig``): the KV pool takes what
    the weights leave of the device budget, or a quarter of it when they do not fit, and the
    planner streams the weights that do not fit (through ``config.spill_dir``).

    Raises:
        PootError: the model cannot be found or loaded, or the memory does not hold one
            sequence.
    """
    files = resolve_model_files(config.model, progress=config.progress)
    h = files.hparams
    max_model_len = config.max_model_len or min(h.context_length, 4096)
    entry_bytes = 2 if numerics_for("auto", files) == "ggml" else 4
    reserve = 0.1
    block_size = DriverOptions().block_size
    # fit keeps ``reserve`` of what it is given back, so the cap is scaled up to stay exact.
    free = int(config.kv_cache_bytes / (1 - reserve))
    available = _available_bytes() - files.total_bytes
    if available > 0:
        free = min(free, available)
    budget = config.device_budget_bytes
    if budget is not None:
        # The KV pool comes out of the device budget: what the weights leave, or a quarter of
        # it when they do not fit (the rest holds the resident part and the double buffer
        # the planner streams the others through).
        left = budget - files.total_bytes
        free = min(free, int((left if left >= budget // 4 else budget // 4) * (1 - reserve)))
    # No more than ``max_num_seqs`` full-length sequences can use: the pool is reserved up
    # front (its pages are touched as KV is written), so a tiny model must not take the cap.
    blocks = config.max_num_seqs * -(-max_model_len // block_size)
    free = min(free, int(blocks * kv_block_bytes(h, block_size, entry_bytes) / (1 - reserve)) + 1)
    opts = DriverOptions.fit(
        h,
        free,
        reserve,
        max_model_len=max_model_len,
        entry_bytes=entry_bytes,
        block_size=block_size,
        max_rows=config.max_num_seqs,
    )
    # fit counts rows as full-length sequences; most requests are far shorter, so the rows
    # asked for are kept and the scheduler preempts if the pool ever runs out.
    opts = opts.with_overrides(max_num_seqs=min(config.max_num_seqs, opts.max_step_tokens))
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
