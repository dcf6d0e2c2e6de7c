"""``poot.compile``: a model, the devices, the budgets and the workload in; a placement out.

``compile`` traces one step of the workload to get per-unit bytes and FLOPs (``graphstats``),
gathers device profiles (stored by ``validate-hardware``; the CPU estimated when it has none;
tests pass synthetic ones), filters the devices the config allows, searches placements
(``search``), re-ranks the best few by a discrete-event simulation of one step (``simulate``) and
returns a ``CompiledModel``: the choice, the runner-up, why each device was dropped, the
simulated timeline, and the ledger its forwards lease from.

Invariants: a zero device budget, or a zero disk budget where only streaming plans exist, fails
closed (``CapacityError`` naming the pool) rather than meaning "unlimited" (``None`` does); a
streaming plan's spill directory is checked (``spill.check_spill_dir``) before it is returned.
"""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from poot import _native
from poot.checkpoints import ModelFiles, resolve_model_files
from poot.config import Settings
from poot.errors import CapacityError, ConfigError, PlannerError
from poot.models import model_definition
from poot.planner.cost import Placement
from poot.planner.discovery import Discovery, discover
from poot.planner.explain import versus
from poot.planner.graphstats import ModelStats, Workload, model_stats
from poot.planner.ledger import CapacityLedger, Generations
from poot.planner.profiles import DeviceProfile, HostProfile, estimated_cpu_profile, load_profile
from poot.planner.record import Recorder
from poot.planner.search import Budgets, Candidate, SearchResult, forced, search
from poot.planner.simulate import SimResult, simulate_step
from poot.planner.spill import check_spill_dir

if TYPE_CHECKING:
    from torch.nn import Module as TorchModule

    from poot.torch_frontend import CompiledModule

__all__ = ["CompileConfig", "CompiledModel", "Placed", "compile", "place", "standing_bytes"]

