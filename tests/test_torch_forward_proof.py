"""Issue 34's forward proof in one place: four models' outputs against torch eager (float32),
on the CPU runtime and on the wgpu runtime (lavapipe in CI), each with its stated bound.

| model | CPU | wgpu |
|---|---|---|
| MLP (linear, SiLU, tanh-GELU, layer norm, softmax) | 1e-5 | 2e-5 |
| ViT (patches by reshape/permute, class token, non-causal attention) | 1e-5 | 2e-5 |
| nanoGPT decoder (2 blocks, causal attention, LM head) | 1e-5 | 2e-5 |
| two-tower ``ModuleGraph`` (dict outputs, a tuple-taking join) | 1e-5 | 2e-5 |

wgpu is looser because layer norms and reductions sum in f32 on the device (f64 on the CPU).

Absolute bounds on outputs of magnitude ~1; the matmuls sum in another order than torch's BLAS.
On wgpu the outputs come back device-resident and are read with ``cpu()``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from tests.planner_fixtures import cpu, lavapipe  # noqa: E402

BOUND = {"cpu": 1e-5, "wgpu": 2e-5}


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(24, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        self.ln = nn.LayerNorm(64)

    def forward(self, x):
        h = F.silu(self.fc1(x))
        h = self.ln(h + F.gelu(self.fc2(h), approximate="tanh"))
        return torch.softmax(self.fc3(h), dim=-1)


def _model(name: str):
    if name == "mlp":
        return Mlp().eval(), torch.randn(8, 24)
    if name == "vit":
        from tests.test_torch_compile_vit import Vit

        return Vit().eval(), torch.randn(2, 3, 16, 16)
    from tests.test_torch_compile_gpt import Gpt

    return Gpt(True).eval(), torch.randint(0, 65, (2, 16))


@pytest.fixture(scope="module", params=["cpu", pytest.param("wgpu", marks=pytest.mark.device_wgpu)])
def device(request):
    if request.param == "cpu":
        return "cpu", None
    from wgpu_util import require_wgpu

    require_wgpu()
    return "wgpu", poot._native.WgpuRuntime(timeout_s=60.0)


@pytest.mark.parametrize("name", ["mlp", "vit", "nanogpt"])
def test_single_module_matches_eager(device, name):
    kind, rt = device
    torch.manual_seed(20)
    m, x = _model(name)
    with torch.no_grad():
        want = m(x).numpy()
    got = poot.compile(m, (x,), runtime=rt)(x)
    assert got.device == ("cpu" if kind == "cpu" else "wgpu:0")
    np.testing.assert_allclose(got.cpu(), want, rtol=0, atol=BOUND[kind])


def test_two_tower_graph_matches_eager(device):
    from poot.planner import CompileConfig
    from tests.test_torch_modgraph import two_tower

    kind, rt = device
    g, inputs, want = two_tower()
    if kind == "cpu":
        compiled = g.compile(inputs, profiles=[cpu()])
    else:
        cfg = CompileConfig(force_placement=(("wgpu:0", 0, 3),))
        compiled = g.compile(inputs, cfg, profiles=[cpu(), lavapipe()], runtimes={"wgpu:0": rt})
    assert set(compiled.placed.values()) == {"cpu" if kind == "cpu" else "wgpu:0"}
    got = compiled(**inputs)
    for k in want:
        np.testing.assert_allclose(got[k].cpu(), want[k].numpy(), rtol=0, atol=BOUND[kind])
