"""Where a function's time goes, part by part, what bounds each part, and what fixing it would win.

One aggregate number per flowchart question cannot say which part of a model to fix first: a
forward with GEMMs near their ceiling and an op-by-op activation chain averages into neither.
:func:`build_parts` splits the measured time by part and walks the flowchart once per part.

**Attribution.** Every timed item of the profiled calls (:func:`hwlab.core.profiling.trace_calls`:
each device kernel on a GPU, each aten op's self time on a CPU) is joined to the aten op that
launched it: the outermost op on its stack that the traffic model (a dispatch mode,
:mod:`hwlab.examine.estimate`) also saw, the k-th instance of that op in the call joined to the
k-th record of it. The op's record gives its bytes, FLOPs, dtypes and sector amplification.
Items are grouped by :func:`hwlab.core.profiling.part_class` (GEMM by dtype, attention,
elementwise/reduction, copy/concat, gather/scatter, quant/dequant, Triton/compiled,
communication). Added to them:

* on a GPU, **gpu idle**: the measured median minus the time kernels kept the GPU busy under
  the profiler (launch gaps, host work between launches);
* on a CPU, **host outside ops**: the profiled calls' duration minus their aten ops' self time
  (Python between ops), as its share of those calls, the way an independent profile reads it.
  On a CPU the parts are shares of the profiled calls (CPU op self times), and a part's ms is its
  share of the measured median. On a busy host a call waits for a CPU inside whichever op runs when it
  is preempted, whose wall-clock self time then holds the host's load: so each op instance (the k-th
  op of the call) takes its **median self time over the profiled calls**, and each gap between
  consecutive outermost ops its median over them (:func:`op_medians`), where a sum over calls would
  keep every preemption.
  Each repeat reads the medians over :data:`REPEAT_CALLS` calls (its own and the next), so the
  calls' disagreement shows as each part's share range and spread; the part's share in each single
  call (the highest and lowest left out) sets its least run-to-run spread (:func:`call_share_spread`),
  so a part the calls disagree on is BORDERLINE near a threshold in every run, not in one of them.
  Calls that ran different ops are pooled instead, the quiet ones only (:func:`quiet_calls`: no more
  run-queue wait than the typical call's). The calls read are the least disturbed of those profiled
  (:func:`steady_calls`: run-queue wait plus page faults beyond the unprofiled calls', as time); where
  most of them still waited (:func:`most_waited`), each op instance takes its least time over them.

Triton kernels and ``torch.compile``d graphs run outside aten ops: their part says its bytes
are not attributable (the traffic model did not see them), unless it is the whole function,
when the function's own required bytes are its floor.

**A part's floor** is the larger of its bytes over the measured copy ceiling and its FLOPs
over the measured GEMM ceiling at its dtype. Its bytes are counted *as if the part's ops were
fused*: every tensor it reads that none of its own ops wrote, once, and every tensor it writes
that an op outside it reads (or the caller gets), once. An op-by-op chain's intermediates are
free at its floor, so the floor shows what fusion would win; fusion only reaches across ops
that run back to back, so each run of consecutive ops of the part is floored on its own. **% of floor** is floor time over
measured time (100% = at the floor). **Expected gain**: the part's time minus its floor time,
and the whole function's speed-up if only that part reached its floor (Amdahl:
``t / (t - saved)``). The idle part's floor is zero: its gain is an upper bound.

On a CPU the profiler also inflates the call (its bookkeeping per op lands in and between ops):
shares of the profiled call are applied to the unprofiled median, so the inflation is spread over
the parts as the profile spreads it. Rates above a measured ceiling raise it where the part's working set proves it low,
and DRAM bytes of at least 2x the fused bytes by the per-op cache bound (moved - cache x op
boundaries) answer F (:mod:`hwlab.examine.rates`).

**The walk per part.** Every part holding at least :data:`WALK_SHARE_PCT` of the time (in the pooled
calls, a repeat, or at the top of its share's spread over the single calls: :func:`walks`) is walked
on its own metrics (slowdown over its floor, its estimated DRAM share, its sector
amplification, its tensor-core share when its FLOPs set its floor or a GEMM part is near the ridge, its matmul FLOPs and
tensor-core kernels for H's applicability); the idle part answers F with no bytes moved and H
with its own idle share. The **headline** is the walked part with the largest expected gain;
the others follow in order of gain. The CPU's host-outside-ops part heads only by
:func:`host_headline_refusal`'s rule (more than its spread across profiled calls, and the
whole-function walk on J too).

**J, in detail** (:func:`j_detail`): a part landing on J is told which of launch, occupancy,
registers or memory latency it is, from measured figures: the idle share, the profiler's kernel
records (Kineto's estimated achieved occupancy, registers per thread, warps per SM) or Nsight
Compute's counted occupancy where ``--ncu`` ran, and the achieved bandwidth against the copy
ceiling. Thresholds (and why) are in :data:`J_RULES`.
"""
from __future__ import annotations

