"""What a profiler trace's timelines answer by themselves, without recorded shapes or a ceiling
(``hwlab examine --trace``, :mod:`hwlab.examine.from_trace`).

* **Bounds from the device timeline** (:func:`timeline_bounds`): the step's time over its device
  busy time bounds its slowdown over any floor from below (B), and the busy share bounds its
  DRAM share from above (F); each is used only where the bound itself decides the question.
* **The idle part's own floor** (:func:`idle_split`, :func:`idle_walk`): the host's launch times
  against the device's start times split each step's device idle into time the device waited for
  the host to launch (host-side) and the device's own gaps between work it already held; the latter
  bound the idle part's floor from above, so idle over it bounds the part's slowdown from below.
  (A floor of zero would not do: idle / 0 is infinite, an upper bound on the slowdown, and an upper
  bound over a threshold decides nothing; the idle a device keeps with its host always ahead is
  small but not zero.) It answers B only where that bound reaches B's threshold (its spread, per
  step and widened by the timelines' clock skew, marks it BORDERLINE), and J then names launch or
  sync from the host side, with the host-side and sync time cited.
* **Sync points** (:func:`sync_points`): host runtime calls that wait for the device inside the
  steps (:data:`hwlab.traces.trace_ops.SYNC_CALL`), named on the idle part's J: its first fix where
  the host sat in them for half its side of the idle or more (the J cause "sync point").
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Callable

from hwlab.diagnosis.flowchart import LEAVES, QUESTIONS, diagnose
from hwlab.examine.parts import PART_ACTIONS, WALK_SHARE_PCT, Parts, gain
from hwlab.traces.trace_ops import OpTrace, StepWork

#: the flowchart's B threshold (slowdown over the floor) and F's estimated-DRAM threshold, which the
#: device timeline's bounds are set against (:func:`_timeline_bounds`)
B_THRESHOLD = next(c.threshold for c in QUESTIONS["B"].criteria if c.metric == "slowdown_vs_floor")
F_DRAM_THRESHOLD = next(c.threshold for c in QUESTIONS["F"].criteria if c.metric == "dram_pct_estimated")

def timeline_bounds(ev: dict[str, Any], src: dict[str, str], t_ms: float, busy_ms: float) -> None:
    """What the device timeline alone decides, as bounds (no shapes, no ceiling needed).

    * B: every kernel takes at least its floor, so the step's floor is at most its device busy time
      and ``step / busy`` is a lower bound on its slowdown over any floor. It answers B only where
      the bound itself reaches the threshold (1.5x: the device idles a third of the step or more);
      under it, B stays open (a bound below a threshold decides nothing).
    * F: the device moves no bytes while idle and at most its copy ceiling while busy, so the
      step's DRAM share is at most its busy share. Set only where that bound is under F's 60%
      (the device idles 40% of the step or more) and B was already answered from the bound."""
    if "slowdown_vs_floor" in ev or busy_ms <= 0 or t_ms <= 0:
        return
    lower = t_ms / busy_ms
    if lower < B_THRESHOLD:
        return
    ev["slowdown_vs_floor"] = lower
    src["slowdown_vs_floor"] = ("a lower bound from the device timeline: step time / device busy time (each kernel "
                                "takes at least its floor); needs no shapes and no peak rate")
    upper = 100.0 * busy_ms / t_ms
    if "dram_pct_estimated" not in ev and upper < F_DRAM_THRESHOLD:
        ev["dram_pct_estimated"] = upper
        src["dram_pct_estimated"] = ("an upper bound from the device timeline: the device's busy share of the step "
                                     "(no bytes move while it idles, at most the device's copy rate while busy)")


@dataclass
class IdleSplit:
    """One step's device idle, split by the host and device timelines (:func:`idle_split`), in us."""
    step: int
    idle_us: float
    own_us: float       # at most this much is the device's own gaps between work it already held
    own_hi_us: float    # the same, each gap widened by the timelines' clock skew
    host_us: float      # idle - own: the device waited for the host to launch (at least this much)
    sync_us: float      # of host_us, while a host thread sat in a synchronising call
    n_gaps: int
    n_host_gaps: int
    in_call_us: float = 0.0     # of own_us, inside the next work's own launch call (not yet returned)
    longest_call_us: float = 0.0


