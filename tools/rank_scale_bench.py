"""Benchmark (not a test) of ``hwlab ranks --traces`` at scale: an N-rank job generated from real
per-rank traces, read with 1, 2, ... workers; and a projection to a large job from the measured costs.

    .venv/bin/python tools/rank_scale_bench.py [--ranks 64 256 1024] [--workers 1 2] [--out FILE]

(about 25 minutes on a busy 2-core machine, about 300 MB of temporary disk)

* **The job.** Rank r is a copy of one of the real per-rank traces (``sampled_rank-{0,1}.json.gz``,
  HolisticTraceAnalysis's test data, under ``$HWLAB_TRACE_DATA`` or ``../shared/data/traces``)
  with its own rank number and world size, on host ``node{r // 8}``; every host's clock is offset
  by up to +-5 s, every rank's times by up to 0.2 ms more and its durations scaled by 1 +- 2%
  (jitter); one rank, the straggler (N // 3), spends a fifth of the others' time inside its
  collectives (it arrives last at each) and so has the longest own time.
* **Each run** is a fresh interpreter calling :func:`hwlab.diagnosis.ranks_traces.report` with
  ``workers``: wall time of the reading, CPU time of the parent and of its workers, the parent's
  peak RSS (VmHWM) and the largest worker's (``ru_maxrss`` of the children, which counts the
  parent's RSS when it started them: an upper bound), the rank named, and a hash of the JSON report (the same for
  every worker count, or the benchmark says so).
* **Per-MB and per-rank costs** come from reducing one rank's trace at 1x and 8x its events in
  this process (a line through the two: slope per MB of JSON, intercept per rank); the parent's
  merge from its CPU at two job sizes and at 8x longer traces (:func:`merge_costs`).
* **The projection** for ``--project-ranks`` ranks of ``--project-mb`` MB of JSON each on
  ``--project-cores`` cores is an estimate from those costs; its assumptions are written beside it.

The machine's load average is recorded with each run: on a shared machine the wall-time ratio of
2 workers to 1 is a measurement under that load.
"""
from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HWLAB_TRACE_DATA", ROOT / ".." / "shared" / "data")) / "traces"
SOURCES = ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz")
RANKS_PER_HOST = 8
STRAGGLER_COMM_SCALE = 0.2


def _load(name: str) -> dict:
    return json.loads(gzip.open(DATA / name).read())


def _is_nccl(e: dict) -> bool:
    n = str(e.get("name", ""))
    return e.get("cat") == "kernel" and (n.startswith("ncclKernel_") or n.startswith("ncclDevKernel_"))


