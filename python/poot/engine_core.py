"""``EngineCore``: the one owner of requests and of the step.

The core holds the Rust scheduler (``poot._native.Scheduler``: queues, KV blocks, chunked
prefill, preemption), the step driver over it (``poot._native.StepDriver``: each request's
sampling state, and a steady-state step scheduled, laid out, run and applied in one call), the
step runner (plans by step shape, the runtime) and the live requests.
Its clients (``poot.LLM`` for offline generation, ``poot.AsyncEngine`` for the server) only
call its public methods, in the shape of vLLM's ``EngineCore``:

- ``add_request(req)``: queue a request made by ``LLM.make_request`` (validated at admission);
- ``abort(request_id)``: end a live request and free its blocks;
- ``step() -> requests``: plan, run and apply one step; each request's accepted text goes to
  its ``pending`` queue and the requests that changed are returned;
- ``has_unfinished()``: whether any request is live.

Invariants:
    - A step is one call into Rust (``StepDriver.step``). Python is called back only to trace
      and compile a plan on a miss (``_plan_for``, through the runner's plan cache), to fill a
      guidance mask while the step runs (``_fill_mask``), and to run on a runtime that is
      itself a Python object. The call also brings back what the host asked for: the logits
      of each prefill token of a request asking for prompt logprobs, and ``step_logits``'s
      row; on a runtime without the logit ops (CUDA, wgpu without ``shader-f64``) it runs a
      step that needs them split, the sampling step on the runner's host CPU runtime. Only a
      step left unrun (``fast=False``, or a split step without a host runtime) takes the
      runner's path and a second call (``update``).
    - The driver's held plans are the runner's cache's: it drops what the cache evicts, and
      the cache records the driver's hits (LRU order, counts) at each miss and at ``stats``.
    - A request is live from ``add_request`` until it finishes, fails or is aborted; live
      requests are exactly the scheduler's unfinished ones once ``settle`` has run.
    - A failed step ends every request it ran (their blocks are freed), closes the step, and
      re-raises; other requests stay queued and the core stays usable.
    - Every block returns to the pool however a request ends: ``abort`` frees a live request's
      blocks at once, and a step left in flight by an error is closed by ``settle``.
    - The core is not thread-safe: one caller steps it at a time (``AsyncEngine`` adds and
      aborts only between steps).
    - Prompt logprobs (``SamplingParams.prompt_logprobs``) come from the request's own
      prefill: a step holding such a prefill chunk runs as an ``all_logits`` step, and each
      prompt position's entry is ``log_softmax`` (on the host, float32) of that token's
      logits, so it equals ``log_softmax(LLM.logits(prompt[:i]))`` bit for bit where the
      runtime's numerics are batch-invariant (the CPU's). Such a request never starts from
      the prefix cache (the driver admits it with ``skip_prefix_cache``, as vLLM does), so
      every prompt position's logits come from its own prefill, windowed layers included; a
      recompute after preemption does not overwrite them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from poot import _native
from poot.guidance import Guide
from poot.models.step import StepKind, StepShape
from poot.outputs import Logprob
from poot.request import Request
from poot.runner import (
    LOGPROB_WIDTH,
    SamplingRows,
    SchedulerOutput,
    StepResult,
    StepRunner,
)
from poot.tokenizer import Tokenizer

__all__ = ["EngineCore", "log_softmax"]

# A plan's key as the driver states it: ``StepShape``'s fields in order (the kind a name).
PlanKey = tuple[int, int, int, str, int, bool, int]


def log_softmax(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``logits - logsumexp(logits)`` in float32 (the host's one formula for prompt
    logprobs; tests apply it to ``LLM.logits`` to compare bit for bit)."""
    x = np.asarray(logits, np.float32)
    m = np.max(x)
    return (x - (m + np.log(np.sum(np.exp(x - m), dtype=np.float32)))).astype(np.float32)


