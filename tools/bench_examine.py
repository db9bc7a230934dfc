"""Time ``hwlab examine`` on a model of GPT-2's size, as a user runs it, and record it.

    python tools/bench_examine.py [--runs 1] [--target examples/small_transformer.py:gpt2_small]
                                  [--out tools/results/examine] [--label vm-cpu]

Each run is its own process, ``python -m hwlab examine TARGET --model --json`` with this checkout's
``src`` first on the path and one torch thread (``OMP_NUM_THREADS=1``, as the kit's CPU ceilings are
kept per thread count). Per run it records: the wall time of the whole process (a monotonic clock
around the child); every progress line on stderr with the second it arrived; the longest silence
on stderr (from the start, between lines, and from the last line to the exit); the step counts the
lines announced (``[k/N]``: N must not change); each time-left estimate (``~X s left``) against the
time that was in fact left, as a ratio, and the lines that gave none ("estimating"); the seconds
each step took (from one ``[k/N]`` line to the next, the last to the exit); the child's CPU seconds
(user + system, beside the wall time: on a shared machine the two differ by what the neighbours
took); the examination's own figures the estimates are built from (its first call, its wall time per
call, the calls the timing made and why it stopped); and the leaf, alternatives and headline the
run printed.

The budgets the record is read against (``BUDGET_S``, ``SILENCE_S``, ``ETA_TOL``): an examination of
a GPT-2-size model within 30 s on a 2-core machine at rest, no silence of 5 s or more on stderr,
estimates within 30% of the truth. A run outside them is listed, and the exit code is 1 (a finding).
The load average before and after each run is recorded beside it: a figure from a busy machine is
labelled by it, not dropped.

The result is written as JSON and text under ``--out``, named by UTC time and host, never over an
earlier one; it names the machine (CPU model, cores), the commit and the load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
#: the budgets (module doc)
BUDGET_S = 30.0
SILENCE_S = 5.0
ETA_TOL = 0.30
ETA_RE = re.compile(r"~(\d+(?:\.\d+)?) s left")
STEP_RE = re.compile(r"\[(\d+)/(\d+)\]")


def _cpu_model() -> str:
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_s_of(pid: int) -> float | None:
    """A live process's user + system CPU seconds so far (``/proc/PID/stat``), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def one_run(target: str, timeout_s: float) -> dict[str, Any]:
    """One examination as its own process (module doc)."""
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    load0 = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "hwlab", "examine", target, "--model", "--json"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    cpu_at: list[float | None] = []  # the child's CPU seconds when each line arrived
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)
    reader.start()
    for ln in p.stderr:
        lines.append((time.monotonic() - t0, ln.rstrip("\n")))
        cpu_at.append(_cpu_s_of(p.pid))
    rc = p.wait(timeout=timeout_s)
    total_s = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    reader.join(timeout=10)
    stamps = [0.0] + [t for t, _ in lines] + [total_s]
    silences = [b - a for a, b in zip(stamps, stamps[1:])]
    totals = sorted({int(m.group(2)) for _, ln in lines for m in [STEP_RE.search(ln)] if m})
    etas = [{"at_s": t, "estimate_s": float(m.group(1)), "truth_s": total_s - t,
             "ratio": float(m.group(1)) / (total_s - t) if total_s - t > 0 else None}
            for t, ln in lines for m in list(ETA_RE.finditer(ln))[-1:]]
    estimating = sum(1 for _, ln in lines if "estimating" in ln)
    starts = [(t, int(m.group(1)), c) for (t, ln), c in zip(lines, cpu_at) for m in [STEP_RE.search(ln)]
              if m and " ... " not in ln]
    steps_s: dict[str, float] = {}
    steps_cpu_s: dict[str, float | None] = {}
    for (t, k, c), (t_next, _, c_next) in zip(starts, starts[1:] + [(total_s, 0, cpu_s)]):
        steps_s[str(k)] = round(steps_s.get(str(k), 0.0) + t_next - t, 3)
        steps_cpu_s[str(k)] = round(c_next - c, 3) if c is not None and c_next is not None else None
    try:
        d = json.loads(out[0]) if out and out[0].strip() else {}
    except json.JSONDecodeError:
        d = {}
    params = (d.get("measurement") or {}).get("params") or {}
    sizing = next((n for n in d.get("notes") or [] if n.startswith("timing sized")), None)
    return {"rc": rc, "total_s": total_s, "cpu_s": cpu_s, "first_line_s": lines[0][0] if lines else None,
            "max_silence_s": max(silences), "step_totals": totals, "etas": etas, "estimating_lines": estimating,
            "steps_s": steps_s, "steps_cpu_s": steps_cpu_s, "first_call_s": params.get("first_call_s"),
            "wall_ms_per_call": params.get("wall_ms_per_call"), "n_rep": (d.get("measurement") or {}).get("n_rep"),
            "run_queue_wait_pct": params.get("run_queue_wait_pct"), "timing_sizing": sizing,
            "n_ops": (d.get("counts") or {}).get("n_ops"),
            "stderr": [{"t_s": round(t, 2), "line": ln} for t, ln in lines],
            "leaf": d.get("leaf"), "alternatives": d.get("alternatives"),
            "headline": (d.get("parts") or {}).get("headline"), "t_ms": (d.get("measurement") or {}).get("t_ms"),
            "load_before": load0, "load_after": os.getloadavg()}


