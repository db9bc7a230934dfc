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
"""
from __future__ import annotations

import os
import threading

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
