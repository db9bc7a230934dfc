"""Progress of one examination: a line at least every :data:`HEARTBEAT_S` seconds, with the time left.

The phases (:data:`hwlab.examine.PHASES`) are announced as they start; a long phase (the timing of a
slow model, the profiler's calls) would otherwise leave the caller without a line for tens of seconds.
A heartbeat thread repeats the current phase, prefixed :data:`SUBSTEP` (a line within a step: the
command line's step count does not grow), with the seconds elapsed and an estimate of those left.

**The estimate** counts what is left in calls of the function, each costing the function's time
per call (the checked first call until the timing measures it, then the latest timing block's median
wall time), with a
fixed cost per phase for the work that is not calls:

* timing: the blocks' calls still to come (:data:`TIMING_CALLS`, less those done);
* profiling: :data:`PROFILE_CALL_FACTOR` calls per profiled call (the profiler's own bookkeeping
  and the trace written and read back);
* counting: :data:`COUNT_CALLS` calls (one under the traffic model's dispatch mode and one under the
  FLOP counter, each slower than a plain call);
* parts and the walk: :data:`WALK_S`.

It is an estimate and says so ("~"); the benchmark (``tools/bench_examine.py``) records how far it
was from the truth.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

#: the most seconds between two progress lines
HEARTBEAT_S = 4.0
#: a label starting with this is progress within the current step, not a new step
SUBSTEP = "... "
#: calls of the function the timing phase makes, at most (warm-up, single calls and back-to-back
#: chunks over three blocks, before the later blocks shrink to the first one's spread)
TIMING_CALLS = 30
#: calls' worth of time per profiled call (the call itself, the profiler's bookkeeping, the trace)
PROFILE_CALL_FACTOR = 2.0
#: calls' worth of time the counting takes (two calls under dispatch modes)
COUNT_CALLS = 4.0
#: seconds the parts and the walks take (no calls of the function)
WALK_S = 3.0


class Progress:
    """The phase now running and the estimate of what is left (module doc); ``heartbeat()`` starts
    the thread that repeats it every :data:`HEARTBEAT_S` without a line."""

    def __init__(self, on_step: Callable[[str], None] | None, n_profiled: int, phases: tuple = ()) -> None:
        self._on_step, self.n_profiled, self.phases = on_step, n_profiled, phases
        self.t0 = time.monotonic()
        self.last = self.t0
        self.phase, self.phase_index = "", 0
        self.call_s: float | None = None
        self.timing_calls_done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, label: str, index: int | None = None) -> None:
        with self._lock:
            if not label.startswith(SUBSTEP):
                self.phase = label
                if index is None and label in self.phases:
                    index = self.phases.index(label)
                if index is not None:
                    self.phase_index = index
            self.last = time.monotonic()
            left = self.left_s() if not label.startswith(SUBSTEP) else None
        if self._on_step is not None:  # a phase's line carries the estimate too, once there is one
            self._on_step(label + (f" (~{left:.0f} s left, estimated)" if left is not None else ""))

    def block_started(self, b: int) -> None:
        """The timing's block ``b`` starts: the blocks before it are done (about a third each)."""
        self.timing_calls_done = round(b * TIMING_CALLS / 3)

    def timed(self, wall_ms: float) -> None:
        """A timing block's median wall time per call: the estimate's unit from now on."""
        self.call_s = wall_ms / 1e3

    def left_s(self) -> float | None:
        """Seconds left (module doc), or None before the function's time per call is known."""
        if self.call_s is None:
            return None
        c, i = self.call_s, self.phase_index
        timing = max(0, TIMING_CALLS - self.timing_calls_done) * c if i <= 2 else 0.0
        profile = self.n_profiled * PROFILE_CALL_FACTOR * c if i <= 4 else 0.0
        count = COUNT_CALLS * c if i <= 5 else 0.0
        return timing + profile + count + WALK_S

    def line(self) -> str:
        el = time.monotonic() - self.t0
        left = self.left_s()
        est = f", ~{left:.0f} s left (estimated)" if left is not None else ""
        return f"{SUBSTEP}{self.phase} ({el:.0f} s in{est})"

    def heartbeat(self) -> "Progress":
        if self._on_step is None or self._thread is not None:
            return self

        def beat() -> None:
            while not self._stop.wait(0.5):
                if time.monotonic() - self.last >= HEARTBEAT_S:
                    self.step(self.line())

        self._thread = threading.Thread(target=beat, name="hwlab-examine-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
