"""Is the GPU shared while we measure? NVML's compute processes, utilisation and MIG mode.

A class on a few GPU nodes puts two learners on one GPU: each measures about half the copy
ceiling, and every verdict judged against it moves. So every live GPU measurement
(:func:`hwlab.core.measure.bench`) reads NVML **before** timing and **during** it (every
``INTERVAL_S`` on a thread, and once after), through the kit's one NVML session
(:func:`hwlab.core.system.nvml_session`), and keeps what it saw as ``Measurement.gpu_share``:

* **processes**: ``nvmlDeviceGetComputeRunningProcesses`` on the measured GPU, or on the MIG slice
  when ``CUDA_VISIBLE_DEVICES`` names one (``MIG-<uuid>``): pid and GPU memory of each. Another
  compute process than this one, in any sample, makes the measurement **SHARED**: a kernel of
  theirs may run beside ours and take SMs, bandwidth and power. A process that holds a context but
  launches nothing costs nothing, and NVML cannot tell the two apart: SHARED means "may differ
  from a quiet GPU", not "was slowed".
* **this process**: its pid, and under a container its pids in every pid namespace
  (``NSpid`` in ``/proc/self/status``). Where NVML lists processes but none of them with one of our
  pids (a container whose pid namespace NVML does not see into), our own entry cannot be told
  apart: then two or more listed processes make it SHARED and ``pids_matched`` is False.
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
    if entry.startswith(("GPU-", "MIG-")):
        return nv.nvmlDeviceGetHandleByUUID(entry)
    return nv.nvmlDeviceGetHandleByIndex(int(entry))


def _try(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: not known, not zero
        return None


def read(nv: Any, handle: Any) -> dict[str, Any]:
    """One NVML reading of ``handle``: processes (pid, used MiB), utilisation, MIG mode, name."""
    procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, handle)
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


def judge(samples: list[dict[str, Any]], pids: set[int] | None = None) -> dict[str, Any]:
    """SHARED or not from NVML readings (module doc): the other processes seen in any sample (pid,
    most memory seen), the highest utilisation seen, the MIG mode and how many samples."""
    pids = own_pids() if pids is None else pids
    lists = [s["processes"] for s in samples if s.get("processes") is not None]
    seen: dict[int, float | None] = {}
    for ps in lists:
        for p in ps:
            prev = seen.get(p["pid"])
            seen[p["pid"]] = p["used_mib"] if prev is None else max(prev, p["used_mib"] or 0.0)
    matched = bool(seen.keys() & pids)
    others = [{"pid": pid, "used_mib": mib} for pid, mib in sorted(seen.items()) if pid not in pids]
    if not lists:
        shared = None  # NVML gave no process list: unknown, not "quiet"
    elif matched:
        shared = bool(others)
    else:
        shared = max(len(ps) for ps in lists) >= 2
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
            self.result = judge(self.samples)
        self._session.__exit__(None, None, None)
