"""``hwlab ranks --traces DIR``: a folder of per-rank PyTorch profiler traces, read together.

The traces are read one at a time, streaming (:mod:`hwlab.traces.kineto`). What is reported, and the
rule behind each part:

* **Per rank and step** (``ProfilerStep#N`` spans on the host): step time; *busy* time (GPU
  kernels other than NCCL on a GPU trace; the main thread's top-level operators on a CPU trace);
  communication time (NCCL kernels, or gloo's worker spans); *exposed* communication (not under
  busy time); idle (neither); *own* time = step minus exposed communication (what the rank's own
  work costs it, the StepLog report's "compute"). Medians over steps, p10-p90 beside the step.
  Steps are the host's ``ProfilerStep`` windows on the device's clock
  (:mod:`hwlab.traces.rank_reading`): each kernel counts in the step whose window holds its host
  launch (correlation id), and where the device runs behind, a step runs from the end of the
  previous step's device work to the end of its own, so idle is the device timeline's and own
  time is never negative; the share of device time outside the host windows is noted (over
  :data:`DEVICE_OUTSIDE_NOTE_PCT`), and kernels without a launch event count in the window they
  ran in. A trace without ``ProfilerStep`` spans is read as one step, said.
* **Which files, which job**: traces are found by content (:func:`hwlab.traces.kineto.discover_traces`),
  every other file listed with why; one trace given twice (same process, events and times) is read
  once, said. A folder whose traces disagree on the world size, name one
  process group with different sizes, or were recorded more than :data:`JOB_SPAN_S` apart is
  refused, naming the files. Ranks missing against the world size (absent or unreadable) make
  the answer undecided (the CLI exits 4), naming them.
* **Per collective**, matched across ranks by process group and sequence number where every
  rank recorded them; the rest by name and process group in order, a pair kept only when the
  ranks' intervals overlap on one clock (one host, the same steps overlapping); without a shared
  clock by order alone, said. Unmatched collectives are counted, never paired by guess. NCCL
  kernels are named by the host op around their launch (:mod:`hwlab.traces.kineto`). With one
  rank, its collectives are listed (:func:`collective_table`). Host clocks of several hosts
  may disagree, so arrival is read from each rank's time *inside* the collective, which needs no
  common clock: the last rank to arrive waits least, so its time inside is the shortest; each
  rank's wait is its time inside minus that shortest time, and the skew is the largest wait.
  When every trace comes from one host (by name, or by content: :func:`hwlab.diagnosis.rank_arrival.one_host_by_content`),
  the start times (one clock) give the arrival order (the last to start arrives last) and the
  share of collectives where the time-inside order agrees is reported. The arrival vote is weighed
  by the wait each late arrival caused the others, a tie within the reading's spread reported as
  a tie (:mod:`hwlab.diagnosis.rank_arrival`).
* **Not one job**, undecided (the CLI exits 4), never clean: one rank stated by two different
  traces (two runs, or two recordings of one rank); no world size stated and no collective on
  every trace, or collectives matched by name and order only, with no shared clock to show that
  they ran together (two single-GPU runs holding the same collective kernel).
* **What is named** (a slow or late rank, a tie, a tail arrival does not confirm, a slow link,
  or nothing) and the rule behind each: :mod:`hwlab.diagnosis.rank_findings`. A tie is undecided
  (the CLI exits 4); nothing named exits 0.
* **Machine and workload** from the traces (``deviceProperties``, host names; backward ops and
  optimizer steps make it a training job, whose M actions differ: :data:`hwlab.diagnosis.flowchart.LEAF_VARIANTS`).
* **Flowchart** on measured values only: B ``slowdown_vs_floor`` (peer floor, above); D
  ``e2e_slowdown`` = median step over the median rank's own time; K ``rank_tail_pct`` (the own-time
  tail of the rank named, else of the longest own time: a rank that starts late with its own work
  no longer has no own-time tail, so its lateness is not sent to L's link and topology actions)
  and ``collective_floor_pct``.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from hwlab.diagnosis import flowchart, incident
from hwlab.traces import kineto, rank_pool
from hwlab.errors import UserInputError
from hwlab.core.measure import quantile
from hwlab.core.store import check_input_folder
from hwlab.diagnosis.ranks import nvml_by_rank, render_tail
from hwlab.diagnosis.rank_arrival import arrivals, last_arriver, one_host_by_content, step_start_lag_ms
from hwlab.diagnosis.rank_findings import (LINK_FLOOR_PCT, MIN_MATCHED, RANK_TAIL_PCT, SINGLE_DEVICE_SLOW,  # noqa: F401
                                           SLOW_LINK_FRACTION, link_finding, rank_finding)
from hwlab.core.tails import TAIL_JUMP, tail_split
from hwlab.traces.rank_reading import (by_rank, collective_table, device_outside as _device_outside,
                                       match as _match, one_job, rank_steps as _rank_steps,
                                       shared_clock as _shared_clock, summary as _summary)

DEVICE_OUTSIDE_NOTE_PCT = 10.0  # device time outside the host steps worth a note (the GPU runs behind)


def find_traces(folder: str | Path) -> list[Path]:
    """Trace files under ``folder`` (one level of sub-folders too, as jobs write per-host ones),
    recognised by content (:func:`hwlab.traces.kineto.discover_traces`, which also says what it skipped)."""
    return kineto.discover_traces(folder)[0]


def looks_like_traces(folder: str | Path) -> bool:
    d = Path(folder)
    return d.is_dir() and bool(find_traces(d)) and not list(d.glob("*/steps-rank-*.jsonl"))


def _ranges(rs: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out[:20]) + (f" (+{len(out) - 20} more)" if len(out) > 20 else "")


def _machine(traces: dict[int, kineto.RankTrace], hosts: list[str]) -> dict[str, Any]:
    """The machine the traces were recorded on, from the traces themselves (``deviceProperties``,
    host names in the trace or its file name), never the machine reading them."""
    names = sorted({n for t in traces.values() for n in t.device_names})
    on_gpu = any(t.on_gpu for t in traces.values())
    n_dev = max((len(t.devices) for t in traces.values()), default=0)
    device = ", ".join(names) if names else ("GPU (not named in the traces)" if on_gpu else
                                             "no GPU (CPU ranks, gloo)")
    return {"device": device, "is_gpu": on_gpu, "host": ", ".join(h for h in hosts if h != "?") or
            "not in the traces (no host name in the trace or its file name)",
            "devices_per_host": n_dev or None, "source": "the profiler traces (deviceProperties, host names)"}



def _per_rank(traces: dict[int, kineto.RankTrace], ranks: list[int], skip: int, problems: list[str],
              notes: list[str]) -> tuple[dict[str, dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Each rank's step rows (after ``skip``) and their summary, with where its device work ran."""
    per_rank: dict[str, dict[str, Any]] = {}
    rows_by: dict[int, list[dict[str, Any]]] = {}
    for r in ranks:
        t = traces[r]
        rows = sorted(_rank_steps(t), key=lambda x: x["step"])[skip:]
        if not rows:
            problems.append(f"{t.path}: fewer than {skip + 1} steps, left out")
            continue
        rows_by[r] = rows
        s = _summary(rows)
        s.update({"host": t.host or "?", "pid": t.pid, "file": Path(t.path).name, "rank_source": t.rank_source,
                  "device": "GPU kernels" if t.on_gpu else "host (CPU ranks)",
                  "device_names": t.device_names, "workload": t.workload,
                  "n_collectives": len(t.collectives), "n_kernels": getattr(t, "n_kernels", len(t.kernels)),
                  "collective_identity": dict(Counter(c.meta_source or ("kernel name only" if c.on == "gpu" else
                                                                        "gloo span name") for c in t.collectives)),
                  "device_outside_steps": _device_outside(t)})
        per_rank[str(r)] = s
        out = s["device_outside_steps"]
        if out and out["outside_steps_pct"] >= DEVICE_OUTSIDE_NOTE_PCT:
            notes.append(
                f"rank {r}: {out['outside_steps_pct']:.0f}% of device time ran outside the host's ProfilerStep "
                f"windows ({out['after_last_step_pct']:.0f}% after the last one ended; the device runs behind "
                f"the host by up to {max(x['device_lag_ms'] for x in rows):.1f} ms): "
                + (f"{out['unattributed_pct']:.0f}% has no launch event to attribute it and is left out of the "
                   "steps" if out["unattributed_pct"] >= 1 else
                   "each kernel is counted in the step that launched it (correlation id)"))
    return per_rank, rows_by


