"""What a raw tool's output says, computed by the kit from the same file the learner reads.

Notebook 09 and exercise 05 ask a learner to read four raw outputs; :mod:`hwlab.course.reading_checks`
grades the answer against what this module computes from the same recording:

* **A profiler trace of one GPU rank** (:func:`gpu_trace_facts`): the largest idle gap between two
  consecutive device activities (kernels, copies) inside one ``ProfilerStep`` (a launch gap: the
  stream waits for the host), per step, with its p10-p90 over steps; the host calls that block until
  the device is done (:data:`hwlab.traces.trace_events.SYNC_CALLS`).
* **Per-rank traces of one job** (:func:`rank_wait_facts`): each rank's time inside the collectives
  (its wait: a collective ends when the last rank arrives, so the ranks that arrived early wait),
  median and p10-p90 over collectives; the late rank is one whose median time inside is below
  :data:`LATE_WAIT_FRACTION` of the other ranks' median (it arrives when the others have waited
  already); a slow link makes every rank wait alike, and no rank is late. A host gap per rank
  (:func:`host_gap_facts`): the largest gap between top-level operators on the main thread.
* **Nsight Compute counters recorded by the kit's tools on the H200** (:func:`ncu_lab01`,
  :func:`ncu_lab02`): as ``tools/refresh_gpu_evidence.py`` stored them (DRAM %, sector
  amplification, registers, occupancy limits, achieved occupancy), beside the kit's estimates.
* **``nvidia-smi topo -m``** (:func:`slow_pairs`) and NCCL's ``NCCL_DEBUG=INFO`` topology lines
  (:func:`nccl_paths`).
"""
from __future__ import annotations

import csv
import io
import re
from itertools import combinations
from pathlib import Path
from typing import Any

from hwlab.core import evidence, ncu, specs, topology

from hwlab.traces import kineto, trace_events
from hwlab.core.measure import quantile

#: a rank is late when its median time inside the collectives is below this fraction of the other
#: ranks' median: the others waited for it. Half leaves room for the run-to-run spread of a
#: collective's own transfer time, which every rank pays.
LATE_WAIT_FRACTION = 0.5
#: the kit's DRAM estimate and ncu's counted DRAM % agree when, on the same denominator (the
#: datasheet peak), they differ by at most this many points: the estimate's traffic model counts
#: the bytes a case must move, ncu counts what the memory system moved
AGREE_PTS = 5.0


def spread(values: list[float]) -> dict[str, float]:
    """median, p10 and p90 (the kit's one quantile) of ``values``."""
    return {"median": quantile(values, 0.5), "p10": quantile(values, 0.1), "p90": quantile(values, 0.9),
            "n": len(values)}


# ---- traces -------------------------------------------------------------------------------------

def gpu_trace_facts(path: str | Path) -> dict[str, Any]:
    """Launch gaps and sync points of one GPU rank's trace (module docstring)."""
    t = trace_events.read_spans(path)
    dev = t.device()
    if not dev:
        raise ValueError(f"{path}: no device activity (kernels or copies): this is a host-only trace")
    gaps = []
    for st in t.steps():
        inside = [s for s in dev if st.ts_us <= s.ts_us < st.end_us]
        if len(inside) < 2:
            continue
        best = max(((b.ts_us - a.end_us, a, b) for a, b in zip(inside, inside[1:])), key=lambda g: g[0])
        gaps.append({"step": st.name, "gap_us": best[0], "before": best[1].name, "after": best[2].name,
                     "start_us": best[1].end_us})
    syncs = [s for s in t.spans if s.row.startswith("host") and s.name in trace_events.SYNC_CALLS]
    return {"path": str(path), "rank": t.rank, "gaps": gaps, "gap_us": spread([g["gap_us"] for g in gaps]),
            "sync_calls": sorted({s.name for s in syncs}), "n_syncs": len(syncs),
            "sync_us": spread([s.dur_us for s in syncs]) if syncs else None,
            "device_rows": sorted({s.row for s in dev})}


