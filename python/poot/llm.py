"""``poot.LLM``: offline generation in the shape users know from vLLM.

``LLM(model)`` resolves the checkpoint, picks its model definition, maps its weights (packed
stays packed) and configures a CPU runtime with a paged KV pool. ``generate`` runs any number of
prompts batched, driven by the Rust scheduler (``poot._native.Scheduler``, poot-engine): FCFS
under a per-step token budget of ``max_step_tokens``, decode rows first, then prefill chunks
(chunked prefill is the only prefill path), blocks allocated as sequences grow and preemption
by recompute when the pool runs out. Sampling is done by the last node of the step graph.
``logits`` is the one path that brings full logits to the host.

Prefix caching (``enable_prefix_caching``, on by default): full KV blocks are hashed over their
token ids, chained from the first block and seeded with a model key
(``poot.numerics.model_key``: the checkpoint's identity and the numerics mode, since
``"exact"`` and ``"ggml"`` write different KV values). A prompt whose leading full blocks
match cached ones skips their prefill (never its last token, whose logits are needed); freed
blocks stay cached until the pool reuses them.
``LLM.stats`` counts prefill tokens computed and taken from the cache.

Invariants:
    - Every KV block returns to the pool when a request ends, however it ends (finish, error,
      a closed stream): the driver loop aborts its live requests on the way out.
    - Runs are reproducible: a request's random draws come from ``numpy.random.Generator(seed)``,
      one per sampled token, so they do not depend on which other requests share its steps
      or on how its prompt was chunked.
    - An ``LLM`` is not thread-safe; use one per thread (or the server, later).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from poot import _native
from poot.checkpoints import ModelFiles, resolve_model_files
from poot.driver_options import DriverOptions
from poot.errors import ConfigError, ContextLengthError, GraphInputError, SamplingParamsError
from poot.guidance import Guide
from poot.models import model_definition
from poot.numerics import Numerics, model_key, numerics_for
from poot.outputs import CompletionOutput, Logprob, RequestOutput
from poot.planner.compiled import CompileConfig, CompiledModel
from poot.prepared import PreparedPolicy
from poot.request import Request, sampling_rows
from poot.runner import StepResult, StepRunner
from poot.sampling import SamplingParams
from poot.tokenizer import Tokenizer, load_tokenizer

__all__ = ["LLM", "PromptType"]

logger = logging.getLogger("poot")

PromptType = str | Sequence[int]

_DEFAULT_MAX_MODEL_LEN = 4096


def _make_runtime(
    threads: int | None, numerics: Literal["ggml", "exact"] = "exact"
) -> _native.CpuRuntime:
    """The runtime an ``LLM`` runs on (tests substitute a reference interpreter here)."""
    return _native.CpuRuntime(threads, numerics)


def _make_wgpu_runtime(
    timeout_s: float, numerics: Literal["ggml", "exact"] = "exact"
) -> _native.WgpuRuntime:
    """The wgpu runtime (``backend="wgpu"``): the first Vulkan adapter, waits bounded by
    ``timeout_s``."""
    return _native.WgpuRuntime(timeout_s, numerics=numerics)


class LLM:
    """A model ready to generate.

    Args:
        model: a model spec (a .gguf file, a HF directory, a hub id; None for the default).
        threads: CPU threads (None: one per core).
        numerics: ``"ggml"`` follows llama.cpp's CPU arithmetic, token for token
            (Q8-quantized activations with integer dots, f16 KV cache);
            ``"exact"`` decodes weights exactly with f32 activations and KV cache;
            ``"auto"`` (default) picks ``"ggml"`` for quantized checkpoints.
        max_model_len: most tokens (prompt + generated) per sequence; default the model's
            context length, at most 4096.
        driver: the batch settings (``poot.DriverOptions``); the keywords below, where
            given, override its fields. One line at start (logger ``"poot"``) says what was
            chosen.
        block_size: tokens per KV block.
        num_blocks: usable KV blocks in the pool (the runtime holds one more, the scheduler's
            reserved null block); default enough for 256 MiB of KV, at least one
            ``max_model_len`` sequence.
        max_step_tokens: most tokens in one step (prefill chunk size).
        max_num_seqs: most sequences decoding together.
        trace_limits: budgets for tracing each step graph.
        compile_limits: budgets for compiling each step graph.
        timeout_s: the deadline of each step on the device.
        config: a ``poot.CompileConfig``: plan the model with ``poot.compile`` (devices, budgets,
            streaming) and run that plan; the result is ``llm.compiled``. None: no planner.
        backend: ``"cpu"`` (default) or ``"wgpu"`` (Vulkan through wgpu). ``numerics``
            resolves the same way on both; wgpu's ``"ggml"`` reproduces llama.cpp's integer
            dots and f16 rounding of KV, q and attention weights (greedy ids follow
            llama.cpp's) but is not bit-identical to the CPU's.
        enable_prefix_caching: reuse the KV of full blocks shared with earlier prompts (same
            token ids from the start, same checkpoint and numerics) instead of prefilling
            them again; logits and greedy output are unchanged. See ``stats``.
        max_prepared_entries: most compiled step plans kept (``poot.prepared``).
        max_prepared_bytes: most bytes of compiled step plans kept.
        prepared_policy: when the plan cache is full, ``"evict"`` drops the least recently
            used, ``"refuse"`` raises ``PreparedEntryLimitError`` (the request ends; the LLM
            is usable).
        progress: on a terminal, a progress bar while the CPU runtime prepares the weights at
            load (huge-page copies and re-lays: seconds for a 2.4 GB F16 model), once that has
            taken half a second.

    Raises:
        ModelNotFoundError, CheckpointFormatError: the model cannot be resolved or opened.
        UnsupportedArchitectureError: poot has no definition for the model's architecture.
        ConfigError: a setting is out of range.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        threads: int | None = None,
        numerics: Numerics = "auto",
        max_model_len: int | None = None,
        driver: DriverOptions | None = None,
        block_size: int | None = None,
        num_blocks: int | None = None,
        max_step_tokens: int | None = None,
        max_num_seqs: int | None = None,
        trace_limits: _native.TraceLimits | None = None,
        compile_limits: _native.CompileLimits | None = None,
        timeout_s: float = 600.0,
        enable_prefix_caching: bool | None = None,
        max_prepared_entries: int | None = None,
        max_prepared_bytes: int | None = None,
        prepared_policy: PreparedPolicy | None = None,
        config: CompileConfig | None = None,
        backend: Literal["cpu", "wgpu"] = "cpu",
        progress: bool = True,
    ) -> None:
        self.files: ModelFiles = resolve_model_files(model)
        self.tokenizer: Tokenizer = load_tokenizer(self.files)
        self.definition = model_definition(self.files)
        h = self.files.hparams
        trace_limits = trace_limits or _native.TraceLimits()
        compile_limits = compile_limits or _native.CompileLimits()
        opts = (driver or DriverOptions()).with_overrides(
            block_size=block_size,
            num_blocks=num_blocks,
            max_step_tokens=max_step_tokens,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            max_prepared_entries=max_prepared_entries,
            max_prepared_bytes=max_prepared_bytes,
            prepared_policy=prepared_policy,
        )
        if backend not in ("cpu", "wgpu"):
            raise ConfigError(f'backend must be "cpu" or "wgpu", got {backend!r}')
        resolved = numerics_for(numerics, self.files)
        if opts.max_step_tokens > trace_limits.max_tokens:
            raise ConfigError(
                f"max_step_tokens={opts.max_step_tokens} exceeds trace_limits.max_tokens="
                f"{trace_limits.max_tokens}"
            )
        if max_model_len is None:
            max_model_len = min(h.context_length, _DEFAULT_MAX_MODEL_LEN)
        if not 2 <= max_model_len <= h.context_length:
            raise ConfigError(
                f"max_model_len must be in 2..{h.context_length} (the model's context), "
                f"got {max_model_len}"
            )
        # f16 or f32 KV entries; wgpu's ggml mode keeps f16-rounded values in f32 storage.
        entry_bytes = 2 if resolved == "ggml" and backend == "cpu" else 4
        opts = opts.resolve(h, max_model_len, entry_bytes)
        assert opts.num_blocks is not None
        self.driver = opts
        block_size, num_blocks = opts.block_size, opts.num_blocks
        max_step_tokens, max_num_seqs = opts.max_step_tokens, opts.max_num_seqs
        enable_prefix_caching = opts.enable_prefix_caching
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.eos_ids = frozenset(self.tokenizer.eos_ids) | frozenset(h.eos_token_ids)
        source = self.files.gguf if self.files.gguf is not None else self.files.safetensors
        assert source is not None
        self.weights = _native.Weights(source)
        self.numerics = resolved
        self.backend = backend
        self.runtime: _native.CpuRuntime | _native.WgpuRuntime = (
            _make_runtime(threads, resolved)
            if backend == "cpu"
            else _make_wgpu_runtime(timeout_s, resolved)
        )
        self.enable_prefix_caching = enable_prefix_caching
        self.model_key = model_key(self.files, resolved)
        self._prefill_tokens = 0
        self._decode_tokens = 0
        # The scheduler owns the KV blocks (``allocator`` for its block counts).
        self.allocator = _native.Scheduler(
            max_num_seqs=min(max_num_seqs, max_step_tokens),
            max_batched_tokens=max_step_tokens,
            max_step_tokens=max_step_tokens,
            max_model_len=max_model_len,
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            model_key=self.model_key,
        )
        self._live: dict[int, Request] = {}
        self._next_id = 0
        self.runner = StepRunner(
            self.definition,
            self.weights,
            self.runtime,
            block_size=block_size,
            num_blocks=num_blocks,
            max_step_tokens=max_step_tokens,
            trace_limits=trace_limits,
            compile_limits=compile_limits,
            timeout_s=timeout_s,
            max_plans=opts.max_prepared_entries,
            max_plan_bytes=opts.max_prepared_bytes,
            plan_policy=opts.prepared_policy,
        )
        self.guide = Guide(self.tokenizer, h.vocab_size, self.eos_ids)
        # The planner's placement (``poot.planner``): the direct path or streaming, with a ledger.
        self.compiled: CompiledModel | None = None
        if config is not None:
            from poot.planner.runners import attach

            self.compiled = attach(self, config)
        # The weights' huge-page copies and re-lays happen here rather than in the first
        # request, wherever the whole model runs on this CPU (streaming and split plans place
        # and stream weights their own way).
        direct = self.compiled is None or self.compiled.direct
        if direct and isinstance(self.runtime, _native.CpuRuntime):
            t0 = time.perf_counter()
            self.runner.prepare_weights(progress=progress)
            logger.info("weights prepared in %.2f s", time.perf_counter() - t0)
        logger.info(opts.log_line(h, entry_bytes))

    def __repr__(self) -> str:
        return (
            f"LLM(model={str(self.files.path)!r}, max_model_len={self.max_model_len}, "
            f"num_blocks={self.allocator.num_blocks}, block_size={self.block_size})"
        )

    # ---- prompts and requests -------------------------------------------------------------

    def _prompt_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
            text: str | None = prompt
        else:
            ids = [int(i) for i in prompt]
            text = None
        vocab = self.files.hparams.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise GraphInputError(
                f"token id {bad[0]} is out of range for a vocabulary of {vocab}",
                name="ids",
                got=str(bad[0]),
            )
        if not ids:
            raise ContextLengthError("the prompt has no tokens", needed=0, limit=self.max_model_len)
        if len(ids) >= self.max_model_len:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens, so it needs {len(ids) + 1} with one to "
                f"generate; max_model_len={self.max_model_len}",
                needed=len(ids) + 1,
                limit=self.max_model_len,
            )
        return text, ids

    def _request(self, index: int, prompt: PromptType, params: SamplingParams) -> Request:
        text, ids = self._prompt_ids(prompt)
        vocab = self.files.hparams.vocab_size
        bad = [t for t, _ in params.bias_items if t >= vocab]
        if bad:
            raise SamplingParamsError(
                f"logit_bias names token {bad[0]}, outside the vocabulary of {vocab}",
                field="logit_bias",
            )
        return Request(
            index=index,
            prompt=text,
            prompt_ids=ids,
            params=params,
            rng=np.random.default_rng(params.seed),
            stream=self.tokenizer.stream(context=ids),
            matcher=self.guide.matcher(params),
        )

    @staticmethod
    def _normalize_prompts(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
        if isinstance(prompts, str):
            return [prompts]
        items = list(prompts)
        if items and all(isinstance(p, int | np.integer) for p in items):
            return [items]  # type: ignore[list-item]
        return items  # type: ignore[return-value]

    # ---- the step loop --------------------------------------------------------------------

    def _add(self, req: Request) -> None:
        p = req.params
        req.request_id = self._next_id
        self._next_id += 1
        self.allocator.add_request(
            req.request_id,
            req.prompt_ids,
            p.max_tokens,
            eos_ids=sorted(self.eos_ids),
            stop_ids=sorted(p.stop_ids),
            ignore_eos=p.ignore_eos,
        )
        self._live[req.request_id] = req

    def _end(self, req: Request) -> None:
        """Forgets a request, aborting it (freeing its blocks) if it is still live."""
        if self._live.pop(req.request_id, None) is not None:
            self.allocator.abort(req.request_id)

    def _settle(self) -> None:
        """Closes a step left in flight (by an error or an abort); aborted rows are ignored."""
        if self.allocator.step_in_flight:
            self.allocator.update([])

    def _step(self, logits_for: Request | None = None) -> npt.NDArray[np.float32] | None:
        """Plans, runs and applies one step; accepted text goes to each request's ``pending``.

        With ``logits_for``, a step that samples that request's row also runs as a ``logits``
        step, and its logits row is returned (rerunning a step rewrites identical KV).
        """
        plan = self.allocator.schedule()
        for rid in plan.preempted:
            if rid in self._live:
                self._live[rid].in_prefill = True
        ids = plan.request_ids
        if not ids:
            raise RuntimeError("the scheduler planned an empty step with requests live")
        rows = [self._live[i] for i in ids]
        samples = plan.sample
        for r, n, sample in zip(rows, plan.row_tokens, samples, strict=True):
            if r.in_prefill:
                self._prefill_tokens += n
                r.in_prefill = not sample
            else:
                self._decode_tokens += n
        sampling = sampling_rows(rows, samples, self.guide)
        logits: npt.NDArray[np.float32] | None = None
        try:
            if logits_for is not None and logits_for.request_id in ids:
                i = ids.index(logits_for.request_id)
                if samples[i]:
                    logits = np.asarray(self.runner.run_plan(plan, "logits")[i], np.float32)
            if logits is not None and len(ids) == 1:
                result = StepResult(np.asarray([int(np.argmax(logits))], np.int32))
            else:
                result = self.runner.run_sample(plan, sampling)
        except BaseException:
            # The failed step's requests cannot go on: end them, then close the step.
            for r in rows:
                self._end(r)
            self._settle()
            raise
        sampled = []
        for i, (r, sample) in enumerate(zip(rows, samples, strict=True)):
            if not sample:
                continue
            token = int(result.token_ids[i])
            if token < 0:  # non-finite logits: end the request, emit no token
                r.fail()
                self._end(r)
                continue
            if result.logprobs is not None and r.logprobs is not None:
                self._record_logprobs(r, result, i)
            sampled.append((r.request_id, token))
        for rid, token, finish in self.allocator.update(sampled):
            req = self._live[rid]
            req.pending.append(req.accept(token, finish))
            if finish is not None:
                del self._live[rid]
            elif req.ended_by_host:
                self._end(req)
        return logits

    def _record_logprobs(self, req: Request, result: StepResult, row: int) -> None:
        assert result.logprob_ids is not None and result.logprobs is not None
        n = req.params.logprobs or 0
        ids = [int(t) for t in result.logprob_ids[row]]
        lps = [float(x) for x in result.logprobs[row]]
        chosen, top = ids[0], ids[1:]
        entry: dict[int, Logprob] = {}
        for rank, (t, lp) in enumerate(zip(top[:n], lps[1 : n + 1], strict=True), start=1):
            if t >= 0:
                entry[t] = Logprob(lp, rank, self._token_text(t))
        rank_of = top.index(chosen) + 1 if chosen in top else None
        entry[chosen] = Logprob(lps[0], rank_of, self._token_text(chosen))
        req.add_logprobs(entry, lps[0])

    def _token_text(self, token: int) -> str:
        piece = self.tokenizer.token_piece(token)
        if piece is not None:
            return piece.decode("utf-8", errors="replace")
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _run(self, requests: Sequence[Request]) -> Iterator[tuple[Request, str]]:
        """Runs requests to completion, yielding each accepted token's text delta."""
        try:
            for req in requests:
                self._add(req)
            while True:
                for req in requests:
                    while req.pending:
                        yield req, req.pending.popleft()
                if all(r.finish_reason is not None for r in requests):
                    return
                if any(
                    r.finish_reason is None and r.request_id not in self._live for r in requests
                ):
                    raise RuntimeError("a request was ended by a failed step")
                self._step()
        finally:
            for req in requests:
                self._end(req)
            self._settle()

    # ---- public API -----------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters over this ``LLM``'s life.

        ``prefill_computed_tokens`` (prompt tokens, and prompt + generated tokens recomputed
        after a preemption, that were run through the model), ``prefill_cached_tokens`` (those
        taken from the prefix cache instead), ``decode_tokens``; the scheduler's ``steps``,
        ``computed_tokens`` (prefill + decode), ``cached_tokens``, ``preemptions``, ``finished``
        and ``aborted``; the KV blocks ``used_blocks`` / ``num_blocks``; and the prepared-plan
        cache's ``prepared_*`` counters (``PreparedCache.stats``).
        """
        s = dict(self.allocator.stats())
        s["prefill_computed_tokens"] = self._prefill_tokens
        s["prefill_cached_tokens"] = s["cached_tokens"]
        s["decode_tokens"] = self._decode_tokens
        s["used_blocks"] = self.allocator.used_blocks
        s["num_blocks"] = self.allocator.num_blocks
        s.update(self.runner.plans.stats())
        return s

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generates a completion for each prompt.

        Args:
            prompts: a prompt (text or token ids) or a list of prompts.
            sampling_params: one ``SamplingParams`` for all prompts, or one per prompt;
                None means ``SamplingParams()``.

        Returns:
            One ``RequestOutput`` per prompt, in order.

        Raises:
            ContextLengthError: a prompt is empty or does not fit ``max_model_len``, or a
                request needs more KV blocks than the whole pool has.
            GraphInputError: a token id is outside the vocabulary.
        """
        items = self._normalize_prompts(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise ValueError(
                    f"{len(params)} sampling params for {len(items)} prompts; give one or "
                    "one per prompt"
                )
        requests = [
            self._request(i, p, sp) for i, (p, sp) in enumerate(zip(items, params, strict=True))
        ]
        for _ in self._run(requests):
            pass
        return [self._output(r) for r in requests]

    @staticmethod
    def _output(req: Request) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            text="".join(req.text),
            token_ids=list(req.out),
            finish_reason=req.finish_reason,  # type: ignore[arg-type]
            logprobs=req.logprobs,
            cumulative_logprob=req.cumulative_logprob,
            stop_reason=req.stop_reason,
        )
        return RequestOutput(
            request_id=str(req.index),
            prompt=req.prompt,
            prompt_token_ids=list(req.prompt_ids),
            outputs=[completion],
            finished=req.finish_reason is not None,
        )

    def generate_stream(
        self, prompt: PromptType, sampling_params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Yields the completion's text as it is generated, in complete characters.

        ``"".join(generate_stream(p, sp))`` equals ``generate(p, sp)[0].outputs[0].text``.
        Closing the iterator early ends the request and frees its blocks.
        """
        req = self._request(0, prompt, sampling_params or SamplingParams())
        for _, delta in self._run([req]):
            if delta:
                yield delta

    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """The full logits (float32 [vocab]) after the last of ``token_ids``.

        The prompt is prefilled in chunks by the scheduler like any other; only the last
        chunk's step outputs logits. This is the only path that brings full logits to the host.
        """
        _, ids = self._prompt_ids(list(token_ids))
        req = self._request(-1, ids, SamplingParams(max_tokens=1, temperature=0.0))
        try:
            self._add(req)
            while True:
                logits = self._step(logits_for=req)
                if logits is not None:
                    return logits
        finally:
            self._end(req)
            self._settle()
