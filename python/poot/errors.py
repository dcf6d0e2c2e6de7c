"""Typed errors raised by poot.

Every error poot raises is a ``PootError`` and also subclasses the builtin that fits, so callers
can catch ``ValueError`` for bad input, ``FileNotFoundError`` for a missing model, and so on.
The native module raises these same classes (``poot._native`` looks them up here by name), so a
Rust error keeps its kind and its fields when it crosses into Python.
"""

from __future__ import annotations


class PootError(Exception):
    """Base class of every error poot raises.

    Each subclass has a ``hint``: what to do next. ``str(error)`` is the message (what happened,
    with the numbers involved) followed by that hint, on one line; ``error.message`` is the
    message alone.
    """

    hint = ""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        text = super().__str__()
        if not self.hint or self.hint in text:
            return text
        return f"{text.rstrip('. ')}. {self.hint}"


class CheckpointError(PootError):
    """A model could not be resolved or loaded."""

    hint = "Check the model spec: a .gguf file, a Hugging Face directory, a hub id, or 'default'."


class CheckpointFormatError(CheckpointError, ValueError):
    """A checkpoint file is malformed.

    Attributes:
        kind: what is wrong, e.g. ``"truncated"``, ``"misaligned"``, ``"duplicate_name"``.
        file: the file's path.
        tensor: the tensor concerned, if any.
        field: the header field concerned, if any.
    """

    hint = (
        "The file is damaged or not what its name says: download it again, or convert it with a"
        " current converter."
    )

    def __init__(
        self,
        message: str,
        *,
        kind: str = "invalid",
        file: str | None = None,
        tensor: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.file = file
        self.tensor = tensor
        self.field = field


class UnsupportedDTypeError(CheckpointFormatError):
    """A tensor is stored in a dtype poot does not know."""

    hint = (
        "Convert or quantize the checkpoint to a supported type (F32, F16, BF16, Q8_0, Q4_0, "
        "Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)."
    )


class UnsupportedQuantizationError(CheckpointFormatError):
    """A checkpoint's quantization layout, bit width or option is one poot does not load."""

    hint = (
        "Use a GPTQ (gptq or gptq_v2, 4 or 8 bits), AWQ (GEMM, 4 bits), compressed-tensors"
        " (pack-quantized 4 or 8 bits, or float-quantized FP8) or fp8 (E4M3, square blocks)"
        " export with group_size -1 or a multiple of 32, or a GGUF file; `field` names the"
        " config key poot refused."
    )


class ModelNotFoundError(CheckpointError, FileNotFoundError):
    """A model spec names nothing poot can find."""

    hint = "`poot inspect SPEC` shows what a spec resolves to."


class OfflineError(CheckpointError, ConnectionError):
    """A model must be downloaded but the network (hub or package index) is unreachable."""

    hint = (
        "Download the model on a machine with network access and pass its path, or set "
        "POOT_CACHE_DIR to a cache that already holds it."
    )


class ChecksumError(CheckpointError, ValueError):
    """A downloaded file does not have the expected sha256."""

    hint = "The download is corrupt or was tampered with: delete the cached file and pull again."


class CacheWriteError(CheckpointError, OSError):
    """The model cache cannot take a file: its disk is full, or it is read-only.

    Attributes:
        path: the file or folder that could not be written.
        needed: the bytes the write needs.
        available: the bytes free on that disk (0 when read-only).
    """

    hint = (
        "Free space on that disk, or set POOT_CACHE_DIR to a writable folder with room; "
        "nothing half-written was left in the cache."
    )

    def __init__(self, message: str, *, path: str = "", needed: int = 0, available: int = 0):
        super().__init__(message)
        self.path = path
        self.needed = needed
        self.available = available


class TokenizerError(PootError, ValueError):
    """A tokenizer cannot be built from the given files or metadata."""

    hint = "Check the tokenizer files (tokenizer.json, or the GGUF's tokenizer.* metadata)."


class ChatTemplateError(TokenizerError):
    """A chat template is missing or failed to render."""

    hint = "Pass a chat template, or use a model whose metadata has one (`poot inspect` shows it)."


class ConfigError(PootError, ValueError):
    """A setting (an environment variable poot reads) has an invalid value."""

    hint = "Fix the setting named in the message; `poot --help` and the docs list the valid range."


class UnsupportedArchitectureError(CheckpointError, ValueError):
    """A checkpoint's architecture has no model definition in poot.

    Attributes:
        architecture: the architecture the checkpoint names.
        supported: the architectures poot can run.
    """

    hint = (
        "Use a model of a supported architecture (`supported` lists them), or add a model "
        "definition (docs: contributing)."
    )

    def __init__(
        self, message: str, *, architecture: str = "", supported: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.architecture = architecture
        self.supported = supported


class TraceError(PootError, ValueError):
    """A model definition's trace was refused (an operand of the wrong shape, an unknown weight).

    Attributes:
        kind: ``"shape"``, ``"unknown_weight"``, ``"bad_value"``, ``"duplicate_input"``,
            ``"duplicate_output"``, ``"finished"`` or ``"budget"``.
        op: the op that refused its operands, if any.
        name: the weight, input or output concerned, if any.
    """

    hint = (
        "The model definition built an invalid graph: this is a bug in the definition, report "
        "it with the message."
    )

    def __init__(
        self,
        message: str,
        *,
        kind: str = "invalid",
        op: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.op = op
        self.name = name


class TraceBudgetError(TraceError):
    """A trace would exceed one of its ``TraceLimits``; nothing past the limit was allocated.

    Attributes:
        resource: ``"tokens"``, ``"values"``, ``"equations"``, ``"literal_bytes"`` or
            ``"records"``.
        limit: the limit.
        total: the total the trace would have reached.
    """

    hint = (
        "Raise the TraceLimits field named `resource` above `total`, or use a smaller step "
        "(max_step_tokens)."
    )

    def __init__(self, message: str, *, resource: str = "", limit: int = 0, total: int = 0) -> None:
        super().__init__(message, kind="budget")
        self.resource = resource
        self.limit = limit
        self.total = total


class CompileError(PootError, RuntimeError):
    """A backend refused to compile a graph."""

    hint = "The backend cannot compile this graph: try another backend (backend='cpu')."


class CompileExpansionError(CompileError):
    """A compile pass would grow the graph past ``CompileLimits.max_equations``.

    Attributes:
        pass_name: the pass.
        limit: the equation limit.
        total: the equations the pass would have produced.
    """

    hint = "Raise CompileLimits.max_equations above `total`, or use a smaller step."

    def __init__(self, message: str, *, pass_name: str = "", limit: int = 0, total: int = 0):
        super().__init__(message)
        self.pass_name = pass_name
        self.limit = limit
        self.total = total


class KernelBodyLimitError(CompileError):
    """A generated kernel would exceed its instruction or local limit (a planner refusal).

    Attributes:
        kernel: the kernel.
        what: ``"instructions"`` or ``"locals"``.
        limit: the limit.
        total: what the kernel needs.
    """

    hint = "Use a smaller step or another backend; the device cannot run a kernel this large."

    def __init__(
        self, message: str, *, kernel: str = "", what: str = "", limit: int = 0, total: int = 0
    ) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.what = what
        self.limit = limit
        self.total = total


class ArtifactTooLargeError(CompileError):
    """A compiled artifact would exceed ``CompileLimits.max_artifact_bytes``; it was not kept.

    Attributes:
        limit: the byte limit.
        total: the artifact's bytes.
    """

    hint = (
        "Raise CompileLimits.max_artifact_bytes above `total`, or use a smaller step "
        "(max_step_tokens, max_num_seqs)."
    )

    def __init__(self, message: str, *, limit: int = 0, total: int = 0) -> None:
        super().__init__(message)
        self.limit = limit
        self.total = total


class UnsupportedOpError(CompileError):
    """A backend has no implementation of an op in the graph.

    Attributes:
        backend: the backend.
        op: the op.
    """

    hint = "Use a backend that supports the op (backend='cpu' supports every op)."

    def __init__(self, message: str, *, backend: str = "", op: str = "") -> None:
        super().__init__(message)
        self.backend = backend
        self.op = op


class UnsupportedTorchOpError(UnsupportedOpError):
    """A ``torch.export`` graph holds an op poot cannot lower.

    Attributes:
        op: the aten op (``aten.cumsum.default``).
        module_path: where it sits in the module tree ("" for the root module).
    """

    hint = "See docs/compiling-modules.md for the ops that lower; rewrite or split the module."

    def __init__(self, message: str, *, op: str = "", module_path: str = "") -> None:
        super().__init__(message, backend="torch", op=op)
        self.module_path = module_path


class UnsupportedFeatureError(PootError, ValueError):
    """A call asks for something the compiled object does not do (another input shape or
    dtype than it was specialized for, an unsupported input type)."""

    hint = "Compile another artifact for these inputs."


class DeviceTensorExportError(UnsupportedFeatureError, BufferError):
    """A ``PootTensor`` held on a GPU was asked for host memory without a copy (DLPack,
    ``numpy.asarray``): DLPack cannot describe a wgpu (Vulkan) buffer to torch or numpy, and
    poot never copies a device tensor implicitly."""

    hint = "Call .cpu() to copy it to a host array (one explicit readback), then export that."


class DeviceMismatchError(UnsupportedFeatureError):
    """A device-resident ``PootTensor`` was passed to a module compiled for another device (or
    another runtime on the same adapter): its buffer cannot be bound there, and poot never
    copies between devices implicitly."""

    hint = "Pass t.cpu() (one explicit readback), or compile the module for the runtime holding it."


class ArtifactFormatError(PootError, ValueError):
    """A file given to ``poot.load`` is not a readable poot artifact (corrupt or foreign)."""

    hint = "Load a file written by CompiledModule.save with this poot version, or compile again."


class PreparedEntryLimitError(PootError, RuntimeError):
    """A prepared (compiled step-shape) entry would pass a limit of the prepared cache.

    Raised under ``prepared_policy="refuse"`` when the cache is full, and under either policy
    when one entry alone is larger than the byte limit. The entry was not kept.

    Attributes:
        resource: ``"entries"`` or ``"bytes"``.
        limit: the limit.
        total: what the cache would hold with the new entry.
    """

    hint = "Raise max_prepared_entries / max_prepared_bytes, or use prepared_policy='evict'."

    def __init__(self, message: str, *, resource: str = "", limit: int = 0, total: int = 0) -> None:
        super().__init__(message)
        self.resource = resource
        self.limit = limit
        self.total = total


class DeviceTimeoutError(PootError, TimeoutError):
    """A device wait passed its deadline; the runtime is poisoned from now on.

    Attributes:
        during: what was running.
    """

    hint = (
        "The device hung or is far too slow for the deadline: raise timeout_s, or check the "
        "device; this runtime is poisoned, so create a new LLM."
    )

    def __init__(self, message: str, *, during: str = "") -> None:
        super().__init__(message)
        self.during = during


class RuntimePoisonedError(PootError, RuntimeError):
    """A runtime that missed a deadline was used again; create a new one.

    Attributes:
        reason: why it was poisoned.
    """

    hint = (
        "Create a new LLM (or restart the server): a runtime that missed a deadline is never "
        "used again."
    )

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class KernelError(PootError, ValueError):
    """A kernel refused its inputs (an index out of range, a dtype it cannot read).

    Attributes:
        op: the op whose kernel refused.
    """

    hint = "A kernel was given inputs it cannot read: this is a bug, report it with the message."

    def __init__(self, message: str, *, op: str = "") -> None:
        super().__init__(message)
        self.op = op


class GraphInputError(PootError, ValueError):
    """A compiled graph was run with a missing or mistyped input.

    Attributes:
        name: the input.
        expected: its type, e.g. ``"I32[4]"`` (None when missing).
        got: what was given (None when missing).
    """

    hint = (
        "Pass the input with the dtype and shape the message names (token ids must be within "
        "the vocabulary)."
    )

    def __init__(
        self, message: str, *, name: str = "", expected: str | None = None, got: str | None = None
    ) -> None:
        super().__init__(message)
        self.name = name
        self.expected = expected
        self.got = got


class DeviceMemoryError(PootError, MemoryError):
    """A runtime allocation would pass its memory limit.

    Attributes:
        what: what was being allocated.
        requested: bytes requested.
        limit: bytes allowed.
    """

    hint = "Lower num_blocks or max_model_len, or raise the memory limit named in the message."

    def __init__(self, message: str, *, what: str = "", requested: int = 0, limit: int = 0):
        super().__init__(message)
        self.what = what
        self.requested = requested
        self.limit = limit


class KvCacheNotConfiguredError(PootError, RuntimeError):
    """A graph with attention ran before the runtime's KV cache was configured."""

    hint = "Call configure_kv on the runtime before running graphs with attention."


class BackendNotCompiledError(PootError, RuntimeError):
    """A runtime was requested whose backend is not compiled into this build.

    Attributes:
        backend: the backend.
    """

    hint = "Install a build with this backend, or use backend='cpu'."

    def __init__(self, message: str, *, backend: str = "") -> None:
        super().__init__(message)
        self.backend = backend


class DeviceUnavailableError(PootError, RuntimeError):
    """A backend compiled into this build cannot run here: its driver, its compiler library
    or a device is missing (``backend="cuda"`` on a machine without an NVIDIA driver).

    Attributes:
        backend: the backend.
        missing: what was not found (a library, a symbol, a device).
    """

    hint = "Install the missing driver or library named in the message, or use backend='cpu'."

    def __init__(self, message: str, *, backend: str = "", missing: str = "") -> None:
        super().__init__(message)
        self.backend = backend
        self.missing = missing


class SamplingParamsError(PootError, ValueError):
    """A ``SamplingParams`` field is out of range.

    Attributes:
        field: the field.
    """

    hint = "Fix the field named in the message (`field`); the docs list every field's range."

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class ContextLengthError(PootError, ValueError):
    """A request does not fit the model's context (``max_model_len``) or the KV cache.

    Attributes:
        needed: tokens the request needs.
        limit: tokens available.
    """

    hint = (
        "Shorten the prompt, lower max_tokens, or raise max_model_len / num_blocks (up to the "
        "model's context)."
    )

    def __init__(self, message: str, *, needed: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.limit = limit


class NodeLostError(PootError, RuntimeError):
    """A Ray node holding a segment of a model placed across nodes was lost (its actor died,
    its node left the cluster, or it stopped answering) while a step ran or was started; the
    step's requests end with this error and the placement is unusable from then on.

    Attributes:
        node: the node's device key (``"cpu:<node id prefix>"``).
        reason: what Ray reported.
    """

    hint = (
        "A model placed across nodes stops when one of its nodes is lost: create a new LLM "
        "once the cluster has the nodes (or budgets) the placement needs."
    )

    def __init__(self, message: str, *, node: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.node = node
        self.reason = reason


# The planner's errors live in their own module to keep this one readable; they are part of
# this module's namespace (the native module looks errors up here by name).
from poot._errors_planner import (  # noqa: E402, I001 - after PootError, which it subclasses
    Cancelled as Cancelled,
    CapacityError as CapacityError,
    HardwareValidationError as HardwareValidationError,
    PlannerError as PlannerError,
    SpillDirError as SpillDirError,
    Stalled as Stalled,
)

from poot._errors_training import (  # noqa: E402, I001 - after the classes they subclass
    NoGradientError as NoGradientError,
    TrainingNotAllowedError as TrainingNotAllowedError,
    TrainingUnsupportedError as TrainingUnsupportedError,
)
