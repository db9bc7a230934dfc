"""Is the GPU shared while we measure? NVML's compute processes, utilisation and MIG mode.

A class on a few GPU nodes puts two learners on one GPU: each measures about half the copy
ceiling, and every verdict judged against it moves. So every live GPU measurement
(:func:`hwlab.core.measure.bench`) reads NVML **before** timing and **during** it (every
``INTERVAL_S`` on a thread, and once after), through the kit's one NVML session
(:func:`hwlab.core.system.nvml_session`), and keeps what it saw as ``Measurement.gpu_share``:

* **processes**: ``nvmlDeviceGetComputeRunningProcesses`` and, for clients of an MPS server (which
  that call does not list), ``nvmlDeviceGetMPSComputeRunningProcesses``, on the measured GPU or on
  its MIG slice: pid and GPU memory of each. The slice is found by its uuid where
  ``CUDA_VISIBLE_DEVICES`` holds ``MIG-<uuid>``, and by the GPU's MIG handles where it holds an index
  and the GPU is in MIG mode (Kubernetes' device plugin: the slice named in
  ``NVIDIA_VISIBLE_DEVICES``, else the index-th slice NVML shows this container). Another
  compute process than this one, in any sample, makes the measurement **SHARED**: a kernel of
  theirs may run beside ours and take SMs, bandwidth and power. A process that holds a context but
  launches nothing costs nothing, and NVML cannot tell the two apart: SHARED means "may differ
  from a quiet GPU", not "was slowed".
* **this process**: its pid, and under a container its pids in every pid namespace
  (``NSpid`` in ``/proc/self/status``). Where NVML lists processes but none of them with one of our
  pids (a container whose pid namespace NVML does not see into), our own entry cannot be told
  apart: then two or more listed processes make it SHARED and ``pids_matched`` is False.
* **per-process utilisation over the whole measurement** (``nvmlDeviceGetProcessUtilization`` from
  the first reading's time, read once after): the driver's own samples name every process that
  ran a kernel in the window, so a neighbour that came and went between two process-list reads
  (``INTERVAL_S`` apart) is still seen; another pid there with SM or memory utilisation above zero
  makes the measurement SHARED.
* **no process listed at all** (not even this one, which holds a context while it measures): NVML
  cannot see the processes here (a container, a driver that hides them), so the judgement is
  unknown (None), never "not shared".
* **utilisation** (``nvmlDeviceGetUtilizationRates``, the share of the last sample period with a
  kernel running) is reported, never judged: it includes our own kernels. NVML does not report it
  per MIG slice (it answers "not supported"); it is then None.
* **MIG mode** (``nvmlDeviceGetMigMode``, current) and the slice's name, so a reader knows which
  datasheet peaks apply (:func:`hwlab.core.specs.lookup` scales them for a MIG device name).

Without NVML (a CPU machine, no driver, no ``pynvml``) nothing is read and nothing is claimed:
``gpu_share`` is None, never "not shared".
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from hwlab.core.system import nvml_session

#: seconds between NVML reads during a measurement (NVML's utilisation window is 1/6 to 1 s)
INTERVAL_S = 0.1
SHARED = "SHARED"


def own_pids() -> set[int]:
    """This process's pid in every pid namespace it belongs to (``NSpid``), at least ``os.getpid()``."""
    pids = {os.getpid()}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    pids |= {int(x) for x in line.split()[1:] if x.isdigit()}
    except OSError:
        pass
    return pids


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def handle_for(nv: Any, cuda_index: int = 0) -> Any:
    """NVML's handle of CUDA device ``cuda_index``: the ``CUDA_VISIBLE_DEVICES`` entry it names
    (an index, a ``GPU-``/``MIG-`` uuid), else NVML's index of the same number."""
    vis = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    entry = vis[cuda_index] if cuda_index < len(vis) else str(cuda_index)
    if entry.startswith("MIG-"):
        return nv.nvmlDeviceGetHandleByUUID(entry)
    h = nv.nvmlDeviceGetHandleByUUID(entry) if entry.startswith("GPU-") else nv.nvmlDeviceGetHandleByIndex(int(entry))
    mode = _try(nv.nvmlDeviceGetMigMode, h)
    if not (mode[0] if isinstance(mode, (list, tuple)) else mode):
        return h
    return _mig_slice(nv, h, cuda_index) or h


def _mig_slice(nv: Any, gpu: Any, cuda_index: int) -> Any:
    """The MIG slice CUDA device ``cuda_index`` is, on ``gpu`` in MIG mode addressed by index: the
    ``MIG-`` uuid in ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's), else the index-th slice
    NVML shows (a container sees only its own); None if neither is found."""
    named = [x.strip() for x in os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if x.strip().startswith("MIG-")]
    if cuda_index < len(named):
        got = _try(nv.nvmlDeviceGetHandleByUUID, named[cuda_index])
        if got is not None:
            return got
    n = _try(nv.nvmlDeviceGetMaxMigDeviceCount, gpu) or 0
    slices = [x for x in (_try(nv.nvmlDeviceGetMigDeviceHandleByIndex, gpu, i) for i in range(n)) if x is not None]
    return slices[cuda_index] if cuda_index < len(slices) else None


