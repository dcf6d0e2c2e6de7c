"""Type stubs for ``poot._native``, the Rust extension module (checked by ``mypy.stubtest``)."""

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, final

import numpy.typing as npt

__all__ = [
    "__version__",
    "build_profile",
    "TensorInfo",
    "GgufFile",
    "BpeModel",
    "SafetensorsFile",
    "SafetensorsModel",
    "TraceLimits",
    "CompileLimits",
    "Weights",
    "Value",
    "Tracer",
    "Graph",
    "Plan",
    "CpuRuntime",
    "LateInput",
    "WgpuRuntime",
    "WgpuTensor",
    "wgpu_adapters",
    "vulkan_devices",
    "CudaRuntime",
    "cuda_devices",
    "cuda_memory",
    "_cuda_emulator",
    "Scheduler",
    "StepDriver",
    "_mapping_probe",
]

__version__: str
build_profile: Literal["debug", "release"]

@final
class TensorInfo:
    """One tensor of a checkpoint: a view (dtype, shape, byte range) into its file."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def n_elements(self) -> int: ...
    @property
    def file(self) -> str: ...

@final
class GgufFile:
    """A GGUF (v2/v3) file, mapped read-only and validated on open."""

    def __new__(cls, path: str | os.PathLike[str]) -> GgufFile: ...
    @property
    def path(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    def metadata(self, *, max_array_len: int | None = None) -> dict[str, Any]: ...
    def keys(self) -> list[str]: ...
    def get(self, key: str) -> Any: ...
    def array_len(self, key: str) -> int | None: ...
    def tensors(self) -> list[TensorInfo]: ...

@final
class BpeModel:
    """A byte-level BPE vocabulary with merge ranks (poot-tokenize); merges pre-tokenized words."""

    def __new__(
        cls, tokens: Sequence[str], merges: Sequence[str], *, ignore_merges: bool = False
    ) -> BpeModel: ...
    @staticmethod
    def from_gguf(file: GgufFile, *, ignore_merges: bool = False) -> BpeModel: ...
    def __len__(self) -> int: ...
    @property
    def n_merges(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def id_to_token(self, token_id: int) -> str | None: ...
    def token_to_id(self, token: str) -> int | None: ...
    def encode(self, words: Sequence[str], *, byte_level: bool = False) -> list[int]: ...

@final
class SafetensorsFile:
    """One safetensors file, mapped read-only and validated on open."""

    def __new__(cls, path: str | os.PathLike[str]) -> SafetensorsFile: ...
    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    def metadata(self) -> dict[str, str]: ...
    def tensors(self) -> list[TensorInfo]: ...

@final
class SafetensorsModel:
    """A checkpoint of one or more safetensors files: a directory, an index JSON, or one file."""

    def __new__(
        cls, path: str | os.PathLike[str], *, packed: tuple[str, int, int] | None = None
    ) -> SafetensorsModel: ...
    @property
    def files(self) -> list[str]: ...
    @property
    def index_path(self) -> str | None: ...
    def tensors(self) -> list[TensorInfo]: ...
    def metadata(self) -> dict[str, str]: ...

@final
class TraceLimits:
    """What a trace may grow to; each excess is a ``poot.errors.TraceBudgetError``."""

    def __new__(
        cls,
        *,
        max_tokens: int | None = None,
        max_values: int | None = None,
        max_equations: int | None = None,
        max_literal_bytes: int | None = None,
        max_records: int | None = None,
    ) -> TraceLimits: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def max_values(self) -> int: ...
    @property
    def max_equations(self) -> int: ...
    @property
    def max_literal_bytes(self) -> int: ...
    @property
    def max_records(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    __hash__: None  # type: ignore[assignment]

@final
class CompileLimits:
    """What compilation may grow to; each excess is its own ``poot.errors.CompileError``."""

    def __new__(
        cls,
        *,
        max_equations: int | None = None,
        max_kernel_instructions: int | None = None,
        max_kernel_locals: int | None = None,
        max_artifact_bytes: int | None = None,
    ) -> CompileLimits: ...
    @property
    def max_equations(self) -> int: ...
    @property
    def max_kernel_instructions(self) -> int: ...
    @property
    def max_kernel_locals(self) -> int: ...
    @property
    def max_artifact_bytes(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    __hash__: None  # type: ignore[assignment]

@final
class Weights:
    """A checkpoint's stored tensors (views into the mapped files; nothing is copied)."""

    def __new__(cls, source: GgufFile | SafetensorsModel) -> Weights: ...
    # Python-owned C-contiguous float32/float16 arrays (int16/uint16 words with dtype "bf16"),
    # held without a copy; their owner must not write them while a run reads them.
    @staticmethod
    def from_arrays(
        arrays: Mapping[str, npt.NDArray[Any]], *, dtypes: Mapping[str, str] | None = None
    ) -> Weights: ...
    def describe(self, name: str) -> tuple[str, tuple[int, ...]] | None: ...
    def __contains__(self, key: str, /) -> bool: ...
    @property
    def total_bytes(self) -> int: ...