def _overlap_us(merged: list[tuple[float, float]], starts: list[float], a: float, b: float) -> float:
    """Time of [a, b] inside the sorted, disjoint intervals ``merged`` (``starts``: their starts)."""
    tot, i = 0.0, max(0, bisect.bisect_right(starts, a) - 1)
    while i < len(merged) and merged[i][0] < b:
        tot += max(0.0, min(b, merged[i][1]) - max(a, merged[i][0]))
        i += 1
    return tot


def idle_split(works: list[StepWork], syncs: list[tuple[float, float, str]]) -> tuple[list[IdleSplit], float]:
    """Each busy step's idle, gap by gap on the device's busy union, and the clock skew (module doc).

    A gap ends where the next device event starts. Its launch call started at ``L`` on the host:
    where ``L`` is before the gap began (or unknown: no launch record), the device held the work and
    the whole gap is its own; where ``L`` is inside the gap, the device waited for the host until
    ``L`` and at most ``gap end - L`` is its own (launch latency, queueing). Idle after the step's
    last device event, up to the step's host end, is host-side (nothing of the step is left to run).
    The skew: no event starts before its launch call; one that appears to shows the host and
    device clocks are offset by at least that much, and each gap's own share is widened by it."""
    skew = 0.0
    rows = []
    for w in works:
        if not w.items:
            continue
        its = sorted(w.items, key=lambda it: it["ts"])
        for it in its:
            if it.get("launch_ts") is not None:
                skew = max(skew, it["launch_ts"] - it["ts"])
        rows.append((w, its))
    merged: list[tuple[float, float]] = []
    for a, d, _ in sorted(syncs):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], a + d))
        else:
            merged.append((a, a + d))
    starts = [a for a, _ in merged]
    out = []
    for w, its in rows:
        lo, hi = w.ts, w.ts + w.window_us
        own = own_hi = host = sync = in_call = longest = 0.0
        n_gaps = n_host = 0
        cur = lo
        for it in its:
            a = max(it["ts"], lo)
            if a > cur:
                g, launch = a - cur, it.get("launch_ts")
                mine = g if launch is None or launch <= cur else min(g, max(0.0, a - launch))
                own += mine
                own_hi += min(g, mine + skew)
                n_gaps += 1
                if mine < g:
                    n_host += 1
                    host += g - mine
                    sync += _overlap_us(merged, starts, cur, min(a, launch))
                    call = max(0.0, min(a, it["launch_end"]) - launch)
                    in_call += call
                    longest = max(longest, call)
            cur = max(cur, it["ts_end"])
        if hi > cur:  # after the step's last device event: the host has not launched the next work yet
            host += hi - cur
            sync += _overlap_us(merged, starts, cur, hi)
        out.append(IdleSplit(w.step, max(0.0, w.window_us - w.busy_us), own, own_hi, host, sync, n_gaps, n_host,
                             in_call, longest))
    return out, skew


def host_side_gap(ev: dict[str, Any], src: dict[str, str], splits: list[IdleSplit], t_ms: float) -> None:
    """The whole step's ``launch_gap_pct`` (H's launch override: "the launch path is the limiter")
    is at most the share of the step the device waited on the host's launch path (:func:`idle_split`'s
    host side, plus the gaps spent inside the next work's own launch call, which had not returned:
    the launch itself was slow; mean over steps), not its whole idle share: the device's own gaps
    between work it already held (launched early and run late, or with no launch record) are not
    shortened by faster launches, so they never send the walk to "launch" (they wait on another
    stream, an event or a peer rank, which the idle part's note names)."""
    if not splits or "launch_gap_pct" not in ev or t_ms <= 0:
        return
    host_pct = min(100.0, 100.0 * sum(s.host_us + s.in_call_us for s in splits) / len(splits) / 1e3 / t_ms)
    if host_pct < ev["launch_gap_pct"]:
        ev["launch_gap_pct"] = host_pct
        src["launch_gap_pct"] = ("the share of the step the device waited for the host to launch, or inside the "
                                 "launch call of its next work (host launch times against device start times); the rest of its idle is the device's own "
                                 "gaps between work it already held, which faster launches do not shorten")


