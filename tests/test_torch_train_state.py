"""A trainable module's artifact carries its training state: ``save`` mid-run and ``poot.load``
resume bit for bit (parameters, AdamW's moments and count, SGD's momentum); a corrupt state is
``ArtifactFormatError``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import ArtifactFormatError  # noqa: E402
from poot.torch_frontend import SGD, AdamW, CosineDecay, TrainConfig  # noqa: E402
from tests.test_torch_compile_gpt import Gpt  # noqa: E402
from tests.test_torch_train import Mlp  # noqa: E402

TRAIN = poot.CompileConfig(allow_training=True)


def _batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(12, 5, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(16, 12, generator=g)
        out.append((x, torch.tanh(x @ w)))
    return out


def _params(compiled) -> dict[str, np.ndarray]:
    return {n: compiled.arrays[n].copy() for n in compiled.trainable}


@pytest.mark.parametrize(
    "opt",
    [AdamW(lr=0.01), SGD(lr=0.05, momentum=0.9, weight_decay=0.01)],
    ids=["adamw", "sgd_momentum"],
)
def test_save_mid_run_and_load_resume_bit_for_bit(tmp_path, opt):
    torch.manual_seed(30)
    batches = _batches(6, 31)
    cfg = TrainConfig(schedule=CosineDecay(t_max=6))
    compiled = poot.compile(Mlp(), example_inputs=(batches[0][0],), config=TRAIN)
    for x, y in batches[:3]:
        compiled.train_step(x, y, "mse", optimizer=opt, config=cfg)
    path = tmp_path / "mid.poot"
    compiled.save(path)
    straight = [compiled.train_step(x, y, "mse", optimizer=opt, config=cfg) for x, y in batches[3:]]
    loaded = poot.load(path)
    assert loaded.trainable == compiled.trainable
    assert loaded.trainer.steps == {opt: 3}
    resumed = [loaded.train_step(x, y, "mse", optimizer=opt, config=cfg) for x, y in batches[3:]]
    assert resumed == straight  # exactly
    want, got = _params(compiled), _params(loaded)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n], err_msg=n)
    for s, a in compiled.trainer.state[opt].items():
        np.testing.assert_array_equal(loaded.trainer.state[opt][s], a, err_msg=s)
    # The loaded module's forward reads the trained parameters.
    x = batches[0][0]
    np.testing.assert_array_equal(loaded(x).cpu(), compiled(x).cpu())


def test_a_decoder_with_embeddings_resumes_bit_for_bit(tmp_path):
    torch.manual_seed(32)
    m = Gpt(True, layers=1).eval()
    idx = torch.randint(0, 65, (2, 16))
    ys = [torch.randint(0, 65, (2, 16)) for _ in range(4)]
    compiled = poot.compile(m, example_inputs=(idx,), config=TRAIN)
    opt = AdamW(lr=3e-3)
    compiled.train_step(idx, ys[0], "cross_entropy", optimizer=opt)
    compiled.save(tmp_path / "gpt.poot")
    straight = [compiled.train_step(idx, y, "cross_entropy", optimizer=opt) for y in ys[1:]]
    loaded = poot.load(tmp_path / "gpt.poot")
    resumed = [loaded.train_step(idx, y, "cross_entropy", optimizer=opt) for y in ys[1:]]
    assert resumed == straight
    for n in compiled.trainable:
        np.testing.assert_array_equal(loaded.arrays[n], compiled.arrays[n], err_msg=n)


def _rewrite(src, dst, edit_meta=None, edit_blobs=None):
    with np.load(src) as z:
        blobs = {k: z[k] for k in z.files}
    meta = json.loads(bytes(blobs.pop("__meta__")).decode())
    if edit_meta:
        edit_meta(meta)
    if edit_blobs:
        edit_blobs(blobs)
    with open(dst, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **blobs)


def test_corrupt_training_state_is_a_typed_error(tmp_path):
    torch.manual_seed(33)
    batches = _batches(2, 34)
    compiled = poot.compile(Mlp(), example_inputs=(batches[0][0],), config=TRAIN)
    for x, y in batches:
        compiled.train_step(x, y, "mse", optimizer=AdamW(lr=0.01))
    good = tmp_path / "good.poot"
    compiled.save(good)
    poot.load(good)  # the untouched file loads

    def opt_entry(meta):
        return meta["training"]["optimizers"][0]

    def set_in(key, value):
        return lambda meta: opt_entry(meta).__setitem__(key, value)

    def first_blob_key(meta):
        return opt_entry(meta)["state"][0][1]

    cases = {
        "unknown optimizer": set_in("optimizer", {"kind": "Lion", "lr": 0.1}),
        "bad betas": set_in(
            "optimizer",
            {"kind": "AdamW", "lr": 0.01, "betas": [0.9, 1.5], "eps": 1e-8, "weight_decay": 0.01},
        ),
        "zero count": set_in("step", 0),
        "text count": set_in("step", "2"),
        "missing state": lambda meta: opt_entry(meta)["state"].pop(),
        "foreign state name": lambda meta: opt_entry(meta)["state"][0].__setitem__(
            0, "state.momentum:fc1.weight"
        ),
        "unknown parameter": lambda meta: meta["training"]["trainable"].append("nope"),
        "not a dict": lambda meta: meta.__setitem__("training", [1, 2]),
    }
    for what, edit in cases.items():
        bad = tmp_path / f"{what.replace(' ', '_')}.poot"
        _rewrite(good, bad, edit_meta=edit)
        with pytest.raises(ArtifactFormatError, match="training state"):
            poot.load(bad)

    # A state blob of the wrong shape, or missing from the archive.
    with np.load(good) as z:
        meta = json.loads(bytes(z["__meta__"]).decode())
    key = first_blob_key(meta)
    bad = tmp_path / "shape.poot"
    _rewrite(good, bad, edit_blobs=lambda b: b.__setitem__(key, np.zeros(3, np.float32)))
    with pytest.raises(ArtifactFormatError, match="float32"):
        poot.load(bad)
    bad = tmp_path / "dtype.poot"
    _rewrite(good, bad, edit_blobs=lambda b: b.__setitem__(key, b[key].astype(np.float64)))
    with pytest.raises(ArtifactFormatError, match="float32"):
        poot.load(bad)
    bad = tmp_path / "gone.poot"
    _rewrite(good, bad, edit_blobs=lambda b: b.pop(key))
    with pytest.raises(ArtifactFormatError, match="training state"):
        poot.load(bad)


def test_a_module_never_trained_saves_and_loads_trainable(tmp_path):
    torch.manual_seed(35)
    x, y = _batches(1, 36)[0]
    compiled = poot.compile(Mlp(), example_inputs=(x,), config=TRAIN)
    compiled.save(tmp_path / "fresh.poot")
    loaded = poot.load(tmp_path / "fresh.poot")
    assert loaded.trainable == compiled.trainable and not loaded.trainer.steps
    assert loaded.train_step(x, y, "mse", optimizer=SGD(lr=0.1)) == compiled.train_step(
        x, y, "mse", optimizer=SGD(lr=0.1)
    )
    # A module compiled without training saves no training state.
    plain = poot.compile(Mlp(), example_inputs=(x,))
    plain.save(tmp_path / "plain.poot")
    assert not poot.load(tmp_path / "plain.poot").trainable