def trace_label(path: str | Path) -> str:
    """Where a trace was recorded, from its own ``deviceProperties`` (none: a CPU run)."""
    devs = kineto.read_trace(path).devices
    return f"recorded on {devs[0]['name']}" if devs and devs[0].get("name") else "recorded on CPU"


def _host_spans(t: trace_events.TraceSpans, row: str) -> list[trace_events.Span]:
    """What a viewer shows on a host thread: its operators and runtime calls, not the step marker."""
    return [s for s in t.spans if s.row == row and not s.name.startswith("ProfilerStep#")
            and s.cat in ("cpu_op", "cuda_runtime", "user_annotation")]


def gpu_timeline(path: str | Path, step: int = 0) -> tuple[dict[str, list], tuple[float, float]]:
    """Rows for :func:`hwlab.traces.trace_events.timeline_figure`: the host thread that runs the steps,
    then each GPU stream; and the window of the ``step``-th profiled step."""
    t = trace_events.read_spans(path)
    st = t.steps()[step]
    rows = {f"{st.row} (host)": _host_spans(t, st.row)}
    for r in sorted({s.row for s in t.device()}):
        rows[r] = [s for s in t.device() if s.row == r]
    return rows, (st.ts_us, st.end_us)


def ranks_timeline(folder: str | Path, steps: tuple[int, int] = (2, 5)) -> tuple[dict[str, list], tuple[float, float]]:
    """Rows per rank (its main thread, then its communication threads as one row) over profiled steps
    ``steps[0]`` to ``steps[1] - 1`` of every rank (the ranks share one host clock when they ran
    on one host)."""
    rows: dict[str, list] = {}
    lo, hi = [], []
    for p in kineto.discover_traces(folder, depth=0)[0]:  # by content, whatever the names
        t = trace_events.read_spans(p)
        st = t.steps()[steps[0]:steps[1]]
        main = st[0].row
        comm = sorted({s.row for s in t.spans if s.row != main and s.name.startswith(("gloo:", "nccl:"))})
        rows[f"rank {t.rank} main"] = _host_spans(t, main)
        rows[f"rank {t.rank} comm"] = [s for s in t.spans if s.row in comm and s.name.startswith(("gloo:", "nccl:"))]
        lo.append(st[0].ts_us)
        hi.append(st[-1].end_us)
    return dict(sorted(rows.items(), key=lambda kv: (int(kv[0].split()[1]), kv[0].endswith("comm")))), \
        (min(lo), max(hi) + 0.03 * (max(hi) - min(lo)))


def rank_traces(folder: str | Path) -> dict[int, kineto.RankTrace]:
    traces = {}
    for p in kineto.discover_traces(folder, depth=0)[0]:  # by content, whatever the names
        rt = kineto.read_trace(p)
        if rt.rank is None:
            raise ValueError(f"{p}: no rank in the trace or its name")
        traces[rt.rank] = rt
    if len(traces) < 2:
        raise ValueError(f"{folder}: {len(traces)} rank trace(s); a collective wait needs two or more ranks")
    return traces


def rank_wait_facts(folder: str | Path) -> dict[str, Any]:
    """Each rank's time inside the collectives, and the late rank if any (module docstring)."""
    traces = rank_traces(folder)
    per_rank = {r: spread([c.dur_us / 1e3 for c in t.collectives]) for r, t in traces.items()}
    late = []
    for r, s in per_rank.items():
        others = quantile([x["median"] for q, x in per_rank.items() if q != r], 0.5)
        if others and s["median"] < LATE_WAIT_FRACTION * others:
            late.append(r)
    waiting = [c.dur_us / 1e3 for r, t in traces.items() if r not in late for c in t.collectives]
    return {"folder": str(folder), "ranks": sorted(traces), "wait_ms_by_rank": per_rank,
            "late_ranks": sorted(late), "wait_ms": spread(waiting),
            "collectives": sorted({c.name for t in traces.values() for c in t.collectives}),
            "backend": next(iter(traces.values())).backend}


