"""``hwlab ranks RUN_DIR``: every rank's step log and startup capture, read together.

What it reports, and the rule behind each part:

* **Distribution** per rank: median step, p10/p90 (the kit's one percentile,
  :func:`hwlab.core.measure.quantile`, linear interpolation), its *compute* (step minus all time in collectives) and its
  *arrival* (step up to the start of its last collective). The first ``skip`` steps (start-up:
  allocation, communicator set-up) are left out.
* **Tail ranks**: sorted by compute, the ranks above the largest jump, when that jump is at
  least ``TAIL_JUMP`` (:func:`hwlab.core.tails.tail_split`, the rule Lab 3 uses too: busy hosts jitter
  by 10-20%, a slow rank costs more). If compute shows no tail, arrival is tried (a rank whose earlier collective crossed a
  slow link arrives late at the last one although its compute is normal). Without recorded
  collective time only the step itself is there; in a loop that syncs every step every rank's
  step is as long as the slowest's, and the report says so.
* **Periodic spikes**: the core's rule (:func:`hwlab.core.tails.spikes`: over 1.5x the median,
  periodic when three or more are evenly spaced) on each rank's compute (its step, without
  collective time), judged against the rank's own spread: they count only when they recur
  (periodic, or more than ``tails.OWN_TAIL_FRAC`` of its steps; fewer uneven ones are the
  rank's own tail, :func:`hwlab.core.tails.recurring`). Over-threshold steps on more than half
  the ranks at the same step are called global when such steps recur by the same rule. A
  rank's own (local) spikes must also rise more than ``SPIKE_OVER_HOST`` (2x) higher than the
  other ranks' excursions: ranks sharing a busy host are each preempted by about one
  scheduler slice at different steps, which is the host's jitter, not that rank's pattern
  (checkpoint, garbage collection, data loading: events that reach most ranks), others local to
  the rank. Half is not enough: on a busy host a rank whose compute is short jitters past 1.5x
  its median now and then, and one such rank coinciding with a slow rank's own spikes would
  relabel them global (seen with 4 CPU ranks on 2 busy cores).
* **Placement** of each tail rank from the capture: host, GPU, NUMA node, CPU binding, its TP
  group's slowest link, the capture's mapping warnings, NCCL's chosen routes.
* **Flowchart walk** on measured values only: B ``slowdown_vs_floor`` = over ranks, the median of
  each rank's p10 compute over the floor its declared work (``StepLog(n_flops=, n_bytes=)``)
  takes at the rates its capture probe measured on that device. p10, not the median: B asks
  about the device, and a throttled card or a regressed kernel is slow in every step (its
  fastest tenth too), while host interference (preemption, a shared CPU) hits some steps only; D ``e2e_slowdown`` = the median step over the median
  rank's compute (what the ranks' own work predicts); K ``rank_tail_pct``: the slowest rank's
  figure minus the on-time ranks' median, in % of the median step (:func:`hwlab.core.tails.tail_pct_of_step`,
  the rule's unit). B takes the on-time ranks only: with two ranks a median over ranks would
  include the straggler itself and send a host stall down the single-device branch.
  A question whose metric the run directory cannot supply stops the walk, and the report
  says what was missing; nothing is answered by hand.
* **Draft incident record** (:mod:`hwlab.diagnosis.incident`) from the walk and the capture.
"""
from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hwlab.core import capture
from hwlab.diagnosis import flowchart, incident
from hwlab.errors import UserInputError
from hwlab.core.evidence import Evidence
from hwlab.core.comms import nccl_routes
from hwlab.core.measure import quantile
from hwlab.core.steplog import read_log
from hwlab.core.tails import OWN_TAIL_FRAC, SPIKE_OVER_MEDIAN, TAIL_JUMP, recurring, spikes, tail_pct_of_step, tail_split
from hwlab.core.store import check_input_folder, read_user_bytes

DEFAULT_SKIP = 3


