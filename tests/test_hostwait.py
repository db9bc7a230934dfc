"""CPU timing net of the run-queue wait (hwlab.core.hostwait): a thread made to share one core with
a busy process reads its own time, not the time the host gave it."""
import os
import statistics
import subprocess
import sys
import time

import pytest
import torch

from hwlab.core import hostwait
from hwlab.core.measure import time_fn


def test_net_time_is_the_wall_time_less_the_wait_and_is_clipped():
    assert hostwait.net_ms(10.0, 4.0) == pytest.approx(6.0)
    assert hostwait.net_ms(10.0, None) == 10.0  # not reported: wall clock
    assert hostwait.net_ms(10.0, 12.0) == pytest.approx(10.0 * hostwait.MIN_NET_FRACTION)
    assert hostwait.wait_share([10.0, 10.0], [5.0, 0.0]) == pytest.approx(0.25)
    assert hostwait.wait_share([10.0], None) is None


@pytest.mark.skipif(not sys.platform.startswith("linux") or hostwait.wait_ns() is None,
                    reason="run-queue wait is reported by Linux schedstats only")
def test_a_thread_sharing_its_core_with_a_busy_process_times_its_own_work(tmp_path):
    """Pinned to one core beside a busy process, a 60 ms busy loop takes about twice as long by the
    wall clock; net of the run-queue wait it reads the thread's own CPU time."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    burner = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile 1: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)
        cpu_ms = []

        def spin():
            c0 = time.thread_time()
            t_end = c0 + 0.06
            while time.thread_time() < t_end:
                pass
            cpu_ms.append((time.thread_time() - c0) * 1e3)

        t = time_fn(spin, [()], torch.device("cpu"), n_warmup=1, n_rep=5, net_of_wait=True)
    finally:
        os.sched_setaffinity(0, before)
        burner.kill()
        burner.wait()
    assert t.timer == "cpu-perf-counter net of run-queue wait" and len(t.wall_ms) == len(t.samples_ms)
    own = cpu_ms[-len(t.samples_ms):]
    assert sum(t.wall_ms) >= 1.5 * sum(own), (t.wall_ms, own)  # the burner took about half the core
    # the median call: one call may still pay a migration or page faults that are not run-queue wait
    assert statistics.median(t.samples_ms) == pytest.approx(statistics.median(own), rel=0.25), (t.samples_ms, own)