def _walk_evidence(traces: dict[int, kineto.RankTrace], ranks: list[int], busy_p10: dict[int, float],
                   peer_floor: float, own: dict[int, float], step_med: float, tail_pct: float,
                   floor_pct: float | None) -> tuple:
    """The flowchart's evidence, measured values only, what it could not measure, the workload."""
    ev: dict[str, Any] = {"n_ranks": len(ranks), "metric_sources": {
        "slowdown_vs_floor": "the slowest rank's p10 busy time over the ranks' median p10 busy time "
                             "(peer floor from the traces: the same code on every rank; an estimate, not a roofline)",
        "e2e_slowdown": "median step over the median rank's own time (step minus exposed communication)",
        "rank_tail_pct": "the named rank's (else the longest) median own time over the other ranks' median, in % of the median "
                         "step, from the profiler traces",
        "collective_floor_pct": "the last arriver's time inside each matched collective, per step, over the median step"}}
    unmeasured: dict[str, str] = {}
    if peer_floor > 0 and len(ranks) > 1:
        ev["slowdown_vs_floor"] = max(busy_p10.values()) / peer_floor
    else:
        unmeasured["B"] = ("no peer floor: one rank only, or no busy time in the steps" if len(ranks) == 1 or
                           peer_floor <= 0 else "")
    own_med = statistics.median(own.values())
    if own_med > 0:
        ev["e2e_slowdown"] = step_med / own_med
    if len(ranks) > 1:
        ev["rank_tail_pct"] = tail_pct
    else:
        unmeasured["K"] = "one rank's trace: no tail to measure"
    if floor_pct is not None:
        ev["collective_floor_pct"] = floor_pct
    kinds = {traces[r].workload for r in ranks}
    workload = kinds.pop() if len(kinds) == 1 else "mixed"
    ev["workload"] = workload
    ev["metric_sources"]["workload"] = ("backward ops / optimizer steps in the traces" if workload == "training"
                                        else "no backward op and no optimizer step in the traces")
    return ev, unmeasured, workload


