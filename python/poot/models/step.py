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
``temperature``    f32    [seqs]              0 = greedy (``sample`` graphs only)
``top_k``          i32    [seqs]              0 = no cut (``sample`` graphs only)
``top_p``          f32    [seqs]              1 = no cut (``sample`` graphs only)
``uniform``        f32    [seqs]              the host's seeded draw in [0, 1) (``sample``)
=================  =====  ==================  ===============================================

A ``sample`` graph's only output is ``token_ids`` (i32 [seqs]): the host reads back token ids,
never logits. A ``logits`` graph outputs ``logits`` (f32 [seqs, vocab]) and exists only for
callers that ask for full logits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from poot._native import Tracer, Value

__all__ = ["StepInputs", "StepKind", "StepShape", "declare_inputs"]

StepKind = Literal["sample", "logits"]


@dataclass(frozen=True)
class StepShape:
    """The static shape of one step graph (one traced and compiled plan per shape).

    Attributes:
        tokens: tokens in the step.
        seqs: sequences (rows of ``block_tables``, one sampled token each).
        max_blocks: columns of ``block_tables``.
        kind: ``"sample"`` (outputs token ids) or ``"logits"`` (outputs full logits).
    """

    tokens: int
    seqs: int
    max_blocks: int
    kind: StepKind = "sample"


@dataclass(frozen=True)
class StepInputs:
    """The declared inputs of one step graph (see the module docs)."""

    ids: Value
    positions: Value
    slot_mapping: Value
    token_seq: Value
    block_tables: Value
    last_rows: Value
    temperature: Value | None = None
    top_k: Value | None = None
    top_p: Value | None = None
    uniform: Value | None = None


def declare_inputs(t: Tracer, shape: StepShape) -> StepInputs:
    """Declares a step's runtime inputs on ``t``."""
    n, s = shape.tokens, shape.seqs
    ins = StepInputs(
        ids=t.input("ids", "i32", [n]),
        positions=t.input("positions", "i32", [n]),
        slot_mapping=t.input("slot_mapping", "i32", [n]),
        token_seq=t.input("token_seq", "i32", [n]),
        block_tables=t.input("block_tables", "i32", [s, shape.max_blocks]),
        last_rows=t.input("last_rows", "i32", [s]),
    )
    if shape.kind == "sample":
        ins = replace(
            ins,
            temperature=t.input("temperature", "f32", [s]),
            top_k=t.input("top_k", "i32", [s]),
            top_p=t.input("top_p", "f32", [s]),
            uniform=t.input("uniform", "f32", [s]),
        )
    return ins
