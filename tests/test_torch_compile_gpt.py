"""A nanoGPT-sized decoder through poot.compile, and the portable artifact.

Bound: logits within 1e-5 absolute of torch eager (float32, CPU runtime): two blocks of
layer norm, causal attention (scaled_dot_product_attention and the explicit masked_fill form)
and a GELU MLP, whose matmuls sum in another order than torch's BLAS.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import ArtifactFormatError, PootError  # noqa: E402


class Attention(nn.Module):
    def __init__(self, c: int, h: int, t: int, sdpa: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.h, self.sdpa = h, sdpa
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, c: int, h: int, t: int, sdpa: bool) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = Attention(c, h, t, sdpa)
        self.mlp = nn.Sequential(
            nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c), nn.Dropout(0.1)
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(
        self, sdpa: bool, v: int = 65, c: int = 32, h: int = 4, layers: int = 2, t: int = 16
    ):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(v, c), nn.Embedding(t, c)
        self.h = nn.ModuleList([Block(c, h, t, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, v, bias=False)

    def forward(self, idx):
        _, t = idx.size()
        x = self.wte(idx) + self.wpe(torch.arange(0, t, dtype=torch.long))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "masked_fill"])
def test_nanogpt_logits_match_eager(sdpa):
    torch.manual_seed(3)
    m = Gpt(sdpa).eval()
    idx = torch.randint(0, 65, (2, 16))
    compiled = poot.compile(m, (idx,))
    with torch.no_grad():
        want = m(idx).numpy()
    np.testing.assert_allclose(compiled(idx).cpu(), want, rtol=0, atol=1e-5)
    # int32 ids are taken too (the graph's ids are i32).
    np.testing.assert_allclose(compiled(idx.int()).cpu(), want, rtol=0, atol=1e-5)


def test_artifact_round_trip(tmp_path):
    torch.manual_seed(4)
    m = Gpt(True, layers=1).eval()
    idx = torch.randint(0, 65, (1, 16))
    compiled = poot.compile(m, (idx,))
    path = tmp_path / "gpt.poot"
    compiled.save(path)
    loaded = poot.load(path)
    np.testing.assert_array_equal(loaded(idx).cpu(), compiled(idx).cpu())
    assert loaded.inputs == compiled.inputs
    assert loaded.trace_limits == compiled.trace_limits


def test_corrupt_and_foreign_files_are_typed_errors(tmp_path):
    torch.manual_seed(5)
    m = Gpt(True, layers=1).eval()
    idx = torch.randint(0, 65, (1, 16))
    path = tmp_path / "gpt.poot"
    poot.compile(m, (idx,)).save(path)
    data = path.read_bytes()
    cut = tmp_path / "cut.poot"
    cut.write_bytes(data[: len(data) // 2])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(3))
    text = tmp_path / "notes.txt"
    text.write_text("not an artifact")
    for bad in (cut, foreign, text, tmp_path / "missing.poot"):
        with pytest.raises(ArtifactFormatError):
            poot.load(bad)
    assert issubclass(ArtifactFormatError, PootError)
    assert issubclass(ArtifactFormatError, ValueError)
