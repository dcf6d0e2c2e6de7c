"""Model definitions: ordinary Python that traces one step of a model into the Rust graph.

``model_definition(files)`` picks the definition for a resolved checkpoint; a definition's
``trace(tracer, shape)`` records one step (see ``poot.models.step`` for the inputs every step
graph declares). Definitions know the tracer, never a runtime.
"""

from poot.models.llama import LlamaModel
from poot.models.registry import architecture_of, model_definition
from poot.models.step import StepInputs, StepKind, StepShape, declare_inputs, trace_head

__all__ = [
    "LlamaModel",
    "StepInputs",
    "StepKind",
    "StepShape",
    "architecture_of",
    "declare_inputs",
    "trace_head",
    "model_definition",
]