def _try(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: not known, not zero
        return None


def read(nv: Any, handle: Any) -> dict[str, Any]:
    """One NVML reading of ``handle``: processes (pid, used MiB), utilisation, MIG mode, name."""
    procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, handle)
    mps = _try(nv.nvmlDeviceGetMPSComputeRunningProcesses, handle)
    if mps:  # MPS clients: listed by their own call only
        procs = [*(procs or []), *[p for p in mps if p.pid not in {q.pid for q in procs or []}]]
    util = _try(nv.nvmlDeviceGetUtilizationRates, handle)
    mig = _try(nv.nvmlDeviceGetMigMode, handle)
    is_mig = _try(nv.nvmlDeviceIsMigDeviceHandle, handle)
    used = [getattr(p, "usedGpuMemory", None) for p in procs or []]
    return {"name": _try(lambda h: _s(nv.nvmlDeviceGetName(h)), handle),
            "uuid": _try(lambda h: _s(nv.nvmlDeviceGetUUID(h)), handle),
            "processes": None if procs is None else [
                {"pid": int(p.pid), "used_mib": None if u is None else u / 2**20} for p, u in zip(procs, used)],
            "util_gpu_pct": None if util is None else float(util.gpu),
            "util_memory_pct": None if util is None else float(util.memory),
            "mig_mode": None if mig is None else bool(mig[0] if isinstance(mig, (list, tuple)) else mig),
            "mig_device": None if is_mig is None else bool(is_mig)}


def process_util(nv: Any, handle: Any, since_us: int) -> list[dict[str, Any]] | None:
    """The driver's per-process utilisation samples since ``since_us`` (pid, SM %, memory %); None where
    NVML does not give them (not supported, or no sample in the window)."""
    got = _try(nv.nvmlDeviceGetProcessUtilization, handle, since_us)
    if got is None:
        return None
    return [{"pid": int(p.pid), "sm_pct": float(getattr(p, "smUtil", 0) or 0),
             "mem_pct": float(getattr(p, "memUtil", 0) or 0)} for p in got]


def judge(samples: list[dict[str, Any]], pids: set[int] | None = None,
          util_procs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """SHARED or not from NVML readings (module doc): the other processes seen in any sample (pid,
    most memory seen) or in the driver's per-process utilisation over the window (``util_procs``),
    the highest utilisation seen, the MIG mode and how many samples."""
    pids = own_pids() if pids is None else pids
    lists = [s["processes"] for s in samples if s.get("processes") is not None]
    seen: dict[int, float | None] = {}
    for ps in lists:
        for p in ps:
            prev = seen.get(p["pid"])
            seen[p["pid"]] = p["used_mib"] if prev is None else max(prev, p["used_mib"] or 0.0)
    matched = bool(seen.keys() & pids)
    others = [{"pid": pid, "used_mib": mib} for pid, mib in sorted(seen.items()) if pid not in pids]
    busy = sorted({u["pid"] for u in util_procs or [] if u["sm_pct"] or u["mem_pct"]})
    matched = matched or bool(set(busy) & pids)
    for pid in busy:  # ran a kernel in the window, between two process-list reads or during them
        if pid not in seen and pid not in pids:
            others.append({"pid": pid, "used_mib": None})
    n_seen = len(seen.keys() | set(busy))
    if matched:
        shared = bool(others)
    elif n_seen == 0:
        shared = None  # NVML listed no process, not even this one: it cannot see them here; unknown
    else:  # our own pid is hidden (a container): one process may be this one, two cannot both be
        shared = n_seen >= 2
    utils = [s["util_gpu_pct"] for s in samples if s.get("util_gpu_pct") is not None]
    last = samples[-1] if samples else {}
    return {"shared": shared, "others": others, "pids_matched": matched,
            "util_gpu_pct_max": max(utils) if utils else None, "n_samples": len(samples),
            "device": last.get("name"), "uuid": last.get("uuid"),
            "mig_mode": last.get("mig_mode"), "mig_device": last.get("mig_device")}


def note(share: dict[str, Any] | None) -> str:
    """One line for a SHARED measurement ("" when not shared or not known)."""
    if not share or not share.get("shared"):
        return ""
    who = ", ".join(f"pid {o['pid']}" + (f" ({o['used_mib']:,.0f} MiB)" if o.get("used_mib") is not None else "")
                    for o in share.get("others", [])) or "processes NVML lists but cannot be told from this one"
    util = share.get("util_gpu_pct_max")
    return (f"{SHARED} GPU: another compute process ran on this GPU while measuring ({who}"
            + (f"; utilisation seen up to {util:.0f}%" if util is not None else "")
            + "): the figures may differ from a quiet GPU's")


class Watch:
    """``with Watch(cuda_index) as w: ...`` reads NVML before, every ``INTERVAL_S`` during and once
    after the block; ``w.result`` is :func:`judge` of the readings, or None without NVML."""

    def __init__(self, cuda_index: int = 0, *, interval_s: float = INTERVAL_S, pynvml: Any | None = None):
        self.cuda_index, self.interval_s, self._pynvml = cuda_index, interval_s, pynvml
        self.samples: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._session = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Watch":
        self._session = nvml_session(self._pynvml)
        nv, why = self._session.__enter__()
        if nv is None:
            return self
        try:
            self._nv, self._h = nv, handle_for(nv, self.cuda_index)
        except Exception:
            return self
        self._since_us = int(time.time() * 1e6)
        self.samples.append(read(nv, self._h))
        self._thread = threading.Thread(target=self._run, name="hwlab-gpu-share", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(read(self._nv, self._h))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.samples.append(read(self._nv, self._h))
            self.result = judge(self.samples, util_procs=process_util(self._nv, self._h, self._since_us))
        self._session.__exit__(None, None, None)