def idle_walk(parts: Parts, splits: list[IdleSplit], skew_us: float, notes: list[str],
              lab_for: Callable[[str], str]) -> None:
    """The idle part floored on the device's own gaps and walked on the bound they give (module doc)."""
    if not splits:
        return
    n = len(splits)
    idle, own, own_hi, host, sync = (sum(getattr(s, k) for s in splits) / n / 1e3
                                     for k in ("idle_us", "own_us", "own_hi_us", "host_us", "sync_us"))
    src = "[host launch times against device start times]"
    notes.append(f"device idle {idle:.4g} ms per step: {host:.4g} ms waiting for the host to launch (of it "
                 f"{sync:.4g} ms while a host thread sat in a synchronising call), at most {own:.4g} ms in the "
                 f"device's own gaps between work it already held {src}")
    p = next((q for q in parts.parts if q.name == "gpu idle"), None)
    if p is None or p.walk is None or idle <= 0:
        return
    if own <= 0 or idle / own < B_THRESHOLD:
        in_call = sum(x.in_call_us for x in splits) / n / 1e3
        longest = max(x.longest_call_us for x in splits) / 1e3
        call = (f"; {in_call:.4g} ms of it inside launch calls that had not yet returned (the longest {longest:.4g} ms: "
                "time the host spent launching, e.g. a first call's module load or JIT; record after a warm-up step, "
                "torch.profiler's schedule(wait=1, warmup=1, active=N), to leave it out)" if in_call >= 0.1 * own else "")
        p.notes.append(f"{own:.4g} of its {idle:.4g} ms are gaps where the device may already have held the next work "
                       f"(launched before the gap began, launched inside it by a call that had not returned, or with no "
                       f"launch record) {src}{call}: its own floor may be that large, so its slowdown is only known to "
                       f"be >= {idle / max(own, 1e-9):.3g}x, under B's {B_THRESHOLD:g}x, which decides nothing. Work "
                       "launched early and run late waits on another stream, an event or another rank (read every "
                       "rank's trace with hwlab ranks --traces); a trace with every launch record (Kineto's runtime "
                       "activities on) bounds the rest")
        return
    slow = idle / own
    ends = [x.idle_us / x.own_hi_us for x in splits if x.own_hi_us > 0] + [idle / own_hi]
    ends += [x.idle_us / x.own_us for x in splits if x.own_us > 0]
    p.floor_ms = own
    p.floor_source = ("at most the device's own gaps between work it already held (host launch times against "
                      "device start times)")
    gain(p, parts.t_ms)
    p.gain_bound = " (the time the device waited for the host: won where the host launches ahead of the device)"
    p.evidence["slowdown_vs_floor"] = slow
    p.sources["slowdown_vs_floor"] = (f"a lower bound from the host and device timelines: idle / at most its own gaps "
                                      f"(spread: the steps' range, and each gap widened by the clocks' "
                                      f"{skew_us:.3g} us skew)")
    p.evidence["metric_spreads"] = {**(p.evidence.get("metric_spreads") or {}),
                                    "slowdown_vs_floor": [min(ends), max(ends)]}
    full = {**p.evidence, "metric_sources": p.sources}
    p.walk = diagnose(full)
    from hwlab.examine.repeats import alternatives
    p.alternatives = alternatives(full, p.walk, [])
    leaf = p.leaf_id
    if not leaf:
        return
    fit = next((v for (pre, lf), v in PART_ACTIONS.items() if p.name.startswith(pre) and lf == leaf), ())
    p.actions = list(fit) + list(LEAVES[leaf].actions)
    p.lab = lab_for(leaf)
    p.notes.append(f"evidence: per step {idle:.4g} ms idle = {host:.4g} ms waiting for the host's launches in "
                   f"{sum(x.n_host_gaps for x in splits) / n:.4g} gap(s) (of it {sync:.4g} ms in synchronising calls) "
                   f"+ at most {own:.4g} ms of the device's own ({sum(x.n_gaps for x in splits) / n:.4g} gaps in all); "
                   f"clock skew {skew_us:.3g} us {src}")
    if leaf == "J":
        cause = "sync point" if host > 0 and sync >= 0.5 * host else "launch"
        p.j = {"cause": cause,
               "rule": ("half or more of the host-side idle is spent in synchronising calls" if cause == "sync point"
                        else "the device waits for the host's launches (host-side idle over its own gaps)"),
               "why": ("each sync drains the device's queue, so it idles while the host launches again"
                       if cause == "sync point" else "the host launches slower than the device runs the work: "
                       "fewer, larger launches (CUDA graph, fusion), or host work off the step's thread"),
               "figures": {"idle_ms": idle, "host_side_ms": host, "sync_ms": sync, "own_gaps_ms_at_most": own,
                           "gaps_per_step": sum(x.n_gaps for x in splits) / n,
                           "host_side_gaps_per_step": sum(x.n_host_gaps for x in splits) / n,
                           "clock_skew_us": skew_us},
               "sources": {k: src for k in ("idle_ms", "host_side_ms", "sync_ms", "own_gaps_ms_at_most",
                                            "gaps_per_step", "host_side_gaps_per_step", "clock_skew_us")}}