class EngineCore:
    """Requests and the step loop over one scheduler and one step runner.

    Args:
        scheduler: the Rust scheduler (it owns the KV blocks).
        runner: runs the scheduler's steps on a runtime.
        guide: guided-decoding matchers and masks.
        tokenizer: token texts for logprobs.
        eos_ids: ids that end a request unless it ignores EOS.
    """

    def __init__(
        self,
        scheduler: _native.Scheduler,
        runner: StepRunner,
        guide: Guide,
        tokenizer: Tokenizer,
        eos_ids: frozenset[int],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.guide = guide
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self._live: dict[int, Request] = {}
        self._next_id = 0
        self._runtime = runner.runtime
        self.driver = _native.StepDriver(
            scheduler,
            runner.runtime,
            self._plan_for,
            self._fill_mask,
            timeout_s=runner.timeout_s,
            samples_on_device=runner.samples_on_device,
            logprob_width=LOGPROB_WIDTH,
            host_runtime=_host_of(runner),
        )
        # Keys the runner's plan cache evicted since the last step (the driver drops them).
        self._evicted: list[PlanKey] = []
        runner.plans.on_evict = self._on_evict
        # What `stats` returns while a step holds the native objects (see there).
        self._last_stats: dict[str, int] | None = None
        self.stats()

    @property
    def eos_ids(self) -> frozenset[int]:
        """Ids that end a request (unless it ignores EOS); requests added later use a new set."""
        return self._eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: frozenset[int]) -> None:
        self._eos_ids = frozenset(ids)
        self._eos_sorted = sorted(self._eos_ids)

    # ---- requests -------------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        """Queues ``req`` (FCFS) and gives it a fresh ``request_id``.

        Raises:
            ContextLengthError: the request needs more KV blocks than the whole pool has.
        """
        p = req.params
        rid = self._next_id
        # The request's random stream moves to the driver here (numpy's PCG64, continued).
        self.driver.add_request(
            rid,
            req.prompt_ids,
            p.max_tokens,
            eos_ids=self._eos_sorted,
            stop_ids=sorted(p.stop_ids),
            ignore_eos=p.ignore_eos,
            temperature=float(p.temperature),
            top_k=p.top_k,
            top_p=float(p.top_p),
            min_p=float(p.min_p),
            repetition=float(p.repetition_penalty),
            presence=float(p.presence_penalty),
            frequency=float(p.frequency_penalty),
            bias=list(p.bias_items),
            rng_state=req.rng.bit_generator.state,
            logprobs=p.logprobs is not None,
            prompt_logprobs=p.prompt_logprobs is not None,
            guided=req.matcher is not None,
        )
        self._next_id += 1
        req.request_id = rid
        self._live[rid] = req

    def abort(self, request_id: int) -> bool:
        """Ends a live request and frees its blocks; False when it was not live."""
        if self._live.pop(request_id, None) is None:
            return False
        self.driver.abort(request_id)
        return True

    def is_live(self, request_id: int) -> bool:
        """Whether the request is queued or running."""
        return request_id in self._live

    def has_unfinished(self) -> bool:
        """Whether any request is live."""
        return bool(self._live)

    def settle(self) -> None:
        """Closes a step left in flight (by an error or an abort); aborted rows are ignored."""
        if self.scheduler.step_in_flight:
            self.scheduler.update([])

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[Request]:
        """Plans, runs and applies one step.

        Returns:
            The requests that accepted a token or ended in this step (their text deltas are
            in ``pending``).

        Raises:
            Any error of the step; the step's requests are ended first.
        """
        return self._step(None)[0]

    def step_logits(self, req: Request) -> npt.NDArray[np.float32] | None:
        """One step that, if it samples ``req``'s row, also brings that row's full logits
        back (the step then also runs as a ``logits`` step: rerunning rewrites identical KV).
        """
        return self._step(req)[1]

    def _step(
        self, logits_for: Request | None
    ) -> tuple[list[Request], npt.NDArray[np.float32] | None]:
        if self.runner.runtime is not self._runtime:  # the runner was given another runtime
            self._runtime = self.runner.runtime
            self.driver.set_runtime(
                self._runtime, self.runner.samples_on_device, _host_of(self.runner)
            )
        forget, self._evicted = self._evicted, []
        try:
            # The one crossing: plan, lay out, run and apply (or plan only; see the docs).
            rid = None if logits_for is None else logits_for.request_id
            out = self.driver.step(True, forget, rid)
        except BaseException:
            self._end_step(self.driver.step_rows)
            raise
        ids: list[int] = out["request_ids"]
        if not ids:
            raise RuntimeError("the scheduler planned an empty step with requests live")
        rows = [self._live[i] for i in ids]
        if out["ran"]:
            changed: list[Request] = []
            if out["prompt_rows"]:
                self._record_prompt_logprobs(rows, out["prompt_rows"], out["prompt_logits"])
            failed = set(out["failed"])
            lp_ids, lps = out["logprob_ids"], out["logprobs"]
            for i, (r, sample) in enumerate(zip(rows, out["sample"], strict=True)):
                if not sample:
                    continue
                if r.request_id in failed:  # non-finite logits: the driver ended it
                    r.fail()
                    del self._live[r.request_id]
                    changed.append(r)
                elif lps is not None and r.logprobs is not None:
                    self._record_logprobs(r, lp_ids[i], lps[i])
            self._accept(out["events"], changed)
            return changed, out["logits"]
        return self._step_on_host(out, rows, logits_for)

    def _step_on_host(
        self, out: dict[str, Any], rows: list[Request], logits_for: Request | None
    ) -> tuple[list[Request], npt.NDArray[np.float32] | None]:
        """A step the driver planned but left to the runner (see the module docs)."""
        ids: list[int] = out["request_ids"]
        samples: list[bool] = out["sample"]
        plan = SchedulerOutput(
            ids,
            out["row_tokens"],
            samples,
            out["preempted"],
            out["num_tokens"],
            out["num_cached_tokens"],
            tuple(out["dims"]),
            out["inputs"],
        )
        # Rows whose prefill chunk asks for prompt logprobs.
        wants = [
            i
            for i, (r, prefill) in enumerate(zip(rows, out["prefill"], strict=True))
            if prefill and r.prompt_logprobs is not None
        ]
        logits: npt.NDArray[np.float32] | None = None
        try:
            sampling = SamplingRows(
                out["sampling"],
                adjust=out["adjust"],
                mask_rows=[(i, rows[i].matcher) for i in out["mask_rows"]],
                fill_mask=self.guide.fill_masks,
                logprobs=out["logprobs"],
            )
            if logits_for is not None and logits_for.request_id in ids:
                i = ids.index(logits_for.request_id)
                if samples[i]:
                    logits = np.asarray(self.runner.run_plan(plan, "logits")[i], np.float32)
            if logits is not None and len(ids) == 1 and not wants:
                result = StepResult(np.asarray([int(np.argmax(logits))], np.int32))
            elif wants:
                result, every = self.runner.run_all_logits(plan, sampling)
                tokens, positions = _prompt_tokens(plan, wants)
                self._record_prompt_logprobs(rows, positions, every[tokens])
            else:
                result = self.runner.run_sample(plan, sampling)
        except BaseException:
            self._end_step(ids)
            raise
        changed: list[Request] = []
        sampled = []
        for i, (r, sample) in enumerate(zip(rows, samples, strict=True)):
            if not sample:
                continue
            token = int(result.token_ids[i])
            if token < 0:  # non-finite logits: end the request, emit no token
                r.fail()
                self.abort(r.request_id)
                changed.append(r)
                continue
            if result.logprobs is not None and r.logprobs is not None:
                assert result.logprob_ids is not None
                self._record_logprobs(r, result.logprob_ids[i], result.logprobs[i])
            sampled.append((r.request_id, token))
        self._accept(self.driver.update(sampled), changed)
        return changed, logits

    def _end_step(self, request_ids: list[int]) -> None:
        """A failed step's requests cannot go on: ends them, then closes the step."""
        for rid in request_ids:
            self.abort(rid)
        self.settle()

    def _accept(
        self, events: Sequence[tuple[int, int, str | None]], changed: list[Request]
    ) -> None:
        """Each accepted token to its request's text; ends requests that finished."""
        for rid, token, finish in events:
            req = self._live[rid]
            req.pending.append(req.accept(token, finish))
            changed.append(req)
            if finish is not None:
                del self._live[rid]
            elif req.ended_by_host:
                self.abort(rid)

    # ---- plans ----------------------------------------------------------------------------

    def _plan_for(self, key: PlanKey, uses: list[tuple[PlanKey, int]]) -> tuple[Any, list[PlanKey]]:
        """The driver's plan miss: records its hits, then the plan of ``key`` through the
        runner's cache (a ``head`` key: a split step's sampling step on the host runtime,
        ``(vocab, seqs, 0, "head", adjust, masked, logprobs)``), and the keys the runner
        holds afterwards."""
        self._record_uses(uses)
        if key[3] == "head":
            vocab, seqs, _, _, adjust, masked, logprobs = key
            plan = self.runner.head_plan(seqs, vocab, adjust, masked, logprobs)
        else:
            plan = self.runner.plan(_shape(key))
        held = [_key(k) for k in self.runner.cached_plans]
        held += [(v, n, 0, "head", a, m, lp) for n, v, a, m, lp in self.runner.head_keys]
        return plan, held

    def _fill_mask(self, rows: list[tuple[int, int]], seqs: int) -> npt.NDArray[np.int32]:
        """A masked step's token mask (``rows``: ``(row, request_id)``), while it runs."""
        matchers = []
        for row, rid in rows:
            m = self._live[rid].matcher
            assert m is not None  # the driver asks only for guided rows
            matchers.append((row, m))
        return self.guide.fill_masks(matchers, seqs)

    def _record_uses(self, uses: list[tuple[PlanKey, int]]) -> None:
        for key, hits in uses:
            if key[3] != "head":  # the runner keeps its head plans outside the cache
                self.runner.plans.touch(_shape(key), hits)

    def _on_evict(self, shape: StepShape) -> None:
        self._evicted.append(_key(shape))

    def _record_logprobs(
        self, req: Request, row_ids: npt.NDArray[np.int32], row_lps: npt.NDArray[np.float32]
    ) -> None:
        n = req.params.logprobs or 0
        ids = [int(t) for t in row_ids]
        lps = [float(x) for x in row_lps]
        chosen, top = ids[0], ids[1:]
        entry: dict[int, Logprob] = {}
        for rank, (t, lp) in enumerate(zip(top[:n], lps[1 : n + 1], strict=True), start=1):
            if t >= 0:
                entry[t] = Logprob(lp, rank, self._token_text(t))
        rank_of = top.index(chosen) + 1 if chosen in top else None
        entry[chosen] = Logprob(lps[0], rank_of, self._token_text(chosen))
        req.add_logprobs(entry, lps[0])

    def _prompt_entry(
        self, logits: npt.NDArray[np.float32], token: int, n: int
    ) -> dict[int, Logprob]:
        lps = log_softmax(logits)
        chosen = float(lps[token])
        entry: dict[int, Logprob] = {}
        if n > 0:
            top = np.argpartition(-lps, n - 1)[:n]
            top = top[np.lexsort((top, -lps[top]))]  # by logprob, ties by id
            for rank, t in enumerate(top.tolist(), start=1):
                entry[t] = Logprob(float(lps[t]), rank, self._token_text(t))
        rank_of = int(np.count_nonzero(lps > lps[token])) + 1
        entry[token] = Logprob(chosen, rank_of, self._token_text(token))
        return entry

    def _record_prompt_logprobs(
        self,
        rows: list[Request],
        positions: Sequence[tuple[int, int]],
        logits: npt.NDArray[np.float32],
    ) -> None:
        """Prompt entries from the logits of prefill tokens (``positions``: each one's
        ``(row, position)``; token j's logits give the logprob of the token after it); an
        entry already there (a recompute after preemption) is kept."""
        for (row, pos), row_logits in zip(positions, logits, strict=True):
            req = rows[row]
            assert req.prompt_logprobs is not None
            p = pos + 1
            if p < len(req.prompt_ids) and req.prompt_logprobs[p] is None:
                n = req.params.prompt_logprobs or 0
                req.prompt_logprobs[p] = self._prompt_entry(row_logits, req.prompt_ids[p], n)

    def _token_text(self, token: int) -> str:
        piece = self.tokenizer.token_piece(token)
        if piece is not None:
            return piece.decode("utf-8", errors="replace")
        return self.tokenizer.decode([token], skip_special_tokens=False)

    # ---- counters -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """The scheduler's counters, the token counters and the KV block counts (and the
        driver's plan hits, given to the runner's plan cache).

        Another thread (the server's ``/metrics``) may ask while a step holds the driver and
        the scheduler (their native objects are borrowed for the step's one call): it then
        gets the counts as of the last call that could read them, never an error.
        """
        try:
            self._record_uses(self.driver.take_plan_uses())
            s = dict(self.scheduler.stats())
            s["prefill_computed_tokens"] = self.driver.prefill_tokens
            s["prefill_cached_tokens"] = s["cached_tokens"]
            s["decode_tokens"] = self.driver.decode_tokens
            s["used_blocks"] = self.scheduler.used_blocks
            s["num_blocks"] = self.scheduler.num_blocks
        except RuntimeError as e:  # pyo3's borrow errors: a step is in flight elsewhere
            if "borrowed" not in str(e) or self._last_stats is None:
                raise
            return dict(self._last_stats)
        self._last_stats = s
        return dict(s)


def _host_of(runner: StepRunner) -> Any:
    """The host runtime a split step samples on; None where the runtime samples itself."""
    return None if runner.samples_on_device else runner.host


def _shape(key: PlanKey) -> StepShape:
    tokens, seqs, max_blocks, kind, adjust, masked, logprobs = key
    return StepShape(tokens, seqs, max_blocks, cast(StepKind, kind), adjust, masked, logprobs)


def _key(shape: StepShape) -> PlanKey:
    s = shape
    return (s.tokens, s.seqs, s.max_blocks, s.kind, s.adjust, s.masked, s.logprobs)


def _prompt_tokens(
    plan: SchedulerOutput, wants: list[int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """The step's tokens in the rows ``wants`` (indices in step order) and their
    ``(row, position)``."""
    positions, seq = plan.inputs["positions"], plan.inputs["token_seq"]
    want = set(wants)
    tokens = [j for j in range(plan.num_tokens) if int(seq[j]) in want]
    return tokens, [(int(seq[j]), int(positions[j])) for j in tokens]