def host_gap_facts(path: str | Path) -> dict[str, Any]:
    """The largest gap between top-level operators on the main thread inside each step (ms): time
    the host launched nothing."""
    rt = kineto.read_trace(path)
    gaps = []
    for _, ts, dur in rt.steps:
        ops = sorted((o for o in rt.host_ops if ts <= o[0] < ts + dur), key=lambda o: o[0])
        if len(ops) >= 2:
            gaps.append(max(b[0] - (a[0] + a[1]) for a, b in zip(ops, ops[1:])) / 1e3)
    return {"path": str(path), "rank": rt.rank, "gap_ms": spread(gaps)}


# ---- Nsight Compute (recorded by the kit's tools) -----------------------------------------------

def ncu_lab01(case: str) -> dict[str, Any]:
    """Lab 1's ncu counters for ``case`` beside the kit's estimate, from the recorded H200 run.

    ``estimate_pct_of_peak`` puts the estimate (bytes moved over time, in % of the copy ceiling
    measured in the run) on ncu's denominator, the datasheet DRAM peak: an estimate."""
    ev = evidence.recorded("lab01_bandwidth")
    c = ev.extra["counters"].get(case)
    if not c:
        raise KeyError(f"no ncu counters recorded for Lab 1 case {case!r} (have {sorted(ev.extra['counters'])})")
    fe = ev.extra["flowchart_evidence"][case]
    peak = specs.lookup(ev.machine["device"]).hbm_gbps
    ceiling = ev.ceilings["copy_gbps"]
    est_peak = fe["dram_pct_estimated"] * ceiling / peak
    return {"case": case, "label": ev.label, "kernels": c["kernels"], "dram_pct": c["dram_pct_of_peak"],
            "sector_amplification": c["sector_amplification"], "tensor_pipe_pct": c["tensor_pipe_pct"],
            "dram_pct_estimated_of_ceiling": fe["dram_pct_estimated"], "copy_ceiling_gbps": ceiling,
            "peak_gbps": peak, "estimate_pct_of_peak": est_peak,
            "agree": abs(est_peak - c["dram_pct_of_peak"]) <= AGREE_PTS}


def ncu_lab02(config: str) -> dict[str, Any]:
    """Lab 2's ncu occupancy rows for tile ``config`` (e.g. ``"128x128x64 w4 s3"``) beside the kit's
    compile report (registers, spills) and its theoretical occupancy (an estimate from registers,
    shared memory and warps), from the recorded H200 run."""
    ev = evidence.recorded("lab02_registers")
    for c in ev.extra["configs"]:
        if c["report"]["config"] == config:
            break
    else:
        raise KeyError(f"no Lab 2 config {config!r} recorded")
    n = c.get("ncu") or {}
    if not n:
        raise KeyError(f"no ncu rows recorded for Lab 2 config {config!r}")
    limits = {k.rsplit("_limit_", 1)[1]: v for k, v in n.items() if k.startswith("launch__occupancy_limit_")}
    low = min(limits.values())
    return {"config": config, "label": ev.label, "ncu": n, "registers": n["launch__registers_per_thread"],
            "achieved_occupancy_pct": n["sm__warps_active.avg.pct_of_peak_sustained_active"],
            "limits": limits, "binding": sorted(k for k, v in limits.items() if v == low),
            "spills": c["report"]["n_spills"], "spills_source": c["report"]["source"],
            "theoretical_occupancy_pct": c["occupancy"]["occupancy_pct"],
            "kit_binding": c["occupancy"]["binding"]}


