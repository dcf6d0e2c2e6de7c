"""A trainable module's training state in its artifact: which parameters train, and for each
optimizer that has updated them its hyperparameters, its update count and its state arrays
(SGD's momentum buffers, AdamW's moments), so a loaded module resumes training where the
saved one stopped, bit for bit (the parameters themselves are the artifact's weights).

Layout: the artifact's JSON meta holds ``"training": {"trainable": [names], "optimizers":
[{"optimizer": {...}, "step": n, "state": [[state name, blob key], ...]}]}`` and each state
array is one float32 blob ``t<i>_<j>`` beside the weights.

Invariants: ``read`` checks everything (names, optimizer fields, counts, blob presence, dtype
and shape against the parameter) before a module is built, and any mismatch is
``ArtifactFormatError``; state is copied out of the file, never aliased.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from poot.errors import ArtifactFormatError, ConfigError
from poot.torch_frontend.optim import Optimizer, from_json, to_json


@dataclass
class TrainingState:
    """What ``read`` found: the trainable names and, per optimizer, (count, state arrays)."""

    trainable: list[str]
    optimizers: list[tuple[Optimizer, int, dict[str, np.ndarray[Any, Any]]]]


def section(compiled: Any) -> tuple[dict[str, Any] | None, dict[str, np.ndarray[Any, Any]]]:
    """The meta entry and the blobs of ``compiled``'s training state (None, {} when the
    module has no trainable parameters)."""
    if not compiled.trainable:
        return None, {}
    trainer = compiled.trainer
    entries: list[dict[str, Any]] = []
    blobs: dict[str, np.ndarray[Any, Any]] = {}
    if trainer is not None:
        for i, (opt, step) in enumerate(trainer.steps.items()):
            refs = []
            for j, (name, arr) in enumerate(sorted(trainer.state.get(opt, {}).items())):
                key = f"t{i}_{j}"
                blobs[key] = arr
                refs.append([name, key])
            entries.append({"optimizer": to_json(opt), "step": step, "state": refs})
    return {"trainable": list(compiled.trainable), "optimizers": entries}, blobs


def read(
    data: Any, blobs: Any, arrays: dict[str, np.ndarray[Any, Any]], where: str
) -> TrainingState:
    """The state ``section`` wrote, checked against the artifact's weights ``arrays``;
    ``blobs`` is the open archive. ``ArtifactFormatError`` (naming ``where``) otherwise."""
    try:
        return _read(data, blobs, arrays)
    except (ValueError, TypeError, KeyError, ConfigError) as e:
        raise ArtifactFormatError(f"{where}: its training state is unusable: {e}") from e


def _read(data: Any, blobs: Any, arrays: dict[str, np.ndarray[Any, Any]]) -> TrainingState:
    if not isinstance(data, dict) or set(data) != {"trainable", "optimizers"}:
        raise ValueError(f"expected trainable and optimizers, got {data!r:.200}")
    trainable = data["trainable"]
    if not isinstance(trainable, list) or not all(isinstance(n, str) for n in trainable):
        raise ValueError("trainable must be a list of names")
    for n in trainable:
        if n not in arrays or arrays[n].dtype != np.float32:
            raise ValueError(f"trainable {n!r} is not a float32 weight of the artifact")
    optimizers = []
    seen: set[Optimizer] = set()
    for entry in data["optimizers"]:
        if not isinstance(entry, dict) or set(entry) != {"optimizer", "step", "state"}:
            raise ValueError(f"an optimizer entry needs optimizer, step, state: {entry!r:.200}")
        opt = from_json(entry["optimizer"])
        step = entry["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ValueError(f"update count {step!r} must be an int >= 1")
        if opt in seen:
            raise ValueError(f"optimizer {entry['optimizer']} appears twice")
        seen.add(opt)
        want = {f"state.{s}:{n}" for s in opt.state_names for n in trainable}
        state: dict[str, np.ndarray[Any, Any]] = {}
        for name, key in entry["state"]:
            if name not in want or name in state:
                raise ValueError(f"unexpected state {name!r} for {type(opt).__name__}")
            arr = np.asarray(blobs[key])
            pshape = arrays[name.split(":", 1)[1]].shape
            if arr.dtype != np.float32 or arr.shape != pshape:
                raise ValueError(
                    f"state {name!r} is {arr.dtype} {list(arr.shape)}, its parameter is "
                    f"float32 {list(pshape)}"
                )
            state[name] = np.array(arr, copy=True)
        if set(state) != want:
            raise ValueError(f"missing state {sorted(want - set(state))}")
        optimizers.append((opt, step, state))
    return TrainingState(list(trainable), optimizers)


def restore(compiled: Any, found: TrainingState) -> None:
    """Installs ``found`` as ``compiled``'s trainer state."""
    from poot.torch_frontend.train import Trainer

    trainer = Trainer(compiled)
    for opt, step, state in found.optimizers:
        trainer.steps[opt] = step
        trainer.state[opt] = state
    compiled.trainer = trainer
