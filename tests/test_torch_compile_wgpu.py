"""A torch module prepared for the wgpu runtime (lavapipe in CI), and an artifact saved on the
CPU runtime loaded there: device choice happens at load, not in the file.

Bound: within 1e-5 absolute of torch eager (float32): linear layers (the IR's `matmul` and
`add`), SiLU, tanh-GELU, softmax, reshapes; the `unary` and `scalar` ops within 1e-6 relative
plus 2e-6 absolute. The other general tensor ops (layer norm, broadcasting binaries, permutes,
batched matmuls, reductions, the causal mask) have no WGSL kernels yet, and preparing a graph
that holds one is a typed `UnsupportedOpError`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import UnsupportedOpError  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    from wgpu_util import require_wgpu

    require_wgpu()
    return poot._native.WgpuRuntime(timeout_s=60.0)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = F.silu(self.fc1(x)) + F.gelu(self.fc1(x), approximate="tanh")
        return torch.softmax(self.fc2(h).view(2, 2, 8), dim=-1)


def test_mlp_on_wgpu_and_a_cpu_artifact_loaded_there(wgpu, tmp_path):
    torch.manual_seed(8)
    m = Mlp().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = m(x).numpy()
    on_wgpu = poot.compile(m, (x,), runtime=wgpu)
    np.testing.assert_allclose(on_wgpu(x).cpu(), want, rtol=0, atol=1e-5)
    path = tmp_path / "mlp.poot"
    poot.compile(m, (x,)).save(path)
    loaded = poot.load(path, runtime=wgpu)
    np.testing.assert_allclose(loaded(x).cpu(), want, rtol=0, atol=1e-5)


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# The IR's `unary` and `scalar` ops run in eltwise.wgsl: shader exp/tanh/sqrt (lavapipe's are
# within a few ulp), erf from a polynomial (1.5e-7 absolute).
ELTWISE = {
    "relu": torch.relu,
    "gelu_erf": F.gelu,
    "tanh_sigmoid": lambda x: torch.tanh(x) + torch.sigmoid(x),
    "neg_exp": lambda x: -torch.exp(x),
    "sqrt_rsqrt_abs": lambda x: torch.sqrt(x.abs()) + torch.rsqrt(x.abs() + 1.0),
    "scalars": lambda x: ((2.0 - x) * 0.5 + 3.0) / 4.0 - 1.0 + 1.0 / (x.abs() + 1.0),
}


@pytest.mark.parametrize("name", sorted(ELTWISE))
def test_eltwise_ops_on_wgpu(wgpu, name):
    torch.manual_seed(9)
    m = Fn(ELTWISE[name]).eval()
    x = torch.randn(3, 70) * 3
    with torch.no_grad():
        want = m(x).numpy()
    got = poot.compile(m, (x,), runtime=wgpu)(x).cpu()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)


def test_an_op_without_a_wgsl_kernel_is_a_typed_error(wgpu):
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).eval()
    with pytest.raises(UnsupportedOpError, match="layer_norm"):
        poot.compile(m, (torch.randn(2, 4),), runtime=wgpu)