def sync_points(ot: OpTrace, works: list[StepWork], parts: Parts, notes: list[str]) -> None:
    """Host calls that wait for the device inside the steps (:data:`~hwlab.traces.trace_ops.SYNC_CALL`):
    each drains the device's queue, so the device idles while the host launches again. Named on
    J's idle part as its cause where the trace holds any (source: the host timeline)."""
    if not ot.syncs or not works:
        return
    wins = [(w.ts, w.ts + w.window_us) for w in works]
    inside = [sy for sy in ot.syncs if any(lo <= sy[0] < hi for lo, hi in wins)]
    if not inside:
        return
    names: dict[str, int] = {}
    for _, _, n in inside:
        names[n] = names.get(n, 0) + 1
    per = len(inside) / len(works)
    what = ", ".join(f"{n} x{k}" for n, k in sorted(names.items(), key=lambda kv: -kv[1]))
    notes.append(f"sync points: {per:.3g} host call(s) per step wait for the device ({what}) [host runtime calls "
                 "in the trace]: the device idles while the host launches again after each")
    for p in parts.parts:
        if p.name == "gpu idle" and p.leaf_id == "J":
            act = (f"remove the sync point(s) from the step ({what} per the host timeline: .item(), .cpu(), "
                   ".tolist() or printing a device tensor, an explicit synchronize)")
            fig = (p.j or {}).get("figures", {})
            if (p.j or {}).get("cause") == "sync point" or "sync_ms" not in fig:
                p.actions.insert(0, act)  # the cause, or no measure of what they cost
            else:  # measured: they hold a small share of the idle, so they come after the cause's fixes
                p.actions.append(act + f" (they hold {fig['sync_ms']:.3g} of the {fig['host_side_ms']:.4g} ms the "
                                       "device waited for the host per step)")
            if isinstance(p.j, dict):
                p.j["sync_calls_per_step"] = per


#: a run of this many elementwise / reduction kernels back to back between two GEMM-class kernels is
#: a fusion candidate: each kernel boundary writes its output to DRAM and the next reads it back, which
#: one fused kernel (torch.compile, a Triton kernel) would not
FUSION_RUN_MIN = 3


def gemm_kernel_ms(works: list[StepWork]) -> float:
    """Per-step mean time (ms) of the items classed GEMM (:func:`hwlab.core.profiling.part_class`:
    by the kernel's own name, the op where the name says nothing): the time a GEMM rate is over."""
    from hwlab.core.profiling import part_class
    us = sum(it["us"] for w in works for it in w.items
             if part_class(it["stack"][0] if it["stack"] else None, it["kernel"]).startswith("gemm"))
    return us / len(works) / 1e3 if works else 0.0