TOP_SIMULATED = 3
_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CompileConfig:
    """What the planner may use.

    Attributes:
        allow_gpu: consider GPUs (wgpu, CUDA) at all.
        allow_mixed_vendor: allow GPUs of different vendors in one plan.
        planner_workers: threads simulating candidates (0 = automatic: up to 4, by cores).
        device_budget_bytes: bytes of weights, buffers and the KV pool of its layers, per
            device (None: its memory; 0 fails).
        host_budget_bytes: host bytes for weights streamed from RAM and activations (None: RAM).
        disk_budget_bytes: spill bytes (None: the spill disk's free space; 0: no spilling).
        spill_dir: where streamed weights' buffer files go (None: ``<cache>/spill``).
        allow_tmpfs_spill: accept a tmpfs spill dir (refused otherwise).
        stall_timeout_s: a wait with no progress for this long raises ``Stalled``.
        rows, context: the workload a step is planned for (tokens per step, KV positions read).
        force_placement: pins the plan instead of searching: ``(device key, start unit, end
            unit)`` per segment in step order, covering units ``0 .. n_layers + 2`` (unit 0 the
            embedding, unit ``i + 1`` layer ``i``, the last the head), each device at most once,
            e.g. ``(("cpu", 0, 3), ("wgpu:0", 3, 7))``. Each range is resident where it fits the
            device's budget, else streamed; the pinned plan is costed, simulated and explained
            like a searched one. For tests and for pinning a known split; None searches.
        allow_training: a ``torch.nn.Module`` compiled with this may be trained
            (``CompiledModule.train_step``); refused otherwise.
    """

    allow_gpu: bool = True
    allow_mixed_vendor: bool = False
    planner_workers: int = 0
    device_budget_bytes: int | None = None
    host_budget_bytes: int | None = None
    disk_budget_bytes: int | None = None
    spill_dir: str | os.PathLike[str] | None = None
    allow_tmpfs_spill: bool = False
    stall_timeout_s: float = 30.0
    rows: int = 1
    context: int = 256
    force_placement: tuple[tuple[str, int, int], ...] | None = None
    allow_training: bool = False

    def __post_init__(self) -> None:
        for name in ("device_budget_bytes", "host_budget_bytes", "disk_budget_bytes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"CompileConfig.{name} must be >= 0 or None, got {v}")
        if not self.stall_timeout_s > 0:
            raise ConfigError(
                f"CompileConfig.stall_timeout_s must be > 0, got {self.stall_timeout_s}"
            )
        if self.planner_workers < 0 or self.rows < 1 or self.context < 1:
            raise ConfigError(
                f"CompileConfig: planner_workers={self.planner_workers} must be >= 0, "
                f"rows={self.rows} and context={self.context} >= 1"
            )

        if self.force_placement is not None:
            # Stored as plain tuples (lists are accepted): the config stays hashable.
            object.__setattr__(self, "force_placement", _placement_spec(self.force_placement))

    def workers(self) -> int:
        if self.planner_workers > 0:
            return self.planner_workers
        return max(1, min(4, len(os.sched_getaffinity(0))))


@dataclass
class Placed:
    """What ``place`` decided: the devices it could use (``eligible``), the budgets, the
    chosen candidate, the runner-up, every candidate weighed, why each device left out was
    dropped, and the chosen one's simulated step."""

    eligible: dict[str, DeviceProfile]
    budgets: Budgets
    chosen: Candidate
    runner_up: Candidate | None
    candidates: list[Candidate]
    dropped: dict[str, str]
    simulation: SimResult

    @property
    def profiles(self) -> dict[str, DeviceProfile]:
        """The devices the placement could use (``eligible``)."""
        return self.eligible


@dataclass
class CompiledModel(Placed):
    """A placed model: what was chosen and why (``Placed``), and the ledger its forwards
    lease from."""

    files: ModelFiles
    definition: Any
    weights: _native.Weights
    config: CompileConfig
    stats: ModelStats
    host: HostProfile
    spill_dir: Path | None
    ledger: CapacityLedger
    generations: Generations = field(default_factory=Generations)
    recorder: Recorder = field(default_factory=Recorder)

    @property
    def placement(self) -> Placement:
        return self.chosen.placement

    @property
    def streams(self) -> bool:
        """Whether any segment streams its weights."""
        return any(s.streamed for s in self.placement.segments)

    @property
    def direct(self) -> bool:
        """A single resident segment: runs with no segmenting, loader or buffer."""
        return len(self.placement.segments) == 1 and not self.streams

    @property
    def simulated_step_s(self) -> float:
        return self.simulation.total_s

    def cancel(self, generation: int) -> bool:
        """Cancels one forward (its generation); others are untouched."""
        return self.generations.cancel(generation)

    def explain(self) -> str:
        """What was chosen, the runner-up, the cost of each, and why each device was dropped."""
        from poot.planner.explain import explain

        return explain(self)

    def visualize(self, path: str | os.PathLike[str], measured: bool = False) -> Path:
        """Writes a self-contained HTML timeline of one step (simulated, or as last measured)."""
        from poot.planner.visualize import write_timeline

        return write_timeline(self, Path(path), measured=measured)


def _placement_spec(spec: Any) -> tuple[tuple[str, int, int], ...]:
    """``spec`` as ``(device, start, end)`` triples, checked: in step order, contiguous from
    unit 0, each device once (whether it ends at the model's last unit is checked when
    placing, where the model is known)."""
    try:
        segs = tuple((str(d), int(a), int(b)) for d, a, b in spec)
    except (TypeError, ValueError):
        segs = ()
    keys = [x[0] for x in segs]
    ok = bool(segs) and len(set(keys)) == len(keys) and segs[0][1] == 0
    ok = ok and all(a < b for _, a, b in segs)
    ok = ok and all(x[2] == y[1] for x, y in zip(segs, segs[1:], strict=False))
    if not ok:
        raise ConfigError(
            "CompileConfig.force_placement must be (device, start, end) triples in step order, "
            f"contiguous from unit 0, each device once; got {spec!r}"
        )
    return segs


def _profiles_from(
    disc: Discovery, version: str, settings: Settings
) -> tuple[dict[str, DeviceProfile], dict[str, str]]:
    profiles: dict[str, DeviceProfile] = {}
    dropped: dict[str, str] = {}
    for d in disc.devices:
        p = load_profile(d, version, settings)
        if p is None and d.kind == "cpu":
            p = estimated_cpu_profile(d)
        if p is None:
            why = "visible, not validated (run `poot validate-hardware`)"
            if d.kind == "wgpu" and "no wgpu runtime" in disc.notes.get("wgpu", ""):
                why = "visible, not validated: no wgpu runtime in this build"
            if d.kind == "vulkan":
                why = "visible, not validated (raw Vulkan: `poot validate-hardware --vulkan`)"
            dropped[d.key] = why
        else:
            profiles[d.key] = p
    return profiles, dropped


def _is_torch_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


@overload
def compile(  # noqa: A001
    model_spec: str | os.PathLike[str] | ModelFiles | None = None,
    config: CompileConfig | None = None,
    *,
    profiles: list[DeviceProfile] | None = None,
    host: HostProfile | None = None,
    definition: Any = None,
    weights: _native.Weights | None = None,
    settings: Settings | None = None,
    kv_pool: tuple[int, dict[str, int]] | None = None,
) -> CompiledModel: ...


@overload
def compile(  # noqa: A001
    model_spec: TorchModule,
    config: Any = None,
    *,
    example_inputs: Any = None,
    trace_limits: _native.TraceLimits | None = None,
    compile_limits: _native.CompileLimits | None = None,
    runtime: Any = None,
) -> CompiledModule: ...


def compile(  # noqa: A001 - the public name the issue asks for (poot.compile)
    model_spec: Any = None,
    config: Any = None,
    *,
    profiles: list[DeviceProfile] | None = None,
    host: HostProfile | None = None,
    definition: Any = None,
    weights: _native.Weights | None = None,
    settings: Settings | None = None,
    kv_pool: tuple[int, dict[str, int]] | None = None,
    example_inputs: Any = None,
    trace_limits: _native.TraceLimits | None = None,
    compile_limits: _native.CompileLimits | None = None,
    runtime: Any = None,
) -> CompiledModel | CompiledModule:
    """Places ``model_spec`` under ``config``; see the module docs.

    Args:
        model_spec: a model spec (as ``poot.LLM`` takes) or resolved ``ModelFiles``; or a
            ``torch.nn.Module``, compiled through ``torch.export`` for ``example_inputs``
            (given second or by keyword) into a ``poot.CompiledModule`` on the CPU runtime
            (``poot.torch_frontend``; ``trace_limits`` and ``compile_limits`` bound it,
            ``runtime`` is the runtime it is prepared for (default a ``CpuRuntime``), and a
            ``config`` is accepted but places nothing yet).
        config: what the planner may use (default ``CompileConfig()``).
        profiles: device profiles to plan over instead of discovering (synthetic, in tests).
        host: the host side of streaming (default: from discovery / measured copy rates).
        definition, weights: an already-loaded definition and weights (``LLM`` passes its own).
        settings: where stored profiles and the default spill dir live.
        kv_pool: the KV pool the runtimes will hold, as ``(positions, bytes per entry by
            device kind)`` (``LLM`` passes its blocks times block size); None: the workload's
            ``rows * context`` positions in f32.

    Raises:
        CapacityError: a zero device budget, or a zero disk budget with only streaming plans.
        PlannerError: no device can hold the model under the budgets.
        SpillDirError: a streaming plan's spill dir is unusable (or tmpfs).
    """
    if _is_torch_module(model_spec):
        # poot.compile(module, example_inputs, config=...): the torch front end.
        from poot.torch_frontend import compile_module

        if example_inputs is None and not isinstance(config, CompileConfig):
            example_inputs, config = config, None
        return compile_module(
            model_spec,
            example_inputs,
            trace_limits=trace_limits,
            compile_limits=compile_limits,
            runtime=runtime,
            config=config,
        )
    config = config or CompileConfig()
    settings = settings or Settings.from_env()
    files = model_spec if isinstance(model_spec, ModelFiles) else resolve_model_files(model_spec)
    definition = definition or model_definition(files)
    if weights is None:
        source = files.gguf if files.gguf is not None else files.safetensors
        assert source is not None
        weights = _native.Weights(source)
    sizes = {t.name: t.nbytes for t in files.tensors()}
    positions, entries = kv_pool or (0, {})
    workload = Workload(config.rows, config.context, kv_positions=positions,
                        kv_entry_bytes=tuple(sorted(entries.items())))  # fmt: skip
    stats = model_stats(definition, weights, sizes, workload)
    if config.device_budget_bytes == 0:
        raise CapacityError(
            f"device budget is 0 B (fails closed): the model needs {stats.total_weight_bytes} B "
            "of weights, streamed or resident",
            pool="device", requested=stats.total_weight_bytes, available=0, limit=0,
        )  # fmt: skip
    if profiles is None:
        disc = discover()
        found, dropped = _profiles_from(disc, _native.__version__, settings)
        cpu = found.get("cpu")
        copy = cpu.copy_bw if cpu is not None and cpu.copy_bw > 0 else HostProfile(0).copy_bw
        host = host or HostProfile(disc.host_available_bytes, copy_bw=copy)
    else:
        found, dropped = {p.key: p for p in profiles}, {}
        host = host or HostProfile(max((p.memory_bytes for p in profiles if p.is_host), default=0))
    spill = Path(config.spill_dir) if config.spill_dir is not None else settings.cache_dir / "spill"
    placed = place(stats, found, host, config, spill, dropped)
    chosen = placed.chosen
    streams = any(s.streamed for s in chosen.placement.segments)
    spill_dir = check_spill_dir(spill, allow_tmpfs=config.allow_tmpfs_spill) if streams else None
    ledger = CapacityLedger(
        host=config.host_budget_bytes,
        device=config.device_budget_bytes,
        disk=config.disk_budget_bytes,
        devices=chosen.placement.devices,
    )
    # Resident weights and each device's KV pool hold their device bytes for the model's life
    # (one standing lease); forwards then lease only what they add. The search already fit
    # them in each device's budget.
    ledger.resident = ledger.lease(devices=standing_bytes(stats, chosen.placement))
    return CompiledModel(
        **vars(placed), files=files, definition=definition, weights=weights, config=config,
        stats=stats, host=host, spill_dir=spill_dir, ledger=ledger,
    )  # fmt: skip


def standing_bytes(stats: ModelStats, placement: Placement) -> dict[str, int]:
    """Per device, the bytes a placement holds for the model's life: its resident segments'
    weights and the KV pool of every segment's layers."""
    held: dict[str, int] = {}
    for s in placement.segments:
        n = stats.kv_of(s.start, s.end, s.device)
        n += 0 if s.streamed else stats.bytes_of(s.start, s.end)
        held[s.device] = held.get(s.device, 0) + n
    return held


def place(
    stats: ModelStats,
    found: dict[str, DeviceProfile],
    host: HostProfile,
    config: CompileConfig,
    spill: Path,
    dropped: dict[str, str] | None = None,
) -> Placed:
    """The placement decision for ``stats`` over ``found`` profiles (no model files needed).

    Raises:
        CapacityError: a zero disk budget where only streaming plans exist.
        PlannerError: nothing fits.
    """
    dropped = dict(dropped or {})
    eligible = eligible_devices(found, config, dropped)
    budgets = _budgets(config, eligible, host, spill)
    result = search_under(stats, eligible, host, budgets, config, dropped)
    if not result.candidates:
        if config.disk_budget_bytes == 0:
            raise CapacityError(
                f"disk budget is 0 B (fails closed) and no device holds the model's "
                f"{stats.total_weight_bytes} B resident",
                pool="disk", requested=stats.total_weight_bytes, available=0, limit=0,
            )  # fmt: skip
        reasons = {**dropped, **result.infeasible}
        raise PlannerError(
            f"no placement fits: the model needs {stats.total_weight_bytes} B; "
            + "; ".join(f"{k}: {v}" for k, v in reasons.items()),
            reasons=reasons,
        )
    chosen, sim, runner_up = choose(
        stats, result.candidates, eligible, host, config, result.best_with, result.infeasible,
        dropped,
    )  # fmt: skip
    return Placed(eligible, budgets, chosen, runner_up, result.candidates, dropped, sim)


def eligible_devices(
    found: dict[str, DeviceProfile], config: CompileConfig, dropped: dict[str, str]
) -> dict[str, DeviceProfile]:
    """The profiles ``config`` lets the planner use; each other one goes to ``dropped`` with
    its reason (GPUs when ``allow_gpu`` is off, GPUs with only an estimated profile)."""
    eligible: dict[str, DeviceProfile] = {}
    for key, p in found.items():
        if not p.is_host and not config.allow_gpu:
            dropped[key] = "allow_gpu=False"
        elif not p.is_host and p.source == "estimated":
            dropped[key] = "no measured profile (run `poot validate-hardware`)"
        else:
            eligible[key] = p
    return eligible


def search_under(
    stats: ModelStats,
    eligible: dict[str, DeviceProfile],
    host: HostProfile,
    budgets: Budgets,
    config: CompileConfig,
    dropped: dict[str, str],
) -> SearchResult:
    """The candidates: the placement ``config.force_placement`` pins, or the search's."""
    if config.force_placement is not None:
        return forced(stats, eligible, host, budgets, config.force_placement, dropped)
    return search(stats, eligible, host, budgets, allow_mixed_vendor=config.allow_mixed_vendor)


def choose(
    stats: ModelStats,
    candidates: list[Candidate],
    eligible: dict[str, DeviceProfile],
    host: HostProfile,
    config: CompileConfig,
    best_with: dict[str, Candidate],
    infeasible: dict[str, str],
    dropped: dict[str, str],
) -> tuple[Candidate, SimResult, Candidate | None]:
    """The chosen candidate, its simulation and the runner-up: the best ``TOP_SIMULATED``
    candidates (by analytic cost) re-ranked by simulating one step. Each eligible device the
    choice leaves out goes to ``dropped`` with its reason: ``infeasible``'s, or what the best
    candidate using it (``best_with``) costs against the chosen one, and why."""
    top = candidates[:TOP_SIMULATED]
    with ThreadPoolExecutor(config.workers(), thread_name_prefix="poot-plan") as pool:
        sims = list(pool.map(lambda c: simulate_step(stats, c.placement, eligible, host), top))
    for c, s in zip(top, sims, strict=True):
        c.simulated_s = s.total_s
    order = sorted(range(len(top)), key=lambda i: top[i].score)
    chosen, sim = top[order[0]], sims[order[0]]
    runner_up = top[order[1]] if len(order) > 1 else None
    used = [eligible[k] for k in chosen.placement.devices]
    for key in eligible:
        if key in chosen.placement.devices:
            continue
        best = best_with.get(key)
        if best is None:
            dropped[key] = infeasible.get(key, "no feasible placement uses it")
        else:
            dropped[key] = (
                f"best plan using it ({best.placement.describe(stats)}) costs "
                f"{best.score * 1e3:.3f} ms vs {chosen.score * 1e3:.3f} ms chosen; "
                + versus(eligible[key], used, stats)
            )
    return chosen, sim, runner_up


def _budgets(
    config: CompileConfig, eligible: dict[str, DeviceProfile], host: HostProfile, spill: Path
) -> Budgets:
    host_b = config.host_budget_bytes
    if host_b is None:
        host_b = host.memory_bytes or _UNLIMITED
    device: dict[str, int] = {}
    for key, p in eligible.items():
        b = p.memory_bytes or _UNLIMITED
        if config.device_budget_bytes is not None:
            b = min(b, config.device_budget_bytes)
        if p.is_host:
            b = min(b, host_b)
        device[key] = b
    disk = config.disk_budget_bytes
    if disk is None:
        probe = spill if spill.exists() else next((a for a in spill.parents if a.exists()), spill)
        try:
            disk = shutil.disk_usage(probe).free
        except OSError:
            disk = 0
    return Budgets(device, host_b, disk)
