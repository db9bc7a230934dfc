"""Read one PyTorch profiler (Kineto / Chrome trace format) file, streaming, standard library only.

A trace from ``torch.profiler`` (``tensorboard_trace_handler``, ``export_chrome_trace``, the
per-rank traces inference servers write) can be gigabytes. :func:`read_trace` never loads it
whole: it walks the file one event at a time (:func:`hwlab.traces.trace_stream.iter_trace`, the
one reader of the format, re-exported here with :func:`sniff` and :func:`discover_traces`),
keeping only what the rank analysis needs (steps, kernels, collectives, the main thread's
top-level operators) as small tuples. Memory grows with the kept events, not with the file.

What it extracts, as torch writes it:

* ``distributedInfo``: ``rank``, ``world_size``, ``backend``, ``pg_config``; the rank's source is
  said (:data:`RANK_FROM_TRACE`); without it the rank comes from the file name
  (``*-TP-{rank}.trace.json[.gz]``, ``rank{N}`` / ``rank-{N}`` / ``rank_{N}``), and a
  ``tensorboard_trace_handler`` name (``{host}_{pid}.{ns}.pt.trace.json[.gz]``) gives host and pid
  only.
* ``ProfilerStep#N`` spans on the host (the ``gpu_user_annotation`` copy on the device is left).
* GPU kernels (``cat`` ``kernel``) with device and stream; NCCL kernels (``ncclKernel_*``,
  ``ncclDevKernel_*``, NCCL's one-rank kernel from ``onerank.cu``, any kernel the kit's one classifier
  calls communication (:func:`hwlab.core.kernel_classes.is_communication`: RCCL, NVSHMEM, expert-parallel
  all-to-all, multimem / one-shot all-reduce, custom all-reduce), or any kernel torch tagged with
  ``Collective name``) are collectives, named from those args where present, else from the
  kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` -> ``allreduce``). Torch writes the
  collective's name, ``In msg nelems``, ``dtype``, process group and group size on the NCCL
  kernel itself; a sequence number only in some versions.
* Collective metadata from ``record_param_comms`` host operators (``Collective name``, ``In msg
  nelems``, ``dtype``, ``Process Group Name``, ``Group size``, ``Seq``, as torch records them
  for NCCL), matched to the NCCL kernels of the same process in launch order.
* Gloo collectives on the host: ``gloo:<collective>`` spans on gloo's worker threads (the time the
  collective itself takes; the ``c10d::allreduce_`` operator on the main thread only enqueues it),
  with the bytes from ``Input Dims`` and ``Input type`` when the profiler recorded shapes.

* Identity of each NCCL kernel from its own trace: the runtime launch (``cudaLaunchKernel``,
  ``hipLaunchKernel``...) whose ``correlation`` equals the kernel's is found on the host, and the
  host collective ops that enclose it on the same thread (``record_param_comms`` with its
  metadata, ``nccl:<collective>``, ``c10d::<collective>_``) name it. Kernels NCCL names by its
  transport (every kernel ``SendRecv`` in some versions) get their collective's name this way;
  ``Collective.meta_source`` says which route each took. Launch order is the last resort, said.
* Each kernel's host launch time (:attr:`RankTrace.kernel_launch_us`), so device work can be
  attributed to the host step that launched it even when the device runs behind.
* What kind of job: backward ops (``autograd::engine...``, ``*Backward*``) and optimizer steps
  (``Optimizer.step#...``) are counted (:attr:`RankTrace.workload`).
* When it was recorded (``baseTimeNanoseconds``, else the first event on a Unix-epoch clock) and
  the device names (``deviceProperties``), to keep traces of different jobs apart.

Which files are traces is decided by content, not by name (:func:`sniff`, :func:`discover_traces`):
the start of the file must be a JSON object that names ``traceEvents``, ``schemaVersion`` or
``deviceProperties``; the kit's own records (``"schema": "hwlab.*"``) and everything else are
listed with the reason they were skipped.

A truncated or malformed file raises :class:`TraceError` with the byte offset; a path that is
not a regular file (a FIFO, a device) is refused before it is opened.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hwlab.core.kernel_classes import collective_of, is_communication
from hwlab.core.profiling import trace_cat
from hwlab.traces.trace_stream import (CHUNK_CHARS, PEEK_CHARS, PROGRESS_EVERY_BYTES, TRACE_MARKERS,  # noqa: F401
                                      TRACE_SUFFIXES, TraceError, discover_traces, event_times, iter_trace, sniff)
from hwlab.errors import UserInputError

RANK_FROM_TRACE = "distributedInfo in the trace"
NOT_TRACES = ("rank-", "nvml-", "node.json", "mapping.json")  # the kit's own records in a run folder

#: bytes per element of the dtypes the profiler writes in ``Input type`` / ``dtype``
DTYPE_BYTES = {"float": 4, "float32": 4, "Float": 4, "double": 8, "float64": 8, "Double": 8,
               "c10::Half": 2, "half": 2, "float16": 2, "Half": 2, "c10::BFloat16": 2, "bfloat16": 2,
               "BFloat16": 2, "int": 4, "int32": 4, "Int": 4, "long int": 8, "int64": 8, "Long": 8,
               "signed char": 1, "int8": 1, "unsigned char": 1, "uint8": 1, "Byte": 1, "bool": 1,
               "c10::Float8_e4m3fn": 1, "Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "Float8_e5m2": 1}

_NCCL_KERNEL = re.compile(r"^ncclDevKernel_|^ncclKernel_")
_ONE_RANK = "_onerank_cu_"  # NCCL's kernel for a one-rank communicator (src/device/onerank.cu)
_NCCL_COLL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_TP_RANK = re.compile(r"-TP-(\d+)(?:[-.]|$)")
_RANK = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.I)
_LAUNCH = re.compile(r"Launch|launch")  # cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel, hipExtModuleLaunchKernel
#: host ranges an optimizer step writes (torch.optim's profiler hooks; fused and foreach kernels' ops)
_OPTIMIZER_MARKS = ("Optimizer.step#", "Optimizer.zero_grad#", "aten::_fused_adam", "aten::_fused_sgd",
                    "aten::_fused_adamw")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "hip_runtime", "cuda_runtime_api")
_HOST_COLL = re.compile(r"^(?:nccl|gloo|c10d)::?|^record_param_comms$")
EPOCH_US_MIN = 1e15  # a timestamp past this (2001 in microseconds since 1970) is on the Unix-epoch clock
_TB_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<ns>\d{10,})\.pt\.trace\.json(?:\.gz)?$")



def coll_key(name: str) -> str:
    """One spelling for a collective across sources: ``all_reduce``, ``AllReduce``, ``allreduce_``
    -> ``allreduce``."""
    n = name.split(":")[-1].lower().replace("_", "").replace(" ", "")
    for pre in ("c10d", "nccl"):
        n = n[len(pre):] if n.startswith(pre) else n
    return n[:-4] if n.endswith("base") and len(n) > 4 else n  # _allgather_base -> allgather


@dataclass
class Collective:
    """One collective on one rank: where its time was spent and what it moved."""
    name: str                 # coll_key spelling
    ts_us: float
    dur_us: float
    on: str                   # "gpu" (an NCCL kernel) or "cpu" (a gloo worker span)
    stream: Any = None        # the CUDA stream (NCCL) or the worker thread id (gloo)
    n_bytes: int | None = None
    n_bytes_out: int | None = None  # the output's bytes (``Out msg nelems``), when recorded
    pg: str | None = None     # process group name, when recorded
    seq: int | None = None    # the collective's sequence number in its group, when recorded
    group_size: int | None = None
    meta_source: str | None = None  # where the size / group / seq came from
    kernel: str | None = None       # the NCCL kernel's name (GPU collectives)
    launch_us: float | None = None  # the host time of its launch (GPU collectives, by correlation id)
    host_op: str | None = None      # the host collective op its launch sits in (nccl:all_reduce ...)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RankTrace:
    """What :func:`read_trace` kept from one file."""
    path: str
    rank: int | None = None
    rank_source: str | None = None
    world_size: int | None = None
    backend: str | None = None
    host: str | None = None
    pid: int | None = None
    pg_config: list[dict[str, Any]] = field(default_factory=list)
    steps: list[tuple[int, float, float]] = field(default_factory=list)      # (step, ts_us, dur_us)
    kernels: list[tuple[float, float, Any]] = field(default_factory=list)   # non-NCCL: (ts_us, dur_us, stream)
    collectives: list[Collective] = field(default_factory=list)
    host_ops: list[tuple[float, float]] = field(default_factory=list)       # main thread, not collectives
    n_events: int = 0
    n_bytes_file: int = 0
    devices: list[Any] = field(default_factory=list)
    schema_version: Any = None
    #: the host launch time of each kernel in :attr:`kernels` (same order; None: no launch event)
    kernel_launch_us: list[float | None] = field(default_factory=list)
    base_time_ns: int | None = None   # ``baseTimeNanoseconds``: the trace's clock offset to Unix time
    trace_name: str | None = None     # ``traceName``: where the profiler wrote it
    t_first_us: float | None = None   # the earliest event, on the trace's own clock
    n_backward_ops: int = 0           # autograd::engine / *Backward* ops on the host
    n_optimizer_steps: int = 0        # Optimizer.step#... spans
    n_bad_times: int = 0              # events with a NaN / infinite / negative time: left out
    gpu_ids: set = field(default_factory=set)  # device ids its kernels ran on (args.device, else the event's pid)

    @property
    def fingerprint(self) -> tuple:
        """What a copy of the same recording shares with it whatever its file name: the process,
        the first event's time, the event count, the steps and the kernel times. Two files with
        one fingerprint are one trace given twice (read once, said)."""
        return (self.pid, self.t_first_us, self.n_events, tuple(self.steps), len(self.kernels),
                self.kernels[0] if self.kernels else None, self.kernels[-1] if self.kernels else None)

    @property
    def recorded_unix_s(self) -> float | None:
        """When the trace was recorded, in Unix seconds: ``baseTimeNanoseconds`` (whole seconds),
        else the first event when the trace's clock is the Unix epoch; None when it cannot say."""
        if self.base_time_ns:
            return self.base_time_ns / 1e9
        if self.t_first_us is not None and self.t_first_us > EPOCH_US_MIN:
            return self.t_first_us / 1e6
        return None

    @property
    def workload(self) -> str:
        """``training`` (backward ops or optimizer steps in the trace) or ``inference`` (forward
        ops only; an estimate from what the trace holds, no label)."""
        return "training" if self.n_backward_ops or self.n_optimizer_steps else "inference"

    @property
    def device_names(self) -> list[str]:
        return sorted({str(d.get("name")) for d in self.devices if d.get("name")})

    @property
    def on_gpu(self) -> bool:
        return bool(self.kernels) or any(c.on == "gpu" for c in self.collectives)


