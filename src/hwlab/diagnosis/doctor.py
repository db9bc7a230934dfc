"""The doctor's report: system state, topology, ceilings (cached with their age, or measured
now), a quick launch probe and a health verdict; and its evidence record.

One module for both users: ``hwlab doctor`` (:mod:`hwlab.cli.cmd_doctor` prints and saves it) and
``tools/refresh_gpu_evidence.py`` (records it as ``doctor.json``). A verdict is unhealthy
when NVML reports a throttle reason or ECC/remap warnings, or the measured copy rate is under
``ceilings.SLOW_CARD_PCT`` of the datasheet's (:func:`hwlab.core.ceilings.datasheet_check`).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import torch

from hwlab.core import ceilings as ceil_mod
from hwlab.core import probes, specs, system, topology
from hwlab.core.ceilings import Ceilings
from hwlab.core.evidence import Evidence, machine_info
from hwlab.core.measure import InputError, Measurement


def age_label(measured_at: str) -> tuple[float | None, str]:
    """Seconds since an ISO timestamp and a short label ("3 days old"); (None, "age unknown")
    for a timestamp that does not parse. A ceiling is shown with its age because one measured
    under another driver or clock setting is not today's."""
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


def _previous_cache() -> Ceilings | None:
    """The cache ``--remeasure`` replaces, to hold the fresh ceilings against; an unreadable one
    is simply replaced (re-measuring is the remedy the unreadable-cache message names)."""
    try:
        return ceil_mod.load_cached()
    except InputError:
        return None


def n_ceiling_steps() -> int:
    """How many progress steps measuring the ceilings takes here (for the progress bar)."""
    if not torch.cuda.is_available():
        return 2  # copy, gemm fp32
    return 1 + 3 + probes.fp8_supported(torch.device("cuda")) + 1  # copy, gemms, host link


def doctor_report(remeasure: bool = False, quick: bool = False, progress=None) -> dict[str, Any]:
    """System state, topology, ceilings, quick probes and a verdict, as one dict.

    ``report['ceilings_status']`` says whether the ceilings were measured now or read from the
    cache, with their age; ``report['healthy']`` is False when a health check flagged this GPU."""
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
    previous = _previous_cache() if remeasure else None  # the cache a re-measure replaces
    if cached is not None:
        c = cached
        age_s, age = age_label(c.measured_at)
        report["ceilings_status"] = {
            "cached": True, "age_s": age_s, "cache_file": str(ceil_mod.cache_path()),
            "label": f"cached, measured {c.measured_at[:16].replace('T', ' ')} UTC ({age}); "
                     "`hwlab doctor --remeasure` measures again"}
    else:
        fresh = ceil_mod.measure(quick=quick, progress=lambda s: step(f"ceiling: {s}"))
        # an unstable fresh ceiling is never cached: the previous value stays (ceilings.to_cache)
        c, cacheable, kept = ceil_mod.to_cache(fresh, previous)
        status = {"cached": False, "age_s": 0.0, "cache_file": str(ceil_mod.cache_path()),
                  "label": f"measured now ({'quick' if quick else 'full'} sizes)",
                  "not_cached_unstable": kept}
        if kept:
            status["label"] += "; " + "; ".join(ceil_mod.kept_lines(kept))
        try:
            if not cacheable:
                status["cache_file"] = None
            else:
                ceil_mod.save(c, overwrite=True)  # a cache: re-measuring is the explicit request
        except OSError as e:  # the figures are still shown and saved with --save
            status["cache_file"] = None
            status["label"] += f"; not cached ({e.strerror or e})"
        if previous is not None:  # flag a cache that differed from today's by more than its spread
            status["drift_vs_previous_cache"] = ceil_mod.drift(previous, fresh)
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


def doctor_evidence(rep: dict[str, Any]) -> Evidence:
    """The doctor report as an evidence record (kind ``doctor``): what ``hwlab doctor --save``
    writes and what the GPU refresh records, one builder for both."""
    return Evidence(kind="doctor", machine=rep["machine"],
                    results=[Measurement.from_dict(p) for p in rep["probes"]],
                    ceilings=Ceilings.from_dict(rep["ceilings"]).to_dict(),
                    versions=rep["snapshot"]["versions"], snapshot=rep["snapshot"],
                    extra={k: rep.get(k) for k in ("topology", "topology_text", "spec", "verdict",
                                                   "ceilings_status")})
