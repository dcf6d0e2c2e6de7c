"""poot.compile(torch.nn.Module) against torch eager: float32 on the CPU runtime.

Bounds: elementwise ops, views and softmax within 1e-6 absolute (each is one f32 operation,
or libm's tanh/exp, against torch's own kernels); layer norm and matmuls (summation order
differs from torch's BLAS) within 1e-5 absolute on values of order 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import UnsupportedFeatureError, UnsupportedOpError  # noqa: E402


def _close(compiled, module, *inputs, atol):
    got = compiled(*inputs)
    with torch.no_grad():
        want = module(*inputs)
    np.testing.assert_allclose(got.cpu(), want.numpy(), rtol=0, atol=atol)
    return got


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x):
        h = self.norm(F.relu(self.fc1(x)))
        return self.fc2(F.silu(h))


def test_mlp_matches_eager():
    torch.manual_seed(0)
    m = Mlp().eval()
    x = torch.randn(7, 12)
    compiled = poot.compile(m, (x,))
    assert isinstance(compiled, poot.CompiledModule)
    _close(compiled, m, x, atol=1e-5)
    # Another input of the same shape runs the same plan.
    _close(compiled, m, torch.randn(7, 12), atol=1e-5)


class Ops(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        return self.fn(x, self.w)


OPS = {
    "relu": lambda x, w: torch.relu(x),
    "gelu_erf": lambda x, w: F.gelu(x),
    "gelu_tanh": lambda x, w: F.gelu(x, approximate="tanh"),
    "silu": lambda x, w: F.silu(x),
    "tanh_sigmoid": lambda x, w: torch.tanh(x) + torch.sigmoid(x),
    "sub_param": lambda x, w: x - w,
    "mul_broadcast": lambda x, w: x * w[0],
    "div_broadcast": lambda x, w: x / (w[:, :1].abs() + 1.0),
    "scalars": lambda x, w: (2.0 - x) * 0.5 + 3.0 - x / 4.0,
    "view_flatten": lambda x, w: (x.view(2, 2, 6) + 1.0).flatten(),
    "softmax_last": lambda x, w: torch.softmax(x, dim=-1),
    "softmax_first": lambda x, w: torch.softmax(x, dim=0),
    "transpose_matmul": lambda x, w: x @ w.t(),
    "layer_norm_plain": lambda x, w: F.layer_norm(x, (6,)),
    "rms_by_hand": lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    "rms_norm": lambda x, w: F.rms_norm(x, (6,), w[0], 1e-5),
    "select_and_to": lambda x, w: x[:, 1].float() * x.select(0, -1).to(torch.float32)[1],
    "reductions": lambda x, w: x.sum(0) + x.amax(-1).mean() + x.abs().sqrt().mean(dim=(0, 1)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_eager(name):
    torch.manual_seed(1)
    m = Ops(OPS[name]).eval()
    x = torch.randn(4, 6)
    _close(poot.compile(m, (x,)), m, x, atol=1e-5 if "matmul" in name else 1e-6)


def test_three_dim_linear_and_residual():
    torch.manual_seed(2)
    lin = nn.Linear(8, 8)

    class Res(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return x + self.lin(x)

    m = Res().eval()
    x = torch.randn(2, 3, 8)
    _close(poot.compile(m, x), m, x, atol=1e-5)


def test_shape_and_dtype_are_specialized():
    m = Mlp().eval()
    compiled = poot.compile(m, (torch.randn(3, 12),))
    with pytest.raises(UnsupportedFeatureError, match=r"shape \[4, 12\].*\[3, 12\]"):
        compiled(torch.randn(4, 12))
    with pytest.raises(UnsupportedFeatureError, match="dtype torch.float64"):
        compiled(torch.randn(3, 12, dtype=torch.float64))
    with pytest.raises(UnsupportedFeatureError, match="2 inputs"):
        compiled(torch.randn(3, 12), torch.randn(3, 12))
    with pytest.raises(UnsupportedFeatureError, match="expected a torch tensor or numpy array"):
        compiled([1.0] * 12)
    # A numpy array of the example's shape and dtype is taken as the tensor would be.
    x = torch.randn(3, 12)
    np.testing.assert_array_equal(compiled(x.numpy()).cpu(), compiled(x).cpu())


class Cumsum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), _CumsumLayer())

    def forward(self, x):
        return self.inner(x)


class _CumsumLayer(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


def test_unsupported_op_names_op_and_module_path():
    with pytest.raises(UnsupportedOpError) as e:
        poot.compile(Cumsum().eval(), (torch.randn(2, 4),))
    assert e.value.op == "aten.cumsum.default"
    assert e.value.module_path == "inner.1"
    assert "aten.cumsum.default" in str(e.value) and "'inner.1'" in str(e.value)


def test_outputs_export_through_dlpack_without_copy():
    m = Mlp().eval()
    x = torch.randn(2, 12)
    out = poot.compile(m, (x,))(x)
    as_torch = torch.from_dlpack(out)
    as_numpy = np.from_dlpack(out)
    assert as_torch.data_ptr() == out.cpu().ctypes.data == as_numpy.ctypes.data
    assert out.shape == (2, 5) and out.device == "cpu"


def test_parameters_are_read_in_place_in_their_dtype():
    lin = nn.Linear(16, 8).to(torch.bfloat16)

    # Parameters reach the store as numpy views of their own memory, bf16 as 16-bit words.
    from poot.torch_frontend.lower import weights_arrays

    arrays, dtypes = weights_arrays({"w": lin.weight, "b": lin.bias})
    assert dtypes == {"w": "bf16", "b": "bf16"}
    assert arrays["w"].ctypes.data == lin.weight.data_ptr()
    weights = poot._native.Weights.from_arrays(arrays, dtypes=dtypes)
    assert weights.describe("w") == ("BF16", (8, 16))
    f32 = nn.Linear(3, 2)
    arrays, dtypes = weights_arrays({"w": f32.weight})
    assert dtypes == {} and arrays["w"].ctypes.data == f32.weight.data_ptr()


def test_trace_limits_apply():
    from poot.errors import TraceBudgetError

    m = Mlp().eval()
    with pytest.raises(TraceBudgetError):
        poot.compile(
            m, (torch.randn(2, 12),), trace_limits=poot._native.TraceLimits(max_equations=4)
        )


def test_config_keyword_and_example_inputs_keyword():
    m = Mlp().eval()
    x = torch.randn(2, 12)
    compiled = poot.compile(m, example_inputs=(x,), config=poot.CompileConfig())
    _close(compiled, m, x, atol=1e-5)


class _Noise(nn.Module):
    def forward(self, x):
        return x + torch.randn(3)


def test_random_ops_are_refused_not_frozen():
    with pytest.raises(UnsupportedOpError, match="random op"):
        poot.compile(_Noise(), (torch.randn(2, 3),))


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def test_tied_weights_are_stored_once():
    torch.manual_seed(6)
    m = _Tied().eval()
    ids = torch.randint(0, 11, (2, 5))
    compiled = _compile_and_check(m, ids)
    assert [w[0] for w in compiled.graph.weights()] == ["emb.weight"]


def _compile_and_check(m, *inputs):
    compiled = poot.compile(m, inputs)
    _close(compiled, m, *inputs, atol=1e-5)
    return compiled


def test_casts_are_refused_with_the_dtypes():
    class Cast(nn.Module):
        def forward(self, x):
            return x.to(torch.float16)

    with pytest.raises(UnsupportedOpError, match="float32 to torch.float16"):
        poot.compile(Cast(), (torch.randn(2, 3),))


def test_from_arrays_refuses_what_it_cannot_hold_in_place():
    native = poot._native
    with pytest.raises(TypeError, match="int64"):
        native.Weights.from_arrays({"a": np.zeros(3, np.int64)})
    with pytest.raises(ValueError, match="not C-contiguous"):
        native.Weights.from_arrays({"a": np.zeros((3, 4), np.float32).T})
    with pytest.raises(TypeError, match="bf16"):
        native.Weights.from_arrays({"a": np.zeros(3, np.float32)}, dtypes={"a": "bf16"})
    ok = native.Weights.from_arrays({"a": np.zeros(3, np.float16)})
    assert ok.describe("a") == ("F16", (3,)) and ok.total_bytes == 6
