"""The planner's cost model on a mixture-of-experts model: a step reads only the experts its
tokens choose, while every expert stays resident.

Fixture: the random-weight Qwen3-MoE checkpoint of ``tests/family_models.py`` (2 layers, 8
experts of width 128, 2 per token, hidden 256), as a GGUF (experts stored as 3-D tensors) and as
a HF directory (experts one tensor each, read through the weight store's virtual stacks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from planner_fixtures import cpu

from poot.planner.cost import unit_compute_s
from poot.planner.graphstats import ModelStats, Workload, experts_read, model_stats

E, K, HIDDEN, EXPERT_FF = 8, 2, 256, 128
STACKS = ("gate", "up", "down")


def _stats(path: Path, rows: int) -> ModelStats:
    from poot import _native
    from poot.checkpoints import resolve_model_files
    from poot.models import model_definition

    files = resolve_model_files(path)
    source = files.gguf if files.gguf is not None else files.safetensors
    assert source is not None
    sizes = {t.name: t.nbytes for t in files.tensors()}
    return model_stats(
        model_definition(files), _native.Weights(source), sizes, Workload(rows=rows, context=32)
    )


def _is_stack(name: str) -> bool:
    return name.endswith("_exps.weight") or ".experts." in name


@pytest.fixture(scope="module")
def moe(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints("qwen3moe")


def test_experts_read_counts_distinct_experts() -> None:
    assert experts_read(E, K, 1) == K  # one token: exactly its k experts
    assert experts_read(E, K, 2) == pytest.approx(E * (1 - (1 - K / E) ** 2))
    assert experts_read(E, K, 4096) == pytest.approx(E)  # a long prefill touches them all
    assert experts_read(128, 8, 3) <= 24  # never more than tokens * k
    assert experts_read(E, E, 5) == E
    assert experts_read(0, K, 5) == experts_read(E, 0, 5) == experts_read(E, K, 0) == 0.0


@pytest.mark.parametrize("form", ["gguf", "hf"])
def test_decode_reads_the_chosen_experts_memory_holds_all(moe: dict[str, Any], form: str) -> None:
    stats = _stats(moe[form], rows=1)
    stack_bytes = E * EXPERT_FF * HIDDEN * 4  # one F32 [E, N, K] stack
    for u in stats.units[1:-1]:
        stacks = sorted(n for n in u.weights if _is_stack(n))
        assert len(stacks) == len(STACKS), stacks
        assert all(stats.sizes[n] == stack_bytes for n in stacks)
        dense = sum(stats.sizes[n] for n in u.weights if not _is_stack(n))
        matrices = sum(stats.sizes[n] for n in u.weights if not _is_stack(n) and "norm" not in n)
        # Resident: every expert. Read per decode step: the dense matrices and k of E experts.
        assert u.weight_bytes == dense + 3 * stack_bytes
        assert u.bytes_by_dtype["F32"] == matrices + 3 * stack_bytes * K // E
        router = 2 * HIDDEN * E
        attn = sum(
            2 * stats.sizes[n] // 4
            for n in u.weights
            if not _is_stack(n)
            and any(p in n for p in ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "_proj."))
        )
        assert u.matmul_flops["F32"] == attn + router + 3 * 2 * K * EXPERT_FF * HIDDEN
        assert u.matmuls == 4 + 1 + 3  # q, k, v, o; the router; gate, up, down
    # Every expert counts against a device's memory, in the placement's budgets too.
    assert stats.bytes_of(1, 2) == stats.units[1].weight_bytes
    assert stats.total_weight_bytes == sum(stats.sizes[n] for n in _stored(stats))


def _stored(stats: ModelStats) -> set[str]:
    return set().union(*(u.weights for u in stats.units))


def test_hf_stacks_cost_as_the_gguf_stacks(moe: dict[str, Any]) -> None:
    """The HF directory's virtual stacks (experts one tensor each) get the GGUF's bytes."""
    gg, hf = _stats(moe["gguf"], rows=1), _stats(moe["hf"], rows=1)
    for a, b in zip(gg.units[1:-1], hf.units[1:-1], strict=True):
        assert a.weight_bytes == b.weight_bytes
        assert a.bytes_by_dtype == b.bytes_by_dtype
        assert a.matmul_flops == b.matmul_flops


def test_more_rows_read_more_experts_and_cost_more(moe: dict[str, Any]) -> None:
    one, four, many = (_stats(moe["gguf"], rows=r) for r in (1, 4, 512))
    stack = E * EXPERT_FF * HIDDEN * 4
    for r, s in ((1, one), (4, four), (512, many)):
        u = s.units[1]
        matrices = sum(s.sizes[n] for n in u.weights if not _is_stack(n) and "norm" not in n)
        want = matrices + 3 * stack * experts_read(E, K, r) / E
        assert u.bytes_by_dtype["F32"] == pytest.approx(want, abs=3)
    # A long prefill reads (nearly) every expert once.
    assert experts_read(E, K, 512) == pytest.approx(E)
    # The analytic cost: a decode step is bound by the bytes it reads (k of E experts).
    p = cpu()
    mm, _ = unit_compute_s(one.units[1], p)
    u = one.units[1]
    reads = u.bytes_by_dtype["F32"] / p.gemv("F32")
    assert mm == pytest.approx(max(reads, u.matmul_flops["F32"] / p.gemm("F32")) + 8 * p.matmul_s)
    assert unit_compute_s(four.units[1], p)[0] > mm
