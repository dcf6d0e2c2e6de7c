"""A torch module prepared for the wgpu runtime (lavapipe in CI), and an artifact saved on the
CPU runtime loaded there: device choice happens at load, not in the file.

Bounds against torch eager (float32): 1e-5 for the MLP of linear layers, SiLU, tanh-GELU,
softmax and reshapes; the `unary` and `scalar` ops within 1e-6 relative plus 2e-6 absolute
(shader exp/tanh/sqrt, erf by a polynomial); the nanoGPT decoder, the ViT and the
reductions/broadcasts model within 2e-5 (layer norms and reductions sum in f32 on the device).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import require_torch, wgpu_runtime

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    return wgpu_runtime()


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


@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "masked_fill"])
def test_nanogpt_on_wgpu(wgpu, sdpa):
    from tests.test_torch_compile_gpt import Gpt

    torch.manual_seed(10)
    m = Gpt(sdpa).eval()
    idx = torch.randint(0, 65, (2, 16))
    with torch.no_grad():
        want = m(idx).numpy()
    got = poot.compile(m, (idx,), runtime=wgpu)(idx).cpu()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_vit_on_wgpu(wgpu):
    from tests.test_torch_compile_vit import Vit

    torch.manual_seed(11)
    m = Vit().eval()
    img = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = m(img).numpy()
    got = poot.compile(m, (img,), runtime=wgpu)(img).cpu()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_reductions_and_broadcasts_on_wgpu(wgpu):
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(1, 5, 1))

        def forward(self, x):
            h = F.layer_norm(x, (7,)) - self.w
            r = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return r.amax(1) + r.sum(dim=(0, 2)).mean() + torch.softmax(r, dim=1)[:, 0]

    torch.manual_seed(12)
    m = M().eval()
    x = torch.randn(3, 5, 7)
    with torch.no_grad():
        want = m(x).numpy()
    got = poot.compile(m, (x,), runtime=wgpu)(x).cpu()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