def kernel_names(works: list[StepWork], parts: Parts, notes: list[str]) -> None:
    """What the kernel names and their order say, per step (source: the device timeline's names).

    * GEMM kernels on tensor cores or on the CUDA cores (SIMT ``sgemm``): a GEMM part whose kernels
      are all SIMT answers H yes (tensor-core use is nil: I, the dtype / MMA path) once B is
      decided; where the part has no floor, the note says so and names the recording that decides B.
    * FP8 GEMMs beside dequantising copies (M's fallback question).
    * Runs of at least :data:`FUSION_RUN_MIN` elementwise / reduction kernels between GEMM-class
      kernels: fusion candidates, counted with their time per step."""
    from hwlab.core.profiling import DEQUANT_KERNEL_MARKERS, kernel_class, part_class
    busy = [w for w in works if w.items]
    if not busy:
        return
    n_tc = n_simt = n_fp8 = n_deq = 0
    runs, run_us = 0, 0.0
    for w in busy:
        cur_n, cur_us, after_gemm = 0, 0.0, False
        for it in sorted(w.items, key=lambda x: x["ts"]):
            k = it["kernel"] or ""
            cls, tc = kernel_class(k)
            n_tc += tc is True and cls in ("gemm", "fp8-gemm")
            n_simt += tc is False and cls == "gemm"
            n_fp8 += cls == "fp8-gemm"
            n_deq += any(m in k.lower() for m in DEQUANT_KERNEL_MARKERS)
            pc = part_class(it["stack"][0] if it["stack"] else None, k)
            if pc.startswith("gemm"):
                if after_gemm and cur_n >= FUSION_RUN_MIN:
                    runs, run_us = runs + 1, run_us + cur_us
                cur_n, cur_us, after_gemm = 0, 0.0, True
            elif pc == "elementwise/reduction":
                cur_n, cur_us = cur_n + 1, cur_us + it["us"]
    n = len(busy)
    src = "[kernel names on the device timeline]"
    if n_tc or n_simt:
        line = (f"GEMM kernels per step: {n_tc / n:.3g} on tensor cores, {n_simt / n:.3g} SIMT (fp32 on the CUDA "
                f"cores, e.g. sgemm) {src}")
        if n_simt and not n_tc:
            line += ": tensor-core use is nil, so H answers yes (I: run the matmuls in bf16/fp16 or enable TF32) once B is"
            line += " decided"
        notes.append(line)
        for p in parts.parts:
            if p.name.startswith("gemm") and p.walk is not None and p.walk.undecided is not None and n_simt and not n_tc:
                p.notes.append(f"its GEMM kernels are SIMT only (no tensor-core kernel) {src}: at H this is I, "
                               "once B is decided")
    from hwlab.core.kernel_classes import unrecognised_table
    unknown = unrecognised_table(((it["kernel"], it["us"]) for w in busy for it in w.items), top_n=5)
    if unknown:
        notes.append("unrecognised kernels (no class from their names; their time is the part "
                     "'unrecognised', never put in another class): " +
                     "; ".join(f"{u['name'][:100]} {u['us'] / n / 1e3:.4g} ms/step x{u['count'] / n:.3g}" for u in unknown)
                     + f" {src}")
    if n_fp8:
        notes.append(f"FP8 GEMM kernels: {n_fp8 / n:.3g} per step, beside {n_deq / n:.3g} dequantising copies {src}")
    if runs:
        notes.append(f"fusion candidates: {runs / n:.3g} run(s) per step of >= {FUSION_RUN_MIN} elementwise kernels "
                     f"between GEMM-class kernels, {run_us / n / 1e3:.4g} ms per step {src}: fused, each run's "
                     "intermediates would not cross DRAM")


def name_recordings(parts: Parts, has_ceiling: bool) -> None:
    """Each walked part that stops at B (no floor) says which recording would floor it: the op
    shapes (``record_shapes=True``) where its ops have none, every rank's trace for collectives,
    counted DRAM bytes (Nsight Compute) for compiled kernels, a measured record of the machine
    where the trace names no datasheet GPU."""
    for p in parts.parts:
        w = p.walk
        if w is None or w.undecided is None or w.undecided.id != "B" or p.name == "host outside ops":
            continue
        if p.name == "gpu idle":
            bound = 1.0 / (1.0 - p.share_pct / 100.0) if p.share_pct < 100.0 else None
            if bound is not None and bound < B_THRESHOLD:
                p.notes.append(f"the device timeline bounds the step's slowdown at {bound:.3g}x (step / busy), under "
                               f"B's {B_THRESHOLD:g}x: the step's floor decides B (the other parts' recordings below)")
            continue
        need = []
        if p.name == "communication":  # a collective's time is set by every rank, not by its own bytes
            need.append("every rank's trace of the same steps: read them together with hwlab ranks --traces DIR "
                        "(per-collective waits and bus bandwidth)")
        elif p.name == "triton/compiled":  # bytes inside compiled kernels are in no trace, shapes or not
            need.append("the compiled kernels' DRAM bytes, which no trace holds: count them with Nsight Compute "
                        "(hwlab examine --ncu on the function, or ncu --metrics dram__bytes_read.sum,"
                        "dram__bytes_write.sum on the job)")
        elif not p.attributable:
            need.append("the ops' shapes: record with torch.profiler(record_shapes=True) (PyTorch >= 1.9 writes "
                        "their dtypes)")
        if not has_ceiling:
            need.append("the machine's ceilings: pass --baseline with a doctor record of that machine "
                        "(hwlab doctor --out FILE on it)")
        if need:
            p.notes.append("to decide B this part needs " + " and ".join(need))
