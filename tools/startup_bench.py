"""Start-up of the ``hwlab`` commands that measure nothing: median wall time and peak memory.

    python tools/startup_bench.py [--runs 15] [--out tools/results/startup] [--label cpu-laptop]

Each command runs ``--runs`` times (after one uncounted warm-up) as its own process,
``python -m hwlab ...`` with this checkout's ``src`` first on the path, on real inputs: the kit's
recorded evidence, the recorded trace folders under ``src/hwlab/recorded/traces``, the committed step-log
run, a drill made here with its recorded observations, grades and an incident written into a
temporary folder; ``examine --trace`` on a committed trace where this hwlab's examine has it. Per command: the median, p10 and p90 wall time of the whole process (start to
exit, from a monotonic clock around the child), and its peak resident memory (the kernel's own
account of the finished child, ``wait4``). The median is the figure: a shared machine's slow runs
land in the p90.

The budget (``BUDGET_S``, 0.3 s) is what a command-line tool like nvidia-smi answers within: a
command over it is listed, and the exit code is 1 (a finding). ``bundle --no-doctor`` is timed and
shown but not held to it: the bug report it writes imports torch on purpose, for the CUDA runtime,
NCCL and device facts torch alone knows (its own start is the same as the others').

The result is written as JSON and text under ``--out``, named by UTC time and host, never over an
earlier one; it says the machine (CPU model, cores, load before and after) it was measured on.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
#: seconds: a command that measures nothing answers within this, as a C tool does
BUDGET_S = 0.3
#: commands timed but not held to the budget, and why
EXEMPT = {"bundle": "imports torch on purpose: the bug report's CUDA runtime, NCCL and device facts"}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("HWLAB_CLASS_DIR", None)
    return env


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, peak RSS in bytes, exit code) of one run of ``python -m hwlab argv``."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "hwlab", *argv], cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, p.returncode  # ru_maxrss: KiB


def commands(tmp: Path) -> list[tuple[str, Any]]:
    """(name, argv or run number -> argv) of each non-measuring command, on inputs made or found here."""
    sys.path.insert(0, str(SRC))
    from hwlab.course import drills

    drill = drills.new(seed=11, live=False)  # recorded observations: nothing measured
    dfile = drill.save(tmp / "drills")
    obs = tmp / "observations.json"
    obs.write_text(json.dumps({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 85.0}))
    traces = ROOT / "src" / "hwlab" / "recorded" / "traces" / "slow_rank"
    steplogs = ROOT / "src" / "hwlab" / "recorded" / "runs" / "straggler_nccl_h200"
    base = ROOT / "tests" / "data"
    examine_help = subprocess.run([sys.executable, "-m", "hwlab", "examine", "--help"], cwd=ROOT, env=_env(),
                                  capture_output=True, text=True).stdout
    trace = ([("examine --trace", ["examine", "--trace", str(traces / sorted(os.listdir(traces))[0])])]
             if "--trace" in examine_help else [])  # reading a recorded trace, where this hwlab has it
    return [
        ("--version", ["--version"]),
        ("--help", ["--help"]),
        ("flowchart", ["flowchart"]),
        ("flowchart --json", ["flowchart", "--json"]),
        ("evidence list", ["evidence", "list"]),
        ("evidence show doctor", ["evidence", "show", "doctor"]),
        ("evidence show lab01_bandwidth --json", ["evidence", "show", "lab01_bandwidth", "--json"]),
        ("ranks (step logs)", ["ranks", str(steplogs)]),
        ("ranks --traces", ["ranks", "--traces", str(traces)]),
        ("examine --help", ["examine", "--help"]),
        *trace,
        ("drill reveal", ["drill", "reveal", str(dfile)]),
        ("drill submit", lambda i: ["drill", "submit", str(dfile), "--leaf", drill.fault().leaf, "--dir",
                                    str(tmp / "grades"), "--class-dir", str(tmp / "class"),
                                    "--learner", f"bench{i}"]),  # a grade is never overwritten
        ("drill summary", ["drill", "summary", "--dir", str(tmp / "grades")]),
        ("class summary", ["class", "summary", str(tmp / "class")]),
        ("incident", ["incident", "--title", "bench", "--scope", "single-card", "--symptom", "slow",
                      "--fix", "fuse", "--reverify", "examine", "--observations", str(obs),
                      "--evidence", str(ROOT / "src/hwlab/recorded/h200/baseline.json"),
                      "--out", str(tmp / "incidents")]),
        ("baseline compare", ["baseline", "compare", str(base / "baseline_cpu_a.json"),
                              str(base / "baseline_cpu_b.json")]),
        ("bundle --no-doctor", ["bundle", str(tmp / "bundle.tar.gz"), "--no-doctor", "--force",
                                "--run-dir", str(traces)]),
    ]


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "kind": "CPU (no GPU used: nothing is measured on one)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="counted runs per command (default 15)")
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "startup"),
                    help="folder for the JSON and text result")
    ap.add_argument("--label", default="", help="a word on the machine, kept in the result")
    ap.add_argument("--only", action="append", help="time only commands whose name starts with this")
    a = ap.parse_args(argv)
    if a.runs < 3:
        ap.error("--runs must be at least 3 (a median of fewer says little)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    stem = out / f"{stamp}-{socket.gethostname()}-cpu"
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="hwlab-startup-"))
    os.environ["HWLAB_DRILL_KEY_FILE"] = str(tmp / "drill.key")  # the drill here and its commands: not the user's key
    env = _env()
    try:
        load_before = os.getloadavg()
        floor = [run_python_floor(env) for _ in range(a.runs)]
        for name, args in commands(tmp):
            if a.only and not any(name.startswith(o) for o in a.only):
                continue
            argv_of = args if callable(args) else (lambda i, args=args: args)
            run_once(argv_of(-1), env)  # warm-up: file cache, .pyc
            walls, cpus, rss, codes = [], [], [], set()
            for i in range(a.runs):
                w, c, m, rc = run_once(argv_of(i), env)
                walls.append(w)
                cpus.append(c)
                rss.append(m)
                codes.add(rc)
            med = statistics.median(walls)
            exempt = next((why for k, why in EXEMPT.items() if name.startswith(k)), None)
            rows.append({"command": f"hwlab {name}", "median_s": med, "p10_s": _quantile(walls, 0.1),
                         "p90_s": _quantile(walls, 0.9), "cpu_median_s": statistics.median(cpus),
                         "peak_rss_mib": max(rss) / 2**20,
                         "exit_codes": sorted(codes), "n_runs": a.runs,
                         "over_budget": med > BUDGET_S and exempt is None, "exempt": exempt})
            print(f"{rows[-1]['command']:<48} median {med:6.3f} s  p10-p90 {rows[-1]['p10_s']:.3f}-"
                  f"{rows[-1]['p90_s']:.3f}  peak {rows[-1]['peak_rss_mib']:6.1f} MiB  exit {sorted(codes)}",
                  file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {"what": "start-up of hwlab commands that measure nothing (whole process, wall clock)",
           "measured_at": stamp, "machine": {**machine(), "label": a.label},
           "load_avg_1m_before_after": [load_before[0], load_after[0]],
           "python_floor_median_s": statistics.median(floor),
           "budget_s": BUDGET_S, "rows": rows}
    text = render(res)
    for path, body in ((stem.with_suffix(".json"), json.dumps(res, indent=1) + "\n"),
                       (stem.with_suffix(".txt"), text)):
        if path.exists():
            raise SystemExit(f"{path} exists: not overwritten")
        part = path.with_name(path.name + ".part")
        part.write_text(body)
        os.replace(part, path)
    print(text, end="")
    print(f"written: {stem}.json and .txt", file=sys.stderr)
    return 1 if any(r["over_budget"] for r in rows) else 0


def run_python_floor(env: dict[str, str]) -> float:
    """Wall seconds of ``python -c pass``: the interpreter's own start, for scale."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.monotonic() - t0