@final
class Value:
    """A value in a trace; only the tracer that made it accepts it."""

    @property
    def id(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...

@final
class Tracer:
    """Records one step's graph under ``TraceLimits``."""

    def __new__(
        cls, weights: Weights, step_tokens: int, limits: TraceLimits | None = None
    ) -> Tracer: ...
    @property
    def step_tokens(self) -> int: ...
    @property
    def limits(self) -> TraceLimits: ...
    def usage(self) -> dict[str, int]: ...
    def input(self, name: str, dtype: str, shape: Sequence[int]) -> Value: ...
    def weight(self, name: str) -> Value: ...
    def has_weight(self, name: str) -> bool: ...
    def literal(self, data: Sequence[float], shape: Sequence[int]) -> Value: ...
    def cast(self, x: Value, to: str = "f32") -> Value: ...
    def embedding(self, table: Value, ids: Value) -> Value: ...
    def rms_norm(self, x: Value, weight: Value, eps: float) -> Value: ...
    def matmul(self, x: Value, w: Value) -> Value: ...
    def add(self, a: Value, b: Value) -> Value: ...
    def mul(self, a: Value, b: Value) -> Value: ...
    def silu(self, x: Value) -> Value: ...
    def gelu(self, x: Value) -> Value: ...
    def softcap(self, x: Value, cap: float) -> Value: ...
    def gather_cols(self, x: Value, ids: Value) -> Value: ...
    def moe_matmul(self, x: Value, w: Value, ids: Value) -> Value: ...
    def moe_combine(self, y: Value, weights: Value) -> Value: ...
    def softmax(self, x: Value) -> Value: ...
    def rope(
        self,
        x: Value,
        positions: Value,
        *,
        n_heads: int,
        head_dim: int,
        rot_dim: int | None = None,
        theta: float = 10000.0,
        style: Literal["interleaved", "neox"] | str = "neox",
        scaling: Mapping[str, Any] | None = None,
    ) -> Value: ...
    def paged_attention(
        self,
        q: Value,
        k: Value,
        v: Value,
        *,
        slot_mapping: Value,
        token_seq: Value,
        positions: Value,
        block_tables: Value,
        layer: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
        window: int = 0,
        softcap: float = 0.0,
    ) -> Value: ...
    def unary(
        self,
        x: Value,
        kind: Literal[
            "relu",
            "gelu_erf",
            "tanh",
            "sigmoid",
            "neg",
            "exp",
            "sqrt",
            "rsqrt",
            "abs",
            "log",
            "step",
            "gelu_erf_grad",
        ]
        | str,
    ) -> Value: ...
    def binary(
        self, a: Value, b: Value, kind: Literal["add", "sub", "mul", "div"] | str
    ) -> Value: ...
    def scalar(
        self,
        x: Value,
        kind: Literal["add", "sub", "mul", "div"] | str,
        value: float,
        *,
        reverse: bool = False,
    ) -> Value: ...
    def layer_norm(
        self, x: Value, weight: Value | None, bias: Value | None, eps: float
    ) -> Value: ...
    def permute(self, x: Value, perm: Sequence[int]) -> Value: ...
    def batch_matmul(self, a: Value, b: Value) -> Value: ...
    def reduce(self, x: Value, kind: Literal["sum", "mean", "max"] | str) -> Value: ...
    def causal_mask(self, x: Value) -> Value: ...
    def reshape(self, x: Value, shape: Sequence[int]) -> Value: ...
    def slice(self, x: Value, axis: int, start: int, end: int) -> Value: ...
    def concat(self, xs: Sequence[Value], axis: int) -> Value: ...
    def gather_rows(self, x: Value, rows: Value) -> Value: ...
    def scatter_add_rows(self, src: Value, ids: Value, rows: int) -> Value: ...
    def sample(
        self,
        logits: Value,
        *,
        temperature: Value,
        top_k: Value,
        top_p: Value,
        min_p: Value,
        uniform: Value,
    ) -> Value: ...
    def adjust_logits(
        self,
        logits: Value,
        *,
        ids: Value,
        counts: Value,
        bias: Value,
        repetition: Value,
        presence: Value,
        frequency: Value,
    ) -> Value: ...
    def mask_logits(self, logits: Value, mask: Value) -> Value: ...
    def top_k_ids(self, x: Value, k: int) -> Value: ...
    def logprobs(self, logits: Value, ids: Value) -> Value: ...
    def output(self, name: str, v: Value) -> None: ...
    def finish(self) -> Graph: ...

@final
class Graph:
    """A traced step: equations in definition order, typed values, named outputs."""

    @property
    def n_equations(self) -> int: ...
    @property
    def step_tokens(self) -> int: ...
    def inputs(self) -> list[tuple[str, str, tuple[int, ...]]]: ...
    def outputs(self) -> list[tuple[str, str, tuple[int, ...]]]: ...
    def output_ids(self) -> dict[str, int]: ...
    def weights(self) -> list[tuple[str, str, tuple[int, ...]]]: ...
    def equations(
        self,
    ) -> list[tuple[str, list[int], dict[str, Any], str, tuple[int, ...]]]: ...
    def dump(self) -> str: ...
    def eliminate_dead_code(self, limits: CompileLimits | None = None) -> Graph: ...

@final
class Plan:
    """A graph compiled for one runtime."""

    @property
    def artifact_bytes(self) -> int: ...
    @property
    def graph(self) -> Graph: ...

@final
class LateInput:
    """A graph input supplied after the run has started (``CpuRuntime.run(late=...)``)."""

    def __init__(self) -> None: ...
    def fill(self, value: npt.NDArray[Any]) -> bool: ...
    def fail(self, reason: str) -> bool: ...
    def wait(self, timeout_s: float = 600.0) -> npt.NDArray[Any]: ...
    @property
    def settled(self) -> bool: ...

@final
class CpuRuntime:
    """The CPU runtime: compiles traced graphs and runs them with bounded waits.

    ``numerics="ggml"`` follows llama.cpp's CPU arithmetic (Q8 activations with integer dots,
    f16 KV cache); ``"exact"`` decodes weights exactly and keeps an f32 KV cache.
    """

    def __new__(
        cls,
        threads: int | None = None,
        numerics: Literal["ggml", "exact"] = "exact",
        *,
        isa: Literal["scalar", "avx2", "avx512", "amx"] | None = None,
        spin_us: int | None = None,
        prefetch: int | None = None,
        prefetch_float: int | None = None,
        prefetch_next: bool | None = None,
        prefetch_gap: int | None = None,
        huge_pages: bool | None = None,
        profile: bool | None = None,
    ) -> CpuRuntime: ...
    @property
    def name(self) -> str: ...
    # Whether graphs with ops of this kind ("adjust_logits", "matmul", ...) compile here.
    def supports(self, op: str) -> bool: ...
    # The same for a runtime of this kind under `numerics`, before one exists.
    @staticmethod
    def kv_entry_bytes_for(numerics: str) -> int: ...
    # Bytes of one K or V element of the KV pool (2: f16, 4: f32).
    @property
    def kv_entry_bytes(self) -> int: ...
    @property
    def isa(self) -> Literal["scalar", "avx2", "avx512", "amx"]: ...
    def prepare(
        self, graph: Graph, weights: Weights, limits: CompileLimits | None = None
    ) -> Plan: ...
    def configure_kv(
        self,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        windowed_layers: int = 0,
        windowed_blocks: int = 0,
    ) -> None: ...
    def run(
        self,
        plan: Plan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
    ) -> dict[str, npt.NDArray[Any]]: ...
    def memory(self) -> dict[str, int]: ...
    def health(self) -> dict[str, str | None]: ...
    # (done, total) stored bytes of the matmul weights the compile in progress has prepared
    # and has to prepare (after it, the last such compile's); callable while `compile` runs.
    def weight_progress(self) -> tuple[int, int]: ...
    # Keep each run's per-equation spans (no profile report) for `last_run_spans`.
    def record_spans(self, on: bool) -> None: ...
    # The last run's equations: (index, op kind, start_s, end_s) since the run began; empty
    # unless `record_spans(True)` or `profile=True`.
    def last_run_spans(self) -> list[tuple[int, str, float, float]]: ...

@final
class WgpuRuntime:
    """The wgpu runtime: WGSL kernels over packed weights on the first Vulkan adapter.

    Raises ``BackendNotCompiledError`` when the build lacks the ``wgpu`` feature. Arithmetic is
    the CPU runtime's ``"exact"`` mode (f32, f32 KV cache) or, with ``numerics="ggml"``,
    llama.cpp's (Q8-quantized activations and integer dots for Q4_0/Q4_1/Q8_0 weights, f16-rounded
    KV, q and attention weights); every wait is bounded by ``timeout_s`` and each run's own, and
    a timeout or a lost device poisons the runtime. Where the adapter has ``shader-f64`` the
    sampling step runs on the device (the host reads back only ids and requested logprobs);
    ``host_sampling=True`` keeps it on the host over read-back logits. ``api="vulkan"`` runs the
    same kernels and executor on raw Vulkan (ash, SPIR-V from naga; not production; ``name`` is
    then ``"vulkan"``), ``BackendNotCompiledError`` in a build without the ``vulkan`` feature.
    """

    def __new__(
        cls,
        timeout_s: float = 600.0,
        max_binding_bytes: int | None = None,
        f16_arithmetic: bool = False,
        numerics: Literal["exact", "ggml"] = "exact",
        host_sampling: bool = False,
        api: Literal["wgpu", "vulkan"] = "wgpu",
    ) -> WgpuRuntime: ...
    @property
    def name(self) -> str: ...
    # Whether graphs with ops of this kind ("adjust_logits", "matmul", ...) compile here.
    def supports(self, op: str) -> bool: ...
    # The same for a runtime of this kind under `numerics`, before one exists.
    @staticmethod
    def kv_entry_bytes_for(numerics: str) -> int: ...
    # Bytes of one K or V element of the KV pool (2: f16, 4: f32).
    @property
    def kv_entry_bytes(self) -> int: ...
    @property
    def adapter(self) -> dict[str, Any]: ...
    def prepare(
        self, graph: Graph, weights: Weights, limits: CompileLimits | None = None
    ) -> Plan: ...
    def configure_kv(
        self,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        windowed_layers: int = 0,
        windowed_blocks: int = 0,
    ) -> None: ...
    def run(
        self,
        plan: Plan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
    ) -> dict[str, npt.NDArray[Any]]: ...
    # Like `run`, but the outputs stay on the device (copied back only by `to_numpy()`); an
    # input may be a WgpuTensor of this runtime, bound as it lies (no readback, no upload).
    def run_on_device(
        self,
        plan: Plan,
        inputs: Mapping[str, npt.NDArray[Any] | WgpuTensor],
        timeout_s: float = 600.0,
    ) -> dict[str, WgpuTensor]: ...
    def memory(self) -> dict[str, int]: ...
    def health(self) -> dict[str, str | None]: ...
    # {"runs", "readback_bytes", "upload_bytes"}: steps run, bytes copied back from the
    # device, bytes of host inputs uploaded at a step's start.
    def stats(self) -> dict[str, int]: ...
    # Device timestamps around each dispatch (where adapter["timestamp_query"]).
    def record_spans(self, on: bool) -> None: ...
    # The last timed run's (equation index, op kind, start_s, end_s) from its first timestamp.
    def last_run_spans(self) -> list[tuple[int, str, float, float]]: ...
    def _inject_stall(self, rows: int) -> None: ...
    def _inject_device_loss(self) -> None: ...

@final
class WgpuTensor:
    """An output of ``WgpuRuntime.run_on_device``, held in a device buffer."""

    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> Literal["f32", "i32"]: ...
    @property
    def nbytes(self) -> int: ...
    # A new numpy array of the values (one bounded readback).
    def to_numpy(self, timeout_s: float = 600.0) -> npt.NDArray[Any]: ...

def wgpu_adapters() -> list[dict[str, str]]: ...

# Raw Vulkan's devices, best first (empty without the `vulkan` feature): name, backend,
# device_type, driver, api_version, shader_f64, subgroup_size, subgroup_ops,
# cooperative_matrix, max_storage_buffer_range, device_local.
def vulkan_devices() -> list[dict[str, Any]]: ...

@final
class CudaRuntime:
    """The CUDA runtime: kernels from ``shaders/cuda`` compiled by NVRTC for one NVIDIA GPU.

    Raises ``BackendNotCompiledError`` when the build lacks the ``cuda`` feature, and
    ``DeviceUnavailableError`` (naming what is missing) where the NVIDIA driver, NVRTC or the
    device is absent. Arithmetic is the CPU runtime's ``"exact"`` mode (f32); every wait is
    bounded by ``timeout_s`` and each run's own, and a timeout or a sticky CUDA error poisons
    the runtime. Graphs with ops it has no kernel for are refused at compile time.
    """

    def __new__(
        cls,
        device: int = 0,
        timeout_s: float = 600.0,
        driver_library: str | None = None,
        nvrtc_library: str | None = None,
    ) -> CudaRuntime: ...
    @property
    def name(self) -> str: ...
    def supports(self, op: str) -> bool: ...
    # Bytes of one K or V element of the KV pool under `numerics`, before a runtime exists.
    @staticmethod
    def kv_entry_bytes_for(numerics: str) -> int: ...
    @property
    def kv_entry_bytes(self) -> int: ...
    @property
    def device(self) -> dict[str, Any]: ...
    def prepare(
        self, graph: Graph, weights: Weights, limits: CompileLimits | None = None
    ) -> Plan: ...
    def configure_kv(
        self,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        windowed_layers: int = 0,
        windowed_blocks: int = 0,
    ) -> None: ...
    def run(
        self,
        plan: Plan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
    ) -> dict[str, npt.NDArray[Any]]: ...
    def memory(self) -> dict[str, int]: ...
    def health(self) -> dict[str, str | None]: ...
    def _inject_stall(self, seconds: float) -> None: ...

def cuda_devices() -> list[dict[str, Any]]: ...
def cuda_memory(device: int = 0, driver_library: str | None = None) -> tuple[int, int]: ...
def _cuda_emulator() -> str: ...

@final
class Scheduler:
    """poot-engine's scheduler: FCFS continuous batching with chunked prefill, paged KV
    blocks (``num_blocks`` usable, plus the reserved null block 0) and preemption by recompute.

    ``kv_window=W`` (every layer attends to a sliding window of at most ``W`` positions): after
    each step a request's blocks wholly before its next token's window go back to the pool and
    its block table shows the null block there. ``window_group=W`` (windowed layers of at
    most ``W`` positions interleaved with global ones): the windowed layers' KV is a second
    group with its own pool (``window_pool_blocks``) and tables (the step inputs
    ``window_slot_mapping`` and ``window_block_tables``), released the same way, while the
    ``num_blocks`` pool keeps every position.

    Raises ``ContextLengthError`` for a prompt past ``max_model_len`` or a request too big for
    the pool, ``ConfigError`` for a bad setting and ``ValueError`` for a bad call.
    """

    def __new__(
        cls,
        *,
        max_num_seqs: int,
        max_batched_tokens: int,
        max_step_tokens: int,
        max_model_len: int,
        block_size: int,
        num_blocks: int,
        enable_prefix_caching: bool = False,
        model_key: int = 0,
        kv_window: int | None = None,
        window_group: int | None = None,
    ) -> Scheduler: ...
    def add_request(
        self,
        request_id: int,
        prompt_ids: Sequence[int],
        max_tokens: int,
        *,
        eos_ids: Sequence[int] = ...,
        stop_ids: Sequence[int] = ...,
        ignore_eos: bool = False,
    ) -> None: ...
    def abort(self, request_id: int) -> bool: ...
    # The next step as plain data (one crossing): request_ids, row_tokens, sample, preempted,
    # num_tokens, num_cached_tokens, dims (tokens, seqs, max_blocks; padded) and inputs (the
    # step graph's int32 arrays at those dims). poot.runner.SchedulerOutput wraps it.
    def schedule(self) -> dict[str, Any]: ...
    def update(
        self, sampled: Sequence[tuple[int, int]]
    ) -> list[tuple[int, int, Literal["stop", "length"] | None]]: ...
    @property
    def num_blocks(self) -> int: ...
    # Blocks the runtime's KV pool holds: the usable ones and the reserved null block 0.
    @property
    def pool_blocks(self) -> int: ...
    @property
    def used_blocks(self) -> int: ...
    # Blocks of each windowed layer's pool (window_group; the null block included), else 0.
    @property
    def window_pool_blocks(self) -> int: ...
    @property
    def used_window_blocks(self) -> int: ...
    @property
    def free_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def has_unfinished_requests(self) -> bool: ...
    @property
    def step_in_flight(self) -> bool: ...
    def stats(self) -> dict[str, int]: ...

# StepShape's fields in order: tokens, seqs, max_blocks, kind, adjust, masked, logprobs.
_PlanKey = tuple[int, int, int, str, int, bool, int]

@final
class StepDriver:
    """One call per step over a ``Scheduler`` (shared) and a runtime: schedules, draws and
    lays out the step, runs its plan (``plan_for(key, uses) -> (plan, held_keys)`` on a miss;
    ``fill_mask(rows, seqs)`` while a masked step runs) and applies the sampled tokens,
    bringing back the prompt-logprob chunks' logits and ``logits_for``'s row when asked. Keeps
    each request's sampling state (numpy's ``PCG64`` stream continued, penalty counts, logit
    bias). A step that needs the host comes back unrun (``ran`` False) for the caller to run
    and ``update``.

    Raises ``ValueError`` for a bad call (a non-PCG64 ``rng_state``, a duplicate request, a bad
    ``timeout_s``), the scheduler's errors, and whatever the run or ``plan_for`` raises (the
    step is then left in flight: end ``step_rows`` and close it).
    """

    def __new__(
        cls,
        scheduler: Scheduler,
        runtime: Any,
        plan_for: Callable[[_PlanKey, list[tuple[_PlanKey, int]]], tuple[Any, list[_PlanKey]]],
        fill_mask: Callable[[list[tuple[int, int]], int], npt.NDArray[Any]],
        *,
        timeout_s: float,
        samples_on_device: bool,
        logprob_width: int,
        host_runtime: CpuRuntime | None = None,
    ) -> StepDriver: ...
    # host_runtime: where split steps sample (a runtime without the logit ops).
    def set_runtime(
        self, runtime: Any, samples_on_device: bool, host_runtime: CpuRuntime | None = None
    ) -> None: ...
    def add_request(
        self,
        request_id: int,
        prompt_ids: Sequence[int],
        max_tokens: int,
        *,
        eos_ids: Sequence[int] = ...,
        stop_ids: Sequence[int] = ...,
        ignore_eos: bool = False,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        repetition: float,
        presence: float,
        frequency: float,
        bias: Sequence[tuple[int, float]],
        rng_state: Mapping[str, Any],
        logprobs: bool,
        prompt_logprobs: bool,
        guided: bool,
    ) -> None: ...
    def abort(self, request_id: int) -> bool: ...
    def step(
        self, fast: bool = True, forget: Sequence[_PlanKey] = ..., logits_for: int | None = None
    ) -> dict[str, Any]: ...
    def update(
        self, sampled: Sequence[tuple[int, int]]
    ) -> list[tuple[int, int, Literal["stop", "length"] | None]]: ...
    @property
    def step_rows(self) -> list[int]: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def decode_tokens(self) -> int: ...
    def take_plan_uses(self) -> list[tuple[_PlanKey, int]]: ...
    @property
    def plan_keys(self) -> list[_PlanKey]: ...

def _mapping_probe(variant: str) -> None: ...