def ncu_lab01_text(case: str) -> str:
    """Lab 1's recorded ncu readings for ``case`` and the kit's estimate, as the evidence stores them
    (no verdict): what a learner reads before answering."""
    f = ncu_lab01(case)
    lines = [f"Nsight Compute, Lab 1 case {case!r} ({f['label']}; ncu via labs/bandwidth.counters_with_ncu)",
             *(f"  kernel: {k[:96]}" for k in f["kernels"]),
             f"  dram__throughput.avg.pct_of_peak_sustained_elapsed (duration-weighted) {f['dram_pct']:10.2f}",
             f"  l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum x 32 B / bytes the case must load {f['sector_amplification']:6.2f}",
             f"  sm__pipe_tensor_op_hmma_cycles_active (% of peak, max over kernels)   {f['tensor_pipe_pct']:10.2f}",
             "the kit's estimate (traffic model over the measured time):",
             f"  dram_pct_estimated, % of the copy ceiling measured in the run          {f['dram_pct_estimated_of_ceiling']:10.2f}",
             f"  copy ceiling measured in the run (GB/s)                                {f['copy_ceiling_gbps']:10.1f}",
             f"  datasheet HBM peak (GB/s, core/specs.py)                               {f['peak_gbps']:10.1f}"]
    return "\n".join(lines)


def ncu_lab02_text(config: str) -> str:
    """Lab 2's recorded ncu row for tile ``config`` and its compile report, as stored (no verdict)."""
    f = ncu_lab02(config)
    ev = evidence.recorded("lab02_registers")
    rep = next(c["report"] for c in ev.extra["configs"] if c["report"]["config"] == config)
    lines = [f"Nsight Compute, Lab 2 GEMM tile {config} ({f['label']}; ncu via labs/registers/counters.py)"]
    lines += [f"  {k:<55s} {v:>10}" for k, v in f["ncu"].items()]
    lines += [f"compile report ({rep['source']}): {rep['n_regs']} registers/thread, {rep['n_spills']} spills, "
              f"{rep['shared_bytes']} B shared memory per block"]
    return "\n".join(lines)


#: where ncu's raw CSV reports of Lab 1 and Lab 2 live once recorded on the H200, and the command that records them
NCU_REPORT_DIR = ("h200", "ncu")
NCU_RECORD_COMMAND = ("PYTHONPATH=src python3 tools/record_ncu_h200.py --out OUT   (on the H200; then copy "
                      "OUT/ncu/ to src/hwlab/recorded/h200/ncu/)")


def ncu_report_dir() -> Path:
    return evidence.RECORDED_DIR.joinpath(*NCU_REPORT_DIR)


def ncu_report_waits() -> str | None:
    """None when the raw ncu reports are recorded, else the sentence naming the recording that waits."""
    d = ncu_report_dir()
    if d.is_dir() and any(d.glob("*.csv")):
        return None
    return f"waits for the H200 recording: {NCU_RECORD_COMMAND}"


def ncu_report(csv_text: str) -> list[dict[str, Any]]:
    """Per kernel of an ``ncu --csv`` report (metrics :data:`hwlab.core.ncu.REPORT_METRICS`): DRAM %
    of peak, global-load sectors per request (4 = a warp's 32 four-byte loads fully coalesced; 32 =
    every lane in its own sector), local-memory sectors (register spills reach memory), registers
    per thread, achieved occupancy and the occupancy limits (blocks per SM by each resource)."""
    out = []
    for r in ncu.parse_csv(csv_text):
        req = r.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")
        sec = r.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum")
        local = [r.get(m) for m in ncu.LOCAL_METRICS]
        limits = {k.rsplit("_limit_", 1)[1]: v for k, v in r.items()
                  if k.startswith("launch__occupancy_limit_") and isinstance(v, float)}
        out.append({"kernel": r.get("kernel", ""),
                    "dram_pct": r.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                    "sectors_per_request": sec / req if isinstance(sec, float) and isinstance(req, float) and req else None,
                    "local_sectors": sum(local) if all(isinstance(x, float) for x in local) else None,
                    "registers": r.get("launch__registers_per_thread"),
                    "achieved_occupancy_pct": r.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                    "limits": limits, "duration_ns": r.get("gpu__time_duration.sum")})
    return out


