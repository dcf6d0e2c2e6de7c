"""uvicorn's ``Config`` and ``Server`` without the rest of its package.

``import uvicorn`` runs the package's ``__init__``, which imports its command line
(``uvicorn.main``, with click) and its reloaders (multiprocessing, watchfiles): none of it
serves a request, and it is a tenth of ``poot-serve``'s start-up CPU. ``Config`` and
``Server`` live in ``uvicorn.config`` and ``uvicorn.server``, which need nothing from that
``__init__``. So where the process has not imported uvicorn yet, the package is registered
without running its ``__init__``, those two modules are imported, and the ``__init__`` runs in
place the first time anything asks the package for a name it lacks (``uvicorn.run``,
``uvicorn.main``): ``import uvicorn`` elsewhere in the process still gets the whole package.

Invariant: ``sys.modules["uvicorn"]`` is always uvicorn's own package object; its
``__init__`` runs at most once.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from types import ModuleType

__all__ = ["Config", "Server"]

_lock = threading.Lock()


def _register_package() -> None:
    spec = importlib.util.find_spec("uvicorn")
    if spec is None or spec.loader is None:
        raise ImportError("uvicorn is not installed", name="uvicorn")
    loader = spec.loader
    package: ModuleType = importlib.util.module_from_spec(spec)

    def run_init(name: str) -> object:
        # PEP 562: called only for names the package lacks, so never for __path__ or the
        # submodules and names set below.
        with _lock:
            if package.__dict__.pop("__getattr__", None) is not None:
                loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = run_init  # type: ignore[method-assign]
    sys.modules["uvicorn"] = package


if "uvicorn" not in sys.modules:
    _register_package()

from uvicorn._version import __version__  # noqa: E402 - after the package is registered
from uvicorn.config import Config  # noqa: E402
from uvicorn.server import Server  # noqa: E402

# What the package's __init__ would export and uvicorn's own modules import from it
# (``uvicorn.lifespan.on`` does ``from uvicorn import Config``).
_package = sys.modules["uvicorn"]
for _name, _value in (("__version__", __version__), ("Config", Config), ("Server", Server)):
    if _name not in _package.__dict__:
        setattr(_package, _name, _value)
