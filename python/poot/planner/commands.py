"""``poot doctor`` and ``poot validate-hardware`` (registered by ``poot.cli``).

``doctor`` lists what is visible (discovery) and whether each device has a validated profile for
this poot version; it runs nothing on a device. ``validate-hardware`` runs the conformance
subset and benchmarks (``validate``; wgpu adapters in ``validate_wgpu``), stores the profiles of
devices that pass and exits 1 when any device failed (a device with no runtime in this build is
skipped, not failed).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_commands", "doctor_report"]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n else "-"


def doctor_report() -> dict[str, Any]:
    """Discovery plus profile state, as plain data (``doctor --json``)."""
    from poot import _native
    from poot.build import build_profile
    from poot.planner.discovery import discover
    from poot.planner.profiles import load_profile, profile_path

    disc = discover()
    devices = []
    for d in disc.devices:
        p = load_profile(d, _native.__version__)
        devices.append(
            {
                "key": d.key,
                "kind": d.kind,
                "name": d.name,
                "vendor": d.vendor,
                "driver": d.driver,
                "memory_bytes": d.memory_bytes,
                "cores": d.cores,
                "features": list(d.features),
                "limits": d.limits,
                "software": d.software,
                "status": "validated" if p is not None and p.validated else "visible",
                "profile": str(profile_path(d, _native.__version__)) if p is not None else None,
            }
        )
    return {
        "poot_version": _native.__version__,
        "build_profile": build_profile(),
        "host_memory_bytes": disc.host_memory_bytes,
        "host_available_bytes": disc.host_available_bytes,
        "devices": devices,
        "notes": disc.notes,
    }


def _cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor_report()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = [("DEVICE", "KIND", "NAME", "MEMORY", "CORES", "FEATURES", "STATUS")]
    for d in report["devices"]:
        feats = ",".join(d["features"]) or "-"
        rows.append(
            (d["key"], d["kind"], d["name"][:40], _gib(d["memory_bytes"]), str(d["cores"] or "-"),
             feats[:48], d["status"])
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(
        f"host memory: {_gib(report['host_memory_bytes'])} total, "
        f"{_gib(report['host_available_bytes'])} available"
    )
    for src, note in report["notes"].items():
        print(f"{src}: {note}")
    print(f"native build: {report['build_profile']}", end="")
    print(
        " (10-50x slower: rebuild with `make build`)" if report["build_profile"] == "debug" else ""
    )
    if any(d["status"] == "visible" for d in report["devices"]):
        print("visible devices are not validated: run `poot validate-hardware`")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from poot.planner.validate import validate_all

    reports = validate_all(quick=args.quick, vulkan=args.vulkan)
    failed = False
    out = []
    for r in reports:
        failed |= r.status == "failed"
        entry: dict[str, Any] = {"key": r.device.key, "name": r.device.name, "status": r.status}
        entry.update(checks=r.checks, note=r.note, stored=str(r.stored) if r.stored else None)
        if r.profile is not None:
            p = r.profile
            entry["profile"] = {
                "read_bw_gbps": round(p.read_bw / 1e9, 2),
                "copy_bw_gbps": round(p.copy_bw / 1e9, 2),
                "gemv_gbps": {k: round(v / 1e9, 2) for k, v in p.gemv_bw.items()},
                "gemm_gflops": {k: round(v / 1e9, 2) for k, v in p.gemm_flops.items()},
                "dispatch_us": round(p.dispatch_s * 1e6, 3),
                "matmul_us": round(p.matmul_s * 1e6, 3),
                "segment_us": round(p.segment_s * 1e6, 3),
                "stage_gbps": round(p.stage_bw / 1e9, 2),
                "stage_us": round(p.stage_s * 1e6, 3),
                "overlap_slowdown": p.overlap_slowdown
                and [round(x, 2) for x in p.overlap_slowdown],
                "link_gbps": round(p.link_bw / 1e9, 3),
                "link_latency_us": round(p.link_latency_s * 1e6, 3),
            }
        out.append(entry)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for e in out:
            print(
                f"{e['key']} ({e['name']}): {e['status']}{' - ' + e['note'] if e['note'] else ''}"
            )
            for name, res in e["checks"].items():
                print(f"  {name}: {res}")
            for k, v in e.get("profile", {}).items():
                print(f"  {k}: {v}")
            if e["stored"]:
                print(f"  profile stored: {e['stored']}")
    return 1 if failed else 0


def add_commands(sub: Any) -> None:
    """Adds ``doctor`` and ``validate-hardware`` to the ``poot`` subparsers."""
    import argparse

    def examples(*lines: str) -> dict[str, Any]:
        text = "examples:\n" + "\n".join(f"  {line}" for line in lines)
        return {"epilog": text, "formatter_class": argparse.RawDescriptionHelpFormatter}

    p = sub.add_parser(
        "doctor",
        **examples("poot doctor", "poot doctor --json | python -m json.tool"),
        help="list visible devices and whether each is validated",
        description="Discovery: the CPU (cores, SIMD/matrix features, memory), wgpu adapters "
        "and CUDA devices where a driver exists. Runs nothing on a device; a device is "
        "'validated' once `poot validate-hardware` stored its profile for this poot version.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=_cmd_doctor)
    p = sub.add_parser(
        "validate-hardware",
        **examples("poot validate-hardware", "poot validate-hardware --quick --json"),
        help="run conformance checks and micro-benchmarks; store device profiles",
        description="For each visible device with a runtime in this build: the backend "
        "conformance subset, then read bandwidth, matmul throughput per dtype and host<->device "
        "transfer. Profiles are stored in the cache keyed by device, driver and poot version. "
        "Exits 1 if any device failed.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--quick", action="store_true", help="smaller benchmark buffers")
    p.add_argument(
        "--vulkan",
        action="store_true",
        help="also profile raw Vulkan devices (vulkan:N; not production), which makes them "
        "eligible for the planner",
    )
    p.set_defaults(func=_cmd_validate)
