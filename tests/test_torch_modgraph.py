"""Several torch modules in one plan: ``poot.compile_modules`` (a linear sequence) and
``poot.ModuleGraph`` (branches, joins, tuple and dict inputs and outputs), placed by the
planner over synthetic device profiles (the CPU here; CPU and wgpu in
tests/test_torch_modgraph_wgpu.py).

Bound: outputs within 1e-5 absolute of the same modules run in torch eager (float32).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import ConfigError, PlannerError  # noqa: E402
from poot.planner import CompileConfig  # noqa: E402
from tests.planner_fixtures import cpu  # noqa: E402


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)

    def forward(self, ids):
        return self.emb(ids)


class Mix(nn.Module):
    """Returns a tuple, which the next module takes as two arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.ln(x)
        return h, F.gelu(self.fc(h))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(16, 7)

    def forward(self, h, g):
        return torch.softmax(self.out(h + g), dim=-1)


class Tower(nn.Module):
    def __init__(self, d_in: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, 32), nn.Linear(32, 16)

    def forward(self, x):
        h = self.fc2(F.silu(self.fc1(x)))
        return {"emb": h / torch.sqrt((h * h).sum(-1, keepdim=True)), "raw": h}


class Score(nn.Module):
    def forward(self, pair):
        q, d = pair
        return (q * d).sum(-1), q - d


def _close(got, want, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got.cpu()), want.numpy(), rtol=0, atol=atol)


def test_a_linear_sequence_is_one_plan():
    torch.manual_seed(1)
    mods = [Embed().eval(), Mix().eval(), Head().eval()]
    ids = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        want = mods[2](*mods[1](mods[0](ids)))
    compiled = poot.compile_modules(mods, (ids,), profiles=[cpu()])
    assert compiled.placed == {"0.Embed": "cpu", "1.Mix": "cpu", "2.Head": "cpu"}
    _close(compiled(ids), want)
    other = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        want2 = mods[2](*mods[1](mods[0](other)))
    _close(compiled(other), want2)
    text = compiled.explain()
    assert "chosen: cpu [0.Embed..2.Head] resident" in text
    assert "1.Mix -> cpu" in text


def two_tower() -> tuple[poot.ModuleGraph, dict, dict]:
    """Query and document towers (dict outputs) joined by a score (tuple in, tuple out)."""
    torch.manual_seed(2)
    g = poot.ModuleGraph()
    query, doc = g.input("query"), g.input("doc")
    q = g.add("query_tower", Tower(12).eval(), query["tokens"])
    d = g.add("doc_tower", Tower(20).eval(), doc)
    s = g.add("score", Score().eval(), (q["emb"], d["emb"]))
    g.output({"score": s[0], "diff": s[1], "query_raw": q["raw"]})
    inputs = {"query": {"tokens": torch.randn(4, 12)}, "doc": torch.randn(4, 20)}
    mods = {n.name: n.module for n in g.nodes}
    with torch.no_grad():
        qo = mods["query_tower"](inputs["query"]["tokens"])
        do = mods["doc_tower"](inputs["doc"])
        so = mods["score"]((qo["emb"], do["emb"]))
    return g, inputs, {"score": so[0], "diff": so[1], "query_raw": qo["raw"]}


def test_a_graph_with_branches_a_join_and_structured_values():
    g, inputs, want = two_tower()
    compiled = g.compile(inputs, profiles=[cpu()])
    got = compiled(**inputs)
    assert set(got) == {"score", "diff", "query_raw"}
    for k in want:
        _close(got[k], want[k])
    again = compiled(inputs)  # one dict holding every input works too
    _close(again["score"], want["score"])


def test_pinned_module_ranges_are_explained_and_simulated(tmp_path):
    g, inputs, want = two_tower()
    cfg = CompileConfig(force_placement=(("cpu", 0, 3),))
    compiled = g.compile(inputs, cfg, profiles=[cpu()])
    assert "pinned by CompileConfig.force_placement" in compiled.explain()
    page = compiled.visualize(tmp_path / "sim.html").read_text()
    for name in ("query_tower", "doc_tower", "score"):
        assert f'data-label="{name}"' in page
    compiled(**inputs)
    measured = compiled.visualize(tmp_path / "m.html", measured=True).read_text()
    assert "poot step timeline (measured)" in measured and 'data-label="score"' in measured


def test_the_ledger_holds_each_device_s_weights():
    g, inputs, _ = two_tower()
    compiled = g.compile(inputs, profiles=[cpu()])
    snap = compiled.ledger.snapshot()
    weights = sum(p.numel() * 4 for n in g.nodes for p in n.module.parameters())
    assert snap["device:cpu"]["used"] == weights


def test_bad_graphs_are_config_errors():
    g = poot.ModuleGraph()
    x = g.input("x")
    with pytest.raises(ConfigError, match="already has"):
        g.input("x")
    with pytest.raises(ConfigError, match="not a module"):
        g.add("n", 3, x)
    with pytest.raises(ConfigError, match="got Tensor"):
        g.add("n", Head(), torch.zeros(1))
    with pytest.raises(ConfigError, match="another graph"):
        g.add("n", Head(), poot.ModuleGraph().input("y"))
    with pytest.raises(ConfigError, match="no output"):
        g.compile({"x": torch.zeros(2, 16)}, profiles=[cpu()])
    g.add("tower", Tower(16).eval(), x)
    g.output(x)
    with pytest.raises(ConfigError, match="missing"):
        g.compile({"y": torch.zeros(2, 16)}, profiles=[cpu()])
    with pytest.raises(ConfigError, match="int or a str"):
        x[1.5]
    with pytest.raises(ConfigError, match="at least one module"):
        poot.compile_modules([], (torch.zeros(1),))


def test_a_call_with_other_inputs_is_refused():
    g, inputs, _ = two_tower()
    compiled = g.compile(inputs, profiles=[cpu()])
    with pytest.raises(ConfigError, match="takes inputs"):
        compiled(query=inputs["query"])
    from poot.errors import UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match="shape"):
        compiled(query={"tokens": torch.randn(5, 12)}, doc=torch.randn(4, 20))


def test_nothing_fits_is_a_planner_error():
    g, inputs, _ = two_tower()
    with pytest.raises(PlannerError, match="no resident placement"):
        g.compile(inputs, CompileConfig(device_budget_bytes=1000), profiles=[cpu()])