def name_rank(path: str | os.PathLike) -> tuple[int | None, str | None, dict[str, Any]]:
    """(rank, how, extra) from a trace's file name; extra holds host/pid of a
    ``tensorboard_trace_handler`` name (which carries no rank)."""
    name = Path(path).name
    extra: dict[str, Any] = {}
    m = _TB_NAME.match(name)
    if m:
        extra = {"host": m["host"], "pid": int(m["pid"])}
    m = _TP_RANK.search(name)
    if m:
        return int(m.group(1)), "file name (-TP-N)", extra
    m = _RANK.search(name)
    if m:
        return int(m.group(1)), "file name (rankN)", extra
    return None, None, extra


def is_trace_name(path: str | os.PathLike) -> bool:
    """A guess from the name alone (kept for callers that list files cheaply); which files are
    traces is decided by content (:func:`discover_traces`)."""
    n = Path(path).name
    if not n.endswith(TRACE_SUFFIXES) or n.startswith(NOT_TRACES):
        return False
    return "trace" in n or bool(_RANK.search(n))





def _nbytes_from_shapes(args: dict[str, Any]) -> int | None:
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types:
        return None
    total = 0
    for d, t in zip(dims, types):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d) and t in DTYPE_BYTES:
            n = 1
            for x in d:
                n *= x
            total += n * DTYPE_BYTES[t]
        elif t == "TensorList" and isinstance(d, list):  # c10d ops: a list of tensors
            return None
    return total or None


