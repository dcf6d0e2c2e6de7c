"""poot: an LLM inference engine with a Rust core.

The public API lives here; ``poot._native`` is an implementation detail. Heavier parts of the
API (the tokenizer, with ``tokenizers`` and ``jinja2``) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from poot._native import __version__
from poot.build import warn_if_debug

warn_if_debug()  # a debug native module is 10-50x slower: say so once, with the fix

if TYPE_CHECKING:
    from poot.async_engine import AsyncEngine, StreamOutput
    from poot.checkpoints import ModelFiles
    from poot.checkpoints import resolve_model_files as load_model_files
    from poot.driver_options import DriverOptions
    from poot.llm import LLM
    from poot.outputs import CompletionOutput, RequestOutput
    from poot.planner import CompileConfig, CompiledModel, compile
    from poot.sampling import SamplingParams
    from poot.tokenizer import Tokenizer, load_tokenizer
    from poot.torch_frontend import (
        CancelToken,
        CompiledModule,
        ModuleGraph,
        PootTensor,
        compile_modules,
        load,
    )

__all__ = [
    "LLM",
    "AsyncEngine",
    "ModuleGraph",
    "CancelToken",
    "CompileConfig",
    "CompiledModel",
    "CompiledModule",
    "CompletionOutput",
    "DriverOptions",
    "ModelFiles",
    "PootTensor",
    "RequestOutput",
    "SamplingParams",
    "StreamOutput",
    "Tokenizer",
    "__version__",
    "compile",
    "compile_modules",
    "load",
    "load_model_files",
    "load_tokenizer",
]

# name -> (module, attribute)
_LAZY = {
    "LLM": ("poot.llm", "LLM"),
    "AsyncEngine": ("poot.async_engine", "AsyncEngine"),
    "StreamOutput": ("poot.async_engine", "StreamOutput"),
    "SamplingParams": ("poot.sampling", "SamplingParams"),
    "DriverOptions": ("poot.driver_options", "DriverOptions"),
    "RequestOutput": ("poot.outputs", "RequestOutput"),
    "CompletionOutput": ("poot.outputs", "CompletionOutput"),
    "ModelFiles": ("poot.checkpoints", "ModelFiles"),
    "load_model_files": ("poot.checkpoints", "resolve_model_files"),
    "Tokenizer": ("poot.tokenizer", "Tokenizer"),
    "load_tokenizer": ("poot.tokenizer", "load_tokenizer"),
    "load": ("poot.torch_frontend", "load"),
    "PootTensor": ("poot.torch_frontend", "PootTensor"),
    "CompiledModule": ("poot.torch_frontend", "CompiledModule"),
    "CancelToken": ("poot.torch_frontend", "CancelToken"),
    "ModuleGraph": ("poot.torch_frontend", "ModuleGraph"),
    "compile_modules": ("poot.torch_frontend", "compile_modules"),
    "compile": ("poot.planner", "compile"),
    "CompileConfig": ("poot.planner", "CompileConfig"),
    "CompiledModel": ("poot.planner", "CompiledModel"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'poot' has no attribute {name!r}")
    import importlib

    module, attribute = target
    return getattr(importlib.import_module(module), attribute)
