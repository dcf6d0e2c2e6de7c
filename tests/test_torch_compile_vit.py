"""A small CNN-free vision transformer through poot.compile against torch eager.

Bound: logits within 1e-5 absolute (float32, CPU runtime): patches cut by reshape and permute
(rank 6), a class token concatenated from a parameter, learned position embeddings broadcast
over the batch, non-causal scaled-dot-product attention, GELU MLPs, the class token's row out.
"""

from __future__ import annotations

import numpy as np

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402


class Encoder(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.heads = heads

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(self.n1(x)).reshape(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.n2(x))


class Vit(nn.Module):
    def __init__(self, img: int = 16, patch: int = 4, d: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.p = patch
        n = (img // patch) ** 2
        self.embed = nn.Linear(3 * patch * patch, d)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.1)
        self.blocks = nn.Sequential(Encoder(d, 4), Encoder(d, 4))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, img):
        b, c, h, w = img.shape
        p = self.p
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        x = self.embed(x.reshape(b, (h // p) * (w // p), c * p * p))
        x = torch.cat([self.cls.expand(b, -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def test_vit_logits_match_eager():
    torch.manual_seed(7)
    m = Vit().eval()
    img = torch.randn(2, 3, 16, 16)
    compiled = poot.compile(m, (img,))
    with torch.no_grad():
        want = m(img).numpy()
    np.testing.assert_allclose(compiled(img).cpu(), want, rtol=0, atol=1e-5)
