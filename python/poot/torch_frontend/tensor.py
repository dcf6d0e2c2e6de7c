"""``PootTensor``: a compiled module's output, on the host or on the device that computed it.

Invariants: a host tensor wraps the numpy array the runtime handed back (no copy); ``cpu()``
returns that array and ``__dlpack__`` exports the same memory, so ``torch.from_dlpack(t)`` and
``numpy.from_dlpack(t)`` see it without a copy. A device tensor (a wgpu run's output, a
``WgpuTensor``) stays in its device buffer: only ``cpu()`` copies it to the host (one readback
per call, counted by the runtime), and every implicit route to host memory (``__dlpack__``,
``__array__``) raises ``DeviceTensorExportError`` naming ``cpu()``, because DLPack cannot hand a
Vulkan buffer to torch or numpy and a silent copy would hide the transfer.

A device tensor fed to a module compiled for the runtime that made it is bound as that
input's buffer (``device_input``: no readback, no upload); fed to a module of any other
runtime it is ``DeviceMismatchError`` naming ``cpu()`` (a different device, or another
``WgpuRuntime`` on the same adapter: buffers do not cross wgpu devices), never a silent copy.
A ``ModuleGraph`` makes that copy itself, as a counted and recorded transfer
(``compiled_graph.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from poot.errors import DeviceMismatchError, DeviceTensorExportError, UnsupportedFeatureError

# DLPack's device type for Vulkan buffers (dlpack.h: kDLVulkan).
_DL_VULKAN = 7


class PootTensor:
    """A compiled module's output (see the module docs)."""

    __slots__ = ("_array", "_device", "_on_device", "_runtime")

    def __init__(
        self,
        array: npt.NDArray[Any] | None = None,
        *,
        on_device: Any = None,
        device: str = "cpu",
        runtime: Any = None,
    ) -> None:
        if (array is None) == (on_device is None):
            raise ValueError("a PootTensor holds either a host array or a device tensor")
        self._array = array
        self._on_device = on_device
        self._device = "cpu" if on_device is None else device
        self._runtime = runtime if on_device is not None else None

    @property
    def runtime(self) -> Any:
        """The runtime whose device holds it (``None`` for a host tensor)."""
        return self._runtime

    @property
    def shape(self) -> tuple[int, ...]:
        if self._array is not None:
            return tuple(self._array.shape)
        return tuple(self._on_device.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        if self._array is not None:
            return self._array.dtype
        return np.dtype(np.int32 if self._on_device.dtype == "i32" else np.float32)

    @property
    def device(self) -> str:
        """``"cpu"``, or the device key holding it (``"wgpu:0"``)."""
        return self._device

    @property
    def nbytes(self) -> int:
        if self._array is not None:
            return int(self._array.nbytes)
        return int(self._on_device.nbytes)

    def cpu(self) -> npt.NDArray[Any]:
        """The values as a numpy array: the same memory for a host tensor; for a device
        tensor a new array copied from the device (each call copies again)."""
        if self._array is not None:
            return self._array
        return self._on_device.to_numpy()  # type: ignore[no-any-return]

    def numpy(self) -> npt.NDArray[Any]:
        if self._array is None:
            raise self._no_export("numpy()")
        return self._array

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        if self._array is None:
            raise self._no_export("numpy.asarray")
        if dtype is None or np.dtype(dtype) == self._array.dtype:
            return self._array.copy() if copy else self._array
        return self._array.astype(dtype)

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self._array is None:
            raise self._no_export("DLPack")
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._array is None:
            return (_DL_VULKAN, int(self._device.partition(":")[2] or 0))
        return self._array.__dlpack_device__()  # type: ignore[no-any-return]

    def _no_export(self, how: str) -> DeviceTensorExportError:
        return DeviceTensorExportError(
            f"this tensor {list(self.shape)} is on {self._device}: {how} cannot read a Vulkan "
            "buffer without a copy, and poot makes none implicitly; call .cpu() to copy it to "
            "the host"
        )

    def __repr__(self) -> str:
        return f"PootTensor(shape={self.shape}, dtype={self.dtype}, device={self._device!r})"


def device_input(t: PootTensor, runtime: Any, name: str, dtype: str, shape: tuple[int, ...]) -> Any:
    """A device tensor as the input ``name`` of a module compiled for ``runtime``: the
    tensor itself, to bind (see the module docs), after the shape and dtype checks
    (``UnsupportedFeatureError``); ``DeviceMismatchError`` when another runtime holds it."""
    if t.runtime is not runtime:
        raise DeviceMismatchError(
            f"input {name!r} is a tensor on {t.device} held by another runtime than this "
            f"module's ({getattr(runtime, 'name', type(runtime).__name__)}); poot does not copy "
            "between devices implicitly: pass t.cpu() to copy it to the host"
        )
    if t.shape != shape:
        raise UnsupportedFeatureError(
            f"input {name!r} has shape {list(t.shape)}, the module was compiled for "
            f"{list(shape)}; compile another one for this shape"
        )
    if t._on_device.dtype != dtype:
        raise UnsupportedFeatureError(
            f"input {name!r} has dtype {t.dtype} on {t.device}, the module was compiled for "
            f"{'float32' if dtype == 'f32' else 'int32 ids'}"
        )
    return t._on_device


def run_to_tensors(
    runtime: Any, plan: Any, feed: dict[str, npt.NDArray[Any]], names: list[str]
) -> list[PootTensor]:
    """Runs ``plan`` and wraps its ``names`` outputs where the runtime left them: on the
    device for a runtime that keeps outputs there (``run_on_device``: wgpu), else on the host."""
    keep = getattr(runtime, "run_on_device", None)
    if keep is not None:
        out = keep(plan, feed)
        device = f"{runtime.name}:0"  # a WgpuRuntime runs on the first adapter
        return [PootTensor(on_device=out[n], device=device, runtime=runtime) for n in names]
    host = runtime.run(plan, feed)
    return [PootTensor(host[n]) for n in names]
