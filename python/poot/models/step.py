"""The contract between a model definition and the engine that runs its step graphs.

A step runs ``tokens`` tokens that belong to ``seqs`` sequences, each sequence's KV blocks
listed in a row of ``block_tables`` (``max_blocks`` wide). Every step graph declares the same
runtime inputs (``StepInputs``), so the engine fills them without knowing the model:

=================  =====  ==================  ===============================================
input              dtype  shape               meaning
=================  =====  ==================  ===============================================
``ids``            i32    [tokens]            token ids
``positions``      i32    [tokens]            each token's position in its sequence
``slot_mapping``   i32    [tokens]            flat KV slot each token's k/v is written to; -1
                                              skips (padding)
``token_seq``      i32    [tokens]            the row of ``block_tables`` the token belongs to
``block_tables``   i32    [seqs, max_blocks]  each sequence's KV blocks in order
``last_rows``      i32    [seqs]              the step row whose logits each sequence samples
=================  =====  ==================  ===============================================

A model whose windowed layers are interleaved with global ones (Gemma 2 and 3) runs its KV in
two groups when the engine asks for it (``declare_inputs(..., windowed=True)``): the global
layers' blocks are the tables above, and the windowed layers have their own pool (the
runtime's last ``windowed_layers`` KV layers, ``windowed_blocks`` blocks each) and their own
step inputs, released behind the window by the scheduler (the null block there):

=========================  =====  ==================  =======================================
input                      dtype  shape               meaning
=========================  =====  ==================  =======================================
``window_slot_mapping``    i32    [tokens]            the windowed group's slot of each token
``window_block_tables``    i32    [seqs, max_blocks]  the windowed group's blocks, position
                                                      for position as ``block_tables``
=========================  =====  ==================  =======================================

A model definition computes ``logits`` [seqs, vocab] from these and hands them to
``trace_head``, which appends the sampling step (``sample`` graphs) or names them as the output
(``logits`` graphs, only for callers that ask for full logits). An ``all_logits`` graph keeps
every token's row to the end (no gather after the last layer), outputs those logits
[tokens, vocab] as ``all_logits`` and samples the gathered last rows (prompt logprobs). The
sampling step declares its own per-row inputs, all [seqs] unless noted:

======================  =====  ========================================================
input                   dtype  meaning
======================  =====  ========================================================
``temperature``         f32    0 = greedy
``top_k``               i32    0 = no cut
``top_p``, ``min_p``    f32    1 and 0 = no cut
``uniform``             f32    the request's seeded draw in [0, 1)
``adj_ids``             i32    [seqs, adjust] ids with a penalty or bias; -1 pads
``adj_counts``          i32    [seqs, adjust] times generated (0: prompt only; -1: bias only)
``adj_bias``            f32    [seqs, adjust] logit bias
``repetition``, ...     f32    repetition, presence, frequency penalties
``token_mask``          i32    [seqs, ceil(vocab/32)] allowed-token bits (guided decoding);
                               declared after the forward pass so the host may supply it
                               late, while the forward runs
======================  =====  ========================================================

The adjust inputs exist only when ``StepShape.adjust`` > 0 and the mask only when
``StepShape.masked``. Outputs: ``token_ids`` (i32 [seqs]; -1 where the row's logits are not
finite or nothing is allowed); with ``StepShape.logprobs`` = K > 0 also ``logprob_ids`` (i32
[seqs, 1 + K]: the chosen id, then the K most likely) and ``logprobs`` (f32, their
log-softmax over the raw logits). Nothing else crosses back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from poot._native import Tracer, Value

__all__ = ["MASK_INPUT", "StepInputs", "StepKind", "StepShape", "declare_inputs", "trace_head"]

MASK_INPUT = "token_mask"

StepKind = Literal["sample", "logits", "all_logits"]


@dataclass(frozen=True)
class StepShape:
    """The static shape of one step graph (one traced and compiled plan per shape).

    Attributes:
        tokens: tokens in the step.
        seqs: sequences (rows of ``block_tables``, one sampled token each).
        max_blocks: columns of ``block_tables``.
        kind: ``"sample"`` (outputs token ids), ``"logits"`` (outputs full logits) or
            ``"all_logits"`` (a sample step that also outputs every token's logits).
        adjust: width of the per-row penalty/bias id lists; 0 = no adjust op.
        masked: whether the step takes a token mask (guided decoding).
        logprobs: top alternatives returned per row; 0 = no logprobs outputs.
    """

    tokens: int
    seqs: int
    max_blocks: int
    kind: StepKind = "sample"
    adjust: int = 0
    masked: bool = False
    logprobs: int = 0


@dataclass(frozen=True)
class StepInputs:
    """The declared inputs of one step graph (see the module docs)."""

    ids: Value
    positions: Value
    slot_mapping: Value
    token_seq: Value
    block_tables: Value
    last_rows: Value
    window_slot_mapping: Value | None = None
    window_block_tables: Value | None = None


def declare_inputs(t: Tracer, shape: StepShape, windowed: bool = False) -> StepInputs:
    """Declares a step's runtime inputs on ``t``; ``windowed`` adds the windowed KV group's."""
    n, s = shape.tokens, shape.seqs
    ins = StepInputs(
        ids=t.input("ids", "i32", [n]),
        positions=t.input("positions", "i32", [n]),
        slot_mapping=t.input("slot_mapping", "i32", [n]),
        token_seq=t.input("token_seq", "i32", [n]),
        block_tables=t.input("block_tables", "i32", [s, shape.max_blocks]),
        last_rows=t.input("last_rows", "i32", [s]),
    )
    if not windowed:
        return ins
    return replace(
        ins,
        window_slot_mapping=t.input("window_slot_mapping", "i32", [n]),
        window_block_tables=t.input("window_block_tables", "i32", [s, shape.max_blocks]),
    )


def trace_head(t: Tracer, logits: Value, shape: StepShape, last_rows: Value | None = None) -> None:
    """Ends a step graph after ``logits`` [seqs, vocab]: the sampling step or the logits.

    An ``all_logits`` step passes every token's logits [tokens, vocab] and ``last_rows``:
    they are output as ``all_logits`` (prompt logprobs), then each sequence's last row is
    sampled as in a ``sample`` step (the kernels' results do not depend on the row count, so
    the gathered rows equal a ``sample`` step's logits bit for bit).
    """
    if shape.kind == "logits":
        t.output("logits", logits)
        return
    if shape.kind == "all_logits":
        if last_rows is None:
            raise ValueError("an all_logits step needs last_rows")
        t.output("all_logits", logits)
        logits = t.gather_rows(logits, last_rows)
    s, vocab = logits.shape
    raw = logits
    if shape.adjust > 0:
        w = [s, shape.adjust]
        logits = t.adjust_logits(
            logits,
            ids=t.input("adj_ids", "i32", w),
            counts=t.input("adj_counts", "i32", w),
            bias=t.input("adj_bias", "f32", w),
            repetition=t.input("repetition", "f32", [s]),
            presence=t.input("presence", "f32", [s]),
            frequency=t.input("frequency", "f32", [s]),
        )
    if shape.masked:
        # Declared last so a runtime reaches it only after the forward pass (a late input).
        mask = t.input(MASK_INPUT, "i32", [s, (vocab + 31) // 32])
        logits = t.mask_logits(logits, mask)
    token_ids = t.sample(
        logits,
        temperature=t.input("temperature", "f32", [s]),
        top_k=t.input("top_k", "i32", [s]),
        top_p=t.input("top_p", "f32", [s]),
        min_p=t.input("min_p", "f32", [s]),
        uniform=t.input("uniform", "f32", [s]),
    )
    t.output("token_ids", token_ids)
    if shape.logprobs > 0:
        ids = t.concat([t.reshape(token_ids, [s, 1]), t.top_k_ids(raw, shape.logprobs)], axis=1)
        t.output("logprob_ids", ids)
        t.output("logprobs", t.logprobs(raw, ids))
