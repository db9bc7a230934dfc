"""CPU time of ``hwlab examine --trace`` / ``hwlab ranks --traces`` against HolisticTraceAnalysis on
the same files (issue 58's speed target: hwlab at most 0.6x HTA's CPU time). Not a test.

HTA (``pip install HolisticTraceAnalysis`` into your own venv; not a project dependency) is timed
loading the trace(s) and computing what ``examine`` / ``ranks`` report in its terms: the temporal
breakdown, the kernel-type breakdown and the idle-time breakdown for one trace; for a rank folder,
the temporal breakdown, the kernel-type breakdown and the communication-computation overlap. Each
run is its own child process; its CPU time (user + system, from ``os.wait4``) and peak RSS are
recorded, best of ``--repeat`` runs (CPU time, not wall time, because the machine is shared).

    .venv/bin/python tools/hta_speed_bench.py --corpus /work/corpus --out tools/results/hta_speed/X.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HTA_ONE = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_gpu_kernel_breakdown(visualize=False)
a.get_idle_time_breakdown(visualize=False)
"""
HTA_RANKS = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_gpu_kernel_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
"""
#: (corpus file or folder, kind): single traces read by examine, one folder by ranks
CASES = [
    ("HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "one"),
    ("TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz", "one"),
    ("TraceLens/tests/traces/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "one"),
    ("TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", "one"),
    ("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz", "one"),
    ("param/et_replay/tests/inputs/linear_kineto.json.gz", "one"),
    ("param/et_replay/tests/inputs/dlrm_kineto", "ranks"),
]


def _run(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")[-300:] if p.stderr else ""
    rc = os.waitstatus_to_exitcode(status)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": time.perf_counter() - t0, "peak_rss_mib": ru.ru_maxrss / 1024,
            "rc": rc, "stderr_tail": err if rc not in (0, 1) else ""}


def _best(cmd: list[str], repeat: int) -> dict:
    runs = [_run(cmd) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["cpu_s"])
    return {**best, "cpu_s_runs": [round(r["cpu_s"], 3) for r in runs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True, help="folder holding tests/data/trace_corpus/MANIFEST.json's files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    hw = [sys.executable, "-c", "import sys; from hwlab.cli import main; sys.exit(main())"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (rel, kind) in enumerate(CASES):
            src = a.corpus / rel
            if not src.exists():
                print(f"skip (not in the corpus folder): {rel}", file=sys.stderr)
                continue
            if kind == "one":   # HTA reads a folder: one link to the file
                d = Path(tmp) / str(i)
                d.mkdir()
                (d / src.name).symlink_to(src.resolve())
                hta = _best([sys.executable, "-c", HTA_ONE, str(d)], a.repeat)
                ours = _best(hw + ["examine", "--trace", str(src), "--json"], a.repeat)
            else:
                hta = _best([sys.executable, "-c", HTA_RANKS, str(src)], a.repeat)
                ours = _best(hw + ["ranks", "--traces", str(src), "--json"], a.repeat)
            ratio = ours["cpu_s"] / hta["cpu_s"] if hta["cpu_s"] > 0 and hta["rc"] == 0 else None
            rows.append({"case": rel, "command": "examine --trace" if kind == "one" else "ranks --traces",
                         "hwlab": ours, "hta": hta, "hwlab_over_hta_cpu": ratio})
            print(f"{rel[-60:]:60s} hwlab {ours['cpu_s']:.2f}s  HTA {hta['cpu_s']:.2f}s (rc {hta['rc']})  "
                  f"ratio {ratio if ratio is None else round(ratio, 2)}", file=sys.stderr)
    import importlib.metadata as md
    ratios = [r["hwlab_over_hta_cpu"] for r in rows if r["hwlab_over_hta_cpu"] is not None]
    out = {"what": "CPU time (user+system of each child process, best of repeats) of hwlab against HTA on the same "
                   "public traces; recorded on a CPU machine, no GPU", "target": "hwlab at most 0.6x HTA's CPU time",
           "hta_version": md.version("HolisticTraceAnalysis"), "python": platform.python_version(),
           "machine": platform.platform(), "cpu_count": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
           "cases": rows, "max_ratio": max(ratios) if ratios else None,
           "all_within_target": bool(ratios) and max(ratios) <= 0.6}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
