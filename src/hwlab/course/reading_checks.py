"""Grade a learner's reading of a raw tool's output (notebook 09, exercise 05).

Each check recomputes the answer from the same recording through :mod:`hwlab.course.reading_facts`
and grades the learner's numbers and the evidence they cite:

* a number read off a trace passes inside the trace's own p10-p90 over steps (or collectives), or
  within :data:`TOL_PCT` % of its median (one step read carefully is a fair reading too);
* a counter read off an ncu report passes within the tolerance stated beside it (:data:`NCU_TOL`:
  the report prints two decimals; the reconciliation is arithmetic on printed figures);
* names (a sync call, a rank, a limit, a link class, GPU pairs) must match; the evidence cited (the
  timeline row, the span timed, the ncu metric, NCCL's path entry) must be the one that decides.

A wrong answer's message names what in the recording contradicts it, never the right value. An
unanswered part (``None``) is "not done yet". The result is a :class:`hwlab.core.grading.ExerciseResult`
(kept in the class folder like every graded answer).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hwlab.core.grading import ExerciseResult, not_done
from hwlab.course import reading_facts as facts
from hwlab.course.tries import Reference, graded

#: a number off a trace passes within this % of the recording's median (or inside its p10-p90)
TOL_PCT = 10.0
#: absolute tolerance per ncu figure: points of %, sectors per request/amplification, registers, spills
NCU_TOL = {"dram_pct": 1.0, "sector_amplification": 0.1, "estimate_pct_of_peak": 1.5,
           "achieved_occupancy_pct": 0.5, "registers": 0.0, "spills": 0.0, "sectors_per_request": 0.1}
#: relative tolerance on a sector count read off a raw report (ncu prints every digit; 1% forgives a
#: rounded reading, not a missed row)
SECTORS_TOL_PCT = 1.0
#: the answer a learner gives when no rank is late (``None`` means not answered yet)
NO_LATE_RANK = "none"


def within(x: float, s: dict[str, float]) -> bool:
    """``x`` inside the recording's p10-p90, or within :data:`TOL_PCT` % of its median."""
    return s["p10"] <= x <= s["p90"] or abs(x - s["median"]) <= TOL_PCT / 100 * abs(s["median"])


def accepted(s: dict[str, float]) -> tuple[float, float]:
    """The ends of what :func:`within` accepts for spread ``s``."""
    tol = TOL_PCT / 100 * abs(s["median"])
    return min(s["p10"], s["median"] - tol), max(s["p90"], s["median"] + tol)


def _spread_ref(label: str, s: dict[str, float]) -> dict[str, float]:
    lo, hi = accepted(s)
    return {f"{label} (median)": s["median"], "p10": s["p10"], "p90": s["p90"], "accepted from": lo, "accepted to": hi}


