"""``ServerConfig``: every setting of ``poot-serve`` in one typed object.

The command line (``poot.server.cli``) builds it; ``create_app`` reads nothing else. Limits are
checked when the object is made, so a bad setting fails before the model loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from poot.errors import ConfigError

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ServerConfig", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str) -> int:
    """Bytes from ``"512MiB"``, ``"2GB"`` or ``"1048576"`` (binary and decimal units).

    Raises:
        ConfigError: not a size.
    """
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not value >= 1:
        raise ConfigError(f"not a size: {text!r} (e.g. 512MiB, 2GB, 1048576)")
    return int(value * _UNITS[unit])


DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server.

    Attributes:
        model: the model spec (None: the default model, pulled on first use).
        served_model_name: the name clients pass as ``model`` (None: derived from the spec).
        api_key: when set, ``/v1/*`` needs ``Authorization: Bearer <api_key>``.
        threads: CPU threads (None: one per core).
        max_model_len: tokens per sequence (None: the model's context, at most 4096).
        max_rows: caps the rows (sequences decoding together) below what the memory holds;
            None: as many as ``DriverOptions.fit`` finds room for (``poot.server.loading``).
            The command line has no flag for it: ``POOT_SERVE_MAX_ROWS`` sets it, for tests
            and diagnosis.
        max_queue: most requests waiting for a row; one more is refused with 429.
        queue_timeout_s: how long a request may wait for a row before 503.
        request_timeout_s: how long a request may take in all (waiting included) before it
            ends with a timeout error.
        max_body_bytes: largest request body; a larger one is refused with 413.
        max_n: largest ``n`` (completions per prompt) a request may ask for.
        chat_template: a Jinja chat template (source text) to use instead of the model's.
        step_timeout_s: the deadline of each engine step on the device; a step that misses
            it poisons the runtime (``/health`` then answers 503 ``dead``).
        backend: ``"cpu"``, ``"wgpu"``, ``"vulkan"`` or ``"cuda"`` (``poot.LLM(backend=...)``).
        progress: progress bars while loading (pulling the default model, preparing weights).
        shutdown_timeout_s: on SIGTERM/SIGINT, how long running requests may go on before
            they are cancelled (``poot.server.shutdown``).
        device_budget_bytes: bytes the model may use on its device (weights, KV pool,
            buffers); when the weights do not fit, the planner streams them
            (``poot.CompileConfig.device_budget_bytes``). None: no planning, the whole model
            resident.
        host_budget_bytes: host bytes for weights streamed from RAM (``CompileConfig``).
        spill_dir: where streamed weights' buffer files go (``CompileConfig.spill_dir``).
        stall_timeout_s: a weight load with no progress for this long fails the step.
    """

    model: str | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    threads: int | None = None
    max_model_len: int | None = None
    max_rows: int | None = None
    backend: str = "cpu"
    max_queue: int = 256
    queue_timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    max_body_bytes: int = 4 << 20
    max_n: int = 16
    chat_template: str | None = None
    step_timeout_s: float = 600.0
    progress: bool = True
    shutdown_timeout_s: float = 30.0
    device_budget_bytes: int | None = None
    host_budget_bytes: int | None = None
    spill_dir: str | None = None
    stall_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_queue", "max_body_bytes", "max_n"):
            value = getattr(self, name)
            if value is None and name == "max_rows":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.shutdown_timeout_s, bool)
            or not isinstance(self.shutdown_timeout_s, int | float)
            or not self.shutdown_timeout_s >= 0
        ):
            raise ConfigError(
                f"shutdown_timeout_s must be a number of seconds >= 0, got "
                f"{self.shutdown_timeout_s!r}"
            )
        for name in ("device_budget_bytes", "host_budget_bytes"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"{name} must be a number of bytes >= 1, got {value!r}")
        for name in ("queue_timeout_s", "request_timeout_s", "step_timeout_s", "stall_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key must not be empty (leave it unset for no key)")