def render(res: dict) -> str:
    m = res["machine"]
    lines = [f"hwlab start-up, {res['measured_at']} on {m['host']} ({m['cpu']}, {m['cores']} cores; "
             f"{m['kind']}){' [' + m['label'] + ']' if m['label'] else ''}",
             f"load average (1 min) before/after: {res['load_avg_1m_before_after'][0]:.2f} / "
             f"{res['load_avg_1m_before_after'][1]:.2f}; python -c pass: median "
             f"{res['python_floor_median_s']:.3f} s; budget {res['budget_s']} s (median)", "",
             "wall: start to exit of the whole process; cpu: its user + system time (less moved by other "
             "tenants of a busy machine)", "",
             f"{'command':<48} {'median s':>9} {'p10-p90 s':>13} {'cpu s':>6} {'peak MiB':>9}  exit  budget"]
    for r in res["rows"]:
        verdict = f"exempt: {r['exempt']}" if r["exempt"] else ("OVER" if r["over_budget"] else "ok")
        lines.append(f"{r['command']:<48} {r['median_s']:9.3f} {r['p10_s']:6.3f}-{r['p90_s']:.3f} "
                     f"{r['cpu_median_s']:6.3f} "
                     f"{r['peak_rss_mib']:9.1f}  {','.join(map(str, r['exit_codes'])):>4}  {verdict}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
