"""``CompiledModule``: a ``torch.nn.Module`` specialized to its example inputs on a poot
runtime (the CPU's by default; ``runtime=`` takes another, e.g. a ``WgpuRuntime``), and its
portable artifact (``save`` / ``load``).

Invariants: a compiled module accepts exactly the example inputs' shapes and dtypes (anything
else is ``UnsupportedFeatureError`` saying what differed); its graph is traced under the
``TraceLimits`` and prepared under the ``CompileLimits`` it was given, once; parameters are
read in place through ``Weights.from_arrays`` (no copy; the module must not change them
afterwards), except that a module compiled for training reads its float32 parameters as
graph inputs fed at each run from the arrays a training step updates in place. An artifact
is one ``.npz`` file holding the program, the input specs, the limits, every weight (a copy;
BF16 as 16-bit words) and a trainable module's training state (``train_state.py``), with no
device choice in it: ``load`` prepares it for the runtime of the machine that loads it. A
file that is not such an artifact is ``ArtifactFormatError``. ``forward_with_cancel_token``
checks a ``CancelToken`` before and after the run (``cancel.py``); ``__call__`` takes no token
and is never cancelled. An input may be a ``PootTensor``: a host one is read in place; a
device one made by this module's runtime is bound as it lies (no readback, no upload), and
one on any other device is ``DeviceMismatchError`` (``tensor.device_input``).
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any

import numpy as np

from poot import _native
from poot.errors import ArtifactFormatError
from poot.torch_frontend.cancel import Admission, CancelToken
from poot.torch_frontend.lower import Lowered, lower, numpy_input, weights_arrays
from poot.torch_frontend.program import Program, replay
from poot.torch_frontend.tensor import PootTensor, device_input, run_to_tensors

# Any runtime with `prepare(graph, weights, limits)` and `run(plan, inputs)`: the CPU runtime
# (the default) takes every op; another (wgpu) refuses an op it lacks when it prepares.
Runtime = Any

FORMAT = "poot.torch_module"
VERSION = 1
_LIMIT_FIELDS = {
    "trace": ("max_tokens", "max_values", "max_equations", "max_literal_bytes", "max_records"),
    "compile": (
        "max_equations",
        "max_kernel_instructions",
        "max_kernel_locals",
        "max_artifact_bytes",
    ),
}


class CompiledModule:
    """A module compiled for one set of input shapes; call it like the module."""

    def __init__(
        self,
        program: Program,
        arrays: dict[str, np.ndarray[Any, Any]],
        dtypes: dict[str, str],
        inputs: list[tuple[str, str, tuple[int, ...]]],
        output_structure: Any,
        trace_limits: _native.TraceLimits,
        compile_limits: _native.CompileLimits,
        runtime: Runtime | None = None,
        config: Any = None,
        trainable: list[str] | None = None,
    ) -> None:
        self.program = program
        self._arrays = arrays
        self._dtypes = dtypes
        self.inputs = inputs
        self._structure = output_structure
        self.trace_limits = trace_limits
        self.compile_limits = compile_limits
        self.weights = _native.Weights.from_arrays(arrays, dtypes=dtypes)
        self.runtime = runtime or _native.CpuRuntime()
        self.runtime_given = runtime is not None
        # Training (train.py): the CompileConfig, the parameters a step updates, its state.
        self.config = config
        self.trainable = list(trainable or [])
        self.trainer: Any = None
        # A module that may train reads its float32 parameters as graph inputs fed from the
        # arrays a step updates in place, so no step makes its forward plan stale.
        self.param_inputs: dict[str, np.ndarray[Any, Any]] = {}
        plan_weights = self.weights
        if self._fed_parameters():
            from poot.torch_frontend.train_graph import forward_graph, param_input

            self.graph, plan_weights = forward_graph(self)
            self.param_inputs = {param_input(n): arrays[n] for n in self.trainable}
        else:
            self.graph = replay(program, self.weights, trace_limits)
        self.plan = self.runtime.prepare(self.graph, plan_weights, compile_limits)
        # Forward plans prepared over this module's life (one: steps never re-prepare).
        self.prepare_count = 1

    def _fed_parameters(self) -> bool:
        if not (self.trainable and getattr(self.config, "allow_training", False)):
            return False
        return all(
            self._arrays[n].dtype == np.float32 and n not in self._dtypes for n in self.trainable
        )

    @property
    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """The weights by name as the store reads them (parameters in place)."""
        return self._arrays

    @property
    def dtypes(self) -> dict[str, str]:
        return self._dtypes

    def train_step(
        self,
        inputs: Any,
        targets: Any,
        loss_fn: Any = "mse",
        *,
        optimizer: Any,
        config: Any = None,
    ) -> float:
        """One training update (forward, loss, gradients, ``optimizer`` step; with
        ``config``, a ``TrainConfig``: clipping, accumulation over micro-batches, a
        learning-rate schedule) as graphs on the runtime; returns the loss. Needs
        ``CompileConfig(allow_training=True)``; see ``poot.torch_frontend.train``."""
        from poot.torch_frontend.train import Trainer

        if self.trainer is None:
            self.trainer = Trainer(self)
        return self.trainer.step(inputs, targets, loss_fn, optimizer, config)

    def __call__(self, *args: Any) -> Any:
        return self._forward(args, None)

    def forward_with_cancel_token(self, token: CancelToken, *args: Any) -> Any:
        """Runs like ``__call__``, but raises ``Cancelled`` if ``token.cancel()`` is called
        after this forward started and before it returns (see ``cancel.py`` for the
        generation rules and the granularity)."""
        if not isinstance(token, CancelToken):
            from poot.errors import ConfigError

            raise ConfigError(
                f"forward_with_cancel_token takes a poot.CancelToken first, "
                f"got {type(token).__name__}"
            )
        return self._forward(args, token.admit())

    def _forward(self, args: tuple[Any, ...], admission: Admission | None) -> Any:
        if len(args) != len(self.inputs):
            from poot.errors import UnsupportedFeatureError

            raise UnsupportedFeatureError(
                f"{len(args)} inputs given, the module was compiled for {len(self.inputs)}"
            )
        feed = {
            name: self._input(name, a, dtype, shape)
            for a, (name, dtype, shape) in zip(args, self.inputs, strict=True)
        }
        if admission is not None:
            admission.check("before its run started")
        feed.update(self.param_inputs)
        flat = run_to_tensors(self.runtime, self.plan, feed, self.program.outputs)
        if admission is not None:
            # The run cannot be interrupted; a cancel during it drops its outputs here.
            admission.check("during its run")

        def build(s: Any) -> Any:
            return flat[s] if isinstance(s, int) else tuple(build(x) for x in s)

        return build(self._structure)

    def _input(self, name: str, a: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        if isinstance(a, PootTensor):
            if a.device != "cpu":
                return device_input(a, self.runtime, name, dtype, shape)
            a = a.cpu()  # the same memory
        return numpy_input(name, a, dtype, shape)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the portable artifact (see the module docs)."""
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "program": self.program.to_json(),
            "inputs": [[n, d, list(s)] for n, d, s in self.inputs],
            "outputs": self._structure,
            "dtypes": self._dtypes,
            "weights": list(self._arrays),
            "limits": {
                "trace": {f: getattr(self.trace_limits, f) for f in _LIMIT_FIELDS["trace"]},
                "compile": {f: getattr(self.compile_limits, f) for f in _LIMIT_FIELDS["compile"]},
            },
        }
        from poot.torch_frontend import train_state

        training, state_blobs = train_state.section(self)
        if training is not None:
            meta["training"] = training
        # Any: numpy's stub types **kwds against its `allow_pickle` keyword.
        blobs: dict[str, Any] = {f"w{i}": a for i, a in enumerate(self._arrays.values())}
        blobs.update(state_blobs)
        with open(path, "wb") as f:
            np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **blobs)


