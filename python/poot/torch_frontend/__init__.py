"""Compiling ``torch.nn.Module``s through ``torch.export`` into poot's graph IR.

``poot.compile(module, example_inputs)`` lands here (``compile_module``): export, lowering of
the aten graph to tracer calls (``lower.py``, ``ops.py``), tracing under ``TraceLimits`` and
preparing under ``CompileLimits`` on the CPU runtime or the one given as ``runtime=``
(``module.py``); ``CancelToken`` cancels a forward (``cancel.py``); ``train_step`` trains a
module compiled with ``CompileConfig(allow_training=True)`` (``train.py``: gradients by
reverse mode over the IR in ``grad.py`` and ``vjp.py``, the step graphs in
``train_graph.py``, ``SGD`` and ``AdamW`` in ``optim.py``, ``TrainConfig`` and the
learning-rate schedules in ``schedule.py``, saved state in ``train_state.py``). Several
modules: ``ModuleGraph`` and ``compile_modules`` (``graph.py``), placed by the planner
(``placement.py``) and run by ``compiled_graph.py`` (``node_runs.py``: a thread per device,
so branches on different devices run at once). torch is imported only
when a module is compiled; the rest of poot never needs it. docs/compiling-modules.md has the
op table.
"""

from poot.torch_frontend.cancel import CancelToken
from poot.torch_frontend.graph import ModuleGraph, compile_modules
from poot.torch_frontend.module import CompiledModule, compile_module, load
from poot.torch_frontend.optim import SGD, AdamW
from poot.torch_frontend.schedule import CosineDecay, LinearWarmup, StepDecay, TrainConfig
from poot.torch_frontend.tensor import PootTensor

__all__ = [
    "SGD",
    "AdamW",
    "CancelToken",
    "CompiledModule",
    "CosineDecay",
    "LinearWarmup",
    "ModuleGraph",
    "PootTensor",
    "StepDecay",
    "TrainConfig",
    "compile_module",
    "compile_modules",
    "load",
]