def _rank_stats(steps: list[dict[str, Any]], skip: int) -> dict[str, Any] | None:
    steps = sorted(steps, key=lambda s: s["step"])[skip:]
    if not steps:
        return None
    gpu = all("gpu_step_ms" in s for s in steps)
    step_ms = [s["gpu_step_ms"] if gpu else s["step_ms"] for s in steps]
    colls = [s["gpu_colls"] if gpu else s["colls"] for s in steps]
    compute = [t - sum(c[1] for c in cs) for t, cs in zip(step_ms, colls)]
    arrival = [t - cs[-1][1] if cs else t for t, cs in zip(step_ms, colls)]
    names = Counter(c[0] for cs in colls for c in cs)
    per_coll = {n: statistics.median([sum(c[1] for c in cs if c[0] == n) for cs in colls]) for n in names}
    has_colls = any(colls)
    ids = [s["step"] for s in steps]
    sp = spikes(compute if has_colls else step_ms)  # the one spike rule (hwlab.core.tails)
    hit, period = [ids[i] for i in sp["at"]], sp["period_steps"]
    # the rank's own tail (a few uneven excursions, tails.OWN_TAIL_FRAC) is no spike pattern
    spike_steps = hit if sp["recurring"] else []
    series = compute if has_colls else step_ms
    med = statistics.median(series)
    excess = [series[i] - med for i in sp["at"]]  # how far each over-threshold step went
    return {"n_steps": len(steps), "clock": "CUDA events" if gpu else "host clock",
            "step_ms": statistics.median(step_ms), "step_p10_ms": quantile(step_ms, 0.1),
            "step_p90_ms": quantile(step_ms, 0.9), "compute_ms": statistics.median(compute),
            "compute_p10_ms": quantile(compute, 0.1), "compute_p90_ms": quantile(compute, 0.9),
            "arrival_p10_ms": quantile(arrival, 0.1), "arrival_p90_ms": quantile(arrival, 0.9),
            "arrival_ms": statistics.median(arrival), "coll_ms": per_coll, "has_colls": has_colls,
            "spike_steps": spike_steps, "spike_period": period, "spike_candidates": hit,
            "spike_excess_ms": excess,
            "t_first_start_s": steps[0]["t_start_s"]}


def _probe_floor_ms(cap: dict[str, Any] | None, header: dict[str, Any]) -> float | None:
    """The step's declared work at the rates this rank's capture probe measured, in ms."""
    if not cap or not cap.get("probe"):
        return None
    flops, nbytes = header.get("n_flops_per_step", 0), header.get("n_bytes_per_step", 0)
    if not (flops or nbytes):
        return None
    rates = {p["name"]: p["derived"] for p in cap["probe"]}
    gemm = next((v["tflops"] for k, v in rates.items() if k.startswith("gemm")), None)
    copy = next((v["gbps"] for k, v in rates.items() if k.startswith("hbm_copy")), None)
    parts = [flops / (gemm * 1e12) * 1e3 if flops and gemm else 0.0,
             nbytes / (copy * 1e9) * 1e3 if nbytes and copy else 0.0]
    return max(parts) or None


def _routes(run_dir: Path, caps: dict[int, dict[str, Any]], extra: list[Path]) -> dict[str, Any]:
    by_pid = {(c["host"], c["pid"]): r for r, c in caps.items()}
    out: dict[str, Any] = {}
    for p in sorted(run_dir.glob("*/nccl.*.log")) + list(extra):
        m = re.match(r"nccl\.(\d+)\.log$", p.name)
        rank = by_pid.get((p.parent.name, int(m.group(1)))) if m else None
        try:  # a FIFO or device named like a log is refused unopened; the rest are read
            text = read_user_bytes(p, "NCCL log", "pass a log written with NCCL_DEBUG=INFO")
        except UserInputError as e:
            if p in extra:  # named by the user (--nccl-log): their input error
                raise
            out[str(p)] = {"rank": rank, "routes": {}, "unreadable": str(e)}
            continue
        out[str(p)] = {"rank": rank, "routes": nccl_routes(text.decode("utf-8", errors="replace"))}
    return out