def report(folder: str | Path, *, link_gbps: float | None = None, skip: int = 0,
           progress: Callable[..., None] | None = None, workers: int | None = 1, scheduler: str | None = None,
           max_bytes: int | None = None) -> dict[str, Any]:
    """Read every trace under ``folder`` (:mod:`hwlab.traces.rank_pool`) and analyse them together."""
    # a missing path, a file, a looping link: each named for what it is (core.store)
    folder = check_input_folder(folder, "--traces", "pass the folder your profiler wrote its traces to")
    files, skipped = kineto.discover_traces(folder)
    skipped_out = [{"file": str(f), "why": why} for f, why in skipped]
    if not files:
        raise UserInputError(f"no profiler traces in {folder} (no .json / .json.gz file starts like one; "
                             f"{len(skipped)} other file(s) skipped): profile with torch.profiler and "
                             "tensorboard_trace_handler(DIR)")
    if link_gbps is not None and not link_gbps > 0:
        raise UserInputError("--link-gbps must be a positive bus bandwidth in GB/s")
    problems: list[str] = []
    unreadable: list[dict[str, str]] = []
    notes: list[str] = []
    read = rank_pool.read_all_reduced(files, progress, problems, unreadable, notes, workers=workers,
                                      scheduler=scheduler, max_bytes=max_bytes)
    one_job(read)
    stated: dict[int, list[str]] = {}
    for t in read:
        if t.rank is not None:
            stated.setdefault(t.rank, []).append(Path(t.path).name)
    same_rank = {r: v for r, v in stated.items() if len(v) > 1}
    traces = by_rank(read, problems, notes)
    if not traces:
        raise UserInputError(f"no usable trace in {folder}: " + "; ".join(problems))
    ranks = sorted(traces)
    worlds = {t.world_size for t in traces.values() if t.world_size}
    world = max(worlds) if worlds else None
    missing = [r for r in range(world) if r not in traces] if world else []
    hosts = sorted({t.host or "?" for t in traces.values()})
    backends = sorted({t.backend for t in traces.values() if t.backend})
    per_rank, rows_by = _per_rank(traces, ranks, skip, problems, notes)
    ranks = sorted(rows_by)
    if not ranks:
        raise UserInputError(f"no trace in {folder} has more than {skip} steps")
    traces = {r: traces[r] for r in ranks}
    content_host = one_host_by_content(traces, MIN_MATCHED) if len(hosts) > 1 and len(ranks) > 1 else None
    if content_host:
        notes.append(f"the names say {len(hosts)} hosts {hosts[:4]}{'...' if len(hosts) > 4 else ''}, the content "
                     f"says one: {content_host}")
    elif len(hosts) > 1:
        notes.append(f"traces from {len(hosts)} hosts {hosts}: host clocks may disagree, so arrival is read "
                     "from each rank's time inside the collective only")
    # one clock: one host (by name, or by content) and the same steps overlap in time on every rank
    one_clock = (len(hosts) == 1 or content_host is not None) and (_shared_clock(traces) if len(ranks) > 1 else True)
    mres = _match(traces, one_clock) if len(ranks) > 1 else {"matched": [], "methods": {}, "unmatched": {},
                                                             "notes": []}
    matched = [m for m, _ in mres["matched"]]
    how_by = [h for _, h in mres["matched"]]
    match_by = ("; ".join(f"{k}: {v}" for k, v in mres["methods"].items()) or "no collective on every rank") \
        if len(ranks) > 1 else "one rank: its collectives are listed per rank"
    notes += mres["notes"]
    colls_out, last_count, wait_ms, agree, caused = arrivals(matched, how_by, ranks, one_clock)
    n_m = len(matched)
    for r in ranks:
        per_rank[str(r)]["pct_arrived_last"] = 100.0 * last_count[r] / n_m if n_m else None
        per_rank[str(r)]["total_wait_ms"] = wait_ms[r] if n_m else None
        per_rank[str(r)]["caused_wait_ms"] = caused["ms"][r] if n_m else None
    step_med = statistics.median(per_rank[str(r)]["step_ms"] for r in ranks)
    own = {r: per_rank[str(r)]["own_ms"] for r in ranks}
    tail = tail_split(own)[0] if len(ranks) > 1 else []
    link_per_step = sum(c["link_ms"] for c in colls_out) / max(1, len(traces[ranks[0]].steps)) if n_m else None
    floor_pct = 100.0 * link_per_step / step_med if link_per_step is not None and step_med > 0 else None
    vote = last_arriver(last_count, caused, n_m, one_clock, len(ranks))
    lag_ms = step_start_lag_ms(traces) if one_clock and len(ranks) > 1 else {}
    finding, tail_pct, slowest, busy_p10, peer_floor = rank_finding(
        per_rank, ranks, own, step_med, vote, n_m, len(traces[ranks[0]].steps), lag_ms)
    finding, link_gbps, link_src = link_finding(finding, folder, ranks, link_gbps, floor_pct, colls_out, backends,
                                                 hosts, per_rank)
    ev, unmeasured, workload = _walk_evidence(traces, ranks, busy_p10, peer_floor, own, step_med, tail_pct,
                                              floor_pct)
    spreads = _spreads(rows_by, slowest if len(ranks) > 1 else None, step_med)
    ev["metric_spreads"] = {k: {"lo": v["p10"], "hi": v["p90"], "n": v["n_steps"], "what": "p10-p90 over steps"}
                            for k, v in spreads.items() if k in ev}
    d = flowchart.diagnose(ev)
    for metric, thr in (("rank_tail_pct", RANK_TAIL_PCT), ("e2e_slowdown", 1.2)):
        sp = spreads.get(metric)
        if sp and ev.get(metric) is not None and sp["p10"] < thr <= sp["p90"]:
            notes.append(f"borderline: {metric} {ev[metric]:.3g} (median), p10-p90 over steps {sp['p10']:.3g}-"
                         f"{sp['p90']:.3g} spans the threshold {thr:g}: a re-run may answer the other way")
    n_of = f"{len(ranks)} of {world} ranks" if world and world != len(ranks) else f"{len(ranks)} ranks"
    undecided = _undecided(finding, ranks, world, n_m, one_clock, missing, unreadable, same_rank)
    tables = {str(r): collective_table(traces[r], world or len(ranks)) for r in ranks}
    rep: dict[str, Any] = {
        "source": "profiler traces", "run_dir": str(folder), "traces_dir": str(folder), "n_ranks": len(ranks),
        "world_size": world, "ranks_present": n_of, "hosts": hosts, "backends": backends, "skip": skip,
        "basis": "own", "per_rank": per_rank, "missing_ranks": missing,
        "recorded_unix_s": [traces[r].recorded_unix_s for r in ranks], "undecided": undecided,
        "skipped": skipped_out, "unreadable": unreadable, "workload": workload,
        "machine": _machine(traces, [f"one, by content (the file names suggest {len(hosts)})"] if content_host else hosts),
        "collectives_by_rank": tables, "tail_ranks": [finding["rank"]] if finding.get("rank") is not None else [],
        "own_time_tail": tail, "rank_tail_pct": tail_pct, "finding": finding,
        "collectives": {"matched": n_m, "match_by": match_by, "one_clock": one_clock,
                        "one_host_by_content": content_host, "last_arriver": vote,
                        "last_by_start_agrees_pct": 100.0 * agree / n_m if one_clock and n_m else None,
                        "per_collective": colls_out[:200], "link_ms_per_step": link_per_step,
                        "methods": mres["methods"], "unmatched": {str(k): v for k, v in mres["unmatched"].items()}},
        "link_gbps": link_gbps, "link_gbps_source": link_src, "mapping_warnings": [], "spreads": spreads,
        "flowchart": {"evidence": ev, "path": d.path, "leaf": d.leaf_id,
                      "unmeasured": {k: v for k, v in unmeasured.items() if v}, "explain": d.explain()},
        "notes": notes, "problems": problems}
    rep["nvml"] = nvml_by_rank(sorted(folder.glob("nvml-rank-*.json")) + sorted(folder.glob("*/nvml-rank-*.json")))
    rep["incident_draft"] = _incident_draft(rep, d)
    return rep