from typing import Any, Callable

from hwlab.diagnosis.flowchart import LEAVES, diagnose  # noqa: F401 (LEAVES re-exported)
from hwlab.core.profiling import part_class
from hwlab.examine.dtype_lever import FP64_NO_BF16, lever_note, no_ceiling_note
from hwlab.examine.fused_ops import COUNTED, FusedSplit, fused_owner
from hwlab.examine.part_advice import J_RULES, PART_ACTIONS, actions_for, j_detail  # noqa: F401 (re-exported)
from hwlab.examine.part_record import WALK_SHARE_PCT, Part, Parts  # noqa: F401 (re-exported)
from hwlab.examine.part_walk import (  # noqa: F401 (re-exported)
    floor_part, gain, host_headline_refusal, is_tc, ncu_matches, part_evidence, rewalk)

#: a part is "the whole function" (its floor may be the function's) at this share of kernel time
WHOLE_PCT = 90.0
#: where the walked shares plus idle must land against the measured time
COVERAGE_TOL_PCT = 5.0


def fused_floor_bytes(part_ops: list, all_ops: list, out_keys: set) -> int:
    """Bytes a group of ops must move if each run of consecutive ops in it were fused into one
    kernel (module doc). A run is a maximal stretch of the group's ops in call order with no
    other op between them (fusion cannot reach across another part's kernel). Per run: reads
    of storages the run did not write, once each, plus writes that an op outside the run reads,
    the caller gets (``out_keys``) or nothing reads at all, once each."""
    mine = {id(o) for o in part_ops}
    runs: list[list] = []
    prev = False
    for o in all_ops:
        inside = id(o) in mine
        if inside:
            if not prev:
                runs.append([])
            runs[-1].append(o)
        prev = inside
    read_anywhere = {k for o in all_ops for k, _ in o.reads}
    total = 0
    for run in runs:
        ids = {id(o) for o in run}
        written_here: set = set()
        reads: dict = {}
        for o in run:
            for k, b in o.reads:
                if k not in written_here:
                    reads[k] = max(reads.get(k, 0), b)
            written_here.update(k for k, _ in o.writes)
        read_elsewhere = {k for o in all_ops if id(o) not in ids for k, _ in o.reads}
        writes: dict = {}
        for o in run:
            for k, b in o.writes:
                if k in read_elsewhere or k in out_keys or k not in read_anywhere:
                    writes[k] = max(writes.get(k, 0), b)
        total += sum(reads.values()) + sum(writes.values())
    return int(total)


def _join(calls: list, traffic_ops: list) -> list[list[tuple[dict, int | None]]]:
    """Each timed item of each call with the index of its traffic record (None: not joined)."""
    by_name: dict[str, list[int]] = {}
    for i, o in enumerate(traffic_ops):
        by_name.setdefault(o.name, []).append(i)
    out = []
    for items in calls:
        seen: dict[str, dict] = {}  # name -> op instance id -> its rank in order of first appearance
        joined = []
        for it in sorted(items, key=lambda x: x["ts"]):
            name, inst = None, None
            for n, oid in zip(reversed(it["stack"]), reversed(it["op_ids"])):  # outermost first
                if n in by_name:
                    name, inst = n, oid
                    break
            idx = None
            if name is not None:
                order = seen.setdefault(name, {})
                k = order.setdefault(inst, len(order))
                idx = by_name[name][k] if k < len(by_name[name]) else None
            joined.append((it, idx))
        out.append(joined)
    return out


