"""The server fits its batch to the memory: rows and KV blocks come from ``DriverOptions.fit``
over the bytes the device budget, or the memory that is free, leaves after the weights
(``poot.server.loading``). The real default model, loaded in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot._native import CpuRuntime
from poot.driver_options import kv_block_bytes
from poot.errors import ConfigError
from poot.server.config import ServerConfig
from poot.server.loading import MAX_ROWS, RUNTIME_KV_LIMIT, kv_bytes_free, load_llm

MIB = 1 << 20


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no /proc/meminfo: the CPU rule reads MemAvailable")


def test_the_bytes_for_the_kv_pool() -> None:
    weights = 100 * MIB
    # A device budget: what the weights leave, or a quarter when they (nearly) fill it.
    assert kv_bytes_free(ServerConfig(device_budget_bytes=500 * MIB), weights) == 400 * MIB
    assert kv_bytes_free(ServerConfig(device_budget_bytes=120 * MIB), weights) == 30 * MIB
    # wgpu adapters do not say what they have free.
    assert kv_bytes_free(ServerConfig(backend="wgpu"), weights) == 1 << 30
    # The CPU: half of what the OS can give after the weights.
    free = kv_bytes_free(ServerConfig(), weights)
    assert 0 < free <= (_mem_total() - weights) // 2


def test_the_rows_and_blocks_are_fitted_to_the_memory(default_model_path: Path) -> None:
    llm = load_llm(ServerConfig(model=str(default_model_path), max_model_len=256, progress=False))
    h = llm.files.hparams
    bb = kv_block_bytes(h, llm.block_size, CpuRuntime.kv_entry_bytes_for(llm.numerics))
    per_seq = 256 // llm.block_size
    blocks = llm.scheduler.num_blocks
    # As many full-length rows as the pool holds, at most MAX_ROWS; the pool no bigger than
    # those rows use (one block of slack), and within 90% of the memory it was given.
    assert llm.max_num_seqs == min(blocks // per_seq, MAX_ROWS)
    assert blocks <= MAX_ROWS * per_seq + 2
    assert blocks * bb <= kv_bytes_free(ServerConfig(), llm.files.total_bytes) * 0.9 + bb


def test_the_pool_stays_within_what_the_runtime_allocates(default_model_path: Path) -> None:
    # At the default max_model_len (4096) the rows could use 24 GB of KV; a machine with
    # more than 16 GB free would offer more than the runtime's 8 GiB.
    llm = load_llm(ServerConfig(model=str(default_model_path), progress=False))
    bb = kv_block_bytes(
        llm.files.hparams, llm.block_size, CpuRuntime.kv_entry_bytes_for(llm.numerics)
    )
    assert llm.scheduler.pool_blocks * bb <= RUNTIME_KV_LIMIT


def test_a_row_cap_gives_one_full_length_row(default_model_path: Path) -> None:
    llm = load_llm(
        ServerConfig(model=str(default_model_path), max_model_len=512, max_rows=1, progress=False)
    )
    assert llm.max_num_seqs == 1
    assert 512 // llm.block_size <= llm.scheduler.num_blocks <= 512 // llm.block_size + 2


def test_the_device_budget_sizes_rows_and_blocks(default_model_path: Path) -> None:
    config = ServerConfig(
        model=str(default_model_path),
        max_model_len=256,
        progress=False,
        device_budget_bytes=98_362_432 + 64 * MIB,
    )
    llm = load_llm(config)
    bb = kv_block_bytes(
        llm.files.hparams, llm.block_size, CpuRuntime.kv_entry_bytes_for(llm.numerics)
    )
    want_blocks = int(kv_bytes_free(config, llm.files.total_bytes) * 0.9) // bb
    assert llm.scheduler.num_blocks == want_blocks
    assert llm.max_num_seqs == want_blocks // (256 // llm.block_size)


def test_a_budget_without_room_for_one_sequence_is_refused(default_model_path: Path) -> None:
    config = ServerConfig(
        model=str(default_model_path), max_model_len=8192, device_budget_bytes=100 * MIB
    )
    with pytest.raises(ConfigError, match="one sequence of 8192 tokens.*raise --device-budget"):
        load_llm(config)


def test_config_refuses_a_bad_row_cap() -> None:
    with pytest.raises(ConfigError, match="max_rows"):
        ServerConfig(max_rows=0)
