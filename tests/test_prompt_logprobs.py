"""``SamplingParams.prompt_logprobs``: every prompt token's log-probability, from the request's
own chunked prefill (an ``all_logits`` step), on the default model (SmolLM2-135M Q4_1).

The reference is ``LLM.logits(prompt[:i])`` through the same host ``log_softmax``; the CPU
kernels keep one summation order whatever a step's token count, so the values are compared bit
for bit (``np.array_equal``), not within a tolerance: alone, chunked, batched with other
requests, and with the prompt's leading blocks in the prefix cache (which such a request does
not read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from poot import LLM, SamplingParams
from poot.engine_core import log_softmax
from poot.errors import SamplingParamsError

PROMPT = (
    "The quick brown fox jumps over the lazy dog and keeps on running far away from the "
    "hunter, who follows it through the forest and down to the river, where the water is cold "
    "and deep and the fox swims across"
)
OTHERS = ["Once upon a time", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def llm(default_model_path: Path) -> LLM:
    # Chunks of 16 tokens, blocks of 16: the prompt is prefilled in several steps and its
    # leading blocks are cached for later requests.
    return LLM(
        str(default_model_path), threads=2, max_step_tokens=16, block_size=16, progress=False
    )


def _reference(llm: LLM, ids: list[int]) -> list[Any]:
    return [log_softmax(llm.logits(ids[:i])) for i in range(1, len(ids))]


@pytest.fixture(scope="module")
def reference(llm: LLM) -> tuple[list[int], list[Any]]:
    ids = llm.tokenizer.encode(PROMPT)
    assert len(ids) > 32
    return ids, _reference(llm, ids)


def _chosen(entries: list[Any], ids: list[int]) -> np.ndarray:
    assert entries[0] is None
    return np.asarray([entries[i][ids[i]].logprob for i in range(1, len(ids))], np.float32)


def test_equal_to_llm_logits_bit_for_bit(llm: LLM, reference: tuple[list[int], list[Any]]) -> None:
    ids, ref = reference
    # Another LLM without a prefix cache: every position comes from the chunked prefill.
    cold = LLM(
        str(llm.files.path),
        threads=2,
        max_step_tokens=16,
        block_size=16,
        enable_prefix_caching=False,
        progress=False,
    )
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=5)
    out = cold.generate(PROMPT, params)[0]
    entries = out.prompt_logprobs
    assert entries is not None and len(entries) == len(ids)
    want = np.asarray([r[ids[i + 1]] for i, r in enumerate(ref)], np.float32)
    assert np.array_equal(_chosen(entries, ids), want)
    for i in range(1, len(ids)):
        lps = ref[i - 1]
        top = sorted(range(len(lps)), key=lambda t: (-lps[t], t))[:5]
        entry = entries[i]
        ranked = sorted(
            (lp.rank, t) for t, lp in entry.items() if lp.rank is not None and lp.rank <= 5
        )
        assert [t for _, t in ranked] == top
        assert entry[ids[i]].rank == int(np.count_nonzero(lps > lps[ids[i]])) + 1
        assert all(np.float32(entry[t].logprob) == lps[t] for t in entry)


def test_prefix_cache_and_batching_give_the_same_values(
    llm: LLM, reference: tuple[list[int], list[Any]]
) -> None:
    ids, ref = reference
    want = np.asarray([r[ids[i + 1]] for i, r in enumerate(ref)], np.float32)
    cached0 = llm.stats()["prefill_cached_tokens"]
    params = [SamplingParams(max_tokens=4, temperature=0)] * 2
    params.insert(1, SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=0))
    outs = llm.generate([OTHERS[0], PROMPT, OTHERS[1]], params)
    # The prompt's leading blocks were cached by the runs before, but a request asking for
    # prompt logprobs starts from none of them: every position comes from its own prefill.
    assert llm.stats()["prefill_cached_tokens"] == cached0
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    assert np.array_equal(_chosen(outs[1].prompt_logprobs, ids), want)
    assert all(len(e) == 1 for e in outs[1].prompt_logprobs[1:])  # 0 alternatives: the token


def test_sampling_is_unchanged(llm: LLM) -> None:
    for params in (
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.9, seed=5, ignore_eos=True),
    ):
        plain = llm.generate([PROMPT, OTHERS[0]], params)
        with_lps = llm.generate(
            [PROMPT, OTHERS[0]],
            [SamplingParams(**{**_fields(params), "prompt_logprobs": 2}), params],
        )
        assert [o.outputs[0].token_ids for o in plain] == [o.outputs[0].token_ids for o in with_lps]


def _fields(p: SamplingParams) -> dict[str, Any]:
    return {
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "seed": p.seed,
        "ignore_eos": p.ignore_eos,
    }


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True])
def test_out_of_range_is_refused(bad: Any) -> None:
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(prompt_logprobs=bad)
    assert e.value.field == "prompt_logprobs"


@pytest.mark.slow  # about a minute: the CUDA kernels compile and run in the CPU emulation
def test_split_sampling_runtime_gives_the_cpus_values(
    stories: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a runtime without the logit ops (the CUDA runtime on its CPU emulation of the
    driver), a step with prompt logprobs and penalties runs split: every token's logits from
    the device, the sampling on the host. Same values and ids as the CPU."""
    import poot.llm
    from poot import _native, errors

    try:
        emulator = _native._cuda_emulator()
    except (RuntimeError, errors.BackendNotCompiledError) as e:
        pytest.skip(f"no CPU emulation of the CUDA driver here ({e})")
    monkeypatch.setattr(
        poot.llm,
        "_make_cuda_runtime",
        lambda t: _native.CudaRuntime(0, t, driver_library=emulator, nvrtc_library=emulator),
    )
    path = str(stories / "stories260K-f32.gguf")
    params = SamplingParams(
        max_tokens=4, temperature=0.8, seed=7, repetition_penalty=1.3, prompt_logprobs=1
    )
    cuda = LLM(path, backend="cuda", max_step_tokens=8, progress=False)
    assert not cuda.runtime.supports("adjust_logits")
    prompt = "Once upon a time there was a little girl named Lily"
    got = cuda.generate(prompt, params)[0]
    want = LLM(path, numerics="exact", max_step_tokens=8, progress=False).generate(prompt, params)[
        0
    ]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    ids = got.prompt_token_ids
    a = _chosen(got.prompt_logprobs, ids)
    b = _chosen(want.prompt_logprobs, ids)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # another device's kernels