def compile_module(
    module: Any,
    example_inputs: Any,
    *,
    trace_limits: _native.TraceLimits | None = None,
    compile_limits: _native.CompileLimits | None = None,
    runtime: Runtime | None = None,
    config: Any = None,
) -> CompiledModule:
    """Exports ``module`` for ``example_inputs`` and compiles it (see the module docs) for
    ``runtime`` (default: a new ``CpuRuntime``). With ``config.allow_training`` the module is
    lowered for training (``train.py``): nodes reading trainable parameters are not folded."""
    import torch

    inputs = (
        tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    )
    with torch.no_grad():
        exported = torch.export.export(module, inputs)
        lowered: Lowered = lower(exported, training=bool(getattr(config, "allow_training", 0)))
    arrays, dtypes = weights_arrays(lowered.weights)
    return CompiledModule(
        lowered.program,
        arrays,
        dtypes,
        lowered.inputs,
        lowered.output_structure,
        trace_limits or _native.TraceLimits(),
        compile_limits or _native.CompileLimits(),
        runtime,
        config,
        lowered.trainable,
    )


def load(
    path: str | os.PathLike[str], *, runtime: Runtime | None = None, config: Any = None
) -> CompiledModule:
    """Reads an artifact written by ``CompiledModule.save`` and prepares it on this host, for
    ``runtime`` (default: a new ``CpuRuntime``; an op it lacks is ``UnsupportedOpError``).
    An artifact saved with training state loads trainable, resuming where it stopped
    (``config`` default: ``CompileConfig(allow_training=True)`` for it)."""
    from poot.torch_frontend import train_state

    training = None
    try:
        # Our own handle: np.load leaks the one it opens when the zip is corrupt.
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            meta = json.loads(bytes(z["__meta__"]).decode())
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ArtifactFormatError(f"{os.fspath(path)!r} is not a poot module artifact")
            if meta.get("version") != VERSION:
                raise ArtifactFormatError(
                    f"{os.fspath(path)!r} is artifact version {meta.get('version')}, "
                    f"this poot reads {VERSION}"
                )
            arrays = {name: z[f"w{i}"] for i, name in enumerate(meta["weights"])}
            if "training" in meta:
                training = train_state.read(meta["training"], z, arrays, repr(os.fspath(path)))
        program = Program.from_json(meta["program"])
        inputs = [(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in meta["inputs"]]
        trace = _native.TraceLimits(**meta["limits"]["trace"])
        comp = _native.CompileLimits(**meta["limits"]["compile"])
        structure = meta["outputs"]
        dtypes = {str(k): str(v) for k, v in meta["dtypes"].items()}
    except ArtifactFormatError:
        raise
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, UnicodeError) as e:
        raise ArtifactFormatError(
            f"{os.fspath(path)!r} is not a readable poot module artifact: {e}"
        ) from e
    trainable = training.trainable if training is not None else None
    if training is not None and config is None:
        from poot.planner.compiled import CompileConfig

        config = CompileConfig(allow_training=True)
    try:
        compiled = CompiledModule(
            program, arrays, dtypes, inputs, structure, trace, comp, runtime, config, trainable
        )
        if training is not None:
            train_state.restore(compiled, training)
        return compiled
    except (ValueError, TypeError) as e:
        from poot.errors import PootError, TraceError

        if isinstance(e, PootError) and not isinstance(e, TraceError):
            raise
        if isinstance(e, TraceError):
            raise ArtifactFormatError(
                f"{os.fspath(path)!r}: its program does not trace: {e}"
            ) from e
        raise ArtifactFormatError(f"{os.fspath(path)!r}: {e}") from e