def build_parts(*, prof, traffic, t_ms: float, gpu: bool, copy_gbps: float | None,
                gemm_tflops_for: Callable[[str | None], float | None], whole_floor_ms: float | None,
                whole_slowdown: float | None, e2e_slowdown: float | None, out_keys: set,
                e2e_spread: dict[str, Any] | None = None,
                ncu: dict[str, Any] | None = None, lab_for: Callable[[str], str] = lambda leaf: "",
                cache_bytes: int | None = None, whole_leaf: str | None = None, call_index: int | None = None,
                repeats: list[Parts] | None = None,
                bf16_ok: Callable[[], tuple[bool, str]] | None = None,
                ceiling_band: tuple[float, float] | None = None,
                gemm_ceiling_for: Callable[[str | None], tuple] | None = None,
                per_op: dict[str, Any] | None = None) -> Parts:
    """The parts of one examination (module doc). ``gemm_tflops_for(dtype)`` is the measured
    GEMM ceiling a matmul of that input dtype is floored at. ``call_index`` picks the profiled
    call on a CPU (default: the call of median duration); ``repeats`` are the same parts built
    on each repeat (:mod:`hwlab.examine.repeats`): their range is each part's spread, and a leaf
    they differ on is BORDERLINE, widened by the ceilings' own spread (``ceiling_band``,
:func:`hwlab.examine.repeats.ceiling_band`). ``bf16_ok`` checks a bf16 fix against the machine.
    ``gemm_ceiling_for(dtype)`` -> ``(TFLOP/s, ceiling name, lever, gain)``, where given, replaces
    ``gemm_tflops_for`` (:func:`hwlab.examine.dtype_lever.gemm_ceiling`). ``per_op``: a CPU's
    measured cost per aten op (:func:`hwlab.examine.op_overhead.per_op_us`), for J in detail."""
    src = ("GPU kernel times from the profiler's Chrome trace, joined to the aten ops that launched them"
           if gpu else "CPU: aten op self times from the profiler's Chrome trace (no device kernels); "
           "shares of the profiled call")
    calls, call_us = list(prof.calls or []), list(prof.call_us or [])
    disturb = [] if gpu else call_disturbance_us(prof, len(calls))
    keep = steady_calls(len(calls), disturb) if len(call_us) == len(calls) else list(range(len(calls)))
    if len(keep) < len(calls):
        calls, call_us, disturb = [calls[k] for k in keep], [call_us[k] for k in keep], [disturb[k] for k in keep]
    waited = most_waited(call_us, disturb)  # most kept calls waited: each op's least time (op_medians)
    outside_ms = ([(u - sum(i["us"] for i in c)) / 1e3 for c, u in zip(calls, call_us)]
                  if not gpu and len(call_us) == len(calls) else [])  # host time outside ops, per profiled call
    share_spread = call_share_spread(calls, call_us, traffic.ops) if not gpu and call_index is None else {}
    steady = None
    if not gpu and len(calls) > 1 and len(call_us) == len(calls):
        pick = None
        if call_index is not None:  # a repeat: the op medians of its own call and the next ones (module doc)
            pick = [(call_index + j) % len(calls) for j in range(min(REPEAT_CALLS, len(calls)))]
        steady = op_medians(calls, call_us, pick, least=waited)
    if steady is not None:
        calls, call_us = [steady[0]], [steady[1]]
    elif not gpu and len(calls) > 1 and len(call_us) == len(calls):  # the quiet calls, pooled (module doc)
        quiet = quiet_calls(call_us, disturb)
        if call_index is not None:  # a repeat reads one quiet call of its own
            quiet = [quiet[call_index % len(quiet)]]
        calls, call_us = [calls[k] for k in quiet], [call_us[k] for k in quiet]
    calls = [c for c in calls if c]
    if not calls or t_ms <= 0:
        return Parts([], t_ms, src, None, error=prof.error or "the profiler's trace had no timed call")
    n = len(calls)
    ops = traffic.ops
    groups = _groups(calls, ops)
    notes: list[str] = []
    items_ms = {c: g["us"] / n / 1e3 for c, g in groups.items()}
    if gpu:
        rest_name, rest_ms, scale = "gpu idle", max(0.0, t_ms - prof.busy_ms_per_call), 1.0
    else:
        ops_ms = sum(items_ms.values())
        call_ms = sum(call_us) / len(call_us) / 1e3 if call_us else ops_ms
        rest_name = "host outside ops"
        rest_raw = max(0.0, call_ms - ops_ms)
        # its share of the profiled calls, as an independent profile reads it (module doc)
        rest_ms = t_ms * rest_raw / call_ms if call_ms > 0 else 0.0
        scale = (t_ms - rest_ms) / ops_ms if ops_ms > 0 else 1.0  # op shares of the rest of the median
        kept = (f" (the {len(keep)} least disturbed of {len(prof.calls)} by run-queue wait and page faults)"
                if len(keep) < len(prof.calls or []) else "")
        stat = "least" if waited else "median"
        how = (f"each op's {stat} self time over {steady[2]} profiled calls{kept}" if steady is not None else
               f"{n} profiled call{'s' if n != 1 else ''}{kept} (the quiet ones by run-queue wait)")
        fault_line = prof.fault_note() if callable(getattr(prof, "fault_note", None)) else None
        churn_line = prof.churn_note(t_ms) if callable(getattr(prof, "churn_note", None)) else None
        notes += [f"CPU: {line}" for line in (fault_line, churn_line) if line]
        notes.append(f"CPU: part times are the ops' shares of {how} (mean "
                     f"{call_ms:.4g} ms under the profiler) applied to the measured "
                     f"median ({t_ms:.4g} ms); time outside ops is its share of those calls ({rest_raw:.4g} of "
                     f"{call_ms:.4g} ms)")
    kernel_total_ms = sum(items_ms.values())
    ceiling_for = gemm_ceiling_for or (lambda dt: (gemm_tflops_for(dt), dt, None, None))
    parts = [_part(cls, g, items_ms, scale, t_ms, n, ops, out_keys, gpu, copy_gbps, ceiling_for, cache_bytes,
                   whole_floor_ms if kernel_total_ms > 0 and 100.0 * items_ms[cls] / kernel_total_ms >= WHOLE_PCT
                   else None) for cls, g in groups.items()]
    rest = Part(name=rest_name, t_ms=rest_ms, share_pct=100.0 * rest_ms / t_ms, n_items=0.0,
                attributable=True, moved_bytes=0, floor_bytes=0, flops=0, floor_ms=0.0,
                floor_source="none: no work runs in it", gbps=0.0,
                gain_bound=" (an upper bound: launches never cost nothing)" if gpu else
                " (an upper bound: some host work always remains)")
    if not gpu:
        rest.not_headline = host_headline_refusal(rest_ms, outside_ms, whole_leaf)
    parts.append(rest)
    coverage = 100.0 * sum(p.t_ms for p in parts) / t_ms
    if gpu and abs(coverage - 100.0) > COVERAGE_TOL_PCT:
        notes.append(f"kernel times plus idle come to {coverage:.1f}% of the measured time (kernels overlap, "
                     "or the profiled calls ran differently from the timed ones)")
    idle_pct = 100.0 * rest.t_ms / t_ms
    for p in parts:
        gain(p, t_ms)
        part_evidence(p, rest, copy_gbps, gpu, whole_slowdown, e2e_slowdown, prof, ncu, e2e_spread)
        floor = share_spread.get(p.name, 0.0)
        if not walks(p, repeats, floor):
            continue
        walk_part(p, repeats, ceiling_band, floor)
        leaf = p.leaf_id
        if leaf:
            ok = (lambda: (False, FP64_NO_BF16)) if p.name == "gemm float64" else bf16_ok
            p.actions = actions_for(p, leaf, ok if p.name.startswith("gemm") and p.flops else None)
            if leaf in ("I", "J") and p.dtype_lever:  # a GEMM part below the faster precision's ceiling
                p.actions.insert(0, p.dtype_lever)
            p.lab = lab_for(leaf)
            if leaf == "J":
                p.j = j_detail(p, idle_pct if gpu else None, copy_gbps,
                               prof.n_spills if p.name == "triton/compiled" else None,
                               ncu if ncu_matches(p, ncu) else None, groups.get(p.name, {}).get("args", []),
                               per_op=per_op if not gpu else None)
    return Parts(parts, t_ms, src, coverage, notes, repeats=repeats or [])


