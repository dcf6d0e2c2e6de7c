"""poot: an LLM inference engine with a Rust core.

The public API lives here; ``poot._native`` is an implementation detail.
"""

from poot._native import __version__

__all__ = ["__version__"]
