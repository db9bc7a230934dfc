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
from pathlib import Path
from typing import Any

from hwlab.core import ceilings as ceil_mod
from hwlab.cli.console import Steps, print_json
from hwlab.errors import EXIT_FINDING, EXIT_OK, EXIT_USAGE
from hwlab.core.store import check_destination, rescue_json
from hwlab.core.store import rescue


def _print_doctor(rep: dict[str, Any], console) -> None:
    from rich.table import Table
    from rich.markup import escape

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
    for line in status.get("drift_vs_previous_cache") or []:
        console.print(f"[yellow]against the previous cache: {escape(line)}[/yellow]", soft_wrap=True)
    if rep.get("spec_note"):
        console.print(f"[yellow]{rep['spec_note']}[/yellow]")
    for p in rep["probes"]:
        if p["name"] == "launch_overhead":
            console.print(f"launch overhead: {p['params']['us_per_launch']:.2f} us per launch "
                          f"[{p['device']}]")
    console.print("[bold]verdict:[/bold]")
    for line in rep["verdict"]:
        console.print(f"  - {line}")


def cmd_doctor(a) -> int:
    from rich.console import Console

    from hwlab.diagnosis.doctor import doctor_evidence, doctor_report, n_ceiling_steps  # measures: torch

    if a.save:
        check_destination(a.save, overwrite=a.force)  # before anything is measured
    cached = not a.remeasure and ceil_mod.cache_path().exists()
    with Steps("hwlab doctor", 3 + (0 if cached else n_ceiling_steps())) as st:
        rep = doctor_report(remeasure=a.remeasure, quick=a.quick, progress=st.step)
    save_error = None
    if a.save:
        ev = doctor_evidence(rep)
        try:
            ev.save(a.save, overwrite=a.force)
            rep["saved_to"] = str(a.save)
        except OSError as e:  # changed since the check (disk full, permissions): keep the run
            save_error = f"hwlab doctor: {rescue(ev.to_dict(), 'doctor', a.save, e)}"
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
