"""``hwlab doctor``: system state, topology, ceilings, a quick probe and a verdict.

Exit codes: 0 healthy (or no GPU: nothing to judge), 1 a health finding (a throttle reason,
ECC/remap warnings, a card under ``SLOW_CARD_PCT`` of its datasheet copy rate), 2 bad input
(``--save`` somewhere that cannot take the file: refused before anything is measured).

Ceilings come from this machine's cache when present: they are shown as *cached* with their
age (a ceiling measured last week under another driver is not today's), and ``--remeasure``
measures them again.
"""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import ceilings as ceil_mod
from .console import Steps, print_json
from .errors import EXIT_FINDING, EXIT_OK, EXIT_USAGE
from .store import check_destination, rescue_json


def _age(measured_at: str) -> tuple[float | None, str]:
    try:
        t = datetime.fromisoformat(measured_at)
    except (TypeError, ValueError):
        return None, "age unknown"
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    s = max((datetime.now(timezone.utc) - t).total_seconds(), 0.0)
    for unit, n in (("day", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            v = s / n
            return s, f"{v:.0f} {unit}{'s' if unit == 'day' and round(v) != 1 else ''} old"
    return s, f"{s:.0f} s old"


def _n_ceiling_steps() -> int:
    import torch

    from .probes import fp8_supported

    if not torch.cuda.is_available():
        return 2  # copy, gemm fp32
    return 1 + 3 + fp8_supported(torch.device("cuda")) + 1  # copy, gemms, host link


def doctor_report(remeasure: bool = False, quick: bool = False, progress=None) -> dict[str, Any]:
    """System state, topology, ceilings, quick probes and a verdict, as one dict.

    ``report['ceilings_status']`` says whether the ceilings were measured now or read from the
    cache, with their age; ``report['healthy']`` is False when a health check flagged this GPU."""
    import torch

    from . import probes, specs, system, topology
    from .evidence import machine_info

    def step(msg):
        if progress:
            progress(msg)

    step("reading NVML")
    snap = system.snapshot()
    gpu = torch.cuda.is_available()
    report: dict[str, Any] = {"machine": machine_info(), "snapshot": snap}
    step("reading topology")
    cap = topology.capture()  # nvidia-smi topo -m, else NVML; an unparsable text is kept with its error
    if cap.error:
        report["topology_error"] = cap.error
    report["topology"] = cap.topo.to_dict() if cap.topo else None
    report["topology_text"] = cap.text
    spec = specs.try_lookup(report["machine"]["device"]) if gpu else None
    report["spec"] = spec.to_dict() if spec else None
    if gpu and spec is None:
        report["spec_note"] = str(specs.UnknownGPUError(report["machine"]["device"]))
    cached = None if remeasure else ceil_mod.load_cached()
    if cached is not None:
        c = cached
        age_s, age = _age(c.measured_at)
        report["ceilings_status"] = {
            "cached": True, "age_s": age_s, "cache_file": str(ceil_mod.cache_path()),
            "label": f"cached, measured {c.measured_at[:16].replace('T', ' ')} UTC ({age}); "
                     "`hwlab doctor --remeasure` measures again"}
    else:
        c = ceil_mod.measure(quick=quick, progress=lambda s: step(f"ceiling: {s}"))
        status = {"cached": False, "age_s": 0.0, "cache_file": str(ceil_mod.cache_path()),
                  "label": f"measured now ({'quick' if quick else 'full'} sizes)"}
        try:
            ceil_mod.save(c, overwrite=True)  # a cache: re-measuring is the explicit request
        except OSError as e:  # the figures are still shown and saved with --save
            status["cache_file"] = None
            status["label"] += f"; not cached ({e.strerror or e})"
        report["ceilings_status"] = status
    report["ceilings"] = c.to_dict()
    step("probe: launch overhead")
    report["probes"] = [probes.launch_overhead(n_launches=500 if quick else 2000).to_dict()]
    flags = system.health_flags(snap) if gpu else []
    warn = ceil_mod.datasheet_check(c)
    if warn:
        flags.append(warn)
    report["healthy"] = not flags
    verdict = list(flags)
    if not gpu:
        verdict.append("no CUDA GPU here: figures are this CPU's; recorded H200 results: "
                       "`hwlab evidence show doctor`")
    report["verdict"] = verdict or ["healthy: no throttling, ECC or link warnings; ceilings "
                                    "within the datasheet band"]
    return report


def _print_doctor(rep: dict[str, Any], console) -> None:
    from rich.table import Table

    m = rep["machine"]
    console.print(f"[bold]hwlab doctor[/bold] on {m['device']} (host {m['host']})")
    v = rep["snapshot"]["versions"]
    console.print("versions: " + ", ".join(f"{k} {v[k]}" for k in
                  ("python", "torch", "cuda_runtime", "triton", "nccl", "driver") if k in v))
    nv = rep["snapshot"].get("nvml", {})
    if not nv.get("available"):
        console.print(f"NVML: [yellow]not available[/yellow]: {nv.get('reason')}")
    for g in rep["snapshot"]["gpus"]:
        def f(key, unit=""):
            val = g.get(key)
            return "unsupported" if isinstance(val, dict) and "unsupported" in val else f"{val}{unit}"
        console.print(f"GPU{g['index']} {f('name')}: {f('temperature_c', ' C')}, {f('power_w', ' W')}"
                      f"/{f('power_limit_w', ' W')}, SM {f('sm_clock_mhz')}/{f('sm_clock_max_mhz')} MHz, "
                      f"PCIe Gen{f('pcie_gen')} x{f('pcie_width')} (max Gen{f('pcie_gen_max')} "
                      f"x{f('pcie_width_max')}), ECC {f('ecc_mode')}, clocks: {f('clock_event_reasons')}")
    if rep.get("topology_text"):
        console.print(rep["topology_text"].split("\n\nLegend")[0])
    c = rep["ceilings"]
    status = rep.get("ceilings_status") or {}
    t = Table(title=f"ceilings of {c.get('device')} ({'cached' if status.get('cached') else 'measured now'})")
    t.add_column("ceiling")
    t.add_column("measured", justify="right")
    t.add_column("datasheet", justify="right")
    spec = rep.get("spec") or {}
    t.add_row("copy bandwidth", f"{c['copy_gbps']:,.0f} GB/s",
              f"{spec['hbm_gbps']:,.0f} GB/s" if spec else "-")
    for dt, val in c["gemm_tflops"].items():
        key = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops",
               "fp8": "fp8_tflops"}.get(dt)
        ds = spec.get(key) if spec and key else None
        t.add_row(f"GEMM {dt}", f"{val:,.2f} TFLOP/s", f"{ds:,.1f}" if ds else "-")
    if c.get("host_link_gbps"):
        t.add_row("host->device (pinned)", f"{c['host_link_gbps']:,.1f} GB/s", spec.get("host_link", "-"))
    console.print(t)
    console.print(f"ceilings: {status.get('label', c.get('source'))}", soft_wrap=True)
    if rep.get("spec_note"):
        console.print(f"[yellow]{rep['spec_note']}[/yellow]")
    for p in rep["probes"]:
        if p["name"] == "launch_overhead":
            console.print(f"launch overhead: {p['params']['us_per_launch']:.2f} us per launch "
                          f"[{p['device']}]")
    console.print("[bold]verdict:[/bold]")
    for line in rep["verdict"]:
        console.print(f"  - {line}")


def _evidence_of(rep: dict[str, Any]):
    from .ceilings import Ceilings
    from .evidence import Evidence
    from .measure import Measurement

    return Evidence(kind="doctor", machine=rep["machine"],
                    results=[Measurement.from_dict(p) for p in rep["probes"]],
                    ceilings=Ceilings.from_dict(rep["ceilings"]).to_dict(),
                    versions=rep["snapshot"]["versions"], snapshot=rep["snapshot"],
                    extra={k: rep.get(k) for k in ("topology", "topology_text", "spec", "verdict",
                                                   "ceilings_status")})


def cmd_doctor(a) -> int:
    from rich.console import Console

    if a.save:
        check_destination(a.save, overwrite=a.force)  # before anything is measured
    cached = not a.remeasure and ceil_mod.cache_path().exists()
    with Steps("hwlab doctor", 3 + (0 if cached else _n_ceiling_steps())) as st:
        rep = doctor_report(remeasure=a.remeasure, quick=a.quick, progress=st.step)
    save_error = None
    if a.save:
        ev = _evidence_of(rep)
        try:
            ev.save(a.save, overwrite=a.force)
            rep["saved_to"] = str(a.save)
        except OSError as e:  # changed since the check (disk full, permissions): keep the run
            fb = rescue_json(ev.to_dict(), "doctor")
            save_error = (f"hwlab doctor: could not write {a.save} ({e.strerror or e}); the record "
                          f"was saved to {fb} instead")
    if a.json:
        print_json(rep)
    else:
        _print_doctor(rep, Console(highlight=False))
    if save_error:
        print(save_error, file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if rep["healthy"] else EXIT_FINDING


def add_parser(sub) -> None:
    d = sub.add_parser("doctor", help="system state, topology, ceilings and a verdict",
                       description=__doc__.split("\n\n")[0] + " Exit: 0 healthy, 1 a health "
                       "finding, 2 bad input, 3 internal error.")
    d.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    d.add_argument("--remeasure", action="store_true", help="re-measure the cached ceilings")
    d.add_argument("--quick", action="store_true", help="small sizes (seconds, less accurate)")
    d.add_argument("--save", metavar="PATH", type=Path,
                   help="also write an evidence record to PATH (checked before measuring)")
    d.add_argument("--force", action="store_true", help="replace PATH if it exists")
    d.set_defaults(fn=cmd_doctor)
