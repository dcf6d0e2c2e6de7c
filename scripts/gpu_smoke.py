"""End-to-end check of the GPU backends (``cuda``, ``wgpu``) on a real checkpoint, for a GPU
machine.

For each model and backend: greedy ids of a few prompts and the logits after one prompt
against the CPU runtime in the same numerics (exact; wgpu also ggml), then timings on each
backend and the CPU: prefill of a 512-token prompt, and decode tok/s at 1 and at 32 concurrent
sequences, greedy and sampled (temperature 0.8, top-p 0.9). ``--emulate`` runs the CUDA path
through poot-cuda's CPU emulation of the driver (no GPU), so the script itself is checked on
any machine; wgpu takes the first Vulkan adapter (lavapipe on a machine without a GPU).

Prints a JSON line per model and exits 1 if ids differ or the logits are off by more than
``--atol``. Timings are wall-clock over ``generate`` calls after a warm-up: they are reports,
not thresholds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

import poot
from poot import _native

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "In 1969, the first humans",
]


def _emulate() -> None:
    import poot.llm

    lib = _native._cuda_emulator()
    poot.llm._make_cuda_runtime = lambda t: _native.CudaRuntime(  # type: ignore[assignment]
        0, t, driver_library=lib, nvrtc_library=lib
    )


def _greedy(llm: poot.LLM, n: int) -> list[list[int]]:
    sp = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]


def _timings(llm: poot.LLM, vocab: int, decode_tokens: int, batch: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    n = min(512, llm.max_model_len - 8)
    long = [int(t) for t in rng.integers(10, min(vocab, 30000), n)]
    one = poot.SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([long[:64]], one)  # warm: plans for prefill and decode shapes
    start = time.perf_counter()
    llm.generate([long], one)
    prefill = n / (time.perf_counter() - start)
    out: dict[str, float] = {f"prefill_{n}_tok_s": round(prefill, 1)}
    modes = {
        "greedy": poot.SamplingParams(max_tokens=decode_tokens, temperature=0.0, ignore_eos=True),
        "sampled": poot.SamplingParams(
            max_tokens=decode_tokens, temperature=0.8, top_p=0.9, seed=1, ignore_eos=True
        ),
    }
    for seqs in (1, batch):
        prompts = [long[i * 8 : i * 8 + 8] for i in range(seqs)]
        llm.generate(prompts, poot.SamplingParams(max_tokens=4, ignore_eos=True))
        for mode, sp in modes.items():
            start = time.perf_counter()
            llm.generate(prompts, sp)
            secs = time.perf_counter() - start
            out[f"decode_{seqs}_seq_{mode}_tok_s"] = round(seqs * decode_tokens / secs, 1)
    return out


def check(path: str, backend: str, numerics: str, args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_num_seqs": args.batch, "numerics": numerics}
    t0 = time.perf_counter()
    gpu = poot.LLM(path, backend=backend, **kw)
    load_gpu = time.perf_counter() - t0
    cpu = poot.LLM(path, threads=args.threads, **kw)
    res: dict[str, Any] = {
        "model": path,
        "backend": backend,
        "numerics": numerics,
        "device": getattr(gpu.runtime, "device", None) or getattr(gpu.runtime, "adapter", None),
        "load_s": round(load_gpu, 2),
    }
    want, got = _greedy(cpu, args.tokens), _greedy(gpu, args.tokens)
    res["greedy_equal"] = sum(a == b for a, b in zip(want, got, strict=True))
    res["greedy_prompts"] = len(PROMPTS)
    firsts = []
    for a, b in zip(want, got, strict=True):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        firsts.append(diff[0] if diff else None)
    res["first_difference"] = firsts
    ids = cpu.tokenizer.encode(PROMPTS[1])
    lc, lg = cpu.logits(ids), gpu.logits(ids)
    res["logits_max_abs_diff"] = float(np.max(np.abs(lc - lg)))
    res["argmax_equal"] = bool(int(np.argmax(lc)) == int(np.argmax(lg)))
    if not args.no_timings:
        vocab = int(lc.shape[0])
        res[backend] = _timings(gpu, vocab, args.decode_tokens, args.batch)
        if not args.no_cpu_timings:
            res["cpu"] = _timings(cpu, vocab, args.decode_tokens, args.batch)
    # ggml numerics on wgpu follows llama.cpp's arithmetic, not the CPU's bits: ids may part.
    exact = numerics == "exact"
    res["ok"] = res["argmax_equal"] and (
        not exact
        or (res["greedy_equal"] == len(PROMPTS) and res["logits_max_abs_diff"] <= args.atol)
    )
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--emulate", action="store_true", help="the CPU emulation of the driver")
    p.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    p.add_argument("--atol", type=float, default=2e-3, help="logits bound, CUDA vs CPU")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="concurrent sequences")
    p.add_argument("--threads", type=int, default=None, help="CPU runtime threads")
    p.add_argument("--no-timings", action="store_true")
    p.add_argument("--no-cpu-timings", action="store_true", help="time the GPU backend only")
    p.add_argument(
        "--backends",
        default="cuda",
        help="comma-separated backend:numerics pairs, e.g. cuda:exact,wgpu:exact,wgpu:ggml",
    )
    args = p.parse_args()
    if args.emulate:
        _emulate()
    elif "cuda" in args.backends:
        # What the server's CUDA fit reads (free, total); never run on hardware before.
        free, total = _native.cuda_memory(0)
        print(json.dumps({"cuda_memory": {"free": free, "total": total}}), flush=True)
    ok = True
    for m in args.models:
        for pair in args.backends.split(","):
            backend, _, numerics = pair.partition(":")
            try:
                res = check(m, backend, numerics or "exact", args)
            except Exception as e:  # one failure must not hide the other results
                res = {
                    "model": m,
                    "backend": pair,
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}",
                }
            print(json.dumps(res), flush=True)
            ok = ok and bool(res["ok"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