def _ncu_ref(f: dict, keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in keys:
        out[k] = f[k]
        if NCU_TOL[k]:
            out[f"{k} accepted from"], out[f"{k} accepted to"] = f[k] - NCU_TOL[k], f[k] + NCU_TOL[k]
    return out


def _number(answer: dict, key: str) -> float | None:
    v = answer.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _result(name: str, problems: list[str], ok: str) -> ExerciseResult:
    if problems:
        return ExerciseResult(name, "wrong", " ".join(problems))
    return ExerciseResult(name, "passed", ok)


def _missing(answer: Any, keys: tuple[str, ...]) -> list[str]:
    if not isinstance(answer, dict):
        return list(keys)
    return [k for k in keys if answer.get(k) is None]


# ---- traces -------------------------------------------------------------------------------------

def gpu_trace_reference(path: str | Path, answer=None) -> Reference:
    f = facts.gpu_trace_facts(path)
    return Reference({**_spread_ref("largest launch gap per step, us", f["gap_us"]), "row": f["device_rows"],
                      "sync_call": f["sync_calls"]})


@graded(gpu_trace_reference)
def check_gpu_trace(path: str | Path, answer: dict | None) -> ExerciseResult:
    """``answer = {"gap_us": ..., "row": "<the timeline row the gap is on>", "sync_call": "<name>"}``."""
    name = "reading a trace: launch gap and sync point"
    keys = ("gap_us", "row", "sync_call")
    if answer is None or _missing(answer, keys) == list(keys):
        return not_done(name, "Fill MY_TRACE: the gap in us, the row you read it on, the host call that waits.")
    miss = _missing(answer, keys)
    if miss:
        return ExerciseResult(name, "wrong", f"incomplete: give {', '.join(miss)} too.")
    f = facts.gpu_trace_facts(path)
    problems = []
    row = str(answer["row"])
    if row not in f["device_rows"]:
        problems.append(f"`{row}` is not a device row of this trace: a launch gap is time the GPU stream sits "
                        "idle between two of its kernels, so read it on a GPU stream row, not on a host thread.")
    gap = _number(answer, "gap_us")
    if gap is None:
        problems.append("gap_us must be a number (microseconds).")
    elif not within(gap, f["gap_us"]):
        # no count of the steps above it: that would be a figure to bisect on
        problems.append(f"{gap:g} us is outside the spread of the largest idle gap per step (the gap between two "
                        "consecutive activities, kernels or copies, of the stream inside one ProfilerStep). Measure "
                        "from one kernel's end to the next one's start, in several steps.")
    sync = str(answer["sync_call"])
    if sync not in f["sync_calls"] or sync.endswith("Async"):
        problems.append(f"`{sync}` is not a host call of this trace that blocks until the device is done: look on "
                        "the host thread (category cuda_runtime) at the end of each step for a call whose name says "
                        "it synchronises.")
    return _result(name, problems, f"the largest launch gap per step is {f['gap_us']['median']:.0f} us "
                   f"(p10-p90 {f['gap_us']['p10']:.0f}-{f['gap_us']['p90']:.0f} us over {f['gap_us']['n']} steps) "
                   f"on {', '.join(f['device_rows'])}; the host waits in {', '.join(f['sync_calls'])}.")


def rank_wait_reference(folder: str | Path, answer=None) -> Reference:
    f = facts.rank_wait_facts(folder)
    return Reference({"late_rank": f["late_ranks"][0] if len(f["late_ranks"]) == 1 else (f["late_ranks"] or NO_LATE_RANK),
                      **_spread_ref("wait_ms", f["wait_ms"]), "span": f["collectives"]})


@graded(rank_wait_reference)
def check_rank_wait(folder: str | Path, answer: dict | None) -> ExerciseResult:
    """``answer = {"late_rank": R or "none", "wait_ms": ..., "span": "<the span you timed>"}``: the
    late rank, the time the ranks that arrived early spend inside the collective, and the span read."""
    name = "reading rank traces: collective wait and late rank"
    keys = ("late_rank", "wait_ms", "span")
    if answer is None or _missing(answer, keys) == list(keys):
        return not_done(name, "Fill MY_RANKS: the late rank (or \"none\"), the wait in ms, the span you timed.")
    miss = _missing(answer, keys)
    if miss:
        return ExerciseResult(name, "wrong", f"incomplete: give {', '.join(miss)} too.")
    f = facts.rank_wait_facts(folder)
    by = f["wait_ms_by_rank"]
    problems = []
    span = str(answer["span"])
    coll = [c.replace("allreduce", "all_reduce") for c in f["collectives"]]
    if span.startswith(("c10d::", "record_param_comms")):
        problems.append(f"`{span}` on the main thread only enqueues the collective; the time spent inside it "
                        "is on the communication thread's span (gloo:... or the NCCL kernel).")
    elif not any(c in span.lower().replace("allreduce", "all_reduce") for c in coll):
        problems.append(f"`{span}` is not a collective's span in these traces; time the collective itself.")
    late = answer["late_rank"]
    late_k = NO_LATE_RANK if str(late).lower() == NO_LATE_RANK else late
    if late_k == NO_LATE_RANK and f["late_ranks"]:
        problems.append("compare the ranks' median times inside the collective: one rank spends far less "
                        "time inside than the others, so they waited for it.")
    elif late_k != NO_LATE_RANK:
        if late_k not in by:
            problems.append(f"rank {late_k!r} is not in these traces (ranks {f['ranks']}).")
        elif late_k not in f["late_ranks"]:
            problems.append(f"rank {late_k} spends about as long inside the collective as the ranks that waited: "
                            "it waited like them, so it did not arrive last. A late rank waits least; compare "
                            "every rank's median time inside the collective.")
    wait = _number(answer, "wait_ms")
    if wait is None:
        problems.append("wait_ms must be a number (milliseconds).")
    elif not within(wait, f["wait_ms"]):
        problems.append(f"{wait:g} ms is outside the spread of the waiting ranks' time inside the collective "
                        "(their p10-p90 over every collective): read the span's duration on a rank that arrived "
                        "early, in several steps.")
    late_txt = ", ".join(f"rank {r}" for r in f["late_ranks"]) or "no rank (every rank waits alike: the link or "\
        "the payload, not a rank)"
    return _result(name, problems, f"late: {late_txt}; the waiting ranks spend {f['wait_ms']['median']:.1f} ms "
                   f"inside each collective (p10-p90 {f['wait_ms']['p10']:.1f}-{f['wait_ms']['p90']:.1f} ms).")


def host_gap_reference(path: str | Path, answer=None) -> Reference:
    return Reference(_spread_ref("gap_ms", facts.host_gap_facts(path)["gap_ms"]))


@graded(host_gap_reference)
def check_host_gap(path: str | Path, answer: dict | None) -> ExerciseResult:
    """``answer = {"gap_ms": ...}``: the largest gap between top-level operators on the rank's main
    thread inside a step (the host launched nothing)."""
    name = "reading a trace: host gap"
    if not isinstance(answer, dict) or answer.get("gap_ms") is None:
        return not_done(name, "Fill MY_GAP: the host gap in ms.")
    f = facts.host_gap_facts(path)
    gap = _number(answer, "gap_ms")
    if gap is None:
        return ExerciseResult(name, "wrong", "gap_ms must be a number (milliseconds).")
    if not within(gap, f["gap_ms"]):
        return ExerciseResult(name, "wrong", f"{gap:g} ms is outside this rank's spread of its largest gap between "
                              "two top-level operators on the main thread inside a step: measure from one operator's "
                              "end to the next one's start, inside one ProfilerStep, in several steps.")
    return ExerciseResult(name, "passed", f"rank {f['rank']}'s host gap is {f['gap_ms']['median']:.1f} ms "
                          f"(p10-p90 {f['gap_ms']['p10']:.1f}-{f['gap_ms']['p90']:.1f} ms): nothing was launched then.")


# ---- Nsight Compute -------------------------------------------------------------------------------

def _ncu_problems(answer: dict, f: dict, keys: tuple[str, ...], what: dict[str, str],
                  unconverted: dict[str, float] | None = None) -> list[str]:
    """What is wrong with each reading in ``answer``: off the report by more than :data:`NCU_TOL`, or
    (``unconverted``) nearer the figure before a conversion the question asks for than to the converted one,
    so the conversion is checked even where it moves the figure less than the tolerance."""
    unconverted = unconverted or {}
    problems = []
    for k in keys:
        x = _number(answer, k)
        if x is None:
            problems.append(f"{k} must be a number.")
        elif abs(x - f[k]) > NCU_TOL[k] + 1e-9:
            problems.append(f"{k} {x:g} is not what the report shows ({what[k]}; read to within ±{NCU_TOL[k]:g}).")
        elif k in unconverted and abs(x - unconverted[k]) <= abs(x - f[k]):
            problems.append(f"{k} {x:g} is the figure before the conversion the question asks for ({what[k]}).")
    return problems


def ncu_lab01_reference(case: str, answer=None) -> Reference:
    return Reference(_ncu_ref(facts.ncu_lab01(case), ("dram_pct", "sector_amplification", "estimate_pct_of_peak")))


@graded(ncu_lab01_reference)
def check_ncu_lab01(case: str, answer: dict | None) -> ExerciseResult:
    """``answer = {"dram_pct": ..., "sector_amplification": ..., "estimate_pct_of_peak": ...}``."""
    name = f"reading ncu: Lab 1 {case}"
    keys = ("dram_pct", "sector_amplification", "estimate_pct_of_peak")
    if not isinstance(answer, dict) or all(answer.get(k) is None for k in keys):
        return not_done(name, "Fill the three figures.")
    f = facts.ncu_lab01(case)
    what = {"dram_pct": "the row dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "sector_amplification": "sectors loaded x 32 B over the bytes the case must load",
            "estimate_pct_of_peak": "the kit's estimate in % of the copy ceiling, times the ceiling over the "
                                    "datasheet peak"}
    problems = _ncu_problems(answer, f, keys, what,
                             unconverted={"estimate_pct_of_peak": f["dram_pct_estimated_of_ceiling"]})
    return _result(name, problems, f"DRAM {f['dram_pct']:.1f}% of peak counted, {f['estimate_pct_of_peak']:.1f}% "
                   f"estimated on the same denominator: they {'agree' if f['agree'] else 'differ'} "
                   f"(rule: within {facts.AGREE_PTS:g} points); sector amplification {f['sector_amplification']:.1f}x.")


def ncu_lab02_reference(config: str, answer=None) -> Reference:
    f = facts.ncu_lab02(config)
    return Reference({**_ncu_ref(f, ("registers", "spills", "achieved_occupancy_pct")),
                      "binding_metric": ["launch__occupancy_limit_" + b for b in f["binding"]]})


@graded(ncu_lab02_reference)
def check_ncu_lab02(config: str, answer: dict | None) -> ExerciseResult:
    """``answer = {"registers": ..., "spills": ..., "achieved_occupancy_pct": ..., "binding_metric": "<ncu metric>"}``."""
    name = f"reading ncu: Lab 2 {config}"
    keys = ("registers", "spills", "achieved_occupancy_pct")
    if not isinstance(answer, dict) or all(answer.get(k) is None for k in keys + ("binding_metric",)):
        return not_done(name, "Fill the figures and the metric that binds occupancy.")
    f = facts.ncu_lab02(config)
    what = {"registers": "the row launch__registers_per_thread",
            "spills": "the compile report's spill count",
            "achieved_occupancy_pct": "the row sm__warps_active.avg.pct_of_peak_sustained_active"}
    problems = _ncu_problems(answer, f, keys, what)
    metric = str(answer.get("binding_metric") or "")
    prefix = "launch__occupancy_limit_"
    if not metric.startswith(prefix) or metric[len(prefix):] not in f["limits"]:
        problems.append(f"`{metric}` is not one of the report's occupancy-limit rows ({prefix}*): each says how many "
                        "blocks per SM one resource allows.")
    elif metric[len(prefix):] not in f["binding"]:
        lim = metric[len(prefix):]
        problems.append(f"{metric} allows {f['limits'][lim]:g} blocks per SM, but it is not the row that binds: "
                        "the binding limit is the one whose count the SM reaches first; read every "
                        f"{prefix}* row of the report and compare their counts.")
    return _result(name, problems, f"{f['registers']:.0f} registers/thread, {f['spills']} spills "
                   f"({f['spills_source']}), achieved occupancy {f['achieved_occupancy_pct']:.2f}% against the kit's "
                   f"theoretical {f['theoretical_occupancy_pct']:.2f}% (an estimate from registers, shared memory and "
                   f"warps); binding: {', '.join(f['binding'])}.")


def ncu_raw_reference(cases: tuple[str, ...], tiles: tuple[str, ...], answer=None) -> Reference:
    out: dict[str, Any] = {}
    tol = NCU_TOL["sectors_per_request"]
    for case in cases:
        v = facts.ncu_raw_facts(case)[0]["sectors_per_request"]
        out.update({f"sectors_per_request[{case}]": v, f"{case} accepted from": v - tol, f"{case} accepted to": v + tol})
    local = {t: sum(r["local_sectors"] or 0.0 for r in facts.ncu_raw_facts(t)) for t in tiles}
    tile = max(local, key=local.get)
    n = local[tile]
    return Reference({**out, "spilling_tile": tile, "local_sectors": n,
                      "local_sectors accepted from": n * (1 - SECTORS_TOL_PCT / 100),
                      "local_sectors accepted to": n * (1 + SECTORS_TOL_PCT / 100)})


@graded(ncu_raw_reference)
def check_ncu_raw(cases: tuple[str, ...], tiles: tuple[str, ...], answer: dict | None) -> ExerciseResult:
    """A reading of ncu's raw rows (:func:`hwlab.course.reading_facts.ncu_raw_text`). ``cases``: Lab 1
    reports (one kernel each, e.g. ``("lab01_strided", "lab01_coalesced")``); ``tiles``: Lab 2 reports of
    which exactly one spills. ``answer = {"sectors_per_request": {case: ...}, "spilling_tile": "<report>",
    "local_sectors": <load + store sectors of local memory of that tile>}``."""
    name = "reading ncu's raw rows: sectors per request and spill traffic"
    if not isinstance(answer, dict) or all(answer.get(k) is None for k in ("sectors_per_request", "spilling_tile",
                                                                              "local_sectors")):
        return not_done(name, "Fill sectors_per_request per case, the spilling tile and its local-memory sectors.")
    problems = []
    spr = answer.get("sectors_per_request") if isinstance(answer.get("sectors_per_request"), dict) else {}
    for case in cases:
        k = facts.ncu_raw_facts(case)
        want = k[0]["sectors_per_request"]
        got = spr.get(case)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            problems.append(f"sectors_per_request[{case!r}] must be a number.")
        elif abs(got - want) > NCU_TOL["sectors_per_request"] + 1e-9:
            problems.append(f"sectors_per_request[{case!r}] {got:g} is not the report's "
                            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum over l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum "
                            f"(read to within ±{NCU_TOL['sectors_per_request']:g}).")
    local = {t: sum(r["local_sectors"] or 0.0 for r in facts.ncu_raw_facts(t)) for t in tiles}
    spilling = [t for t, v in local.items() if v > 0]
    if len(spilling) != 1:
        raise ValueError(f"exactly one of {tiles} must spill in the recorded reports (local sectors {local})")
    tile = answer.get("spilling_tile")
    if tile not in tiles:
        problems.append(f"spilling_tile must be one of {list(tiles)}.")
    elif tile != spilling[0]:
        problems.append(f"{tile}'s local-memory rows (l1tex__t_sectors_pipe_lsu_mem_local_op_ld/st) read 0: its "
                        "registers held everything.")
    n = _number(answer, "local_sectors")
    want = local[spilling[0]]
    if n is None:
        problems.append("local_sectors must be a number.")
    elif abs(n - want) > SECTORS_TOL_PCT / 100 * want:
        problems.append(f"local_sectors {n:g} is not the spilling tile's local-memory sectors, loads and stores "
                        f"together (read to within {SECTORS_TOL_PCT:g}%).")
    said = ", ".join(f"{c} {facts.ncu_raw_facts(c)[0]['sectors_per_request']:g}" for c in cases)
    return _result(name, problems, f"sectors per request: {said}; {spilling[0]} moves {want:,.0f} local-memory "
                   f"sectors ({want * 32 / 1e9:.1f} GB through L1 at 32 B each) that its registers could not hold.")


# ---- topology and NCCL ----------------------------------------------------------------------------

def _pairs(x: Any) -> set[tuple[int, int]] | None:
    try:
        return {tuple(sorted((int(a), int(b)))) for a, b in x}
    except (TypeError, ValueError):
        return None


def slow_pairs_reference(topo_text: str, group: list[int], answer=None) -> Reference:
    f = facts.slow_pairs(topo_text, group)
    return Reference({"pairs": sorted(f["pairs"]), "link": f["slowest"]})


@graded(slow_pairs_reference)
def check_slow_pairs(topo_text: str, group: list[int], answer: dict | None) -> ExerciseResult:
    """``answer = {"pairs": [(a, b), ...], "link": "<class>"}``: every GPU pair of ``group`` that
    crosses the group's slowest link, and that link's class as nvidia-smi prints it."""
    name = "reading nvidia-smi topo -m: the slow pairs"
    if not isinstance(answer, dict) or (answer.get("pairs") is None and answer.get("link") is None):
        return not_done(name, "Fill MY_TOPO: the pairs and the link class.")
    f = facts.slow_pairs(topo_text, group)
    got = _pairs(answer.get("pairs") or [])
    problems = []
    if got is None:
        return ExerciseResult(name, "wrong", "pairs must be a list of (GPU, GPU) number pairs.")
    outside = [p for p in got if p not in f["links"]]
    if outside:
        problems.append(f"{outside} are not pairs of the group {f['group']}.")
    for p in sorted(got - set(f["pairs"]) - set(outside)):
        problems.append(f"GPU{p[0]}-GPU{p[1]} reads {f['links'][p]}, which is not the group's slowest class: rank "
                        "the classes by the legend under the matrix and read every cell between the group's GPUs.")
    if not problems and got != set(f["pairs"]):
        problems.append(f"you listed {len(got)} pair(s); more pairs of this group cross the same class: read "
                        "every cell between the group's GPUs.")
    link = str(answer.get("link") or "")
    if link.upper().replace("SOC", "SYS") != f["slowest"]:
        problems.append(f"`{link}` is not the class printed in the slowest cells among the group's GPUs: compare "
                        "the cells with the legend under the matrix.")
    return _result(name, problems, f"the slowest class in GPUs {f['group']} is {f['slowest']}, crossed by "
                   + ", ".join(f"GPU{a}-GPU{b}" for a, b in f["pairs"]) + ".")


def nccl_path_reference(log: str, answer=None) -> Reference:
    paths = [p for p in facts.nccl_paths(log) if p["src"].startswith("GPU/") and p["type"] != "LOC"]
    worst = min(paths, key=lambda p: p["gbps"])
    return Reference({"gbps": worst["gbps"], "type": worst["type"]}, how=f"the path to {worst['dst']}")


@graded(nccl_path_reference)
def check_nccl_path(log: str, answer: dict | None) -> ExerciseResult:
    """``answer = {"gbps": ..., "type": "<path type>"}``: the slowest path NCCL's topology dump gives
    the GPU (bandwidth in GB/s and path type, as NCCL prints them)."""
    name = "reading NCCL_DEBUG=INFO: the GPU's slowest path"
    if not isinstance(answer, dict) or (answer.get("gbps") is None and answer.get("type") is None):
        return not_done(name, "Fill MY_NCCL: the bandwidth and the path type.")
    paths = [p for p in facts.nccl_paths(log) if p["src"].startswith("GPU/") and p["type"] != "LOC"]
    if not paths:
        raise ValueError("no GPU path lines (GPU/... :... (hops/bw/type)) in this log")
    worst = min(paths, key=lambda p: p["gbps"])
    problems = []
    gbps = _number(answer, "gbps")
    if gbps is None:
        problems.append("gbps must be a number (NCCL prints GB/s).")
    elif abs(gbps - worst["gbps"]) > 1e-6 * max(1.0, worst["gbps"]):
        faster = [p["dst"] for p in paths if abs(p["gbps"] - gbps) < 1e-6]
        problems.append(f"{gbps:g} GB/s is " + (f"the path to {faster[0]}, which is not the GPU's slowest path: "
                                                  "read the bandwidth of every path line NCCL printed for the GPU "
                                                  "(the middle field of (hops/bandwidth/type)) and compare them."
                                                  if faster else "no bandwidth NCCL printed for the GPU's paths."))
    typ = str(answer.get("type") or "")
    if typ.upper() not in {p["type"] for p in paths if p["gbps"] == worst["gbps"]}:
        problems.append(f"`{typ}` is not the type NCCL printed on the slowest path: the last field in "
                        "(hops/bandwidth/type).")
    return _result(name, problems, f"the GPU's slowest path: to {worst['dst']} at {worst['gbps']:g} GB/s "
                   f"({worst['type']}, {worst['hops']} hops).")
