"""Progress of one examination: a line at least every :data:`HEARTBEAT_S` seconds, with the time left.

The phases (:data:`hwlab.examine.PHASES`) are announced as they start; a long phase (the timing of a
slow model, the profiler's calls) would otherwise leave the caller without a line for tens of seconds.
A heartbeat thread repeats the current phase, prefixed :data:`SUBSTEP` (a line within a step: the
command line's step count does not grow), with the seconds elapsed and an estimate of those left.

**The estimate** is built from what this run has measured, and is not given before there is a
basis: until one plain call of the function has been timed (the probe call after the checked one,
:meth:`Progress.probe`), and while ceilings are being measured (their cost depends on the machine),
the line says "estimating the time left" instead of a number.

It counts the work left in **CPU seconds** of this process, so a host whose load changes from one
phase to the next does not change the sums: the unit is one call's CPU time ``c`` (the probe call's,
then the timing's wall time per call over the slowdown below), and

* timing: the calls :func:`hwlab.examine.timing_blocks.timed_blocks` says it still plans (at the size
  the measured spread calls for; the ceilings' re-timings counted in calls by their measured cost);
  before its first round, blocks halfway between their floor and cap (the spread is not known yet)
  and, on a GPU, the protocol's warm-up and sustained run;
* profiling: :data:`PROFILE_CALL_FACTOR` calls per profiled call (the call, the profiler's
  bookkeeping, the trace written and read back: all grow with the ops a call runs, as its time
  does) plus :data:`PROFILE_FIXED_S` (the profiler's start and stop; on a GPU, CUPTI's) and, where
  torch's compiler stack is not loaded yet, :data:`PROFILER_IMPORT_S` (the profiler loads it);
* counting: :data:`COUNT_CALLS` calls (one call under the traffic model's dispatch mode and one
  under the FLOP counter, each paying Python per op);
* parts, the walk, the report and the process's exit: :data:`WALK_S`.

Within a phase its own cost shrinks by the CPU seconds already spent in it, to no less than
:data:`OVERRUN_SHARE` of it (a phase past its estimate has some time left, not none). The CPU
seconds left become wall seconds at the **slowdown** measured now: the process's wall seconds over
its CPU seconds in the last :data:`WINDOW_S` (above 1 while the host's run queue makes it wait;
under 1 while several threads compute). Each calibrated factor is read from
``tools/bench_examine.py``'s record, which logs every estimate beside the time that was in fact
left and each step's wall and CPU seconds; the line says "estimated".
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Callable

#: the most seconds between two progress lines: the silence budget is 5 s, and a busy host may
#: wake the heartbeat thread late
HEARTBEAT_S = 3.5
#: a label starting with this is progress within the current step, not a new step
SUBSTEP = "... "
#: what a line says while there is no basis for a number (module doc)
ESTIMATING = "estimating the time left"
#: calls' worth of CPU time per profiled call, on a CPU and on a GPU (module doc)
PROFILE_CALL_FACTOR = {"cpu": 1.5, "cuda": 2.0}
#: CPU seconds the profiler costs whatever the calls (start, stop; CUPTI's set-up on a GPU)
PROFILE_FIXED_S = {"cpu": 0.15, "cuda": 4.5}
#: CPU seconds the profiler's first start costs where torch's compiler stack is not loaded yet:
#: torch.profiler asks ``hasattr(torch, "_inductor")``, which imports torch._inductor and dynamo
PROFILER_IMPORT_S = 1.1
#: calls' worth of CPU time the counting takes (two calls under dispatch modes, Python per op)
COUNT_CALLS = 3.0
#: CPU seconds the parts, the walks, the report and the exit take (no calls of the function)
WALK_S = 1.15
#: a phase past its own estimate still has this share of it left (module doc)
OVERRUN_SHARE = 0.15
#: seconds over which the slowdown (wall over CPU seconds) is measured (module doc)
WINDOW_S = 5.0


def fmt_s(s: float) -> str:
    """Seconds as a line shows them: tenths under ten seconds (a rounding to whole seconds near the
    end would be off by more than the estimate itself), whole seconds above."""
    return f"{s:.1f}" if s < 9.95 else f"{s:.0f}"


class Progress:
    """The phase now running and the estimate of what is left (module doc); ``heartbeat()`` starts
    the thread that repeats it every :data:`HEARTBEAT_S` without a line and measures the slowdown.
    ``clock()`` gives (wall, CPU) seconds (a test passes its own)."""

    def __init__(self, on_step: Callable[[str], None] | None, n_profiled: int, phases: tuple = (),
                 device_type: str = "cpu", n_blocks: int = 3,
                 clock: Callable[[], tuple[float, float]] | None = None) -> None:
        self._on_step, self.n_profiled, self.phases = on_step, n_profiled, phases
        self.device_type, self.n_blocks = device_type, n_blocks
        self.clock = clock or (lambda: (time.monotonic(), time.process_time()))
        self.t0, cpu0 = self.clock()
        self.last = self.t0
        self.phase, self.phase_index, self.phase_cpu0 = "", 0, cpu0
        #: one call's CPU seconds (module doc), None before the probe call
        self.call_cpu_s: float | None = None
        #: the ceilings are being measured now (no basis for their time)
        self.measuring_ceilings = False
        self._timing_left: tuple[float, float] | None = None  # (CPU seconds, CPU clock when told)
        self._window: deque[tuple[float, float]] = deque([(self.t0, cpu0)])
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what the examination tells it
    def step(self, label: str, index: int | None = None) -> None:
        with self._lock:
            sub = label.startswith(SUBSTEP)
            wall, cpu = self.sample()
            if not sub:
                self.phase, self.phase_cpu0 = label, cpu
                if index is None and label in self.phases:
                    index = self.phases.index(label)
                if index is not None:
                    self.phase_index = index
            self.last = wall
            left = None if sub else self.left_s()
        if self._on_step is not None:  # a phase's line carries the estimate too, or says there is none yet
            self._on_step(label if sub else f"{label} ({self.left_text(left)})")

    def probe(self, wall_s: float, cpu_s: float) -> None:
        """One plain call's wall and CPU seconds (after the checked call): the first basis."""
        self.call_cpu_s = cpu_s if cpu_s > 0 else wall_s

    def timed(self, wall_ms: float) -> None:
        """The timing's latest median wall time per call, over the slowdown now: the unit from now on."""
        self.call_cpu_s = wall_ms / 1e3 / self.slowdown()

    def timing_left(self, calls: float) -> None:
        """The timing's own account of the calls it has left (:func:`~hwlab.examine.timing_blocks.timed_blocks`)."""
        self._timing_left = (calls, self.clock()[1])

    # ------------------------------------------------------------------ the estimate
    def sample(self) -> tuple[float, float]:
        """Now's (wall, CPU) seconds, kept for the slowdown over the last :data:`WINDOW_S`."""
        now = self.clock()
        with self._lock:
            self._window.append(now)
            while len(self._window) > 2 and now[0] - self._window[1][0] >= WINDOW_S:
                self._window.popleft()
        return now

    def slowdown(self) -> float:
        """Wall seconds per CPU second over the last :data:`WINDOW_S` (module doc); 1 without a basis."""
        with self._lock:
            (w0, c0), (w1, c1) = self._window[0], self._window[-1]
        if w1 - w0 < 0.5 or c1 - c0 < 0.05:  # too short a window, or a process waiting on a device
            return 1.0
        return min(20.0, max(0.05, (w1 - w0) / (c1 - c0)))

    @staticmethod
    def left_text(left: float | None) -> str:
        return f"~{fmt_s(left)} s left, estimated" if left is not None else ESTIMATING

    def timing_plan_calls(self, c: float) -> float:
        """The calls the timing is planned to take before it has measured a spread (module doc):
        each block halfway between its floor and its cap, so neither a steady function (the floor)
        nor a noisy one (the cap) is far from it."""
        from hwlab.examine.timing_blocks import E2E_CHUNK_MS_HINT, MAX_BLOCK_CHUNKS, MAX_BLOCK_REP, MIN_BLOCK_REP

        per_chunk = max(1, min(20, int(E2E_CHUNK_MS_HINT / max(c * 1e3, 1e-3))))
        singles, chunks = (MIN_BLOCK_REP + MAX_BLOCK_REP) / 2, (MIN_BLOCK_REP + MAX_BLOCK_CHUNKS) / 2
        return self.n_blocks * (1 + singles + chunks * per_chunk)

    def phase_costs(self, c: float, cpu_now: float) -> list[float]:
        """CPU seconds each phase from the timing on costs, by this run's call ``c`` (module doc):
        [timing, accepted, profiling, counting, walk]."""
        dev = self.device_type if self.device_type in PROFILE_CALL_FACTOR else "cpu"
        if self._timing_left is not None:
            calls, at = self._timing_left
            timing = max(0.0, calls * c - (cpu_now - at))
        else:
            timing = self.timing_plan_calls(c) * c
            if self.device_type == "cuda":
                from hwlab.core.measure import GPU_MIN_RUN_S, GPU_WARMUP_S

                timing += GPU_WARMUP_S + GPU_MIN_RUN_S * (1 + (self.n_blocks - 1) / self.n_blocks)
        profile = self.n_profiled * c * PROFILE_CALL_FACTOR[dev] + PROFILE_FIXED_S[dev] + (
            PROFILER_IMPORT_S if "torch._inductor" not in sys.modules else 0.0)
        return [timing, 0.0, profile, COUNT_CALLS * c, WALK_S]

    def left_s(self) -> float | None:
        """Wall seconds left (module doc), or None where there is no basis yet."""
        if self.call_cpu_s is None or (self.measuring_ceilings and self.phase_index <= 1):
            return None
        i = self.phase_index
        _, cpu_now = self.clock()
        left = 0.0
        for k, cost in enumerate(self.phase_costs(self.call_cpu_s, cpu_now), start=2):
            if k < i:
                continue
            if k == i and k != 2:  # the timing reports its own progress
                cost = max(OVERRUN_SHARE * cost, cost - (cpu_now - self.phase_cpu0))
            left += cost
        return left * self.slowdown()

    def line(self) -> str:
        el = self.clock()[0] - self.t0
        return f"{SUBSTEP}{self.phase.split(' (')[0]} ({el:.0f} s in, {self.left_text(self.left_s())})"

    def heartbeat(self) -> "Progress":
        if self._on_step is None or self._thread is not None:
            return self

        def beat() -> None:
            while not self._stop.wait(0.25):
                wall, _ = self.sample()
                if wall - self.last >= HEARTBEAT_S:
                    self.step(self.line())

        self._thread = threading.Thread(target=beat, name="hwlab-examine-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