def _undecided(finding: dict[str, Any], ranks: list[int], world: int | None, n_m: int, one_clock: bool,
               missing: list[int], unreadable: list[dict[str, str]], same_rank: dict[int, list[str]]) -> str | None:
    """Why no answer holds for the job (the CLI exits 4), or None: a tied vote; files not shown to
    be one job (one rank stated by two different traces; no world size stated and no collective on
    every trace, or collectives matched by order alone with no shared clock to show they ran
    together); ranks missing against the world size; a trace that could not be read."""
    undecided = finding["why"] if finding["kind"] == "arrival_tie" else None
    if same_rank:
        r, files = sorted(same_rank.items())[0]
        undecided = (f"not one job: rank {r} is stated by {len(files)} different traces ({', '.join(files[:4])}): "
                     "two runs, or two recordings of one rank; put one recording of each rank of one job in a folder")
    elif len(ranks) > 1 and world is None and (n_m == 0 or not one_clock):  # nothing shows these files are one job
        undecided = ("not shown to be one job: no trace states a world size (distributedInfo) and "
                     + (f"no collective was found on every one of the {len(ranks)} traces" if n_m == 0 else
                        "the collectives match by name and order only, with no shared clock to show they ran "
                        "together") + "; read each with hwlab examine --trace, or put one job's rank traces "
                     "(recorded together, with torch.distributed) in a folder")
    if missing:
        undecided = (f"ranks {_ranges(missing)} of world size {world} have no readable trace"
                     + (f" (unreadable: {', '.join(Path(u['file']).name for u in unreadable)})" if unreadable else "")
                     + ": a missing rank may be the slow one, so no answer holds for the job"
                     + (f"; among the {len(ranks)} present ranks: {finding['kind'].replace('_', ' ')}"))
    elif unreadable:  # no world size to count against, but a rank's file was not read: partial
        names = ", ".join(Path(u["file"]).name for u in unreadable[:20])
        undecided = (f"{len(unreadable)} trace file(s) could not be read ({names}"
                     + (f" and {len(unreadable) - 20} more" if len(unreadable) > 20 else "")
                     + "): their ranks may hold the slow one, so no answer holds for the job; among the "
                     + f"{len(ranks)} read: {finding['kind'].replace('_', ' ')}")
    return undecided