#: profiled calls the parts read on a CPU, where more were profiled and each one's disturbance is known:
#: the least disturbed (run-queue wait plus page faults beyond the unprofiled calls', as time), so a
#: call the profiler's own memory made fault inside its ops is left out like one preempted inside them
N_STEADY_CALLS = 5


def call_disturbance_us(prof, n: int) -> list[float]:
    """Each profiled call's run-queue wait plus its page-fault time beyond the unprofiled calls' (us),
    where the profile measured them for all ``n`` calls; else empty."""
    waits = list(getattr(prof, "call_wait_us", None) or [])
    fault = list(getattr(prof, "call_fault_us", None) or [])
    if len(waits) != n:
        return []
    return [w + (fault[k] if len(fault) == n else 0.0) for k, w in enumerate(waits)]


def steady_calls(n: int, disturb_us: list[float]) -> list[int]:
    """Indices, in call order, of the :data:`N_STEADY_CALLS` least disturbed of ``n`` profiled calls
    (all of them where there are no more, or their disturbance is not known)."""
    if len(disturb_us) != n or n <= N_STEADY_CALLS:
        return list(range(n))
    return sorted(sorted(range(n), key=lambda k: (disturb_us[k], k))[:N_STEADY_CALLS])


#: a kept call's disturbance share (wait plus fault time over the call) at which it counts as having
#: waited: where most kept calls did, each op instance takes its least time over them (:func:`op_medians`)
WAITED_SHARE = 0.15


