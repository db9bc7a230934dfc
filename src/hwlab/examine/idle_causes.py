"""Why the device waited for its host, measured from the host timeline (``hwlab examine --trace``).

:func:`hwlab.examine.trace_bounds.idle_split` measures how long the device waited for the host
(host-side idle: a gap the device could not fill because the next work was not launched yet). This
module says what the host was doing in that time, cause by cause, each a union of host intervals
clipped to the host-side gaps, counted once in this order (first claim wins):

0. **collective wait**: the host inside a collective that runs on the CPU (gloo's ``gloo:<op>``
   ranges) or inside a wait for a collective's result (:data:`COLLECTIVE_WAIT`: ``c10d::wait``,
   ``barrier``, a range whose name holds both a wait and a collective, as TorchRec's
   ``...AllToAll...Awaitable wait()`` and ``wait_sparse_data_dist``), on any thread of the step's
   process, less the top-level ops inside it that launched device work (launch work, cause 4);
   autograd's backward nodes of such ops launch work and are left to the causes below.
   A collective ends when the last rank arrives, so this wait may be a late peer's, which one
   rank's trace cannot tell from its own link: the advice is to read the whole job's traces
   together (``hwlab ranks --traces``), never CUDA graphs. It comes first because a sync inside
   such a wait (``.item()`` on a collective's output) waits for the collective. The host ops that
   only enqueue an NCCL collective (``c10d::allreduce_``, ``nccl:all_reduce``) are launch work:
   the NCCL kernel's own wait is device time (the communication part), not idle.
1. **sync point** (a sync or blocking copy): a host runtime call that waits for the device
   (:data:`hwlab.traces.trace_ops.SYNC_CALL`: ``cudaDeviceSynchronize``, a ``cudaMemcpy`` without
   ``Async``, ...).
2. **data loading**: host ranges of the DataLoader (:data:`DATALOADER`: PyTorch's
   ``enumerate(DataLoader)#...__next__``), on any thread of the step's process.
3. **one-time init / autotune / compile**: host ops or runtime calls named by :data:`ONE_TIME`
   (cuBLAS / cuDNN / MIOpen handle creation and find, module loads, allocator growth,
   torch.compile / Dynamo / Inductor, autotuning benchmarks); and, beside the host-side gaps, the
   device's wait inside a launch call of :data:`LONG_LAUNCH_US` or longer that had not returned
   (a first call's module load or JIT: idle_split counts it as the device's own). Where these are found, the steps
   holding them are warm-up candidates (:func:`warmup_steps`).
4. **launch**: the step's thread inside a top-level host op that launched device work, inside a
   launch call, or between ops for under :data:`CPU_PHASE_US` (the Python and dispatch between
   launching ops): the host runs behind the device on launching itself, the only cause CUDA
   graphs and fewer, larger launches address.
5. **CPU-only work**: the step's thread inside a top-level host op that launched nothing (CPU
   tensors, preprocessing recorded as ops), or in no recorded op for :data:`CPU_PHASE_US` or
   longer (a host phase with no launch at all: no launch path is that slow).

The cause with the largest share names J's cause, and only the launch cause gets CUDA-graph advice.

**Warm-up** (:func:`warmup_steps`): leading steps whose window is more than :data:`WARMUP_RATIO`
times the median of the later steps (at least :data:`WARMUP_MIN_LATER` later steps) are first-call
steps (one-time init, autotune, compile): left out of the parts and their gains, and said so.
"""
from __future__ import annotations

import bisect
import functools
import re
import statistics
from typing import Any

from hwlab.traces.trace_ops import OpTrace, StepWork

#: host range names of a collective running on the CPU or a wait for one (module doc, cause 0): gloo's
#: ranges, c10d's wait and barrier, and any range naming both a wait and a collective (TorchRec's awaitables)
COLLECTIVE_WAIT = re.compile(r"^gloo:|c10d::(?:wait|barrier)|^barrier$|(?=.*wait)(?=.*(?:all_?2_?all|all_?to_?all|"
                             r"all_?reduce|all_?gather|reduce_?scatter|broadcast|data_dist|awaitable))", re.I)
#: host range names of data loading (PyTorch's DataLoader iterator ranges)
DATALOADER = re.compile(r"dataloader|_next_data|DataLoaderIter", re.I)
#: host op / runtime call names of one-time work: library handles and algorithm search, module
#: loads, allocator growth, compilation, autotuning
ONE_TIME = re.compile(r"cublas(Lt)?Create|cudnnCreate|miopenCreate|miopenFind|FindConvolution|cudnnFind|"
                      r"cudnnGet.*Algorithm|benchmark|autotun|cuModuleLoad|hipModuleLoad|cuLibraryLoad|"
                      r"cudaMalloc(?!Async)|hipMalloc(?!Async)|cudaHostAlloc|hipHostMalloc|cuMemCreate|_lazy_init|"
                      r"TorchDynamo|dynamo|inductor|compile_fx|CompiledFxGraph.*compile|triton.*compile", re.I)