def generate(job: Path, n_ranks: int, seed: int = 59, times: int = 1) -> dict:
    """Write an n-rank job (module doc) under ``job``, each rank's events ``times`` over; returns
    what was injected."""
    rng = random.Random(seed)
    srcs = [_times_k(_load(s), times) if times > 1 else _load(s) for s in SOURCES]
    straggler = n_ranks // 3
    offsets = {h: rng.uniform(-5e6, 5e6) for h in range(n_ranks // RANKS_PER_HOST + 1)}
    job.mkdir(parents=True, exist_ok=True)
    n_bytes_json = 0
    for r in range(n_ranks):
        d = copy.deepcopy(srcs[r % len(srcs)])
        d["distributedInfo"] = {**d["distributedInfo"], "rank": r, "world_size": n_ranks}
        d["hostname"] = f"node{r // RANKS_PER_HOST:03d}"
        shift = offsets[r // RANKS_PER_HOST] + rng.uniform(0, 200)
        scale = 1 + rng.uniform(-0.02, 0.02)
        for e in d["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = round(e["ts"] + shift, 3)
            if isinstance(e.get("dur"), (int, float)):
                e["dur"] = round(e["dur"] * scale * (STRAGGLER_COMM_SCALE if r == straggler and _is_nccl(e) else 1), 3)
        text = json.dumps(d).encode()
        n_bytes_json += len(text)
        (job / f"rank-{r}.json.gz").write_bytes(gzip.compress(text, 1))
    return {"straggler": straggler, "json_mb_per_rank": n_bytes_json / n_ranks / 1e6,
            "gz_mb_total": sum(f.stat().st_size for f in job.iterdir()) / 1e6}


RUN = r"""
import hashlib, json, os, resource, sys, time
from hwlab.cli.console import dumps_strict
from hwlab.diagnosis import ranks_traces as R
t0 = time.perf_counter()
rep = R.report(sys.argv[1], workers=int(sys.argv[2]))
wall = time.perf_counter() - t0
s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
# VmHWM: this process's own peak (ru_maxrss keeps the RSS of the process that started it, across exec)
hwm_kib = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
f = rep["finding"]
print(json.dumps({"wall_s": wall, "parent_cpu_s": s.ru_utime + s.ru_stime, "workers_cpu_s": c.ru_utime + c.ru_stime,
                  "parent_peak_mib": hwm_kib / 1024, "worker_peak_mib": c.ru_maxrss / 1024 if c.ru_maxrss else None,
                  "named": f.get("names"), "n_collectives": sum(x["n_collectives"] for x in rep["per_rank"].values()), "kind": f["kind"], "n_ranks_read": rep["n_ranks"],
                  "json_sha256": hashlib.sha256(dumps_strict(rep).encode()).hexdigest(),
                  "report_json_kib": len(dumps_strict(rep).encode()) / 1024}))
"""


def run(job: Path, workers: int) -> dict:
    env = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}
    load = os.getloadavg()
    p = subprocess.run([sys.executable, "-c", RUN, str(job), str(workers)], capture_output=True, text=True, env=env,
                       check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out.update(workers=workers, loadavg_1_5_15=[round(x, 2) for x in load],
               loadavg_after=[round(x, 2) for x in os.getloadavg()])
    out["cpu_s"] = out["parent_cpu_s"] + out["workers_cpu_s"]
    return out


def _times_k(d: dict, k: int) -> dict:
    """The trace with its events repeated ``k`` times, each copy later by the trace's span and its
    steps, correlation and external ids renumbered (a longer recording of the same job)."""
    ev = d["traceEvents"]
    ts = [e["ts"] for e in ev if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    out = []
    for i in range(k):
        for e in ev:
            e2 = copy.deepcopy(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] += i * span
            n = str(e2.get("name", ""))
            if n.startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(n.split('#')[1]) + i * 1000}"
            a = e2.get("args") or {}
            for key in ("correlation", "External id"):
                if isinstance(a.get(key), int):
                    a[key] += i * 10**8
            out.append(e2)
    return {**d, "traceEvents": out}


def per_byte_costs(tmp: Path) -> dict:
    """CPU s to reduce one rank's trace at 1x and 8x its events (median of 3), as a line."""
    from hwlab.traces import rank_summary
    d = _load(SOURCES[0])
    pts = []
    for k in (1, 8):
        f = tmp / f"x{k}.json.gz"
        text = json.dumps(_times_k(d, k)).encode()
        f.write_bytes(gzip.compress(text, 1))
        ts = []
        for _ in range(3):
            c0 = time.process_time()
            rank_summary.read_reduced(str(f))
            ts.append(time.process_time() - c0)
        pts.append((len(text) / 1e6, sorted(ts)[1]))
    (mb1, s1), (mb8, s8) = pts
    per_mb = (s8 - s1) / (mb8 - mb1)
    return {"points_mb_cpu_s": pts, "cpu_s_per_mb": per_mb, "intercept_cpu_s": s1 - per_mb * mb1,
            "cpu_s_per_rank_fixed": max(0.0, s1 - per_mb * mb1)}


def summary_memory(tmp: Path) -> dict:
    """What one rank's summary occupies in the parent: the Python heap a :class:`ReducedTrace` of
    each source trace holds (``tracemalloc``, allocated after it was built minus before, the
    trace's reading freed; one reading first, unmeasured, so the reader's one-time caches are not
    counted), and its pickled size (what a worker sends back)."""
    import gc
    import pickle
    import tracemalloc
    from hwlab.traces import rank_summary
    out = {}
    for s in SOURCES:
        (tmp / f"mem-{s}").write_bytes((DATA / s).read_bytes())
    rank_summary.read_reduced(str(tmp / f"mem-{SOURCES[0]}"))
    for s in SOURCES:
        f = tmp / f"mem-{s}"
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        red = rank_summary.read_reduced(str(f))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        out[s] = {"heap_kib": held / 1024, "pickled_kib": len(pickle.dumps(red)) / 1024,
                  "n_collectives": len(red.collectives)}
    per_rank = sum(v["heap_kib"] for v in out.values()) / len(out)
    return {"per_source": out, "heap_kib_per_rank": per_rank}


def parent_heap(tmp: Path, sizes: tuple[int, int] = (64, 192), workers: int = 2) -> dict:
    """What the parent's Python heap holds per rank, from ``tracemalloc`` at two job sizes read by
    ``workers``: the summaries it received (:func:`hwlab.traces.rank_pool.read_all_reduced`), and
    the report it returns (:func:`hwlab.diagnosis.ranks_traces.report`, the summaries freed); each as
    a slope per rank between the two sizes, so what every job holds whatever its size cancels."""
    import gc
    import tracemalloc
    from hwlab.diagnosis import ranks_traces
    from hwlab.traces import rank_pool
    held: dict[int, tuple[float, float]] = {}
    for n in sizes:
        job = tmp / f"heap{n}"
        generate(job, n)
        files = sorted(job.iterdir())
        gc.collect()
        tracemalloc.start()
        red = rank_pool.read_all_reduced(files, None, [], [], [], workers=workers)
        summaries = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del red
        gc.collect()
        tracemalloc.start()
        rep = ranks_traces.report(job, workers=workers)
        report_kib = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del rep
        held[n] = (summaries / 1024, report_kib / 1024)
        import shutil
        shutil.rmtree(job)
    (a, (sa, ra)), (b, (sb, rb)) = sorted(held.items())
    return {"sizes": list(sizes), "workers": workers, "held_kib": {str(n): v for n, v in held.items()},
            "summaries_kib_per_rank": (sb - sa) / (b - a), "report_kib_per_rank": (rb - ra) / (b - a)}


def memory_growth(runs: list[dict], summary: dict) -> dict:
    """The parent's peak (VmHWM) at each job size read by workers, its growth per rank between the
    smallest and each larger job, beside one rank's summary: the growth is only the summaries when
    the ratio is near 1 (above it: something else the parent keeps per rank)."""
    w = max(r["workers"] for r in runs)
    at = sorted((r for r in runs if r["workers"] == w and r.get("times", 1) == 1), key=lambda r: r["n_ranks"])
    base = at[0]
    rows = []
    for r in at:
        grow_kib = (r["parent_peak_mib"] - base["parent_peak_mib"]) * 1024
        dn = r["n_ranks"] - base["n_ranks"]
        rows.append({"n_ranks": r["n_ranks"], "parent_peak_mib": r["parent_peak_mib"],
                     "growth_kib_per_rank": grow_kib / dn if dn else None,
                     "growth_over_summary": grow_kib / dn / summary["heap_kib_per_rank"] if dn else None})
    return {"workers": w, "summary_heap_kib_per_rank": summary["heap_kib_per_rank"], "by_size": rows}


def merge_costs(runs: list[dict], big: dict) -> dict:
    """The parent's CPU while workers read (it merges summaries): per rank from the two largest jobs
    at the most workers, and per MB of a rank's JSON from a job of 8x longer traces (``big``)."""
    w = max(r["workers"] for r in runs)
    at = sorted((r for r in runs if r["workers"] == w and r.get("times", 1) == 1), key=lambda r: r["n_ranks"])
    a, b = at[-2], at[-1]
    per_rank = (b["parent_cpu_s"] - a["parent_cpu_s"]) / (b["n_ranks"] - a["n_ranks"])
    small = next(r for r in at if r["n_ranks"] == big["n_ranks"])
    per_coll = (big["parent_cpu_s"] - small["parent_cpu_s"]) / (big["n_collectives"] - small["n_collectives"])
    return {"workers": w, "parent_cpu_s_per_rank": per_rank, "parent_cpu_s_per_collective": per_coll,
            "collectives_per_rank_per_mb": small["n_collectives"] / small["n_ranks"] / small["json_mb_per_rank"],
            "parent_peak_mib_1x_8x": [small["parent_peak_mib"], big["parent_peak_mib"]],
            "from_runs": [(r["n_ranks"], r.get("times", 1), r["parent_cpu_s"], r["n_collectives"])
                          for r in (a, b, small, big)]}


def project(costs: dict, merge: dict, n_ranks: int, mb: float, cores: int) -> dict:
    per_rank_s = costs["cpu_s_per_rank_fixed"] + costs["cpu_s_per_mb"] * mb
    reduce_wall = per_rank_s * n_ranks / cores
    n_coll = merge["collectives_per_rank_per_mb"] * mb * n_ranks
    merge_s = n_ranks * max(merge["parent_cpu_s_per_rank"], 0.0) + n_coll * max(merge["parent_cpu_s_per_collective"], 0.0)
    return {
        "estimate": True, "n_ranks": n_ranks, "mb_json_per_rank": mb, "cores": cores,
        "per_rank_cpu_s": per_rank_s, "reduce_wall_s": reduce_wall, "parent_merge_s": merge_s,
        "total_wall_s": reduce_wall + merge_s, "total_wall_min": (reduce_wall + merge_s) / 60,
        "assumptions": [
            "reading cost is linear in a rank's JSON bytes, at the slope measured here between 1x and 8x one real "
            "rank's events (cpu_s_per_mb), plus the intercept per rank",
            f"{cores} workers each on its own core, as fast as one core of this machine; no other load",
            "the file system delivers the traces as fast as the workers decode them "
            f"({n_ranks * mb / 1e3:.0f} GB in total_wall_s)",
            "the parent's merge (receiving summaries, matching collectives, the report) runs on one core, "
            "taken as not overlapping the workers (an upper bound); it grows linearly in ranks and in "
            "collectives, at the slopes measured here (merge_costs), with collectives per MB as in the real "
            f"trace ({n_coll:,.0f} collectives in all)",
            "a negative measured slope (noise under the fixed start-up cost) counts as zero",
            "gzip decompression cost is included in the measured slope (the generated traces are .json.gz)"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--project-ranks", type=int, default=1024)
    ap.add_argument("--project-mb", type=float, default=200.0)
    ap.add_argument("--project-cores", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "rank_scale" /
                                         time.strftime("%Y-%m-%dT%H%M%SZ-vm-cpu.json", time.gmtime())))
    ap.add_argument("--add-memory-to", metavar="RECORD",
                    help="only measure one rank's summary and add it, with the parent's growth per rank, to an "
                         "earlier record of this benchmark (its runs' peaks are kept as they were measured)")
    a = ap.parse_args()
    if a.add_memory_to:
        rec_path = Path(a.add_memory_to)
        rec = json.loads(rec_path.read_text())
        with tempfile.TemporaryDirectory(prefix="hwlab-rank-bench-") as tmp:
            summary = summary_memory(Path(tmp))
            heap = parent_heap(Path(tmp))
        rec["summary_memory"] = {**summary, "measured_unix_s": int(time.time())}
        rec["parent_heap"] = heap
        rec["parent_memory_growth"] = memory_growth(rec["runs"], summary)
        tmp_out = rec_path.with_suffix(".tmp")
        tmp_out.write_text(json.dumps(rec, indent=1) + "\n")
        tmp_out.replace(rec_path)
        print(json.dumps(rec["parent_memory_growth"], indent=1))
        return 0
    if len(set(a.ranks)) < 2 or 1 not in a.workers:  # the merge cost is a line through two job sizes
        ap.error("give --ranks two sizes or more and --workers including 1 (the per-rank merge cost and the "
                 "speed-up are read from them)")
    if not all((DATA / s).is_file() for s in SOURCES):
        print(f"rank_scale_bench: the real traces {SOURCES} are not in {DATA}: set HWLAB_TRACE_DATA", file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory(prefix="hwlab-rank-bench-") as tmp:
        costs = per_byte_costs(Path(tmp))
        summary = summary_memory(Path(tmp))
        heap = parent_heap(Path(tmp))
        print(f"summary memory: {summary}; parent heap: {heap}", file=sys.stderr)
        print(f"costs: {costs}", file=sys.stderr)
        for n in a.ranks:
            job = Path(tmp) / f"job{n}"
            t0 = time.perf_counter()
            gen = generate(job, n)
            print(f"generated {n} ranks in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            for w in a.workers:
                r = {"n_ranks": n, **gen, **run(job, w)}
                r["straggler_named"] = r["named"] == f"rank {gen['straggler']}"
                runs.append(r)
                print(json.dumps(r), file=sys.stderr)
            import shutil
            shutil.rmtree(job)
        n_big = min(a.ranks)  # the 8x job: as many ranks as the smallest 1x job, to set the two side by side
        job = Path(tmp) / "job_x8"
        gen = generate(job, n_big, times=8)
        big = {"n_ranks": n_big, "times": 8, **gen, **run(job, max(a.workers))}
        big["straggler_named"] = big["named"] == f"rank {gen['straggler']}"
        runs.append(big)
        print(json.dumps(big), file=sys.stderr)
    by = {(r["n_ranks"], r["workers"]): r for r in runs if r.get("times", 1) == 1}
    merge = merge_costs(runs, big)
    ratios = {str(n): by[(n, w)]["wall_s"] / by[(n, 1)]["wall_s"] for n in a.ranks for w in a.workers
              if w == max(a.workers) and (n, 1) in by and w > 1}
    same = {str(n): len({r["json_sha256"] for r in runs if r["n_ranks"] == n and r.get("times", 1) == 1}) == 1
            for n in a.ranks}
    res = {"schema": "hwlab.bench.rank_scale", "what": "hwlab ranks --traces on generated N-rank jobs (CPU)",
           "machine": {"cpus_affinity": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
                       "kind": "CPU (no GPU used: nothing is measured on one)",
                       "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                capture_output=True, text=True).stdout.strip(),
                       "note": "a shared CPU VM: see each run's load average"},
           "recorded_unix_s": int(time.time()), "runs": runs,
           "wall_ratio_max_workers_over_1": ratios, "json_identical_across_workers": same,
           "costs": costs, "merge_costs": merge, "summary_memory": summary, "parent_heap": heap,
           "parent_memory_growth": memory_growth(runs, summary),
           "projection": project(costs, merge, a.project_ranks, a.project_mb, a.project_cores)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("wall_ratio_max_workers_over_1", "json_identical_across_workers")}))
    print(json.dumps(res["projection"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