def _pct(x: float | None) -> str:
    return "not reported" if x is None else f"{x:.0f}%"


def _ratios(r: dict[str, Any]) -> str:
    xs = [e["ratio"] for e in r["etas"] if e["ratio"] is not None]
    return f"{min(xs):.2f}-{max(xs):.2f}x" if xs else "none"


def findings(r: dict[str, Any]) -> list[str]:
    out = []
    if r["total_s"] > BUDGET_S:
        out.append(f"took {r['total_s']:.1f} s (budget {BUDGET_S:.0f} s at rest; load before {r['load_before'][0]:.1f})")
    if r["max_silence_s"] >= SILENCE_S:
        out.append(f"a silence of {r['max_silence_s']:.1f} s on stderr (budget {SILENCE_S:.0f} s)")
    if len(r["step_totals"]) > 1:
        out.append(f"the step count changed: {r['step_totals']}")
    off = [e for e in r["etas"] if e["ratio"] is not None and abs(e["ratio"] - 1) > ETA_TOL]
    if off:
        out.append(f"{len(off)} of {len(r['etas'])} time-left estimates off by more than {100 * ETA_TOL:.0f}%")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--target", default="examples/small_transformer.py:gpt2_small")
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "examine"))
    ap.add_argument("--label", default="")
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args(argv)
    runs = []
    for i in range(a.runs):
        r = one_run(a.target, a.timeout)
        r["findings"] = findings(r)
        runs.append(r)
        print(f"run {i + 1}: {r['total_s']:.1f} s ({r['cpu_s']:.1f} CPU s), longest silence {r['max_silence_s']:.1f} s, "
              f"leaf {r['leaf']} "
              f"{r['alternatives'] or ''}; " + ("; ".join(r["findings"]) or "within the budgets"), file=sys.stderr)
    now = datetime.now(timezone.utc)
    rec = {"kind": "examine_bench", "target": a.target, "when": now.isoformat(timespec="seconds"),
           "host": socket.gethostname(), "cpu": _cpu_model(), "cores": os.cpu_count(), "commit": _commit(),
           "label": a.label or "CPU", "device": "CPU (no GPU on this machine)",
           "budgets": {"total_s": BUDGET_S, "silence_s": SILENCE_S, "eta_tol": ETA_TOL}, "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{now.strftime('%Y-%m-%dT%H%M%SZ')}-{a.label or socket.gethostname()}"
    for suffix, text in ((".json", json.dumps(rec, indent=1) + "\n"),
                         (".txt", "\n".join(
                             f"run {i + 1}: {r['total_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU (load "
                             f"{r['load_before'][0]:.1f} -> "
                             f"{r['load_after'][0]:.1f}, the timing's run-queue wait {_pct(r['run_queue_wait_pct'])}), "
                             f"first line at {r['first_line_s'] or 0:.1f} s, "
                             f"longest silence {r['max_silence_s']:.1f} s, "
                             f"time-left estimates {_ratios(r)} of the truth ({r['estimating_lines']} lines "
                             "'estimating'), steps "
                             f"{r['step_totals']}, leaf {r['leaf']} alternatives {r['alternatives']} headline "
                             f"{r['headline']}, {r['t_ms'] and round(r['t_ms'], 1)} ms per call; "
                             + ("; ".join(r["findings"]) or "within the budgets") for i, r in enumerate(runs)) + "\n")):
        path = stem.with_suffix(suffix)
        if path.exists():
            print(f"{path} exists: not overwritten", file=sys.stderr)
            return 2
        path.write_text(text)
    print(f"recorded {stem}.json", file=sys.stderr)
    return 1 if any(r["findings"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