def _spreads(rows_by: dict[int, list[dict[str, Any]]], slowest: int | None, step_med: float) -> dict[str, Any]:
    """p10-p90 over steps of the walk's per-step metrics: the slowest rank's own time over the others'
    median (in % of the median step), and the median step over the median own time."""
    ids = set.intersection(*({r["step"] for r in rows} for rows in rows_by.values()))
    by = {rk: {r["step"]: r for r in rows} for rk, rows in rows_by.items()}
    tail, e2e = [], []
    for i in sorted(ids):
        own = {rk: by[rk][i]["own_ms"] for rk in by}
        step = statistics.median(by[rk][i]["step_ms"] for rk in by)
        if slowest is not None and len(own) > 1 and step_med > 0:
            others = [v for rk, v in own.items() if rk != slowest]
            tail.append(100.0 * (own[slowest] - statistics.median(others)) / step_med)
        m = statistics.median(own.values())
        if m > 0:
            e2e.append(step / m)
    out = {}
    for k, xs in (("rank_tail_pct", tail), ("e2e_slowdown", e2e)):
        if xs:
            out[k] = {"p10": quantile(xs, 0.1), "p90": quantile(xs, 0.9), "n_steps": len(xs)}
    return out


def _incident_draft(rep: dict[str, Any], d: flowchart.Diagnosis) -> dict[str, Any]:
    """The seed's incident record (:func:`hwlab.diagnosis.incident.from_diagnosis`, as the StepLog report
    drafts it), its symptom, fix and re-verification worded for what the traces found."""
    f, n = rep["finding"], rep["ranks_present"]
    if f["kind"] in ("slow_rank", "late_rank"):
        title = f"{f['kind'].replace('_', ' ')} {f['rank']} in {Path(rep['traces_dir']).name}"
        symptom = (f"rank {f['rank']} arrived last: {f['measured']}; its own time {f['own_tail_pct']:.0f}% of the step over the "
                   f"others' ({n}, profiler traces)")
        fix = f"draft: {f['why'] if f['kind'] == 'late_rank' else f['single_device_branch']}"
        reverify = "re-profile the same steps; `hwlab ranks --traces` names no rank (exit 0)"
    elif f["kind"] == "slow_link":
        title = f"collectives held by the link in {Path(rep['traces_dir']).name}"
        symptom = (f"every rank waits inside the collectives: the last arriver's time inside is "
                   f"{f['collective_floor_pct']:.0f}% of the step; no rank arrives late ({n}, profiler traces)")
        fix = f"draft: {f['verdict']} on {f['names']}: {f['why']}; " + (d.leaf.actions[0] if d.leaf else "")
        reverify = "re-profile after the change; `hwlab ranks --traces --link-gbps G` names no link (exit 0)"
    else:
        title = f"ranks of {Path(rep['traces_dir']).name}"
        symptom = f"no slow rank and no link finding over {n} (profiler traces)" + (
            f"; {f['why']}" if f.get("why") else "")
        fix = "draft: " + (d.leaf.actions[0] if d.leaf else "measure what the walk lacks first")
        reverify = "re-profile; `hwlab ranks --traces` exits 0"
    lines = []
    for r, s in rep["per_rank"].items():
        last = "-" if s["pct_arrived_last"] is None else f"{s['pct_arrived_last']:.0f}%"
        lines.append(f"rank {r}: median step {s['step_ms']:.2f} ms, busy {s['busy_ms']:.2f} ms, communication "
                     f"{s['comm_ms']:.2f} ms (exposed {s['exposed_comm_ms']:.2f}), idle {s['idle_ms']:.2f} ms, "
                     f"arrived last {last} [profiler trace]")
    lines += [f"not measured ({q}): {why}" for q, why in rep["flowchart"]["unmeasured"].items()] + rep["notes"]
    waits = {r: s["total_wait_ms"] for r, s in rep["per_rank"].items() if s["total_wait_ms"] is not None}
    if rep.get("undecided"):
        title = f"undecided: ranks missing in {Path(rep['traces_dir']).name}"
        symptom = rep["undecided"]
        fix = "draft: collect a complete trace from every rank (the missing ones named above), then re-run"
    from hwlab.core.evidence import Evidence
    m = rep["machine"]
    when = [t for t in rep.get("recorded_unix_s", []) if t]
    import datetime as _dt
    ev = Evidence(kind="profiler_trace", machine={"device": m["device"], "host": m["host"], "is_gpu": m["is_gpu"]},
                  recorded_at=_dt.datetime.fromtimestamp(min(when), _dt.timezone.utc).isoformat(timespec="seconds")
                  if when else "unknown (the traces carry no Unix time)")
    inc = incident.from_diagnosis(title, ev, d, symptom_scope="multi-GPU", symptom=symptom, fix=fix,
                                  reverify=reverify, rank_mapping=", ".join(
                                      f"{r}->{s['host']} ({s['rank_source']})" for r, s in rep["per_rank"].items()),
                                  extra_evidence=lines, collective_wait_ms=waits or None)
    return {"markdown": inc.to_markdown(), "record": asdict(inc)}


