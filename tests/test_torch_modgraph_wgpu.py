"""Modules of one plan on different devices: the CPU and the wgpu runtime (lavapipe in CI).

The profiles are synthetic (tests/planner_fixtures.py style) so the planner's choice is
fixed; the runtimes are real. Bound: outputs within 2e-5 absolute of torch eager (float32;
layer norms and reductions sum in f32 on the device).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import eager_chain, require_torch, wgpu_runtime

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.planner import CompileConfig  # noqa: E402
from poot.planner.profiles import DeviceProfile  # noqa: E402
from tests.planner_fixtures import DTYPES, cpu, flat, lavapipe  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    return wgpu_runtime()


def fast_small_gpu(memory: int) -> DeviceProfile:
    """A wgpu device much faster than the CPU at one-row matmuls, holding ``memory`` bytes."""
    return DeviceProfile(
        key="wgpu:0", kind="wgpu", name="synthetic fast wgpu", vendor="mesa",
        memory_bytes=memory, read_bw=900e9, gemv_bw=flat(800e9), gemm_flops=flat(50e12),
        dispatch_s=1e-6, link_bw=16e9, link_latency_s=10e-6, source="measured",
    )  # fmt: skip


def slow_cpu():
    p = cpu()
    return DeviceProfile(**{**p.__dict__, "gemv_bw": dict.fromkeys(DTYPES, 1e9)})


class Big(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.ln = nn.LayerNorm(256)

    def forward(self, x):
        return self.ln(F.gelu(self.fc(x)))


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 10)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)


def test_the_planner_splits_a_sequence_over_cpu_and_wgpu(wgpu, tmp_path):
    torch.manual_seed(3)
    mods = [Big().eval(), Big().eval(), Small().eval()]
    x = torch.randn(4, 256)
    one = sum(p.numel() * 4 for p in mods[0].parameters())
    # The fast device holds one Big module and the Small head, not two Bigs: all-wgpu does not
    # fit, all-CPU costs more, and wgpu first would leave the head on the slow CPU too; so
    # the search puts the first Big on the CPU and the rest on wgpu.
    profiles = [slow_cpu(), fast_small_gpu(one + one // 2)]
    compiled = poot.compile_modules(mods, (x,), profiles=profiles, runtimes={"wgpu:0": wgpu})
    assert compiled.placed == {"0.Big": "cpu", "1.Big": "wgpu:0", "2.Small": "wgpu:0"}
    got = compiled(x)
    np.testing.assert_allclose(np.asarray(got.cpu()), eager_chain(mods, x), rtol=0, atol=2e-5)
    text = compiled.explain()
    assert "chosen: cpu [0.Big] resident; wgpu:0 [1.Big..2.Small] resident" in text
    assert "0.Big -> cpu" in text and "2.Small -> wgpu:0" in text
    assert "runner-up:" in text
    page = compiled.visualize(tmp_path / "sim.html").read_text()
    assert 'data-lane="wgpu:0"' in page and 'data-lane="cpu"' in page
    assert 'class="span transfer"' in page  # the cut between the devices


def test_a_pinned_two_tower_graph_on_both_devices(wgpu):
    from tests.test_torch_modgraph import two_tower

    g, inputs, want = two_tower()
    cfg = CompileConfig(force_placement=(("cpu", 0, 1), ("wgpu:0", 1, 3)))
    compiled = g.compile(inputs, cfg, profiles=[cpu(), lavapipe()], runtimes={"wgpu:0": wgpu})
    assert compiled.placed == {"query_tower": "cpu", "doc_tower": "wgpu:0", "score": "wgpu:0"}
    got = compiled(**inputs)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k].cpu()), want[k].numpy(), rtol=0, atol=2e-5)
    assert "doc_tower -> wgpu:0" in compiled.explain()