def _comms_meta(args: dict[str, Any]) -> dict[str, Any]:
    """The collective metadata torch writes on ``record_param_comms`` (and, in some versions, on
    the NCCL kernel itself)."""
    out: dict[str, Any] = {}
    if "Collective name" in args:
        out["name"] = coll_key(str(args["Collective name"]))
    nel = args.get("In msg nelems")
    dt = args.get("dtype")
    if isinstance(nel, int) and dt is not None:
        size = DTYPE_BYTES.get(str(dt)) or DTYPE_BYTES.get(str(dt).split(".")[-1])
        if size:
            out["n_bytes"] = nel * size
            if isinstance(args.get("Out msg nelems"), int):
                out["n_bytes_out"] = args["Out msg nelems"] * size
    for key, k in (("Process Group Name", "pg"), ("Process Group Description", "pg_desc")):
        if args.get(key) not in (None, ""):
            out[k] = str(args[key])
    for key in ("Seq", "seq", "Sequence number"):
        if isinstance(args.get(key), int) and "Collective name" in args:
            out["seq"] = args[key]
            break
    if isinstance(args.get("Group size"), int):
        out["group_size"] = args["Group size"]
    return out



def read_trace(path: str | os.PathLike, *, progress: Callable[[int, int], None] | None = None) -> RankTrace:
    """Stream one trace file into a :class:`RankTrace` (module docstring). ``progress(bytes_read,
    file_bytes)`` is called every :data:`PROGRESS_EVERY_BYTES` of file read."""
    p = Path(path)
    rt = RankTrace(path=str(p))
    main_tids: set[Any] = set()
    ops: list[tuple[float, float, Any]] = []
    metas: list[tuple[float, dict[str, Any]]] = []
    ctx = _Ctx()
    for key, v in iter_trace(p, progress):
        if key == "event":
            rt.n_events += 1
            if isinstance(v, dict):
                _take(v, rt, ops, metas, main_tids, ctx)
        elif key == "distributedInfo" and isinstance(v, dict):
            rt.rank, rt.world_size = _rank_and_world(p, v.get("rank"), v.get("world_size"))
            rt.backend, rt.pg_config = v.get("backend"), v.get("pg_config") or []
        elif key == "deviceProperties" and isinstance(v, list):
            rt.devices = [{k: d.get(k) for k in ("id", "name", "computeMajor", "computeMinor",
                                                   "numSms", "totalGlobalMem")} for d in v if isinstance(d, dict)]
        elif key in ("host_name", "hostname") and isinstance(v, str):
            rt.host = v
        elif key == "schemaVersion":
            rt.schema_version = v
        elif key == "baseTimeNanoseconds" and isinstance(v, int):
            rt.base_time_ns = v
        elif key == "traceName" and isinstance(v, str):
            rt.trace_name = v
    rt.n_bytes_file = p.stat().st_size
    _finish(rt, ops, metas, main_tids, ctx)
    if rt.rank is not None:
        rt.rank_source = RANK_FROM_TRACE
    n_rank, how, extra = name_rank(p)
    if rt.rank is None and n_rank is not None:
        rt.rank, rt.rank_source = n_rank, how
    rt.host = rt.host or extra.get("host")
    rt.pid = rt.pid if rt.pid is not None else extra.get("pid")
    return rt


