"""The errors of training a compiled module (``CompiledModule.train_step``); re-exported by
``poot.errors``, where the native module looks errors up by name."""

from __future__ import annotations

from poot.errors import ConfigError, UnsupportedFeatureError, UnsupportedOpError


class TrainingNotAllowedError(ConfigError):
    """``train_step`` on a module compiled without ``CompileConfig(allow_training=True)``."""

    hint = "Compile the module with config=poot.CompileConfig(allow_training=True)."


class TrainingUnsupportedError(UnsupportedFeatureError):
    """Training was asked of a plan that cannot train: weights streamed, a placement over
    several nodes, a runtime in another process (a worker), or parameters that are not
    float32."""

    hint = (
        "Train on one in-process runtime (CpuRuntime or WgpuRuntime) with float32 parameters "
        "held resident."
    )


class NoGradientError(UnsupportedOpError):
    """An op on the path from the parameters to the loss has no vector-Jacobian product.

    Attributes:
        op: the graph op (``reduce_max``, ``rope``).
    """

    hint = "docs/compiling-modules.md lists the ops training differentiates."

    def __init__(self, message: str, *, op: str = "") -> None:
        super().__init__(message, backend="grad", op=op)
