"""A profiler trace's steps, their device work and the host ops that launched it, streaming.

:mod:`hwlab.traces.kineto` keeps what the rank analysis needs; this module keeps what a per-part
analysis of one trace needs (``hwlab examine --trace``): every host op with its recorded input
shapes, every device kernel / memcpy / memset, and the runtime launch that ties them together.
The file is decoded event by event with kineto's chunked reader (standard library only, no
torch), so a trace is read where torch is not installed.

**Steps.** ``ProfilerStep#N`` ranges on the host (``cpu_op`` or ``user_annotation``; the
``gpu_user_annotation`` copy on the device is left). Without them, the kit's own
``hwlab::examine_call`` ranges (the trace ``hwlab examine --out`` writes) are the steps; without
either, the whole trace is one step, and the result says so.

**Launch join** (:func:`step_items`). Each item names the *outermost* aten op above it
(``top_op``, its ``stack`` that op's name alone): the op whose recorded shapes give its bytes.
A device event is joined to its launch: the runtime or driver event (``cudaLaunchKernel``,
``cuLaunchKernel``, ``hipLaunchKernel``, ``hipExtModuleLaunchKernel``, ``cudaMemcpyAsync``, ...)
whose ``args.correlation`` equals the kernel's; the ops above the launch are the host events
that enclose its start on the same process and thread (time nesting). A device event with no
launch record is kept, marked ``unlaunched``, and assigned to the last step that started at or
before it. One launched before the first step or between steps belongs to no step and is left
out of every step.

**Step window.** A step starts where its host range starts and ends at the later of its host
end and the end of the last device event it launched: work still running after the step's
host range (the last step's tail above all) belongs to the step that launched it. Where the
device runs behind the host (the previous step's window ends after this step's host range
began), the step starts where the previous one ended: windows never overlap, so a step's idle
is idle on the device timeline, not the previous step's work counted again (device work of a
step that ran beside the previous step's tail, on another stream, counts from the step's start).

**Item times.** On a GPU trace each device event's time is its *exclusive* share of the busy
time: where several run at once (streams), each elementary interval is split evenly between
those running, so the items add up to the union of the busy intervals and busy plus idle is
the step window exactly. On a CPU trace (no device events) each item is a host op's *self* time
(its duration minus its direct child ops'), as :func:`hwlab.core.profiling.trace_calls` reads a
live examination's trace.
"""
from __future__ import annotations

import bisect
import errno
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hwlab.traces.kineto import TraceError, discover_traces, iter_trace, name_rank
from hwlab.traces.trace_stream import event_times
from hwlab.core.profiling import (COMPILED_TRACE_MARKS, KERNEL_OCCUPANCY_ARGS, KIT_CALL_FAULT_KEY, KIT_CALL_WAIT_KEY,
                                  OP_SHAPE_ARGS, TRACE_KERNEL_CATS, trace_cat)

#: the most per-call waits a trace's kit key may hold (hwlab examine profiles a handful of calls)
MAX_KIT_CALLS = 1000
from hwlab.errors import UserInputError

#: the host range ``hwlab examine`` wraps each profiled call in (examine/torch_profile.CALL_MARK)
KIT_CALL_MARK = "hwlab::examine_call"
#: trace categories of host ops and ranges
HOST_CATS = ("cpu_op", "user_annotation")
#: trace categories of runtime / driver calls (launches carry ``args.correlation``)
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver")
#: args of a host op kept: its recorded inputs (``record_shapes=True``)
SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
#: host runtime calls that block until the device catches up: explicit synchronisation, a
#: blocking copy (``cudaMemcpy`` without ``Async``: a device-to-host ``.item()``, ``.cpu()``,
#: ``print``), an event wait on the host; CUDA and HIP spellings
SYNC_CALL = re.compile(r"^(cuda|hip)(Device|Stream|Event)Synchronize|^(cuda|hip)Memcpy(?!.*Async)|"
                       r"^cu(Ctx|Stream|Event)Synchronize|^cuMemcpyDtoH(?!.*Async)")
#: the stack entry of a device event with no launch record
UNLAUNCHED = "(unlaunched)"


@dataclass
class HostOp:
    """A host op or range: ``cat`` cpu_op / user_annotation."""
    name: str
    cat: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    ext: Any
    args: dict[str, Any]
    idx: int = -1          # position in its thread's sorted list
    parent: int = -1       # index of the enclosing event on the thread (-1: none)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def has_shapes(self) -> bool:
        return bool(self.args.get("Input Dims")) and bool(self.args.get("Input type"))