def _rank_and_world(p: Path, rank: Any, world: Any) -> tuple[int | None, int | None]:
    """``distributedInfo``'s rank and world size, each a whole number (null: not stated): the world
    1..:data:`hwlab.core.validate.MAX_RANKS`, the rank 0..world - 1. Anything else (text, a
    fraction, a negative or out-of-world rank, a world of 10^9) makes the file unreadable as a rank's
    trace (:class:`TraceError`: a folder's reader names it and reads the other ranks)."""
    from hwlab.core.validate import MAX_RANKS

    def whole(v: Any, field: str, lo: int, hi: int) -> int | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            shown = repr(v) if not isinstance(v, int) or abs(v) < 10**12 else f"an integer of {len(str(v))} digits"
            raise TraceError(f"{p}: distributedInfo.{field} is {shown[:40]}, not a whole number in {lo}..{hi:,}: "
                             "the trace does not say which rank it is; fix or remove the distributedInfo entry")
        return v

    w = whole(world, "world_size", 1, MAX_RANKS)
    return whole(rank, "rank", 0, (w if w is not None else MAX_RANKS) - 1), w


class _Ctx:
    """What the reader keeps only until :func:`_finish`: launches by correlation id, host
    collective ops, the correlation id of each kept kernel."""

    def __init__(self) -> None:
        self.launches: dict[Any, tuple[float, Any]] = {}      # correlation -> (host ts, tid)
        self.host_colls: list[tuple[float, float, Any, str, dict[str, Any]]] = []  # ts, end, tid, name, meta
        self.kernel_corr: list[Any] = []                       # parallel to rt.kernels
        self.coll_corr: dict[int, Any] = {}                    # id(collective) -> correlation
        self.rpc_by_ext: dict[Any, dict[str, Any]] = {}        # record_param_comms External id -> meta