def most_waited(call_us: list[float], disturb_us: list[float]) -> bool:
    """Whether more than half of the calls lost :data:`WAITED_SHARE` of their time or more to waits and
    faults: a long op then catches a wait in most of them, and its median with it."""
    if len(disturb_us) != len(call_us) or not call_us:
        return False
    waited = sum(1 for d, u in zip(disturb_us, call_us) if u <= 0 or d / u >= WAITED_SHARE)
    return 2 * waited > len(call_us)


#: profiled calls whose run-queue wait share is within this of the typical (lower median) call's count
#: as quiet: a call preempted inside its ops beyond what the host's load gave every call is left out
QUIET_WAIT_SHARE = 0.05


def quiet_calls(call_us: list[float], wait_us: list[float]) -> list[int]:
    """Indices of the profiled calls the pooled parts may be read from (module doc): where each
    call's run-queue wait is known, those whose wait share is within :data:`QUIET_WAIT_SHARE` of
    the typical call's (a wait inside an op's wall-clock time inflates that op's share);
    else all of them."""
    if len(wait_us) != len(call_us) or not call_us:
        return list(range(len(call_us)))
    share = [w / u if u > 0 else 1.0 for w, u in zip(wait_us, call_us)]
    typical = sorted(share)[(len(share) - 1) // 2]  # the lower median: a host loaded evenly keeps every call
    return [i for i, x in enumerate(share) if x <= typical + QUIET_WAIT_SHARE]


#: profiled calls a repeat's op medians are read from: its own and the next ones (module doc)
REPEAT_CALLS = 3


def op_medians(calls: list, call_us: list[float], pick: list[int] | None = None, least: bool = False
               ) -> tuple[list[dict[str, Any]], float, int] | None:
    """The profiled calls (``pick``: those of them) as one call whose every op instance takes its median
    self time over them, with the time outside ops from each gap's median (:func:`_gaps`, module doc):
    ``(items, call_us, n_calls)``;
    None where the calls did not run the same ops in the same order (then they are pooled). A
    preemption lands inside whichever op runs at that moment and inflates that instance in that call
    only, so the median over three or more calls leaves it out where a sum or mean over calls keeps it.
    ``least``: each instance's and gap's least time instead, for calls most of which waited
    (:func:`most_waited`): a long op then catches a preemption in most calls, its median with it,
    and a wait only ever adds time."""
    import statistics

    pick_stat = min if least else statistics.median
    ks = sorted(set(pick)) if pick is not None else list(range(len(calls)))
    if len(ks) < 3:
        return None
    seqs = [sorted(calls[k], key=lambda x: x["ts"]) for k in ks]
    names = [[(it["stack"][:1], it["kernel"]) for it in q] for q in seqs]
    if not seqs[0] or any(x != names[0] for x in names[1:]):
        return None
    items = [{**it, "us": pick_stat([q[j]["us"] for q in seqs])} for j, it in enumerate(seqs[0])]
    gaps = [_gaps(q, call_us[k]) for q, k in zip(seqs, ks)]
    if all(g is not None and len(g) == len(gaps[0]) for g in gaps):  # each gap between ops its own median
        outside = sum(pick_stat([g[j] for g in gaps]) for j in range(len(gaps[0])))
    else:
        outside = pick_stat([max(0.0, call_us[k] - sum(it["us"] for it in calls[k])) for k in ks])
    return items, sum(it["us"] for it in items) + outside, len(ks)


def _gaps(items: list[dict[str, Any]], call_us: float) -> list[float] | None:
    """A call's time outside ops as its gaps: before the first and after the last outermost op (one
    figure), then each gap between consecutive outermost ops; None where the items carry no
    duration. A preemption between two ops lands in one gap of one call, as one inside an op does."""
    between, end = [], None
    for it in items:  # in start order; an op starting before the current outermost op ends is inside it
        if "dur" not in it:
            return None
        if end is None or it["ts"] >= end:
            if end is not None:
                between.append(it["ts"] - end)
            end = it["ts"] + it["dur"]
    outside = max(0.0, call_us - sum(it["us"] for it in items))
    return [max(0.0, outside - sum(between)), *between]


#: a part's share in each profiled call, the highest and lowest left out from this many calls on
#: (one preempted call is not the calls' disagreement), gives the part's least run-to-run spread
SHARE_SPREAD_MIN_CALLS = 5


def call_share_spread(calls: list, call_us: list[float], ops: list) -> dict[str, float]:
    """part -> half the range of its share over the profiled calls, relative to the median share
    (module doc): with :data:`SHARE_SPREAD_MIN_CALLS` calls or more, the highest and lowest share left
    out. A part whose calls disagree by this much has a time (and every metric read from it) that
    a re-run's calls may put anywhere in that range, so its timed metrics are spread at least this
    much on each side (:func:`hwlab.examine.repeats.spreads_over`'s ``run_to_run``), in every run
    alike, rather than only in the run whose three repeats happened to straddle a threshold."""
    import statistics

    if len(calls) < 3 or len(call_us) != len(calls):
        return {}
    per = []
    for c, u in zip(calls, call_us):
        if not c or u <= 0:
            return {}
        per.append({k: g["us"] / u for k, g in _groups([c], ops).items()})
    out = {}
    for k in {k for x in per for k in x}:
        xs = sorted(x.get(k, 0.0) for x in per)
        if len(xs) >= SHARE_SPREAD_MIN_CALLS:
            xs = xs[1:-1]
        med = statistics.median(xs)
        if med > 0:
            out[k] = (xs[-1] - xs[0]) / (2 * med)
    return out


def walks(p: Part, repeats: list[Parts] | None, spread: float = 0.0) -> bool:
    """Whether a part is walked: its share is :data:`WALK_SHARE_PCT` or more, in the pooled calls, in a
    repeat, or at the top of the share's own spread over the single calls (:func:`call_share_spread`):
    a part the calls put on either side of the cut is walked in every run, not dropped in some."""
    same = [q.share_pct for r in (repeats or []) for q in r.parts if q.name == p.name]
    return max([p.share_pct * (1.0 + spread), *same]) >= WALK_SHARE_PCT


def walk_part(p: Part, repeats: list[Parts] | None, band: tuple[float, float] | None = None,
              run_to_run: float = 0.0) -> None:
    """Walk one part on its evidence, its metrics' spreads taken from the same part in each repeat
    (their range, at least ``run_to_run`` of each timed metric's value on each side:
    :func:`call_share_spread`), and name the leaves a repeat or a spread end reaches
    (:mod:`hwlab.examine.repeats`)."""
    from hwlab.examine.repeats import alternatives, leaf_name, merge_spreads, spreads_over

    same = [next((q for q in r.parts if q.name == p.name), None) for r in (repeats or [])]
    sp = spreads_over([q.evidence if q is not None else {} for q in same], p.evidence, band, run_to_run)
    ev = {**p.evidence, "metric_sources": p.sources}
    if sp:
        ev["metric_spreads"] = merge_spreads(sp, p.evidence.get("metric_spreads"))
    p.walk = diagnose(ev)
    p.repeat_leaves = [leaf_name(q.leaf_id, q.walk.undecided.id if q.walk.undecided else None)
                       if q is not None and q.walk is not None else None for q in same]
    shares = [q.share_pct for q in same if q is not None] + [p.share_pct]
    if len(shares) > 1:  # the repeats' own profiled calls: the share's range over them
        p.share_range_pct = [min(shares), max(shares)]
    p.alternatives = alternatives(ev, p.walk, p.repeat_leaves)


def _groups(calls: list, ops: list) -> dict[str, dict[str, Any]]:
    """The profiled calls' timed items grouped by part class (module doc), each with its time,
    count, traffic records, kernels and kernel records."""
    groups: dict[str, dict[str, Any]] = {}
    split = FusedSplit()
    for joined in _join(calls, ops):
        split.new_call()
        for it, idx in joined:
            rec = ops[idx] if idx is not None else None
            op = rec.name if rec else (it["stack"][-1] if it["stack"] else None)
            shaped = None
            if fused_owner(it) is not None:  # a layer run natively: split by what its work is (fused_ops)
                cls, shaped = split.classify(it)
                idx = None
            else:
                cls = part_class(op, it["kernel"], tuple(rec.in_dtypes) if rec else (), it["compiled"])
            if rec is not None and rec.kind in ("quant", "dequant"):
                cls = "quant/dequant"
            g = groups.setdefault(cls, {"us": 0.0, "n": 0, "recs": set(), "kernels": {}, "args": [],
                                        "unjoined_us": 0.0, "kernel_list": [], "shaped": []})
            g["us"] += it["us"]
            g["n"] += 1
            if idx is not None:
                g["recs"].add(idx)
            elif shaped is COUNTED:  # a later kernel of an op counted with its first
                pass
            elif shaped is not None:
                g["shaped"].append(shaped)
            else:
                g["unjoined_us"] += it["us"]
            label = it["kernel"] or (it["stack"][0] if it["stack"] else "?")
            g["kernels"][label] = g["kernels"].get(label, 0.0) + it["us"]
            if it["kernel"]:
                g["kernel_list"].append(it["kernel"])
            if it["args"]:
                g["args"].append((it["us"], it["args"]))
    gemms = sorted((c for c in groups if c.startswith("gemm ")), key=lambda c: -groups[c]["us"])
    if "gemm" in groups and gemms:  # composite matmul glue (aten::linear / matmul self time) joins its GEMM
        g, h = groups.pop("gemm"), groups[gemms[0]]
        for k in ("us", "n", "unjoined_us"):
            h[k] += g[k]
        h["kernel_list"] += g["kernel_list"]
        h["shaped"] += g["shaped"]
        h["args"] += g["args"]
        for k, v in g["kernels"].items():
            h["kernels"][k] = h["kernels"].get(k, 0.0) + v
    return groups


def _part(cls: str, g: dict[str, Any], items_ms: dict[str, float], scale: float, t_ms: float, n: int, ops: list,
          out_keys: set, gpu: bool, copy_gbps: float | None, ceiling_for: Callable[[str | None], tuple],
          cache_bytes: int | None, whole_floor_ms: float | None) -> Part:
    """One part from its group: time, counts and floor (module doc); ``whole_floor_ms`` where the
    part holds :data:`WHOLE_PCT` of the kernel time (a compiled part then takes the function's floor)."""
    t = items_ms[cls] * scale
    recs = [ops[i] for i in sorted(g["recs"])]
    # a record read from a trace without its input shapes (hwlab.traces.trace_shapes) has no bytes
    shapeless = [o for o in recs if getattr(o, "shapes", True) is False]
    shaped = g.get("shaped") or []  # ops inside fused native ops, counted from their shapes (fused_ops), n calls
    p = Part(name=cls, t_ms=t, share_pct=100.0 * t / t_ms, n_items=g["n"] / n,
             attributable=bool(recs or shaped) and not shapeless and cls != "triton/compiled",
             top=[k[:120] for k, _ in sorted(g["kernels"].items(), key=lambda kv: -kv[1])[:3]])
    if gpu:
        p.n_tc = sum(1 for k in g["kernel_list"] if is_tc(k)) / n
    if p.attributable:
        p.moved_bytes = int(sum(o.moved_bytes for o in recs) + sum(o.moved_bytes for o in shaped) / n)
        p.floor_bytes = fused_floor_bytes(recs, ops, out_keys) + int(sum(o.moved_bytes for o in shaped) / n)
        p.flops = int(sum(o.flops for o in recs) + sum(o.flops for o in shaped) / n)
        p.n_ops = len(recs) + round(len(shaped) / n)
        if shaped:
            p.notes.append(f"{len(shaped) / n:.0f} of its ops per call ran inside fused native ops (e.g. the "
                           "encoder fast path): classed and counted from their recorded shapes, each on its own")
        if g["unjoined_us"] > 0.05 * g["us"]:
            p.notes.append(f"{100 * g['unjoined_us'] / g['us']:.0f}% of this part's time ran in ops the "
                           "traffic model did not see (composite or host-only ops): their bytes are not counted")
        dtype = next((o.in_dtypes[0] for o in [*recs, *shaped] if o.kind == "matmul" and o.in_dtypes), None)
        est = [o for o in recs if o.amplification is not None and o.read_bytes]
        if est:
            p.sector_amplification = sum(o.read_bytes * o.amplification for o in est) / sum(
                o.read_bytes for o in est)
        tf, name, lever, lever_gain = ceiling_for(dtype) if p.flops else (None, dtype, None, None)
        if p.flops and tf is None:
            p.notes.append(no_ceiling_note(dtype, name))
        elif p.flops:
            p.dtype_lever, p.lever_gain = lever, lever_gain
            p.notes += [x for x in (lever_note(dtype, name, lever),) if x]
        floor_part(p, name or dtype, copy_gbps, tf, cache_bytes)
    elif cls == "triton/compiled" and whole_floor_ms:
        p.floor_ms = whole_floor_ms
        p.floor_source = "the function's floor: this part is the whole function's device time"
        p.notes.append("bytes inside Triton / compiled kernels are not attributable; this part holds "
                       f"at least {WHOLE_PCT:.0f}% of the kernel time, so the function's floor is its floor")
    elif shapeless:
        p.notes.append(f"no input shapes recorded for {len(shapeless)} of its ops (a trace without "
                       "record_shapes, or a tensor list): no floor; walked only on what the trace measures")
    elif cls == "communication":
        p.notes.append("bytes not attributable: collective kernels (NCCL / RCCL / gloo) ran outside the aten ops "
                       "the traffic model sees, and their time is set by every rank taking part")
    else:
        p.notes.append("bytes not attributable: kernels ran outside aten ops (Triton / torch.compile); "
                       "with --ncu their DRAM traffic is counted")
    return p
