"""The sampling step on the wgpu device (lavapipe in CI) against the CPU runtime, on SmolLM2.

Where the adapter has ``shader-f64`` the whole decode graph runs on wgpu: penalties, bias, the
guided mask (a late input), temperature, top-k/p, min-p, the request's seeded draw and top-20
logprobs (poot-wgpu's ``sample.rs``). The uniform draws come from the request's seeded stream
on the host, so a seed gives the same tokens on both runtimes.

Bounds: both runtimes use ``numerics="exact"``; their logits differ by summation order (about
5e-6 on SmolLM2, see test_wgpu_models.py), and the device's sampling sums differ from the CPU's
by rounding (``sample.wgsl``), so a draw could differ only when a row's uniform falls within
that difference of a cumulative-probability boundary; the fixed seeds here are far from one and
the ids are asserted equal. Logprobs agree within 1e-3 (the logits' difference, through
log-softmax).

Readback is counted in bytes the wgpu runtime copies back (``WgpuRuntime.stats``, in
``LLM.stats()`` as ``runtime_readback_bytes``): a step of
S sequences reads S token ids (4 bytes each) and, when a row asks for logprobs, S x 21 ids and
logprobs; so a whole batched generation reads back less than one logits row (vocabulary x 4
bytes), which the host-sampling path reads at every step.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import poot
import poot.llm
from poot import SamplingParams
from poot.runner import LOGPROB_WIDTH

pytestmark = pytest.mark.device_wgpu

PROMPT = "The quick brown fox"

# One request of each kind the sampling step has; each seeded.
KINDS: dict[str, SamplingParams] = {
    "sampled": SamplingParams(max_tokens=5, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True),
    "top_k_min_p": SamplingParams(
        max_tokens=5, temperature=1.1, top_k=40, min_p=0.05, seed=6, ignore_eos=True
    ),
    "biased": SamplingParams(
        max_tokens=5, temperature=0.7, logit_bias={28: 3.0, 314: -100.0}, seed=7, ignore_eos=True
    ),
    "penalised": SamplingParams(
        max_tokens=5,
        temperature=0.9,
        repetition_penalty=1.3,
        presence_penalty=0.4,
        frequency_penalty=0.2,
        seed=8,
        ignore_eos=True,
    ),
    "guided": SamplingParams(max_tokens=5, temperature=0.9, regex=r"[a-z ]+", seed=9),
    "logprobs": SamplingParams(max_tokens=5, temperature=0.6, logprobs=5, seed=10, ignore_eos=True),
}


@pytest.fixture(scope="module")
def wgpu_ok() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()


@pytest.fixture(scope="module")
def llms(wgpu_ok: None, default_model_path: Path) -> Iterator[tuple[poot.LLM, poot.LLM]]:
    path = str(default_model_path)
    cpu = poot.LLM(path, numerics="exact", threads=1, num_blocks=64)
    gpu = poot.LLM(path, backend="wgpu", numerics="exact", num_blocks=64)
    yield cpu, gpu


def _wgpu(llm: poot.LLM) -> Any:
    return getattr(llm.runtime, "inner", llm.runtime)


def test_the_adapter_samples_on_the_device(llms: tuple[poot.LLM, poot.LLM]) -> None:
    _, gpu = llms
    rt = _wgpu(gpu)
    assert rt.adapter["shader_f64"] and rt.adapter["samples_on_device"]
    for op in ("adjust_logits", "mask_logits", "top_k", "logprobs"):
        assert rt.supports(op), op


def test_every_kind_of_request_draws_the_cpus_tokens_reading_back_no_logits(
    llms: tuple[poot.LLM, poot.LLM],
) -> None:
    """One batch holding every kind: each request's tokens (and logprobs) equal the CPU's, and
    the whole generation reads back fewer bytes than one logits row."""
    cpu, gpu = llms
    params = list(KINDS.values())
    prompts = [PROMPT] * len(params)
    want = cpu.generate(prompts, params)
    before = gpu.stats()
    got = gpu.generate(prompts, params)
    after = gpu.stats()
    for name, w, g in zip(KINDS, want, got, strict=True):
        a, b = w.outputs[0], g.outputs[0]
        assert b.token_ids == a.token_ids, name
        assert b.text == a.text, name
        if name == "guided":
            assert all(c.islower() or c == " " for c in b.text), b.text
        if name == "logprobs":
            assert a.logprobs is not None and b.logprobs is not None
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                assert x.keys() == y.keys()
                assert all(abs(x[t].logprob - y[t].logprob) < 1e-3 for t in x)
    runs = after["runtime_runs"] - before["runtime_runs"]
    assert runs >= max(len(g.outputs[0].token_ids) for g in got)
    # Per run at most 8 padded rows: ids, and 21 logprob ids and logprobs per row.
    read = after["runtime_readback_bytes"] - before["runtime_readback_bytes"]
    assert read <= runs * 8 * (4 + 8 * (1 + LOGPROB_WIDTH))
    assert read < 4 * _vocab(gpu)


def _vocab(llm: poot.LLM) -> int:
    return int(llm.logits(llm.tokenizer.encode("a")).shape[-1])


def test_the_host_sampling_path_reads_logits_and_draws_the_same(
    wgpu_ok: None, stories: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback of an adapter without f64 (forced here; stories260K keeps it quick): a
    temperature step reads its logits row back, and the tokens are the device path's."""
    path = str(stories / "stories260K-f32.gguf")
    device = poot.LLM(path, backend="wgpu", numerics="exact", num_blocks=16)

    def host_sampling(timeout_s: float, numerics: Any = "exact") -> Any:
        return poot._native.WgpuRuntime(timeout_s, numerics=numerics, host_sampling=True)

    monkeypatch.setattr(poot.llm, "_make_wgpu_runtime", host_sampling)
    host = poot.LLM(path, backend="wgpu", numerics="exact", num_blocks=16)
    rt = _wgpu(host)
    assert not rt.adapter["samples_on_device"] and not rt.supports("adjust_logits")
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=4, ignore_eos=True)
    before = rt.stats()
    got = host.generate("Once upon a time", params)[0].outputs[0]
    runs = rt.stats()["runs"] - before["runs"]
    read = rt.stats()["readback_bytes"] - before["readback_bytes"]
    assert read == runs * (4 + 4 * _vocab(device))
    dev = _wgpu(device)
    before = dev.stats()
    assert got.token_ids == device.generate("Once upon a time", params)[0].outputs[0].token_ids
    assert dev.stats()["readback_bytes"] - before["readback_bytes"] == 4 * (
        dev.stats()["runs"] - before["runs"]
    )