def ncu_raw(name: str) -> str:
    """The recorded raw report ``name`` (``lab01_<case>`` or ``lab02_<BMxBNxBKxWxS>``) as ncu wrote it."""
    path = ncu_report_dir() / f"{name}.csv"
    if not path.is_file():
        have = sorted(p.stem for p in ncu_report_dir().glob("*.csv"))
        raise KeyError(f"no raw ncu report {name!r} recorded (have {have}); {ncu_report_waits() or ''}".rstrip("; "))
    return path.read_text()


def ncu_raw_text(name: str, metrics: tuple[str, ...] = ()) -> str:
    """ncu's own rows of the recorded raw report ``name``: kernel, metric, unit and value as ncu printed
    them (the CSV's other columns, process and launch ids, left out). No sum, ratio or verdict.
    ``metrics``: keep only the rows whose metric name contains one of these parts."""
    lines = [ln for ln in ncu_raw(name).splitlines() if ln.startswith('"')]
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines)))
            if not metrics or any(m in r["Metric Name"] for m in metrics)]
    out = [f"ncu --csv, {name} (recorded on NVIDIA H200 by tools/record_ncu_h200.py): {len({r['ID'] for r in rows})} kernel(s)"]
    for r in rows:
        k = r["Kernel Name"]
        out.append(f"  [{r['ID']}] {k[:40] + '...' if len(k) > 43 else k:<43s} {r['Metric Name']:<58s} "
                   f"{r['Metric Unit']:<16s} {r['Metric Value']:>14s}")
    return "\n".join(out)


def ncu_raw_facts(name: str) -> list[dict[str, Any]]:
    """Per kernel of the recorded raw report ``name``, as :func:`ncu_report` reads it."""
    return ncu_report(ncu_raw(name))


# ---- topology and NCCL ----------------------------------------------------------------------------

def slow_pairs(topo_text: str, group: list[int]) -> dict[str, Any]:
    """The slowest link class among the GPUs of ``group`` and every pair that crosses it."""
    t = topology.parse_topo_matrix(topo_text)
    cells = {(a, b): t.link(a, b) for a, b in combinations(sorted(group), 2)}
    worst = max(cells.values(), key=topology.link_rank)
    return {"group": sorted(group), "links": cells, "slowest": worst,
            "pairs": sorted(p for p, c in cells.items() if c == worst)}


_PATH_LINE = re.compile(r"NCCL INFO (?P<src>[A-Z]+/[\w-]+) :(?P<rest>(?:\s*[A-Z]+/[\w-]+ \(\d+/[\d.]+/[A-Z]+\))+)")
_PATH_ENTRY = re.compile(r"(?P<dst>[A-Z]+/[\w-]+) \((?P<hops>\d+)/(?P<bw>[\d.]+)/(?P<type>[A-Z]+)\)")


def nccl_paths(log: str) -> list[dict[str, Any]]:
    """NCCL's topology paths from an ``NCCL_DEBUG=INFO`` log: lines such as ``GPU/0-60 :GPU/0-60
    (0/5000.0/LOC) CPU/0-ff (1/48.0/PHB) NET/0-0 (3/1.2/PHB)`` (each destination with its hop count,
    bandwidth in GB/s and path type), one dict per source and destination."""
    out: list[dict[str, Any]] = []
    for m in _PATH_LINE.finditer(log):
        for e in _PATH_ENTRY.finditer(m["rest"]):
            d = {"src": m["src"], "dst": e["dst"], "hops": int(e["hops"]), "gbps": float(e["bw"]), "type": e["type"]}
            if d not in out:  # NCCL prints its topology once per communicator
                out.append(d)
    return out