def report(run_dir: str | Path, *, skip: int = DEFAULT_SKIP, nccl_logs: list[str] | None = None) -> dict[str, Any]:
    """Read every rank's step log and capture under ``run_dir``; see the module docstring."""
    run_dir = check_input_folder(run_dir, "run directory", "pass the run directory your job wrote (each rank "
                                 "calls hwlab.core.capture.capture(RUN_DIR) at start-up and logs its steps "
                                 "with hwlab.core.steplog.StepLog(RUN_DIR); see examples/straggler_torchrun.py)")
    problems: list[str] = []
    logs: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for p in sorted(run_dir.glob("*/steps-rank-*.jsonl")):
        header, steps, probs = read_log(p)
        problems += probs
        st = _rank_stats(steps, skip) if header else None
        if st is None:
            if header:
                problems.append(f"{p}: fewer than {skip + 1} steps, left out")
            continue
        st["host"] = p.parent.name
        logs[header["rank"]] = (header, st)
    if not logs and problems:  # logs there, none usable: say why (the first reason, and how many more)
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise UserInputError(f"no usable step log in {run_dir}: {problems[0]}{more}")
    if not logs:
        raise UserInputError(f"no step logs (*/steps-rank-*.jsonl) in {run_dir}: record them with "
                             "hwlab.core.steplog.StepLog(RUN_DIR) in your loop, and hwlab.core.capture.capture(RUN_DIR) "
                             "at start-up, on every rank (examples/straggler_torchrun.py does both); a folder of "
                             "profiler traces: hwlab ranks --traces DIR")
    cap_list, nodes, cprobs = capture.load_run(run_dir)
    problems += cprobs
    topos = {h: capture.Topology.from_dict(n["topology"]) for h, n in nodes.items() if n.get("topology")}
    caps = {}
    for c in cap_list:  # a GPU its host's topology does not list: a capture no run wrote together
        t, gpu = topos.get(c["host"]), c["device"].get("gpu")
        if t is not None and gpu is not None and gpu not in t.gpus:
            problems.append(f"capture of rank {c['rank']}: {gpu!r} is not a GPU of {c['host']}'s topology "
                            f"({', '.join(t.gpus)})")
            continue
        caps[c["rank"]] = c
    ranks = sorted(logs)
    missing_caps = [r for r in ranks if r not in caps]
    findings = capture.mapping_findings(list(caps.values()), topos) if caps else []
    stats = {r: logs[r][1] for r in ranks}
    has_colls = all(s["has_colls"] for s in stats.values())
    basis = "compute" if has_colls else "step"
    notes = []
    tail, tail_pct = _split_beyond_spread(stats, basis, notes)
    if has_colls and not tail:
        a_tail, a_pct = _split_beyond_spread(stats, "arrival", notes)
        if a_tail:
            basis, tail, tail_pct = "arrival", a_tail, a_pct
    if not has_colls:
        notes.append("no collective time recorded (log.collective()): in a loop that syncs every step each "
                     "rank's step lasts as long as the slowest rank's, so a tail may not show; D is not measured")
    # flowchart evidence: measured values only
    step_med = statistics.median(s["step_ms"] for s in stats.values())
    split_pct = tail_pct  # the tail split's own % (over the on-time ranks' figure), kept beside
    tail_pct = tail_pct_of_step({r: st[f"{basis}_ms"] for r, st in stats.items()}, tail, step_med)
    on_time = [r for r in ranks if r not in tail] or ranks
    ev: dict[str, Any] = {"rank_tail_pct": tail_pct, "n_ranks": len(ranks), "metric_sources": {
        "slowdown_vs_floor": "median over the on-time ranks (the tail ranks left out: a rank that stalls the "
                             "others is K's question, not the device's) of each rank's p10 compute (step minus "
                             "collectives) over its declared work at its capture probe's GEMM/copy rates",
        "e2e_slowdown": "median step over the median rank's compute (what the ranks' own work predicts)",
        "rank_tail_pct": f"the slowest rank's median {basis} time minus the on-time ranks' median, in % of the "
                         "median step, from the step logs"}}
    unmeasured: dict[str, str] = {}
    floors = {r: _probe_floor_ms(caps.get(r), logs[r][0]) for r in ranks}
    slow = {r: stats[r]["compute_p10_ms"] / f for r, f in floors.items() if f}
    for r, v in slow.items():
        stats[r]["slowdown_vs_floor"] = v
    if len(slow) == len(ranks):
        ev["slowdown_vs_floor"] = statistics.median(slow[r] for r in on_time)
    elif missing_caps:
        unmeasured["B"] = (f"capture missing for ranks {missing_caps}: no probe baseline to set a floor "
                           "(call hwlab.core.capture.capture(run_dir, probe=True) at startup)")
    else:
        unmeasured["B"] = ("no floor: the step log declares no work (StepLog(n_flops=, n_bytes=)) or the "
                           "capture ran without probe=True")
    own_ms = statistics.median(s["compute_ms"] for s in stats.values())
    if has_colls and own_ms > 0:
        ev["e2e_slowdown"] = statistics.median(s["step_ms"] for s in stats.values()) / own_ms
    elif has_colls:
        unmeasured["D"] = "the ranks' own work measured as zero: every step is spent in collectives"
    else:
        unmeasured["D"] = "no collective time recorded: the step cannot be split into own work and waiting"
    d = flowchart.diagnose(ev)
    # placement of each tail rank
    placement = {}
    for r in tail or []:
        c = caps.get(r)
        if c is None:
            placement[r] = "capture missing: link and NUMA placement unknown"
            continue
        dev, grp = c["device"], c.get("tp_group")
        topo = topos.get(c["host"])
        link = None
        if grp and topo and all(caps.get(x) and caps[x]["device"].get("gpu") in topo.gpus for x in grp):
            gpus = [caps[x]["device"]["gpu"] for x in grp]
            if len({caps[x]["host"] for x in grp}) == 1:
                link = topo.slowest_link(gpus)
        placement[r] = {"host": c["host"], "gpu": dev.get("gpu"), "gpu_source": dev.get("gpu_source"),
                        "numa_node": dev.get("numa_node"), "cpu_affinity": c.get("cpu_affinity"),
                        "numa_binding": c.get("numa_binding"), "tp_group": grp, "tp_group_slowest_link": link,
                        "topology_source": c.get("topology_source"),
                        "mapping_warnings": [w for w in findings if grp and f"ranks {grp}" in w]}
    routes = _routes(run_dir, caps, [Path(x) for x in nccl_logs or []])
    rep = {"run_dir": str(run_dir), "n_ranks": len(ranks), "skip": skip, "basis": basis,
           "per_rank": {str(r): stats[r] for r in ranks}, "tail_ranks": tail, "rank_tail_pct": tail_pct,
           "tail_over_on_time_pct": split_pct, "median_step_ms": step_med,
           "capture": {"missing_ranks": missing_caps, "present": bool(caps),
                       "topology": {h: n.get("topology_source") for h, n in nodes.items()}},
           "mapping_warnings": findings, "placement": {str(k): v for k, v in placement.items()},
           "spikes": _spike_summary(stats), "nccl_routes": routes,
           "flowchart": {"evidence": ev, "path": d.path, "leaf": d.leaf_id, "unmeasured": unmeasured,
                         "explain": d.explain(), "walk": d.to_dict()},
           "notes": notes, "problems": problems}
    rep["nvml"] = nvml_by_rank(sorted(run_dir.glob("*/nvml-rank-*.json")))
    rep["incident_draft"] = _incident(rep, d, caps, nodes)
    return rep