@dataclass
class DeviceEvent:
    name: str
    cat: str
    ts: float
    dur: float
    corr: Any
    ext: Any
    device: Any
    stream: Any
    args: dict[str, Any]


@dataclass
class OpTrace:
    """What :func:`read_ops` kept from one file."""
    path: str
    n_events: int = 0
    meta: dict[str, Any] = field(default_factory=dict)      # top-level keys other than traceEvents
    devices: list[dict[str, Any]] = field(default_factory=list)
    rank: int | None = None
    record_shapes: bool | None = None
    host: dict[tuple, list[HostOp]] = field(default_factory=dict)   # (pid, tid) -> ops sorted
    device: list[DeviceEvent] = field(default_factory=list)
    launches: dict[Any, tuple[float, Any, Any, str, float]] = field(default_factory=dict)  # corr -> (ts, pid, tid, name, dur)
    steps: list[dict[str, Any]] = field(default_factory=list)       # {step, ts, dur, pid, tid, mark}
    step_source: str = ""
    tops: list[HostOp] | None = field(default=None, repr=False)  # outermost aten ops, by start (cache)
    tops_ts: list[float] = field(default_factory=list, repr=False)
    #: events whose time is NaN, infinite or negative: left out (a NaN would shift every share)
    n_bad_times: int = 0
    #: host runtime calls that wait for the device (:data:`SYNC_CALL`): (ts, dur, name)
    syncs: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return bool(self.device)


