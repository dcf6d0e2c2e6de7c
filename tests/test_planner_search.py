"""The planner reproduces the known cases on synthetic profiles, and its parts keep their
invariants (cost model, search, discrete-event simulation, NullRuntime, explain)."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_fixtures import GB, cpu, gpu, host, lavapipe, scaled_stats

from poot.errors import CapacityError, PlannerError
from poot.planner import CompileConfig, NullRuntime, Workload
from poot.planner.compiled import compile, place
from poot.planner.cost import Placement, Segment, step_cost
from poot.planner.search import Budgets, search
from poot.planner.simulate import Task, run_tasks, simulate_step


@pytest.fixture(scope="module")
def gguf(stories: Path) -> Path:
    return stories / "stories260K-Q8_0.gguf"


@pytest.fixture(scope="module")
def model4g(gguf: Path):  # type: ignore[no-untyped-def]
    return scaled_stats(gguf, 4 * GB)


def _place(stats, profiles, config=None, tmp=Path("/tmp")):  # type: ignore[no-untyped-def]
    return place(stats, {p.key: p for p in profiles}, host(), config or CompileConfig(), tmp)


def test_fits_one_fast_gpu_goes_there(model4g) -> None:  # type: ignore[no-untyped-def]
    placed = _place(model4g, [cpu(), gpu()])
    assert placed.chosen.placement.devices == ("cuda:0",)
    assert not placed.chosen.placement.segments[0].streamed
    assert "cpu" in placed.dropped and "costs" in placed.dropped["cpu"]


def test_two_gpus_over_a_slow_link_lose_to_one(model4g) -> None:  # type: ignore[no-untyped-def]
    a = gpu("cuda:0", peer={"cuda:1": 0.5e9})
    b = gpu("cuda:1", peer={"cuda:0": 0.5e9})
    placed = _place(model4g, [cpu(), a, b])
    assert len(placed.chosen.placement.devices) == 1
    split = [c for c in placed.candidates if set(c.placement.devices) == {"cuda:0", "cuda:1"}]
    assert split, "the two-GPU splits were considered"
    assert min(c.cost.total_s for c in split) > placed.chosen.cost.total_s
    assert min(c.cost.transfer_s for c in split) > 0


def test_fits_ram_not_vram_cpu_beats_streaming_over_pcie(model4g) -> None:  # type: ignore[no-untyped-def]
    placed = _place(model4g, [cpu(), gpu(memory=2 * GB)])
    by = {c.placement.devices: c for c in placed.candidates}
    gpu_only, cpu_only = by[("cuda:0",)], by[("cpu",)]
    assert gpu_only.placement.segments[0].residency == "host"  # streamed over PCIe
    assert cpu_only.cost.total_s < gpu_only.cost.total_s
    chosen = placed.chosen.placement
    assert not any(s.streamed and s.device == "cuda:0" for s in chosen.segments)
    assert placed.chosen.score < gpu_only.cost.total_s


def test_lavapipe_is_dropped_for_the_cpu(model4g) -> None:  # type: ignore[no-untyped-def]
    placed = _place(model4g, [cpu(), lavapipe()])
    assert placed.chosen.placement.devices == ("cpu",)
    assert "costs" in placed.dropped["wgpu:0"]
    # Its segments run between the CPU's (never at once), so a split pays no contention, only
    # the adapter's slower compute and the transfers: it still loses.
    both = [c for c in placed.candidates if len(c.placement.devices) == 2]
    assert both and all(c.cost.contention_s == 0 for c in both)
    assert all(c.cost.total_s > placed.chosen.cost.total_s for c in both)


def test_real_lavapipe_here_is_not_validated(gguf: Path) -> None:
    compiled = compile(gguf, CompileConfig())
    assert compiled.placement.devices == ("cpu",)
    for key, why in compiled.dropped.items():
        assert key != "cpu"
        assert "not validated" in why or "validate-hardware" in why or "costs" in why


def test_allow_gpu_and_mixed_vendor(model4g) -> None:  # type: ignore[no-untyped-def]
    placed = _place(model4g, [cpu(), gpu()], CompileConfig(allow_gpu=False))
    assert placed.chosen.placement.devices == ("cpu",)
    assert placed.dropped["cuda:0"] == "allow_gpu=False"
    other = gpu("wgpu:1", memory=2 * GB)
    other = type(other)(**{**other.to_json(), "vendor": "amd", "kind": "wgpu"})
    placed = _place(model4g, [cpu(), gpu(memory=2 * GB), other])
    assert not any({"cuda:0", "wgpu:1"} <= set(c.placement.devices) for c in placed.candidates)
    placed = _place(
        model4g, [cpu(), gpu(memory=2 * GB), other], CompileConfig(allow_mixed_vendor=True)
    )
    assert any({"cuda:0", "wgpu:1"} <= set(c.placement.devices) for c in placed.candidates)


def test_every_candidate_covers_every_unit_once_within_budgets(model4g) -> None:  # type: ignore[no-untyped-def]
    profiles = {p.key: p for p in (cpu(memory=3 * GB), gpu(memory=2 * GB))}
    budgets = Budgets({"cpu": 3 * GB, "cuda:0": 2 * GB}, host=64 * GB, disk=100 * GB)
    result = search(model4g, profiles, host(), budgets)
    assert result.candidates
    n = len(model4g.units)
    for c in result.candidates:
        covered = [u for s in c.placement.segments for u in range(s.start, s.end)]
        assert covered == list(range(n))
        for s in c.placement.segments:
            if s.streamed:
                assert all(
                    model4g.bytes_of(a, b) <= budgets.device[s.device] // 2 for a, b in s.chunks
                )
            else:
                assert model4g.bytes_of(s.start, s.end) <= budgets.device[s.device]


def test_nothing_fits_is_a_typed_error(model4g) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlannerError) as e:
        _place(model4g, [cpu(memory=1000)])
    assert "cpu" in e.value.reasons
    with pytest.raises(CapacityError) as c:
        _place(model4g, [cpu(memory=1 * GB)], CompileConfig(disk_budget_bytes=0))
    assert c.value.pool == "disk" and c.value.limit == 0


def test_zero_device_budget_fails_closed(gguf: Path) -> None:
    with pytest.raises(CapacityError) as e:
        compile(gguf, CompileConfig(device_budget_bytes=0))
    assert e.value.pool == "device" and e.value.requested > 0 and e.value.available == 0


def test_simulation_double_buffer_overlaps_and_orders(model4g) -> None:  # type: ignore[no-untyped-def]
    placed = _place(model4g, [cpu(memory=2 * GB)])
    seg = placed.chosen.placement.segments[0]
    assert seg.streamed and len(seg.chunks) >= 3
    sim = simulate_step(model4g, placed.chosen.placement, placed.eligible, host())
    loads = [s for s in sim.spans if s.kind == "load"]
    computes = [s for s in sim.spans if s.kind == "compute"]
    assert len(loads) == len(seg.chunks)
    # A load of chunk i + 2 starts only after chunk i's last unit computed.
    ends = []
    for a, b in seg.chunks:
        names = {model4g.units[u].name for u in range(a, b)}
        ends.append(max(s.end for s in computes if s.label in names))
    for i in range(2, len(loads)):
        assert loads[i].start >= ends[i - 2] - 1e-12
    # Loading overlaps computing: the step is shorter than loads + computes in series.
    serial = sum(s.end - s.start for s in loads) + sum(s.end - s.start for s in computes)
    assert sim.total_s < serial


def test_des_serializes_a_resource_and_respects_deps() -> None:
    r = run_tasks([Task("a", "x", 1.0), Task("b", "x", 1.0), Task("c", "y", 0.5, [0])])
    spans = {s.label: s for s in r.spans}
    assert spans["b"].start == 1.0 and spans["c"].start == 1.0 and r.total_s == 2.0


def test_null_runtime_matches_the_cost_model(gguf: Path, model4g) -> None:  # type: ignore[no-untyped-def]
    from poot import _native
    from poot.checkpoints import resolve_model_files
    from poot.models import model_definition

    files = resolve_model_files(gguf)
    p = gpu()
    sizes = model4g.sizes
    rt = NullRuntime(p, sizes, context=Workload().context)
    shape = Workload().shape()
    assert files.gguf is not None
    w = _native.Weights(files.gguf)
    t = _native.Tracer(w, shape.tokens)
    model_definition(files).trace(t, shape)
    plan = rt.prepare(t.finish(), w)
    out = rt.run(plan, {})
    assert out["token_ids"].shape == (1,)
    placement = Placement((Segment("cuda:0", 0, len(model4g.units)),))
    cost = step_cost(model4g, placement, {"cuda:0": p}, host())
    modeled = cost.total_s - cost.transfer_s
    assert rt.clock_s == pytest.approx(modeled, rel=0.02)


def test_explain_names_choice_runner_up_costs_and_drops(gguf: Path) -> None:
    compiled = compile(gguf, CompileConfig(), profiles=[cpu(), lavapipe()], host=host())
    text = compiled.explain()
    assert "chosen: cpu [pre..post] resident" in text
    assert "runner-up:" in text and "wgpu:0" in text
    assert "ms" in text and "dropped:" in text
    assert "path: direct" in text
    assert compiled.direct


def test_the_kv_pool_counts_against_each_device_budget(gguf: Path) -> None:
    from planner_fixtures import kv_bytes

    from poot.planner.compiled import standing_bytes

    stats = scaled_stats(gguf, 4 * GB, Workload(rows=8, context=4096))
    kv = kv_bytes(gguf, Workload(rows=8, context=4096))
    assert kv == stats.kv_of(0, len(stats.units)) > 0
    # Weights alone fit 4.5 GB; with the KV pool of 8 x 4096 positions they stream.
    fits = stats.total_weight_bytes + kv
    near = cpu(memory=fits - 1)
    placed = _place(stats, [near])
    assert placed.chosen.placement.segments[0].streamed
    placed = _place(stats, [cpu(memory=fits)])
    assert not placed.chosen.placement.segments[0].streamed
    held = standing_bytes(stats, placed.chosen.placement)
    assert held == {"cpu": fits}
    # A split keeps each segment's layers' KV on its own device.
    split = Placement((Segment("cpu", 0, 3), Segment("cuda:0", 3, len(stats.units))))
    held = standing_bytes(stats, split)
    assert held["cpu"] == stats.bytes_of(0, 3) + stats.kv_of(0, 3)
    assert held["cuda:0"] - stats.bytes_of(3, len(stats.units)) == stats.kv_of(3, len(stats.units))
    # A budget the KV alone fills holds nothing.
    with pytest.raises(PlannerError, match="KV pool"):
        _place(stats, [cpu(memory=kv)], CompileConfig(disk_budget_bytes=10 * GB))


def test_force_placement_pins_a_split_and_is_checked(model4g) -> None:  # type: ignore[no-untyped-def]
    from poot.errors import ConfigError

    n = len(model4g.units)
    spec = (("cpu", 0, 3), ("cuda:0", 3, n))
    placed = _place(model4g, [cpu(), gpu()], CompileConfig(force_placement=spec))
    assert [(s.device, s.start, s.end) for s in placed.chosen.placement.segments] == list(spec)
    assert len(placed.candidates) == 1 and placed.chosen.simulated_s is not None
    with pytest.raises(PlannerError, match="not eligible") as e:
        _place(model4g, [cpu()], CompileConfig(force_placement=spec))
    assert "cuda:0" in e.value.reasons
    with pytest.raises(ConfigError, match=f"must end at unit {n}"):
        _place(model4g, [cpu()], CompileConfig(force_placement=(("cpu", 0, 3),)))
    for bad in [
        (("cpu", 1, n),),
        (("cpu", 0, 3), ("cuda:0", 4, n)),
        (("cpu", 0, 3), ("cpu", 3, n)),
    ]:
        with pytest.raises(ConfigError, match="force_placement"):
            CompileConfig(force_placement=bad)