def _take(ev: dict[str, Any], rt: RankTrace, ops: list, metas: list, main_tids: set,
          ctx: _Ctx | None = None) -> None:
    if ev.get("ph") != "X":
        return
    ctx = ctx or _Ctx()
    name, cat = str(ev.get("name", "")), trace_cat(ev.get("cat"))
    times = event_times(ev)
    if times is None:
        rt.n_bad_times += 1  # missing, text, NaN, negative or past a day: places nothing; counted, said
        return
    ts, dur = times
    if rt.t_first_us is None or ts < rt.t_first_us:
        rt.t_first_us = ts
    args = ev.get("args") or {}
    if cat == "kernel":
        stream = args.get("stream")
        rt.gpu_ids.add(args.get("device", ev.get("pid")))
        corr = args.get("correlation")
        if _NCCL_KERNEL.match(name) or "Collective name" in args or _ONE_RANK in name or is_communication(name):
            m = _NCCL_COLL.match(name)  # NCCL names its collective; other libraries' kernels by name
            c = Collective(coll_key(m.group(1)) if m else ("nccl" if "nccl" in name.lower() else
                                                            collective_of(name)), ts, dur, "gpu", stream)
            c.kernel = name[:120]
            meta = _comms_meta(args)
            if meta:
                c.name = meta.get("name", c.name)
                c.n_bytes, c.pg, c.seq = meta.get("n_bytes"), meta.get("pg"), meta.get("seq")
                c.n_bytes_out = meta.get("n_bytes_out")
                c.group_size, c.meta_source = meta.get("group_size"), "kernel args"
            rt.collectives.append(c)
            ctx.coll_corr[id(c)] = (corr, args.get("External id"))
        else:
            rt.kernels.append((ts, dur, stream))
            ctx.kernel_corr.append(corr)
        return
    if cat in _RUNTIME_CATS:
        corr = args.get("correlation")
        if corr is not None and _LAUNCH.search(name):
            ctx.launches[corr] = (ts, ev.get("tid"))
        return
    if cat in ("cpu_op", "user_annotation") and _HOST_COLL.match(name):
        meta = _comms_meta(args) if name == "record_param_comms" else {}
        ctx.host_colls.append((ts, ts + dur, ev.get("tid"), name, meta))
        if meta and args.get("External id") is not None:
            ctx.rpc_by_ext[args["External id"]] = meta
    if cat == "cpu_op" and (name.startswith("autograd::engine") or "backward" in name.lower()):
        rt.n_backward_ops += 1  # aten::*_backward, *Backward0, the autograd engine's own ranges
    elif name.startswith(_OPTIMIZER_MARKS) and cat in ("cpu_op", "user_annotation", "python_function"):
        rt.n_optimizer_steps += 1
    if name.startswith("ProfilerStep#") and cat != "gpu_user_annotation":
        try:
            rt.steps.append((int(name.split("#", 1)[1]), ts, dur))
        except ValueError:
            return
        main_tids.add(ev.get("tid"))
        if rt.pid is None and isinstance(ev.get("pid"), int):
            rt.pid = ev["pid"]
        return
    if name.startswith("gloo:") and cat in ("user_annotation", "cpu_op"):
        rt.collectives.append(Collective(coll_key(name), ts, dur, "cpu", ev.get("tid"),
                                         n_bytes=_nbytes_from_shapes(args),
                                         meta_source="Input Dims" if "Input Dims" in args else None))
        return
    if cat == "cpu_op" and name == "record_param_comms":
        meta = _comms_meta(args)
        if meta:
            metas.append((ts, meta))
        return
    if cat == "cpu_op":
        ops.append((ts, dur, ev.get("tid")))


