"""How long this thread waited for a CPU while it was timed: the host's load, measured apart from
the work's own time.

Core floor (imports nothing from hwlab). On a busy host (other processes, a test run beside it)
a thread that is ready to run waits in the kernel's run queue until a core is free, and a
wall-clock timer counts that wait as if the work had run. Linux keeps each thread's run-queue
wait (schedstats' ``run_delay``, the second field of ``/proc/thread-self/schedstat``, in ns):
the wall time of a call minus the wait the calling thread accrued across it is the call's time
net of the host's load. Rules, and why:

* **Net of the wait, never of anything else.** Only time the thread spent *ready but not
  running* is taken out; cache and memory contention from neighbours stays in the time (it is
  real work the CPU did slower) and shows as spread between timing blocks.
* **One thread is exact; several are under-corrected.** Only the calling thread's wait is read:
  with several torch threads, the workers' waits stay in the time, so a net time is never
  below what the work itself took.
* **Clipped.** The wait is read just outside the timed interval, so a preemption between the
  clock and the read can make it exceed the call; a net time is held at
  :data:`MIN_NET_FRACTION` of the wall time or more.
* **Unavailable means wall clock.** Where the file is missing (not Linux, no schedstats)
  :func:`wait_ns` returns None and timings stay wall-clock, labelled so.

**Page faults** are the other disturbance a profiled call meets that the timed calls may not: the
profiler's own bookkeeping takes heap memory a freed tensor sat in, so the next tensor of that
size lands on pages the kernel has to supply (and zero) again. :func:`faults` counts this thread's
page faults (``getrusage(RUSAGE_THREAD)``, minor and major) and :func:`fault_us` measures what one
costs here (fresh anonymous pages written once, less the same write again), so a call's faults
beyond the unprofiled calls' count read as time. Unlike the run-queue wait this is work the CPU
did, so it is never taken out of a timing: it only ranks which profiled calls resemble the timed
ones (:mod:`hwlab.examine.torch_profile`).
"""
from __future__ import annotations

import mmap
import os
import threading
import time

#: a net time is held at this fraction of its wall time or more (module doc: clipped)
MIN_NET_FRACTION = 0.01

_local = threading.local()


def wait_ns() -> int | None:
    """The calling thread's run-queue wait so far, in ns, or None where Linux does not report it."""
    fd = getattr(_local, "fd", None)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            _local.fd = -1
            return None
        _local.fd = fd
    if fd < 0:
        return None
    try:
        return int(os.pread(fd, 128, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return None


def faults() -> int | None:
    """This thread's page faults so far (minor plus major), or None where the OS does not count
    them per thread (module doc)."""
    try:
        import resource
        ru = resource.getrusage(resource.RUSAGE_THREAD)
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return int(ru.ru_minflt + ru.ru_majflt)


#: pages written to measure one fault's cost: enough faults that the clock's resolution and the
#: loop's own cost are small beside them, few enough to stay a few ms
FAULT_PROBE_PAGES = 1024
#: probes taken, the least kept: the first pages a process takes may cost the host more than the
#: re-used pages a heap faults on again
FAULT_PROBES = 3
_fault_cost: list[float | None] = []


def _fault_probe() -> float | None:
    page = mmap.PAGESIZE
    f0 = faults()
    if f0 is None:
        return None
    m = mmap.mmap(-1, FAULT_PROBE_PAGES * page)
    try:
        t0 = time.perf_counter_ns()
        for i in range(0, len(m), page):
            m[i] = 1
        t1 = time.perf_counter_ns()
        f1 = faults()
        for i in range(0, len(m), page):
            m[i] = 2
        t2 = time.perf_counter_ns()
    finally:
        m.close()
    n = (f1 or 0) - f0
    return max(0.0, ((t1 - t0) - (t2 - t1)) / 1e3 / n) if n > 0 else None


def fault_us() -> float | None:
    """What one page fault costs this process, in us, measured once and kept (module doc): fresh
    anonymous pages written byte-by-page, less the same writes again on the now-present pages, over
    the faults counted between, the least of :data:`FAULT_PROBES`; None where faults are not
    counted or none happened."""
    if _fault_cost:
        return _fault_cost[0]
    costs = [c for c in (_fault_probe() for _ in range(FAULT_PROBES)) if c is not None]
    cost = min(costs) if costs else None
    _fault_cost.append(cost)
    return cost


def net_ms(wall_ms: float, wait_ms: float | None) -> float:
    """``wall_ms`` less the thread's run-queue wait across it (module doc), clipped."""
    if wait_ms is None:
        return wall_ms
    return max(wall_ms - wait_ms, MIN_NET_FRACTION * wall_ms)


def wait_share(wall_ms: list[float], wait_ms: list[float] | None) -> float | None:
    """The share (0-1) of the summed wall time the thread waited for a CPU, or None unmeasured."""
    if not wait_ms or not wall_ms or sum(wall_ms) <= 0:
        return None
    return min(1.0, sum(wait_ms) / sum(wall_ms))