def nvml_by_rank(paths: list[Path]) -> dict[str, Any]:
    """Per-rank NVML samples (``nvml-rank-N.json`` from :mod:`hwlab.core.nvml_sampler`), summarised."""
    from hwlab.core.nvml_sampler import summarise
    from hwlab.core.store import loads_user_json
    out: dict[str, Any] = {}
    for p in paths:
        try:
            d = loads_user_json(p.read_text())  # refuses nesting and giant integers as ValueError
            out[str(d["rank"])] = summarise(d)
        except (OSError, ValueError, KeyError, TypeError) as e:
            out[p.name] = {"available": False, "reason": f"unreadable ({type(e).__name__})", "gpus": {}, "flags": []}
    return out


def render_nvml(nvml: dict[str, Any]) -> list[str]:
    """The NVML lines of the report: per rank, each series' median (p10-p90), NVLink, flags."""
    out = []
    for r, nv in nvml.items():
        if not nv["available"]:
            out.append(f"NVML rank {r}: not sampled ({nv['reason']})")
            continue
        for gid, g in nv["gpus"].items():
            parts = [f"{k} {v['median']:.0f} ({v['p10']:.0f}-{v['p90']:.0f})" for k, v in g.items()
                     if isinstance(v, dict) and v]
            out.append(f"NVML rank {r} GPU{gid}: " + ", ".join(parts) + f"; NVLink {g['nvlink']}"
                       + (f"; {g['sm_active_note']}" if g["sm_active_note"] else ""))
        out += [f"  NVML FLAG rank {r}: {f}" for f in nv["flags"]]
    return out
def _split_beyond_spread(stats: dict[int, dict[str, Any]], basis: str, notes: list[str]) -> tuple[list[int], float]:
    """:func:`hwlab.core.tails.tail_split` on the per-rank medians of ``basis``, kept only when every
    tail rank's p10 lies above every on-time rank's p90: a tail inside the ranks' own spread
    (a busy host delays one rank's collectives for a while) is borderline, not a slow rank."""
    tail, pct = tail_split({r: st[f"{basis}_ms"] for r, st in stats.items()})
    if not tail:
        return tail, pct
    on_time_p90 = max(st[f"{basis}_p90_ms"] for r, st in stats.items() if r not in tail)
    tail_p10 = min(stats[r][f"{basis}_p10_ms"] for r in tail)
    if tail_p10 > on_time_p90:
        return tail, pct
    notes.append(f"ranks {tail} are {pct:.0f}% later by median {basis} time but within spread "
                 f"(borderline): their p10 {tail_p10:.2f} ms is not above the others' p90 "
                 f"{on_time_p90:.2f} ms, so a re-run may not repeat it; not called a tail")
    return [], pct