def _enclosing(host: list, starts: list[float], ts: float, tid: Any) -> list[tuple]:
    """The host collective ops on thread ``tid`` whose span holds ``ts`` (outermost first)."""
    import bisect
    out = []
    for i in range(bisect.bisect_right(starts, ts) - 1, -1, -1):
        h = host[i]
        if h[1] >= ts and h[2] == tid:
            out.append(h)
        if ts - h[0] > 60e6:  # a collective op does not last a minute: stop looking back
            break
    return out[::-1]


def _identify(rt: RankTrace, ctx: _Ctx) -> None:
    """Name each NCCL kernel by the host ops around its launch (correlation id), and take the
    size, process group and sequence number from ``record_param_comms`` there (module docstring)."""
    host = sorted(ctx.host_colls, key=lambda h: h[0])
    starts = [h[0] for h in host]
    for c in rt.collectives:
        if c.on != "gpu":
            continue
        corr, ext = ctx.coll_corr.get(id(c), (None, None))
        launch = ctx.launches.get(corr) if corr is not None else None
        if launch is None:
            if c.meta_source is None and ext is not None and ext in ctx.rpc_by_ext:
                m = ctx.rpc_by_ext[ext]
                c.name = m.get("name", c.name)
                c.n_bytes, c.pg, c.seq = m.get("n_bytes"), m.get("pg"), m.get("seq")
                c.n_bytes_out = m.get("n_bytes_out")
                c.group_size, c.meta_source = m.get("group_size"), "record_param_comms (External id)"
            continue
        c.launch_us = launch[0]
        around = _enclosing(host, starts, launch[0], launch[1])
        if not around:
            continue
        named = [h for h in around if h[3] != "record_param_comms"]
        c.host_op = named[-1][3] if named else "record_param_comms"
        rpc = [h[4] for h in around if h[4]]
        if c.meta_source == "kernel args":
            continue
        if rpc:
            m = rpc[-1]
            c.name = m.get("name") or (coll_key(named[-1][3]) if named else c.name)
            c.n_bytes, c.pg, c.seq = m.get("n_bytes"), m.get("pg"), m.get("seq")
            c.n_bytes_out = m.get("n_bytes_out")
            c.group_size, c.meta_source = m.get("group_size"), "record_param_comms (by correlation id)"
        elif named:
            c.name, c.meta_source = coll_key(named[-1][3]), f"host op {named[-1][3]} (by correlation id)"


def _finish(rt: RankTrace, ops: list, metas: list, main_tids: set, ctx: _Ctx | None = None) -> None:
    ctx = ctx or _Ctx()
    rt.steps.sort(key=lambda s: s[1])
    launch = [ctx.launches.get(c)[0] if c is not None and c in ctx.launches else None for c in ctx.kernel_corr]
    launch += [None] * (len(rt.kernels) - len(launch))
    order = sorted(range(len(rt.kernels)), key=lambda i: rt.kernels[i][0])
    rt.kernels = [rt.kernels[i] for i in order]
    rt.kernel_launch_us = [launch[i] for i in order]
    rt.collectives.sort(key=lambda c: c.ts_us)
    _identify(rt, ctx)
    # the main thread's top-level operators, not the collective enqueues
    top: list[tuple[float, float]] = []
    end = -1.0
    for ts, dur, tid in sorted(ops, key=lambda o: o[0]):
        if main_tids and tid not in main_tids:
            continue
        if ts >= end:
            top.append((ts, dur))
            end = ts + dur
    rt.host_ops = top
    # NCCL kernels without metadata: take the record_param_comms of the same collective, in order
    gpu = [c for c in rt.collectives if c.on == "gpu" and c.meta_source is None]
    metas.sort(key=lambda m: m[0])
    by_name: dict[str, list[dict[str, Any]]] = {}
    for _, m in metas:
        if "name" in m:
            by_name.setdefault(m["name"], []).append(m)
    seen: dict[str, int] = {}
    for c in gpu:
        lst = by_name.get(c.name) or []
        i = seen.get(c.name, 0)
        if i < len(lst):
            m = lst[i]
            c.n_bytes, c.pg, c.seq = m.get("n_bytes"), m.get("pg"), m.get("seq")
            c.n_bytes_out = m.get("n_bytes_out")
            c.group_size, c.meta_source = m.get("group_size"), "record_param_comms (in launch order: no correlation id)"
        seen[c.name] = i + 1