_LAUNCH = re.compile(r"Launch|launch")
#: a stretch of host time in no recorded op up to this long is the Python / dispatch between launching
#: ops (launch cause: eager PyTorch spends some tens of µs per op there); a longer one launches nothing
#: for longer than any launch path takes, so it is a CPU-only phase
CPU_PHASE_US = 1000.0
#: a leading step longer than this times the later steps' median is a warm-up step
WARMUP_RATIO = 2.0
#: warm-up is judged only with at least this many later steps to take the median of
WARMUP_MIN_LATER = 2
#: a launch call that has not returned after this long is not launching (microseconds): it is loading a
#: module, compiling or allocating on a first call, and the device's wait inside it is one-time work
LONG_LAUNCH_US = 1000.0
CAUSES = ("collective wait", "sync point", "data loading", "one-time init / autotune / compile", "launch", "CPU-only work")


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _clip(merged: list[tuple[float, float]], starts: list[float], a: float, b: float) -> list[tuple[float, float]]:
    out = []
    i = max(0, bisect.bisect_right(starts, a) - 1)
    while i < len(merged) and merged[i][0] < b:
        lo, hi = max(a, merged[i][0]), min(b, merged[i][1])
        if hi > lo:
            out.append((lo, hi))
        i += 1
    return out


def _minus(iv: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``iv`` minus ``cut`` (both merged, sorted)."""
    out, j = [], 0
    for a, b in iv:
        cur = a
        while j < len(cut) and cut[j][1] <= cur:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > cur:
                out.append((cur, cut[k][0]))
            cur = max(cur, cut[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def _host_gaps(w: StepWork) -> list[tuple[float, float]]:
    """The step's host-side idle intervals (the rule of :func:`~hwlab.examine.trace_bounds.idle_split`):
    from a gap's start to the next event's launch where that launch is inside the gap, and after
    the step's last device event to the step's end."""
    lo, hi = w.ts, w.ts + w.window_us
    out, cur = [], lo
    for it in sorted(w.items, key=lambda x: x["ts"]):
        a = max(it["ts"], lo)
        launch = it.get("launch_ts")
        if a > cur and launch is not None and launch > cur:
            out.append((cur, min(a, launch)))
        cur = max(cur, it["ts_end"])
    if hi > cur:
        out.append((cur, hi))
    return out


def _long_launch_waits(w: StepWork) -> list[tuple[float, float]]:
    """The device's idle inside launch calls of :data:`LONG_LAUNCH_US` or longer that had not returned
    (the part of a gap from the next work's launch to its start, up to the call's end): the rule of
    :func:`~hwlab.examine.trace_bounds.idle_split` counts it as the device's own (it may have held the
    work); such a call is first-call work, so this wait is one-time init, not launch cost."""
    lo = w.ts
    out, cur = [], lo
    for it in sorted(w.items, key=lambda x: x["ts"]):
        a = max(it["ts"], lo)
        la, le = it.get("launch_ts"), it.get("launch_end")
        if a > cur and la is not None and le is not None and le - la >= LONG_LAUNCH_US:
            x, y = max(cur, la), min(a, le)
            if y > x:
                out.append((x, y))
        cur = max(cur, it["ts_end"])
    return out


def _real_op(o) -> bool:
    return o.cat == "cpu_op" and not o.name.startswith(("ProfilerStep#", "hwlab::"))


def _top_level(o, ops) -> bool:
    """A host op with no other host op above it (step ranges and the kit's marks left aside)."""
    if not _real_op(o):
        return False
    p = o.parent
    while p >= 0:
        if _real_op(ops[p]):
            return False
        p = ops[p].parent
    return True


@functools.lru_cache(maxsize=1 << 14)  # pure in the name; a trace repeats a few hundred names
def _name_kind(name: str) -> tuple[bool, bool, bool, bool]:
    """(a launch call, one-time init / autotune, a DataLoader range, a collective wait) by the name's
    patterns; autograd's backward nodes are never a collective wait (they launch the backward)."""
    coll = bool(COLLECTIVE_WAIT.search(name)) and "Backward" not in name
    return bool(_LAUNCH.search(name)), bool(ONE_TIME.search(name)), bool(DATALOADER.search(name)), coll


def _cause_intervals(ot: OpTrace, pid: Any, tid: Any) -> list[list[tuple[float, float]]]:
    """Per cause (:data:`CAUSES`), the merged host intervals that claim it."""
    sync = [(a, a + d) for a, d, _ in ot.syncs]
    coll, data, once, launch_ops, cpu_ops = [], [], [], [], []
    calls = [(ts, ts + dur, name, p, t) for ts, p, t, name, dur in ot.launches.values()]
    launches = [(a, b) for a, b, name, p, t in calls if _name_kind(name)[0] and (p, t) == (pid, tid)]
    once += [(a, b) for a, b, name, _, _ in calls if _name_kind(name)[1]]
    launch_starts = sorted(a for a, _ in launches)
    for (p, t), ops in ot.host.items():
        if p != pid:
            continue
        for o in ops:
            kind = _name_kind(o.name)
            if kind[3]:
                coll.append((o.ts, o.end))
            elif kind[2]:
                data.append((o.ts, o.end))
            elif kind[1]:
                once.append((o.ts, o.end))
            elif t == tid and _top_level(o, ops):
                i = bisect.bisect_left(launch_starts, o.ts)
                launched = i < len(launch_starts) and launch_starts[i] <= o.end
                (launch_ops if launched else cpu_ops).append((o.ts, o.end))
    launching = _union(launch_ops + launches)
    # inside a wait range, the ops that launched device work are launch work, not the wait
    return [_minus(_union(coll), launching), _union(sync), _union(data), _union(once), launching, _union(cpu_ops)]


def idle_causes(ot: OpTrace, works: list[StepWork]) -> dict[str, Any] | None:
    """Host-side idle per step split by cause (module doc): ``ms_per_step`` per cause, ``cause``
    (the largest) and ``host_side_ms``; None where the steps have no host-side idle."""
    if not works or not ot.steps:
        return None
    pid, tid = ot.steps[0]["pid"], ot.steps[0]["tid"]
    causes = _cause_intervals(ot, pid, tid)
    starts = [[a for a, _ in c] for c in causes]
    tot = dict.fromkeys(CAUSES, 0.0)
    in_call = 0.0
    for w in works:
        for a, b in _host_gaps(w):
            left = [(a, b)]
            for name, iv, st in zip(CAUSES, causes, starts):
                claim = _union([x for la, lb in left for x in _clip(iv, st, la, lb)])
                tot[name] += sum(y - x for x, y in claim)
                left = _minus(left, claim)
            for x, y in left:  # in no recorded op: between launching ops, or a CPU-only phase
                tot["launch" if y - x < CPU_PHASE_US else "CPU-only work"] += y - x
        in_call += sum(y - x for x, y in _long_launch_waits(w))
    n = len(works)
    host_ms = sum(tot.values()) / n / 1e3
    tot["one-time init / autotune / compile"] += in_call
    if host_ms <= 0 and not in_call:
        return None
    per = {k: v / n / 1e3 for k, v in tot.items()}
    cause = max(per, key=per.get)
    return {"ms_per_step": per, "host_side_ms": host_ms, "cause": cause, "long_launch_ms": in_call / n / 1e3,
            "source": "host timeline: runtime calls, host op and DataLoader ranges against the device's host-side gaps"}


#: J's cause -> (why, actions); CUDA graphs only where launches are the cause
CAUSE_ADVICE = {
    "collective wait": ("the host waits on a collective, which ends when the last rank arrives: a late peer or "
                        "the link, which one rank's trace cannot tell apart",
                        ("read every rank's trace of the same steps together: hwlab ranks --traces DIR on the whole "
                         "job names the rank the others wait for, or the link",)),
    "sync point": ("each sync or blocking copy drains the device's queue, so it idles while the host launches "
                   "again", ()),  # the named calls' own action comes from trace_bounds.sync_points
    "data loading": ("the step waits for the next batch from the DataLoader",
                     ("load data in worker processes (DataLoader num_workers > 0, persistent_workers=True) with "
                      "pin_memory=True and prefetching, so the next batch is ready when the step ends",)),
    "one-time init / autotune / compile": ("first-call work (library handles, algorithm search, compilation, "
                                           "allocator growth) that later steps do not repeat",
                                           ("profile after warm-up steps (torch.profiler schedule(wait=1, warmup=1, "
                                            "active=N)) to measure the steady state; cache the autotune / find "
                                            "results if the job restarts often",)),
    "launch": ("the host launches slower than the device runs the work",
               ("capture the step in a CUDA graph (torch.compile mode='reduce-overhead') so launches cost nothing",
                "fuse small kernels (torch.compile) so there are fewer launches")),
    "CPU-only work": ("host work that launches nothing (ops on CPU tensors, or a phase of Python with no op "
                      "for a millisecond or more) runs while the device waits",
                      ("move the CPU work off the step's thread (a worker, the DataLoader) or onto the device; "
                       "profile with with_stack=True (or py-spy) to see the Python where no op was recorded",)),
}


def apply_causes(parts, ic: dict[str, Any] | None, notes: list[str]) -> None:
    """Name the idle part's J cause from :func:`idle_causes` and give that cause's advice only; where
    the communication part is at least the idle part's gain, say that one rank's trace cannot
    split its collectives' time into a late peer's wait and the link (the whole job's traces can)."""
    if not ic:
        return
    per = ic["ms_per_step"]
    notes.append("host-side idle by cause, ms per step: " + ", ".join(f"{k} {v:.4g}" for k, v in per.items() if v > 0)
                 + f" [{ic['source']}]" + (
                     f"; one-time init includes {ic['long_launch_ms']:.4g} ms the device waited inside launch calls "
                     f"of {LONG_LAUNCH_US / 1e3:.0f} ms or more (a first call's module load or JIT, not launch cost)"
                     if ic.get("long_launch_ms") else ""))
    p = next((q for q in parts.parts if q.name == "gpu idle"), None)
    comm = next((q for q in parts.parts if q.name == "communication"), None)
    if p is not None and comm is not None and comm.t_ms >= (p.saved_ms if p.saved_ms is not None else p.t_ms):
        p.notes.append(f"the communication part ({comm.t_ms:.4g} ms, {comm.share_pct:.0f}% of the step) outweighs "
                       "this part's gain: a collective's time includes the wait for the last rank to arrive, which "
                       "one rank's trace cannot tell from its link; read the whole job with hwlab ranks --traces DIR "
                       "before acting on this part")
    once = per.get("one-time init / autotune / compile", 0.0)
    if p is not None and once > 0 and p.saved_ms is not None:  # first-call work is not a steady-state gain
        p.saved_ms = max(0.0, p.saved_ms - once)
        if getattr(p, "speedup", None) is not None and parts.t_ms > p.saved_ms:
            p.speedup = parts.t_ms / (parts.t_ms - p.saved_ms)
        p.notes.append(f"its gain leaves out {once:.4g} ms per step of one-time work (first calls: handles, module "
                       "loads, compilation, autotuning), which a step after warm-up does not repeat")
    if p is None or p.leaf_id != "J" or not isinstance(p.j, dict):
        return
    cause = ic["cause"]
    why, actions = CAUSE_ADVICE[cause]
    p.j.update({"cause": cause, "rule": "the largest share of the time the device waited for the host, by what "
                "the host was doing (host timeline)", "why": why, "by_cause_ms": per})
    graph_like = ("CUDA graph", "fuse small kernels")
    kept = [a for a in p.actions if not any(g in a for g in graph_like)] if cause != "launch" else p.actions
    if cause == "sync point":  # the named sync calls first
        kept = sorted(kept, key=lambda a: not a.startswith("remove the sync point"))
    p.actions = list(actions) + [a for a in kept if a not in actions]


def whole_step_gap(ev: dict[str, Any], src: dict[str, str], ic: dict[str, Any] | None, t_ms: float) -> None:
    """Where the host timeline names another cause than launches, the whole step's
    ``launch_gap_pct`` (H's launch override: "the launch path is the limiter") is the share of the
    step the device waited on launches alone, not its whole idle share, so the walk never blames
    launches for idle its own notes give to data loading, syncs, first calls or CPU work."""
    if not ic or ic["cause"] == "launch" or "launch_gap_pct" not in ev or t_ms <= 0:
        return
    ev["launch_gap_pct"] = min(100.0, 100.0 * ic["ms_per_step"]["launch"] / t_ms)
    src["launch_gap_pct"] = (f"the share of the step the device waited on the host's launches alone (host timeline; "
                             f"most of its idle waited on {ic['cause']}, see the gpu idle part)")


def warmup_steps(works: list[StepWork]) -> list[int]:
    """Leading steps longer than :data:`WARMUP_RATIO` times the later steps' median (module doc)."""
    if len(works) < WARMUP_MIN_LATER + 1:
        return []
    out = []
    for i, w in enumerate(works):
        later = [x.window_us for x in works[i + 1:]]
        if len(later) < WARMUP_MIN_LATER or w.window_us <= WARMUP_RATIO * statistics.median(later):
            break
        out.append(w.step)
    return out
