"""``poot.LLM``: offline generation in the shape users know from vLLM.

``LLM(model)`` resolves the checkpoint, picks its model definition, maps its weights (packed
stays packed) and configures a CPU runtime with a paged KV pool. ``generate`` runs any number of
prompts batched through the engine core (``poot.engine_core.EngineCore``, ``llm.core``) over the
Rust scheduler (``poot._native.Scheduler``, poot-engine; ``llm.scheduler``): FCFS
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
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from poot import _native
from poot.checkpoints import ModelFiles, resolve_model_files
from poot.config import CpuSettings
from poot.driver_options import DriverOptions
from poot.engine_core import EngineCore
from poot.errors import ConfigError, ContextLengthError, GraphInputError, SamplingParamsError
from poot.guidance import Guide
from poot.host_memory import trim_heap
from poot.kv_windows import kv_group_window, kv_window, kv_windows
from poot.models import model_definition
from poot.numerics import Numerics, model_key, numerics_for
from poot.outputs import CompletionOutput, RequestOutput
from poot.prepared import PreparedPolicy
from poot.request import Request
from poot.runner import StepRunner
from poot.runtimes import Runtime
from poot.sampling import SamplingParams
from poot.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    # Only annotations here: the planner is imported where a config asks for it, which keeps
    # it off poot-serve's start-up path.
    from poot.planner.compiled import CompileConfig, CompiledModel
    from poot.serve.nodes import NodesConfig

__all__ = ["LLM", "PromptType"]

logger = logging.getLogger("poot")

PromptType = str | Sequence[int]

_DEFAULT_MAX_MODEL_LEN = 4096


def _make_runtime(
    threads: int | None, numerics: Literal["ggml", "exact"] = "exact", **tuning: Any
) -> _native.CpuRuntime:
    """The runtime an ``LLM`` runs on (tests substitute a reference interpreter here);
    ``tuning`` is ``CpuSettings.runtime_kwargs()``."""
    return _native.CpuRuntime(threads, numerics, **tuning)


def _make_wgpu_runtime(
    timeout_s: float, numerics: Literal["ggml", "exact"] = "exact"
) -> _native.WgpuRuntime:
    """The wgpu runtime (``backend="wgpu"``): the first Vulkan adapter, waits bounded by
    ``timeout_s``."""
    return _native.WgpuRuntime(timeout_s, numerics=numerics)


def _make_vulkan_runtime(
    timeout_s: float, numerics: Literal["ggml", "exact"] = "exact"
) -> _native.WgpuRuntime:
    """The raw Vulkan runtime (``backend="vulkan"``, not production): wgpu's kernels and
    executor on the best Vulkan device through ash; ``BackendNotCompiledError`` in a build
    without it (never a wgpu runtime in its place)."""
    return _native.WgpuRuntime(timeout_s, numerics=numerics, api="vulkan")


def _make_cuda_runtime(timeout_s: float) -> _native.CudaRuntime:
    """The CUDA runtime (``backend="cuda"``): device 0, exact numerics, waits bounded by
    ``timeout_s``. ``DeviceUnavailableError`` names what is missing where there is no
    driver, NVRTC or device."""
    return _native.CudaRuntime(0, timeout_s)


class _WeightPreparation:
    """``runner.prepare_weights`` on a thread of its own; ``join`` waits and re-raises what it
    raised. Always joined before the ``LLM`` is returned or its constructor raises, so no
    preparation outlives the constructor."""

    def __init__(self, runner: StepRunner, progress: bool) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(runner, progress), name="poot-prepare", daemon=True
        )
        self._thread.start()

    def _run(self, runner: StepRunner, progress: bool) -> None:
        t0 = time.perf_counter()
        try:
            runner.prepare_weights(progress=progress)
        except BaseException as e:  # re-raised by join, on the constructor's thread
            self._error = e
            return
        # The first step's warm-up: its compile prepared every weight.
        logger.info("weights prepared in %.2f s", time.perf_counter() - t0)

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


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
            A ``NodesConfig`` (``poot.serve.nodes``, docs/ray.md) places the model's layers
            across the nodes of a Ray cluster instead.
        backend: ``"cpu"`` (default), ``"wgpu"`` (Vulkan through wgpu), ``"vulkan"`` (the
            same kernels on raw Vulkan through ash; not production) or ``"cuda"`` (an
            NVIDIA GPU; exact numerics only, and until it has kernels for every op of a step
            (attention, sampling) loading a model on it fails with the op it lacks).
            ``numerics`` resolves the same way on cpu and wgpu; wgpu's ``"ggml"`` reproduces
            llama.cpp's integer dots and f16 rounding of KV, q and attention weights (greedy
            ids follow llama.cpp's) but is not bit-identical to the CPU's.
        enable_prefix_caching: reuse the KV of full blocks shared with earlier prompts (same
            token ids from the start, same checkpoint and numerics) instead of prefilling
            them again; logits and greedy output are unchanged. See ``stats``.
        max_prepared_entries: most compiled step plans kept (``poot.prepared``).
        max_prepared_bytes: most bytes of compiled step plans kept.
        prepared_policy: when the plan cache is full, ``"evict"`` drops the least recently
            used, ``"refuse"`` raises ``PreparedEntryLimitError`` (the request ends; the LLM
            is usable).
        cpu: the CPU runtime's tuning knobs (``poot.config.CpuSettings``: code path, spin,
            prefetch, huge pages, profiling); None takes the ``POOT_CPU_*`` environment
            defaults.
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
        config: CompileConfig | NodesConfig | None = None,
        backend: Literal["cpu", "wgpu", "vulkan", "cuda"] = "cpu",
        progress: bool = True,
        cpu: CpuSettings | None = None,
    ) -> None:
        t_start = time.perf_counter()
        self.files: ModelFiles = resolve_model_files(model)
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
        if backend not in ("cpu", "wgpu", "vulkan", "cuda"):
            raise ConfigError(f'backend must be "cpu", "wgpu", "vulkan" or "cuda", got {backend!r}')
        if backend == "cuda" and numerics == "ggml":
            raise ConfigError('backend="cuda" has exact numerics only; use numerics="exact"')
        resolved: Literal["ggml", "exact"] = (
            "exact" if backend == "cuda" else numerics_for(numerics, self.files)
        )
        runtime: Runtime = (
            _make_runtime(threads, resolved, **(cpu.runtime_kwargs() if cpu else {}))
            if backend == "cpu"
            else _make_cuda_runtime(timeout_s)
            if backend == "cuda"
            else _make_vulkan_runtime(timeout_s, resolved)
            if backend == "vulkan"
            else _make_wgpu_runtime(timeout_s, resolved)
        )
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
        # The pool is sized by the runtime's own KV element (f16 on the CPU in ggml numerics).
        entry_bytes = runtime.kv_entry_bytes
        # What sliding windows save (a planner placement keeps no window group).
        windows = kv_windows(self.definition)
        if windows is not None and windows.grouped and config is not None:
            windows = None
        opts = opts.resolve(h, max_model_len, entry_bytes, windows)
        assert opts.num_blocks is not None
        self.driver = opts
        block_size, num_blocks = opts.block_size, opts.num_blocks
        max_step_tokens, max_num_seqs = opts.max_step_tokens, opts.max_num_seqs
        enable_prefix_caching = opts.enable_prefix_caching
        self.max_model_len = max_model_len
        self.definition = self.definition.for_context(max_model_len)
        # A planner placement (config) keeps one KV table for every layer (no window group).
        window_group = kv_group_window(self.definition) if config is None else None
        if window_group is not None:
            self.definition = self.definition.with_window_group()
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        source = self.files.gguf if self.files.gguf is not None else self.files.safetensors
        assert source is not None
        self.weights = _native.Weights(source)
        self.numerics = resolved
        self.backend: str = backend
        self.runtime: Runtime = runtime
        self.enable_prefix_caching = enable_prefix_caching
        self.model_key = model_key(self.files, resolved)
        # The scheduler owns the KV blocks (and says how many the runtime's pool holds).
        self.scheduler = _native.Scheduler(
            max_num_seqs=min(max_num_seqs, max_step_tokens),
            max_batched_tokens=max_step_tokens,
            max_step_tokens=max_step_tokens,
            max_model_len=max_model_len,
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            model_key=self.model_key,
            kv_window=kv_window(self.definition),
            window_group=window_group,
        )
        runner = StepRunner(
            self.definition,
            self.weights,
            self.runtime,
            block_size=block_size,
            pool_blocks=self.scheduler.pool_blocks,
            window_pool_blocks=self.scheduler.window_pool_blocks,
            max_step_tokens=max_step_tokens,
            trace_limits=trace_limits,
            compile_limits=compile_limits,
            timeout_s=timeout_s,
            max_plans=opts.max_prepared_entries,
            max_plan_bytes=opts.max_prepared_bytes,
            plan_policy=opts.prepared_policy,
        )
        # The planner's placement (``poot.planner``): the runner it builds for this model
        # (direct, streamed or split), and the runtime and backend the steps then run on.
        self.compiled: CompiledModel | None = None
        logger.debug("load: model mapped in %.3f s", time.perf_counter() - t_start)
        if config is not None:
            from poot.planner.compiled import CompileConfig
            from poot.planner.runners import plan_runner

            t0 = time.perf_counter()
            # A config that places the model itself (across Ray nodes) has its own plan_runner.
            own = getattr(config, "plan_runner", None)
            if own is not None:
                planned = own(runner, self.files, backend, resolved)
            else:
                assert isinstance(config, CompileConfig)
                planned = plan_runner(runner, self.files, config, backend, resolved)
            runner, self.compiled = planned.runner, planned.compiled
            self.runtime, self.backend = planned.runtime, planned.backend
            logger.debug("load: planned in %.3f s", time.perf_counter() - t0)
        # The weights' huge-page copies and re-lays happen here rather than in the first
        # request, wherever the whole model runs on this CPU (streaming and split plans place
        # and stream weights their own way). They run on a thread of their own, mostly
        # without the GIL, while the tokenizer (Python) loads on this one.
        direct = self.compiled is None or self.compiled.direct
        preparing = (
            _WeightPreparation(runner, progress)
            if direct and isinstance(self.runtime, _native.CpuRuntime)
            else None
        )
        try:
            t0 = time.perf_counter()
            self.tokenizer: Tokenizer = load_tokenizer(self.files)
            logger.debug("load: tokenizer in %.3f s", time.perf_counter() - t0)
            eos_ids = frozenset(self.tokenizer.eos_ids) | frozenset(h.eos_token_ids)
            self.guide = Guide(self.tokenizer, h.vocab_size, eos_ids)
            self.core = EngineCore(self.scheduler, runner, self.guide, self.tokenizer, eos_ids)
        finally:
            if preparing is not None:
                preparing.join()
        # What loading freed (the tokenizer's parse, the re-lays' transient buffers) leaves the
        # heap now rather than staying resident beside the weights.
        trim_heap()
        logger.info(opts.log_line(h, entry_bytes, windows))

    def __repr__(self) -> str:
        return (
            f"LLM(model={str(self.files.path)!r}, max_model_len={self.max_model_len}, "
            f"num_blocks={self.scheduler.num_blocks}, block_size={self.block_size})"
        )

    @property
    def eos_ids(self) -> frozenset[int]:
        """Ids that end a request unless it ignores EOS (settable: later requests use it)."""
        return self.core.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: frozenset[int]) -> None:
        self.core.eos_ids = ids

    @property
    def runner(self) -> StepRunner:
        """The step runner the engine core runs steps with (plans by shape, the runtime)."""
        return self.core.runner

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

    def make_request(
        self, prompt: PromptType, params: SamplingParams | None = None, index: int = 0
    ) -> Request:
        """Validates a prompt and its sampling settings into a request for ``core``.

        This is where a request is admitted: token ids are checked against the vocabulary
        and ``max_model_len``, a logit bias against the vocabulary, and a guided request's
        schema, regex or grammar is compiled for this tokenizer.

        Raises:
            ContextLengthError: the prompt is empty or does not fit ``max_model_len``.
            GraphInputError: a token id is outside the vocabulary.
            SamplingParamsError: a bias names a token outside the vocabulary, or the
                constraint does not compile.
        """
        params = params or SamplingParams()
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

    # ---- the step loop ----------------------------------------------------------------------

    def _run(self, requests: Sequence[Request]) -> Generator[tuple[Request, str], None, None]:
        """Runs requests to completion, yielding each accepted token's text delta."""
        core = self.core
        try:
            for req in requests:
                core.add_request(req)
            while True:
                for req in requests:
                    while req.pending:
                        yield req, req.pending.popleft()
                if all(r.finish_reason is not None for r in requests):
                    return
                if any(
                    r.finish_reason is None and not core.is_live(r.request_id) for r in requests
                ):
                    raise RuntimeError("a request was ended by a failed step")
                core.step()
        finally:
            for req in requests:
                core.abort(req.request_id)
            core.settle()

    # ---- public API -----------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters over this ``LLM``'s life.

        ``prefill_computed_tokens`` (prompt tokens, and prompt + generated tokens recomputed
        after a preemption, that were run through the model), ``prefill_cached_tokens`` (those
        taken from the prefix cache instead), ``decode_tokens``; the scheduler's ``steps``,
        ``computed_tokens`` (prefill + decode), ``cached_tokens``, ``preemptions``, ``finished``
        and ``aborted``; the KV blocks ``used_blocks`` / ``num_blocks``; the prepared-plan
        cache's ``prepared_*`` counters (``PreparedCache.stats``); and, where the runtime
        counts them (``WgpuRuntime.stats``), ``runtime_runs`` and ``runtime_readback_bytes``
        (bytes copied back from the device).
        """
        s = self.core.stats()
        s.update(self.runner.plans.stats())
        runtime_stats = getattr(getattr(self.runtime, "inner", self.runtime), "stats", None)
        if callable(runtime_stats):
            s.update({f"runtime_{k}": int(v) for k, v in runtime_stats().items()})
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
            self.make_request(p, sp, i) for i, (p, sp) in enumerate(zip(items, params, strict=True))
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
            prompt_logprobs=req.prompt_logprobs,
        )

    def generate_stream(
        self, prompt: PromptType, sampling_params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Yields the completion's text as it is generated, in complete characters.

        ``"".join(generate_stream(p, sp))`` equals ``generate(p, sp)[0].outputs[0].text``.
        Closing the iterator early ends the request and frees its blocks.
        """
        req = self.make_request(prompt, sampling_params)
        run = self._run([req])
        try:
            for _, delta in run:
                if delta:
                    yield delta
        finally:
            # Closed here, not left to the collector: on Python 3.12 the inner generator
            # outlived this one's close(), holding the request's KV blocks.
            run.close()

    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """The full logits (float32 [vocab]) after the last of ``token_ids``.

        The prompt is prefilled in chunks by the scheduler like any other; only the last
        chunk's step outputs logits. This is the only path that brings full logits to the host.
        """
        _, ids = self._prompt_ids(list(token_ids))
        req = self.make_request(ids, SamplingParams(max_tokens=1, temperature=0.0), -1)
        core = self.core
        try:
            core.add_request(req)
            while True:
                logits = core.step_logits(req)
                if logits is not None:
                    return logits
        finally:
            core.abort(req.request_id)
            core.settle()