#: a rank's spikes are its own when they rise this many times higher than the other ranks' excursions
SPIKE_OVER_HOST = 2.0


def _stands_out(rank: int, stats: dict[int, dict[str, Any]]) -> bool:
    """True when ``rank``'s over-threshold steps rise more than :data:`SPIKE_OVER_HOST` times
    the median excursion of the other ranks' over-threshold steps (or the others have none).
    Ranks that share a busy host are each preempted now and then by about one scheduler slice;
    excursions every rank shows at different steps are the host's, not one rank's pattern."""
    own = stats[rank].get("spike_excess_ms")
    others = [x for r, st in stats.items() if r != rank for x in st.get("spike_excess_ms", [])]
    if not own or not others:
        return True
    return statistics.median(own) > SPIKE_OVER_HOST * statistics.median(others)


def _spike_summary(stats: dict[int, dict[str, Any]]) -> dict[str, Any]:
    n = len(stats)
    # global: most ranks over their threshold at one step, each rank's excursions counted
    at = Counter(s for st in stats.values() for s in st.get("spike_candidates", st["spike_steps"]))
    global_steps = sorted(s for s, k in at.items() if k >= 2 and k > n / 2)  # most ranks, not one partner
    n_steps = min((st["n_steps"] for st in stats.values() if "n_steps" in st), default=None)
    if n_steps and not recurring(len(global_steps), n_steps, False):
        global_steps = []  # as rare as one rank's own tail: a host hiccup, not the job's pattern
    local = {str(r): {"steps": st["spike_steps"], "period": st["spike_period"]} for r, st in stats.items()
             if len([s for s in st["spike_steps"] if s not in global_steps]) >= 2 and _stands_out(r, stats)}
    return {"global_steps": global_steps, "local": local,
            "rule": (f"> {SPIKE_OVER_MEDIAN}x the rank's median, on more than {OWN_TAIL_FRAC:.0%} of its steps "
                     f"or periodic (fewer, uneven ones are the rank's own tail), and > {SPIKE_OVER_HOST:g}x "
                     "the other ranks' excursions (smaller ones are the shared host's)")}


