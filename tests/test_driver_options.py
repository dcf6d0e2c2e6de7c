"""poot.DriverOptions: validation, the fit arithmetic, and LLM accepting the options."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from shared_data import SHARED_MODELS, require_shared

import poot
from poot import errors
from poot.driver_options import DriverOptions, kv_block_bytes

STORIES = SHARED_MODELS / "stories260K"


@dataclass(frozen=True)
class _Shape:
    n_layers: int = 2
    n_kv_heads: int = 4
    head_dim: int = 8
    context_length: int = 256


def test_exported_lazily() -> None:
    assert poot.DriverOptions is DriverOptions


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_num_seqs": 0},
        {"max_step_tokens": 0},
        {"block_size": -1},
        {"num_blocks": 0},
        {"max_prepared_entries": 0},
        {"max_prepared_bytes": 0},
        {"prepared_policy": "lru"},
        {"enable_prefix_caching": "yes"},
        {"max_num_seqs": 2.5},
        {"block_size": True},
    ],
)
def test_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(errors.ConfigError):
        DriverOptions(**kwargs)  # type: ignore[arg-type]


def test_overrides_fill_and_revalidate() -> None:
    base = DriverOptions(max_num_seqs=4)
    assert base.with_overrides(max_num_seqs=None) is base
    assert base.with_overrides(block_size=32).block_size == 32
    with pytest.raises(errors.ConfigError):
        base.with_overrides(block_size=0)


def test_fit_arithmetic() -> None:
    shape = _Shape()
    block = kv_block_bytes(shape, 16, 4)
    assert block == 2 * 4 * 2 * 4 * 8 * 16  # 8192 bytes
    # 100 blocks of memory, 10% reserve -> 90 blocks; a 256-token sequence needs 16 -> 5 rows.
    opts = DriverOptions.fit(shape, 100 * block, reserve_fraction=0.1)
    assert opts.num_blocks == 90
    assert opts.max_num_seqs == 5
    assert opts.block_size == 16 and opts.max_step_tokens == 256
    # Rows are capped by max_rows and by max_step_tokens.
    assert DriverOptions.fit(shape, 10_000 * block, max_rows=7).max_num_seqs == 7
    assert DriverOptions.fit(shape, 10_000 * block, max_step_tokens=3).max_num_seqs == 3
    # A shorter max_model_len, f16 entries, other fields passed through.
    opts = DriverOptions.fit(
        shape,
        100 * block,
        reserve_fraction=0.0,
        max_model_len=64,
        entry_bytes=2,
        enable_prefix_caching=False,
    )
    assert opts.num_blocks == 200 and opts.max_num_seqs == 50
    assert opts.enable_prefix_caching is False


def test_fit_errors() -> None:
    shape = _Shape()
    with pytest.raises(errors.ConfigError):
        DriverOptions.fit(shape, 1 << 30, reserve_fraction=1.0)
    with pytest.raises(errors.ConfigError):
        DriverOptions.fit(shape, 1 << 30, reserve_fraction=-0.1)
    with pytest.raises(errors.ConfigError, match="needs 16"):
        DriverOptions.fit(shape, 15 * kv_block_bytes(shape, 16), reserve_fraction=0.0)


def test_llm_accepts_options_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    path = STORIES / "stories260K-f32.gguf"
    require_shared(path, "stories260K")
    opts = DriverOptions(max_num_seqs=3, max_step_tokens=32, block_size=8, num_blocks=40)
    with caplog.at_level(logging.INFO, logger="poot"):
        llm = poot.LLM(str(path), driver=opts, max_model_len=64, max_num_seqs=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("driver:")]
    assert len(lines) == 1
    # The keyword overrides the options' field; the rest come from the options.
    assert llm.driver.max_num_seqs == 2
    kv = 40 * kv_block_bytes(llm.files.hparams, 8, 4)
    assert lines[0].startswith(
        f"driver: rows=2 step_tokens=32 blocks=40 block_size=8 kv_bytes={kv}"
    )
    assert llm.stats()["num_blocks"] == 40
    params = poot.SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    outs = llm.generate(["Once upon a time", "The cat", "A dog"], params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 5, 5]
    assert llm.stats()["used_blocks"] == 0


def test_llm_default_options() -> None:
    path = STORIES / "stories260K-f32.gguf"
    require_shared(path, "stories260K")
    llm = poot.LLM(str(path), max_model_len=128)
    assert llm.driver.num_blocks is not None and llm.driver.num_blocks >= 128 // 16
    assert llm.driver.max_num_seqs == 8
