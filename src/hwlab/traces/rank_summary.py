"""One rank's trace reduced to what the job view needs (``hwlab ranks --traces``): a compact,
picklable :class:`ReducedTrace` built in a worker process, so the process that compares the ranks
holds summaries, never a rank's kernels.

What a rank's summary keeps, and why each part is enough:

* **Per step** the rows :func:`hwlab.traces.rank_reading.rank_steps` computes (step, busy,
  communication, exposed, idle, own time, device lag) and where device work ran outside the host
  steps (:func:`~hwlab.traces.rank_reading.device_outside`): the per-rank report and the spreads
  over steps read these rows only.
* **Per collective** every :class:`~hwlab.traces.kineto.Collective` (identity, size, process
  group, sequence number, start and duration on that rank's clock): matching across ranks and the
  arrival order need all of them.
* **The rank's facts**: rank, world size, backend, process groups, host, pid, devices, when it
  was recorded, workload counts, the step windows (a shared clock is checked on them), the kernel
  count, the fingerprint that finds one trace given twice, and whether it ran on a GPU.
* **Kernels and host operators are dropped.** A trace without ``ProfilerStep`` spans is read as
  one step spanning all its work (:func:`~hwlab.traces.rank_reading.by_rank`): for it the summary
  keeps, in ``host_ops``, only the earliest-starting and the latest-ending of its kernels and
  operators, which fix that span exactly; its rows are computed for that span.

The rows are computed by the same functions the one-process reading calls, so the job view built
from summaries is the one built from the whole traces.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from hwlab.traces import kineto
from hwlab.traces.rank_reading import by_rank, device_outside, rank_steps


@dataclass
class ReducedTrace(kineto.RankTrace):
    """A :class:`~hwlab.traces.kineto.RankTrace` without its kernels, with its step rows computed."""
    rows_steps: tuple = ()                                   # the step windows the rows were computed for
    rows: list[dict[str, Any]] = field(default_factory=list)
    outside: dict[str, Any] | None = None                    # device_outside for those windows
    n_kernels: int = 0
    kept_fingerprint: tuple = ()
    kept_on_gpu: bool = False

    @property
    def fingerprint(self) -> tuple:
        return self.kept_fingerprint

    @property
    def on_gpu(self) -> bool:
        return self.kept_on_gpu

    def step_rows(self) -> list[dict[str, Any]]:
        """The rows for the current step windows (a copy); they are only known for the windows
        they were computed for, so anything else is a bug, said."""
        self._check_steps()
        return [dict(r) for r in self.rows]

    def device_outside(self) -> dict[str, Any] | None:
        self._check_steps()
        return copy.deepcopy(self.outside)

    def _check_steps(self) -> None:
        if tuple(self.steps) != self.rows_steps:
            raise ValueError(f"{self.path}: step rows were computed for other step windows")


def _extremes(t: kineto.RankTrace) -> list[tuple[float, float]]:
    """The earliest-starting and the latest-ending of the kernels and host operators, as (ts, dur)."""
    spans = [(ts, d) for ts, d, _ in t.kernels] + list(t.host_ops)
    if not spans:
        return []
    first = min(spans, key=lambda s: s[0])
    last = max(spans, key=lambda s: s[0] + s[1])
    return [first, last]


def reduce_trace(t: kineto.RankTrace) -> ReducedTrace:
    """The summary of one rank's trace (module doc)."""
    stepped = t
    if not t.steps:  # what by_rank will make of it: one step over all its work
        stepped = copy.copy(t)
        by_rank([stepped], [], [])
    rows = rank_steps(stepped) if stepped.steps else []
    out = device_outside(stepped) if stepped.steps else None
    keep = {f.name: getattr(t, f.name) for f in fields(kineto.RankTrace)}
    keep.update(kernels=[], kernel_launch_us=[], host_ops=[] if t.steps else _extremes(t))
    return ReducedTrace(**keep, rows_steps=tuple(stepped.steps), rows=rows, outside=out,
                        n_kernels=len(t.kernels), kept_fingerprint=t.fingerprint, kept_on_gpu=t.on_gpu)


def read_reduced(path: str, progress: Callable[[int, int], None] | None = None) -> ReducedTrace:
    """Read one trace file (streaming, :func:`hwlab.traces.kineto.read_trace`) and reduce it."""
    return reduce_trace(kineto.read_trace(path, progress=progress))
