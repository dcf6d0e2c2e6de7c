"""``PootTensor``: a compiled module's output, held on the host.

Invariant: it wraps the numpy array the runtime handed back (no copy); ``cpu()`` returns that
array and ``__dlpack__`` exports the same memory, so ``torch.from_dlpack(t)`` and
``numpy.from_dlpack(t)`` see it without a copy. Outputs live on the host in this slice (the
CPU runtime); a device-resident tensor is future work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


class PootTensor:
    """A compiled module's output on the host (see the module docs)."""

    __slots__ = ("_array",)

    def __init__(self, array: npt.NDArray[Any]) -> None:
        self._array = array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._array.dtype

    @property
    def device(self) -> str:
        return "cpu"

    def cpu(self) -> npt.NDArray[Any]:
        """The values as a numpy array (the same memory, not a copy)."""
        return self._array

    def numpy(self) -> npt.NDArray[Any]:
        return self._array

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        if dtype is None or np.dtype(dtype) == self._array.dtype:
            return self._array.copy() if copy else self._array
        return self._array.astype(dtype)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"PootTensor(shape={self.shape}, dtype={self.dtype}, device='cpu')"