def read_ops(path: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> OpTrace:
    """Stream one trace into an :class:`OpTrace` (module doc)."""
    ot = OpTrace(path=str(path))
    host: dict[tuple, list[HostOp]] = {}
    for key, v in iter_trace(path, progress):
        if key != "event":
            if key == "deviceProperties" and isinstance(v, list):
                ot.devices = [d for d in v if isinstance(d, dict)]
            elif key == "distributedInfo" and isinstance(v, dict):
                r = v.get("rank")  # a whole number >= 0; text, true/false or a negative says no rank
                ot.rank = r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else None
            elif key == "record_shapes":
                ot.record_shapes = bool(v)
            if isinstance(v, (str, int, float, bool)) or v is None:
                ot.meta[key] = v
            elif key in (KIT_CALL_WAIT_KEY, KIT_CALL_FAULT_KEY) and isinstance(v, list) and len(v) <= MAX_KIT_CALLS:
                ot.meta[key] = v  # hwlab examine's per-call waits, faults (checked where read: from_trace)
            continue
        ot.n_events += 1
        if not isinstance(v, dict) or v.get("ph") != "X":
            continue
        cat = trace_cat(v.get("cat"))
        times = event_times(v)
        if times is None:
            ot.n_bad_times += 1  # missing, text, NaN, negative or past a day: places nothing; counted, said
            continue
        ts, dur = times
        args = v.get("args") if isinstance(v.get("args"), dict) else {}
        name = str(v.get("name", ""))
        if cat in HOST_CATS:
            if "Input dims" in args and "Input Dims" not in args:  # PyTorch 1.8's spelling
                args = {**args, "Input Dims": args["Input dims"]}
            op = HostOp(name, cat, ts, dur, v.get("pid"), v.get("tid"), args.get("External id"),
                        {k: args[k] for k in SHAPE_ARGS if k in args})
            host.setdefault((op.pid, op.tid), []).append(op)
            if name.startswith("ProfilerStep#"):
                try:
                    n = int(name.split("#", 1)[1])
                except ValueError:
                    n = None
                if n is not None:
                    ot.steps.append({"step": n, "ts": ts, "dur": dur, "pid": op.pid, "tid": op.tid,
                                     "mark": "ProfilerStep"})
        elif cat in TRACE_KERNEL_CATS:
            ot.device.append(DeviceEvent(name, cat, ts, dur, args.get("correlation"), args.get("External id"),
                                         args.get("device", v.get("pid")), args.get("stream", v.get("tid")),
                                         {a: args[a] for a in KERNEL_OCCUPANCY_ARGS if a in args}))
        elif cat in RUNTIME_CATS:
            if "correlation" in args:
                ot.launches[args["correlation"]] = (ts, v.get("pid"), v.get("tid"), name, dur)
            if ("ynchronize" in name or "Memcpy" in name or "DtoH" in name) and SYNC_CALL.search(name):
                ot.syncs.append((ts, dur, name))
    for ops in host.values():
        ops.sort(key=lambda o: (o.ts, -o.dur))
        stack: list[HostOp] = []
        for i, o in enumerate(ops):
            o.idx = i
            while stack and not (o.ts >= stack[-1].ts and o.end <= stack[-1].end + 1e-3):
                stack.pop()
            o.parent = stack[-1].idx if stack else -1
            stack.append(o)
    ot.host = host
    _choose_steps(ot)
    if ot.rank is None:
        ot.rank = name_rank(path)[0]
    return ot


def _choose_steps(ot: OpTrace) -> None:
    """ProfilerStep ranges (one pid/tid where the trace holds several), else the kit's call
    marks, else the whole trace (module doc)."""
    if ot.steps:
        first = ot.steps[0]
        seen: set[int] = set()
        keep = []
        for s in sorted(ot.steps, key=lambda s: s["ts"]):
            if (s["pid"], s["tid"]) == (first["pid"], first["tid"]) and s["step"] not in seen:
                seen.add(s["step"])
                keep.append(s)
        ot.steps, ot.step_source = keep, "ProfilerStep#N ranges"
        return
    marks = [o for o in ot.host.values() for o in o if o.name == KIT_CALL_MARK and o.cat == "user_annotation"]
    if marks:
        marks.sort(key=lambda o: o.ts)
        ot.steps = [{"step": i, "ts": o.ts, "dur": o.dur, "pid": o.pid, "tid": o.tid, "mark": KIT_CALL_MARK}
                    for i, o in enumerate(marks)]
        ot.step_source = f"the kit's {KIT_CALL_MARK} ranges (a trace hwlab examine wrote)"
        return
    spans = [(o.ts, o.end) for ops in ot.host.values() for o in ops if o.cat == "cpu_op"] + \
        [(d.ts, d.ts + d.dur) for d in ot.device]
    if not spans:
        bad = (f" ({ot.n_bad_times:,} complete event(s) left out: their ts or dur is missing, text, "
               "true/false, NaN, negative or over a day)" if ot.n_bad_times else "")
        raise UserInputError(f"{ot.path}: no host ops and no device kernels in the trace{bad}: pass a trace "
                             "written by torch.profiler (export_chrome_trace or tensorboard_trace_handler)")
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    main = max(ot.host.items(), key=lambda kv: len(kv[1]))[0] if ot.host else (None, None)
    ot.steps = [{"step": 0, "ts": lo, "dur": hi - lo, "pid": main[0], "tid": main[1], "mark": "whole trace"}]
    ot.step_source = "the whole trace as one step (no ProfilerStep#N ranges)"


def enclosing(ops: list[HostOp], starts: list[float], ts: float) -> list[HostOp]:
    """Host events of one thread enclosing ``ts``, innermost first (``starts``: their ts)."""
    i = bisect.bisect_right(starts, ts) - 1
    # the innermost enclosing event is the last one started at or before ts, or one of its
    # ancestors (proper nesting): climb past those that ended before ts
    while i >= 0 and not (ops[i].ts <= ts <= ops[i].end):
        i = ops[i].parent
    out = []
    while i >= 0:
        out.append(ops[i])
        i = ops[i].parent
    return out


def _exclusive(intervals: list[tuple[float, float]]) -> tuple[list[float], float]:
    """Each interval's exclusive share of the busy time (overlaps split evenly), and the busy
    union."""
    share = [0.0] * len(intervals)
    events: list[tuple[float, int, int]] = []
    for i, (a, b) in enumerate(intervals):
        if b > a:
            events.append((a, 1, i))
            events.append((b, 0, i))
    events.sort()
    active: set[int] = set()
    busy, last = 0.0, None
    for t, kind, i in events:
        if last is not None and active and t > last:
            seg = t - last
            busy += seg
            for j in active:
                share[j] += seg / len(active)
        last = t
        if kind:
            active.add(i)
        else:
            active.discard(i)
    return share, busy


@dataclass
class StepWork:
    """One step: its window and its timed items (the same item dicts as
    :func:`hwlab.core.profiling.trace_calls`, plus ``unlaunched``, ``launch_ts`` / ``launch_end`` (its
    launch call on the host, None without one) and ``ts_end``), and the
    outermost aten ops it ran (in order, for the shape model)."""
    step: int
    ts: float
    host_dur_us: float
    window_us: float
    busy_us: float
    items: list[dict[str, Any]]
    top_ops: list[HostOp]
    n_unlaunched: int = 0


def step_items(ot: OpTrace) -> list[StepWork]:
    """Every step's work (module doc)."""
    starts = {k: [o.ts for o in ops] for k, ops in ot.host.items()}
    steps = sorted(ot.steps, key=lambda s: s["ts"])
    if not steps:
        return []
    bounds = [s["ts"] for s in steps]

    def host_step(ts: float) -> int | None:
        i = bisect.bisect_right(bounds, ts) - 1
        if i >= 0 and ts <= steps[i]["ts"] + steps[i]["dur"]:
            return i
        return None

    def stack_of(pid, tid, ts) -> tuple[list[HostOp], bool]:
        ops = ot.host.get((pid, tid), [])
        encl = enclosing(ops, starts.get((pid, tid), []), ts) if ops else []
        compiled = any(any(h.name.startswith(m) for m in COMPILED_TRACE_MARKS) for h in encl)
        cpu = [h for h in encl if h.cat == "cpu_op" and not h.name.startswith("ProfilerStep#")]
        return [h for h in cpu if h.name.startswith("aten::")], compiled, (cpu[-1] if cpu else None)

    per: list[list[dict[str, Any]]] = [[] for _ in steps]
    n_un = [0] * len(steps)
    if ot.device:
        pending = []
        for d in ot.device:
            launch = ot.launches.get(d.corr) if d.corr is not None else None
            if launch is not None:
                i = host_step(launch[0])
                if i is None:
                    continue  # launched outside every step (before the first, between steps)
                aten, compiled, other = stack_of(launch[1], launch[2], launch[0])
                # the outermost aten op launched it; with none, the outermost host op names it
                top = aten[-1] if aten else other
                pending.append((i, d, top, [top.name] if top else [], compiled, launch, aten))
            else:  # no launch record: kept, in the step whose window holds its start
                i = bisect.bisect_right(bounds, d.ts) - 1
                if i < 0:
                    continue
                pending.append((i, d, None, [UNLAUNCHED], False, None, []))
                n_un[i] += 1
        for i, d, top, stack, compiled, launch, aten in pending:
            per[i].append({"stack": stack, "op_ids": [id(top)] if top else [None] * len(stack),
                           # every aten op over the launch, innermost first, and the innermost's shapes:
                           # what a layer run natively (a fused op) did, counted by examine's fused split
                           "inner_stack": [a.name for a in aten], "inner_op_ids": [id(a) for a in aten],
                           "op_args": {k: aten[0].args[k] for k in OP_SHAPE_ARGS if k in aten[0].args} if aten else {},
                           "top_op": top, "us": float(d.dur), "kernel": d.name,
                           "compiled": compiled, "args": dict(d.args), "ts": d.ts, "ts_end": d.ts + d.dur,
                           "unlaunched": launch is None, "launch_ts": launch[0] if launch else None,
                           "launch_end": launch[0] + launch[4] if launch else None, "cat": d.cat})
    out: list[StepWork] = []
    prev_end = None
    for i, s in enumerate(steps):
        lo, host_end = s["ts"], s["ts"] + s["dur"]
        top = _top_ops(ot, lo, host_end)
        if ot.device:
            items = per[i]
            end = max([host_end] + [it["ts_end"] for it in items])
            if prev_end is not None and prev_end > lo:  # the device lags: this step starts where the last ended
                lo = min(prev_end, end)
            prev_end = end
            share, busy = _exclusive([(max(it["ts"], lo), max(it["ts_end"], lo)) for it in items])
            for it, sh in zip(items, share):
                it["us"] = sh
            out.append(StepWork(s["step"], lo, s["dur"], end - lo, busy, items, top, n_un[i]))
        else:
            items = _cpu_items(ot, s, starts)
            out.append(StepWork(s["step"], lo, s["dur"], s["dur"], sum(it["us"] for it in items), items, top))
    return out


def _top_ops(ot: OpTrace, lo: float, hi: float) -> list[HostOp]:
    """Outermost aten ops (no aten op above them on their thread) that start inside [lo, hi],
    in start order: the ops a dispatch-mode traffic model would see first."""
    tops = ot.tops
    if tops is None:  # once per trace, then a bisect per step
        tops = []
        for ops in ot.host.values():
            for o in ops:
                if o.cat != "cpu_op" or not o.name.startswith("aten::"):
                    continue
                p, above = o.parent, False
                while p >= 0:
                    if ops[p].cat == "cpu_op" and ops[p].name.startswith("aten::"):
                        above = True
                        break
                    p = ops[p].parent
                if not above:
                    tops.append(o)
        tops.sort(key=lambda o: o.ts)
        ot.tops, ot.tops_ts = tops, [o.ts for o in tops]
    ts = ot.tops_ts
    return tops[bisect.bisect_left(ts, lo):bisect.bisect_right(ts, hi)]


def _cpu_items(ot: OpTrace, s: dict[str, Any], starts) -> list[dict[str, Any]]:
    """Every cpu_op inside the step on the step's thread with its self time (module doc)."""
    ops = ot.host.get((s["pid"], s["tid"]), [])
    lo, hi = s["ts"], s["ts"] + s["dur"] + 1e-3
    inside = [o for o in ops if o.cat == "cpu_op" and lo <= o.ts and o.end <= hi
              and not o.name.startswith("ProfilerStep#")]
    child_us: dict[int, float] = {}
    ids = {o.idx for o in inside}
    for o in inside:
        # the nearest cpu_op ancestor inside the step is its direct parent op
        p = o.parent
        while p >= 0 and p not in ids:
            p = ops[p].parent
        if p >= 0:
            child_us[p] = child_us.get(p, 0.0) + o.dur
    items = []
    for o in inside:
        chain, p = [o], o.parent
        while p >= 0:
            chain.append(ops[p])
            p = ops[p].parent
        aten = [h for h in chain if h.cat == "cpu_op" and h.name.startswith("aten::")]
        top = aten[-1] if aten else None
        items.append({"stack": [top.name] if top else [], "op_ids": [id(top)] if top else [],
                      "top_op": top, "us": max(0.0, o.dur - child_us.get(o.idx, 0.0)),
                      "kernel": None, "compiled": False, "args": {}, "ts": o.ts, "ts_end": o.end,
                      "unlaunched": False, "cat": "cpu_op"})
    return items


def find_trace(path: str | os.PathLike, rank: int | None = None) -> Path:
    """The trace file to read: ``path`` itself, or in a folder (one level of sub-folders too) the
    one trace found by content (:func:`hwlab.traces.kineto.discover_traces`), or the one of ``rank``
    (by its file name, else its distributedInfo)."""
    p = Path(path)
    try:
        os.stat(p)
    except FileNotFoundError:
        raise UserInputError(f"{p}: no such file or folder: pass a profiler trace (.json / .json.gz) or its folder") from None
    except OSError as e:  # a symbolic link that loops, a path through a file: the cause, not "no such file"
        raise UserInputError(f"cannot read {p} ({e.strerror or e}): "
                             + ("a symbolic link on the way loops back on itself: fix or remove it, or " if
                                e.errno == errno.ELOOP else "") + "pass a profiler trace (.json / .json.gz) or its folder") from None
    if p.is_file() or not p.is_dir():
        return p
    files, skipped = discover_traces(p)  # by content, whatever the names (kineto)
    if not files:
        why = "; ".join(f"{f.name}: {w}" for f, w in skipped[:3])
        raise UserInputError(f"no profiler trace in {p}" + (f" ({why})" if why else "") +
                             ": pass the folder the profiler wrote its traces to, or one trace file")
    if rank is None:
        if len(files) == 1:
            return files[0]
        raise UserInputError(f"{p} holds {len(files)} trace files: pass --rank R (or one file)")
    hits = []
    for f in files:
        r = name_rank(f)[0]
        if r is None:
            r = _content_rank(f)
        if r == rank:
            hits.append(f)
    if len(hits) != 1:
        raise UserInputError(f"{len(hits) or 'no'} trace file(s) of rank {rank} in {p}: pass the file itself")
    return hits[0]


def _content_rank(f: Path) -> int | None:
    try:
        for key, v in iter_trace(f):
            if key == "distributedInfo" and isinstance(v, dict) and isinstance(v.get("rank"), int):
                return v["rank"]
            if key == "event":  # distributedInfo is written before or after the events: read on
                continue
    except (UserInputError, TraceError):
        return None
    return None