def _incident(rep: dict[str, Any], d: flowchart.Diagnosis, caps: dict[int, dict[str, Any]],
              nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    c0 = caps.get(min(caps)) if caps else None
    ev = None
    if c0:
        node = nodes.get(c0["host"], {})
        ev = Evidence(kind="run_capture", machine={"device": c0["device"].get("name") or "no GPU (CPU ranks)",
                                                   "host": c0["host"]},
                      versions=c0.get("versions", {}), extra={"topology": node.get("topology")},
                      recorded_at=c0["taken_at"])
    mapping_txt = ", ".join(f"{r}->{c['host']}:{c['device'].get('gpu') or 'cpu'}" for r, c in sorted(caps.items())) \
        or "capture missing"
    fix = ("draft: " + rep["mapping_warnings"][0]) if rep["mapping_warnings"] else \
        ("draft: " + d.leaf.actions[0] if d.leaf else "draft: measure what the walk lacks first")
    lines = [f"rank {r}: median step {s['step_ms']:.2f} ms, compute {s['compute_ms']:.2f} ms, arrival "
             f"{s['arrival_ms']:.2f} ms, collectives {({k: round(v, 2) for k, v in s['coll_ms'].items()})} [{s['clock']}]"
             for r, s in rep["per_rank"].items()]
    lines += rep["mapping_warnings"] + [f"not measured ({q}): {why}" for q, why in rep["flowchart"]["unmeasured"].items()]
    inc = incident.from_diagnosis(
        f"rank tail in {Path(rep['run_dir']).name}", ev, d, symptom_scope="multi-GPU",
        symptom=(f"ranks {rep['tail_ranks']} take {rep['rank_tail_pct']:.0f}% of the median step longer than the others "
                 f"({rep['basis']} time) over {rep['n_ranks']} ranks") if rep["tail_ranks"] else
                f"no tail rank over {rep['n_ranks']} ranks (spread {rep['rank_tail_pct']:.0f}%)",
        fix=fix, reverify="re-run with the same capture and step log; `hwlab ranks` reports rank_tail_pct < 10%",
        rank_mapping=mapping_txt, extra_evidence=lines)
    return {"markdown": inc.to_markdown(), "record": asdict(inc)}


def render(rep: dict[str, Any]) -> str:
    """The report as text, for the terminal."""
    out = [f"hwlab ranks: {rep['n_ranks']} ranks in {rep['run_dir']} (first {rep['skip']} steps left out)"]
    out.append(f"{'rank':>5} {'host':<14} {'steps':>5} {'step ms':>9} {'p10-p90':>15} {'compute':>9} "
               f"{'arrival':>9}  collectives (median ms)")
    for r, s in rep["per_rank"].items():
        mark = "*" if int(r) in rep["tail_ranks"] else " "
        out.append(f"{mark}{r:>4} {s['host'][:14]:<14} {s['n_steps']:>5} {s['step_ms']:>9.2f} "
                   f"{s['step_p10_ms']:>7.2f}-{s['step_p90_ms']:<7.2f} {s['compute_ms']:>9.2f} {s['arrival_ms']:>9.2f}  "
                   + ", ".join(f"{k} {v:.2f}" for k, v in s["coll_ms"].items()))
    if rep["tail_ranks"]:
        out.append(f"TAIL: ranks {rep['tail_ranks']} ({rep['basis']} time {rep['rank_tail_pct']:.0f}% of the median step over the "
                   f"others' median; split at a jump >= {TAIL_JUMP}x)")
    elif not (rep["spikes"]["global_steps"] or rep["spikes"]["local"]):
        out.append(f"no tail, no spikes (largest spread {rep['rank_tail_pct']:.0f}%, {rep['basis']} time; "
                   f"spikes: {rep['spikes']['rule']})")
    else:
        out.append(f"no tail rank (largest spread {rep['rank_tail_pct']:.0f}%, {rep['basis']} time)")
    for r, p in rep["placement"].items():
        if isinstance(p, str):
            out.append(f"  rank {r}: {p}")
        else:
            gpu = f"{p['gpu']} ({p['gpu_source']})" if p["gpu"] else "no GPU"
            out.append(f"  rank {r}: {p['host']} {gpu}, NUMA {p['numa_node']}, "
                       f"CPUs {p['cpu_affinity']} ({p['numa_binding']}); TP group {p['tp_group']} slowest link "
                       f"{p['tp_group_slowest_link'] or 'unknown'} [topology: {p['topology_source']}]")
    cap = rep["capture"]
    if not cap["present"]:
        out.append("capture MISSING: no rank-*.json in the run directory (call hwlab.core.capture.capture at startup)")
    elif cap["missing_ranks"]:
        out.append(f"capture missing for ranks {cap['missing_ranks']}")
    for w in rep["mapping_warnings"]:
        out.append(f"MAPPING: {w}")
    sp = rep["spikes"]
    if sp["global_steps"]:
        out.append(f"spikes on most ranks at steps {sp['global_steps'][:12]} ({sp['rule']}): a global event")
    for r, v in sp["local"].items():
        per = f", every {v['period']:g} steps" if v["period"] else ""
        out.append(f"spikes on rank {r} only: steps {v['steps'][:12]}{per}")
    for path, v in rep["nccl_routes"].items():
        out.append(f"NCCL routes (rank {v['rank']}): "
                   f"{v.get('unreadable') or v['routes'] or 'no route lines'} [{path}]")
    out += render_tail(rep, "in this run directory")
    return "\n".join(out)


def render_tail(rep: dict[str, Any], where: str) -> list[str]:
    """The lines every rank report ends with (step logs and traces alike): NVML per rank, the
    flowchart walk, what it could not measure ``where``, notes and skipped inputs."""
    fc = rep["flowchart"]
    out = render_nvml(rep.get("nvml", {})) + ["flowchart (measured values only):"]
    out += ["  " + ln for ln in fc["explain"].splitlines()]
    out += [f"  {q} not measured {where}: {why}" for q, why in fc["unmeasured"].items()]
    return out + [f"note: {n}" for n in rep["notes"]] + [f"skipped: {p}" for p in rep["problems"]]


def has_finding(rep: dict[str, Any]) -> bool:
    """A tail rank or a mapping warning: the CLI exits 1."""
    return bool(rep["tail_ranks"] or rep["mapping_warnings"])