def render(rep: dict[str, Any]) -> str:
    """The report as text, for the terminal."""
    out = [f"hwlab ranks --traces: {rep['ranks_present']} in {rep['traces_dir']} "
           f"(backend {', '.join(rep['backends']) or 'unknown'}; hosts " + (rep["machine"]["host"] if
           rep["collectives"]["one_host_by_content"] else ", ".join(rep["hosts"])) + ")"]
    out.append(f"{'rank':>5} {'steps':>5} {'step ms':>9} {'p10-p90':>15} {'busy':>8} {'comm':>8} {'exposed':>8} "
               f"{'idle':>8} {'own':>8} {'last%':>6} {'wait ms':>8}  rank from")
    for r, s in rep["per_rank"].items():
        mark = "*" if int(r) in rep["tail_ranks"] else " "
        last = "-" if s["pct_arrived_last"] is None else f"{s['pct_arrived_last']:.0f}"
        wait = "-" if s["total_wait_ms"] is None else f"{s['total_wait_ms']:.1f}"
        out.append(f"{mark}{r:>4} {s['n_steps']:>5} {s['step_ms']:>9.2f} {s['step_p10_ms']:>7.2f}-{s['step_p90_ms']:<7.2f} "
                   f"{s['busy_ms']:>8.2f} {s['comm_ms']:>8.2f} {s['exposed_comm_ms']:>8.2f} {s['idle_ms']:>8.2f} "
                   f"{s['own_ms']:>8.2f} {last:>6} {wait:>8}  {s['rank_source']}")
    c = rep["collectives"]
    for r, rows in rep.get("collectives_by_rank", {}).items():
        if rows and (len(rep["per_rank"]) == 1 or not c["matched"]):
            out.append(f"rank {r} collectives (time inside, waiting included; bus bandwidth by the nccl-tests formula):")
            for x in rows[:12]:
                bw = (f"algbw {x['algbw_gbps']:.3g} GB/s, busbw {x['busbw_gbps']:.3g} GB/s" if x["busbw_gbps"] is not None
                      else (f"algbw {x['algbw_gbps']:.3g} GB/s, " if x["algbw_gbps"] is not None else "")
                      + f"busbw -- ({x['busbw_note']})")
                out.append(f"  {x['name']:<14} pg {x['pg'] or '?':<4} {_fmt_bytes(x['n_bytes']):>9} x{x['count']:<4} "
                           f"{x['total_ms']:.3f} ms (median {x['median_ms']:.3f}); {bw} [{x['meta_source']}]")
    ident = Counter()
    for s in rep["per_rank"].values():
        ident.update(s.get("collective_identity") or {})
    if ident:
        out.append("collective names and sizes from: " + "; ".join(f"{k}: {v}" for k, v in ident.most_common()))
    line = (f"collectives matched on every rank: {c['matched']} (by {c['match_by']})" if len(rep["per_rank"]) > 1
            else "one rank's trace: its collectives are listed above, no other rank to pair them with")
    if c.get("unmatched") and any(c["unmatched"].values()):
        line += "; unmatched " + ", ".join(f"rank {r}: {n}" for r, n in c["unmatched"].items())
    if c["last_by_start_agrees_pct"] is not None:
        line += (f"; one host clock: start-time order agrees with time-inside order on the last arriver in "
                 f"{c['last_by_start_agrees_pct']:.0f}%")
    out.append(line)
    la = c.get("last_arriver")
    if la:
        who = (f"rank {la['rank']}, {la['caused_wait_ms']:.3g} ms of the others' wait ({la['share_of_wait_pct']:.0f}% "
               f"of {la['total_wait_ms']:.3g} ms), last alone at {la['arrived_last']} of {la['of']} collectives"
               if la["rank"] is not None else f"tied within {la['tie_spread_ms']:.3g} ms: ranks "
               + _ranges(la["tied"]) + f", top {la['caused_wait_ms']:.3g} ms of the others' wait over {la['of']} collectives")
        out.append(f"the rank the others waited for most ({la['by']}): {who}")
    f = rep["finding"]
    if f["kind"] == "slow_rank":
        out.append(f"SLOW RANK: rank {f['rank']}: {f['measured']}; its own time is {rep['rank_tail_pct']:.0f}% of the "
                   f"step over the other ranks' (own-time split at a jump >= {TAIL_JUMP}x: {rep['own_time_tail']})")
        out.append(f"  single-device check: {f['single_device_branch']}")
    elif f["kind"] == "late_rank":
        out.append(f"LATE RANK: rank {f['rank']}: {f['measured']}; {f['why']}")
        out.append(f"  single-device check: {f['single_device_branch']}")
    elif f["kind"] == "slow_link":
        out.append(f"LINK: {f['verdict']} -- {f['names']}; {f['why']}")
        out.append(f"  every rank waits inside the collectives: the last arriver's time inside is "
                   f"{f['collective_floor_pct']:.0f}% of the step (median arrival skew {f['median_skew_ms']:.2f} ms); "
                   f"{f['overlap_hidden_pct']:.0f}% of communication hidden under compute")
    elif f["kind"] == "tail_unconfirmed":
        out.append(f"no rank named: {f['why']}")
    elif not rep.get("undecided"):
        out.append(f"no slow rank and no slow link (own-time spread {rep['rank_tail_pct']:.0f}%)")
    sp = rep.get("spreads") or {}
    if sp:
        out.append("spread over steps (p10-p90): " + "; ".join(
            f"{k} {v['p10']:.3g}-{v['p90']:.3g}" for k, v in sp.items()))
    m = rep.get("machine") or {}
    if m:
        out.append(f"machine (from the traces): {m['device']}; host {m['host']}; workload: {rep['workload']} "
                   "(backward ops / optimizer steps in the traces)" if rep["workload"] == "training" else
                   f"machine (from the traces): {m['device']}; host {m['host']}; workload: {rep['workload']}")
    tail = render_tail(rep, "from these traces")
    if rep.get("undecided"):  # the walk below covers the present ranks only: the job's answer is undecided
        tail = [ln.replace("flowchart (measured values only):", f"flowchart over the {rep['ranks_present']} present "
                           "(measured values only; not the job's answer, see UNDECIDED below):") for ln in tail]
        k = next((i for i, ln in enumerate(tail) if ln.startswith("note: ")), len(tail))
        tail.insert(k, f"UNDECIDED: {rep['undecided']}")
    out += tail
    for u in rep.get("skipped", []):
        out.append(f"not a trace: {u['file']}: {u['why']}")
    return "\n".join(out)


def _fmt_bytes(n: int | None) -> str:
    if not n:
        return "? bytes"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n} B"


def is_undecided(rep: dict[str, Any]) -> bool:
    """Ranks missing against the world size the traces state, or a trace in the folder that could
    not be read (named in ``unreadable``: it may be the slow rank): the CLI exits 4 (undecided)."""
    return bool(rep.get("undecided")) or bool(rep.get("unreadable"))


def has_finding(rep: dict[str, Any]) -> bool:
    """A named slow or late rank, a link finding, or an own-time tail that arrival does not confirm
    (the walk's K says yes, no rank is named): the CLI exits 1."""
    return rep["finding"]["kind"] in ("slow_rank", "late_rank", "slow_link", "tail_unconfirmed")
