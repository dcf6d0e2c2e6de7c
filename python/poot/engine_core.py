"""``EngineCore``: the one owner of requests and of the step.

The core holds the Rust scheduler (``poot._native.Scheduler``: queues, KV blocks, chunked
prefill, preemption), the step runner (plans by step shape, the runtime) and the live requests.
Its clients (``poot.LLM`` for offline generation, ``poot.AsyncEngine`` for the server) only
call its public methods, in the shape of vLLM's ``EngineCore``:

- ``add_request(req)``: queue a request made by ``LLM.make_request`` (validated at admission);
- ``abort(request_id)``: end a live request and free its blocks;
- ``step() -> requests``: plan, run and apply one step; each request's accepted text goes to
  its ``pending`` queue and the requests that changed are returned;
- ``has_unfinished()``: whether any request is live.

Invariants:
    - A request is live from ``add_request`` until it finishes, fails or is aborted; live
      requests are exactly the scheduler's unfinished ones once ``settle`` has run.
    - A failed step ends every request it ran (their blocks are freed), closes the step, and
      re-raises; other requests stay queued and the core stays usable.
    - Every block returns to the pool however a request ends: ``abort`` frees a live request's
      blocks at once, and a step left in flight by an error is closed by ``settle``.
    - The core is not thread-safe: one caller steps it at a time (``AsyncEngine`` adds and
      aborts only between steps).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from poot import _native
from poot.guidance import Guide
from poot.outputs import Logprob
from poot.request import Request, sampling_rows
from poot.runner import SchedulerOutput, StepResult, StepRunner
from poot.tokenizer import Tokenizer

__all__ = ["EngineCore"]


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
        self.prefill_tokens = 0
        self.decode_tokens = 0

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
        self.scheduler.add_request(
            rid,
            req.prompt_ids,
            p.max_tokens,
            eos_ids=self._eos_sorted,
            stop_ids=sorted(p.stop_ids),
            ignore_eos=p.ignore_eos,
        )
        self._next_id += 1
        req.request_id = rid
        self._live[rid] = req

    def abort(self, request_id: int) -> bool:
        """Ends a live request and frees its blocks; False when it was not live."""
        if self._live.pop(request_id, None) is None:
            return False
        self.scheduler.abort(request_id)
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
        # One crossing plans the step and lays out its inputs; one runs it; one applies it.
        plan = SchedulerOutput(**self.scheduler.schedule())
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
                self.prefill_tokens += n
                r.in_prefill = not sample
            else:
                self.decode_tokens += n
        logits: npt.NDArray[np.float32] | None = None
        try:
            sampling = sampling_rows(rows, samples, self.guide)
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
                self.abort(r.request_id)
            self.settle()
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
                self._record_logprobs(r, result, i)
            sampled.append((r.request_id, token))
        for rid, token, finish in self.scheduler.update(sampled):
            req = self._live[rid]
            req.pending.append(req.accept(token, finish))
            changed.append(req)
            if finish is not None:
                del self._live[rid]
            elif req.ended_by_host:
                self.abort(rid)
        return changed, logits

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

    # ---- counters -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """The scheduler's counters, the token counters and the KV block counts."""
        s = dict(self.scheduler.stats())
        s["prefill_computed_tokens"] = self.prefill_tokens
        s["prefill_cached_tokens"] = s["cached_tokens"]
        s["decode_tokens"] = self.decode_tokens
        s["used_blocks"] = self.scheduler.used_blocks
        s["num_blocks"] = self.scheduler.num_blocks
        return s
