"""An honest nothing: a profiler trace too short or too sparse to diagnose (``hwlab examine --trace``).

A step of a few hundred nanoseconds, or one kernel, has no parts to tell apart: whatever a walk
said of it (a launch-bound J, a gain) would be the profiler's own grain. Such a trace raises
:class:`NothingToDiagnose`, which the command prints (strict JSON with ``--json``) and exits 0.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hwlab.traces.trace_ops import OpTrace, StepWork

#: a trace whose mean step (window) is shorter than this, or whose steps ran fewer timed items
#: than :data:`MIN_ITEMS_PER_STEP` lasting less than this, is too little to diagnose: one kernel
#: launch costs a few µs on the host and the profiler's own timestamps are µs-grained, so no part of
#: so short a step can be told from launch cost and timer grain; such a trace gets an honest
#: nothing, exit 0. A lone kernel of a step that lasts longer (one large gather) is walked: its own
#: rates decide it, as the live examination walks it
MIN_STEP_US = 100.0
MIN_ITEMS_PER_STEP = 2
#: a GPU trace with less device work than this in all its selected steps is too little to diagnose
#: however long its host windows: a few dozen launches' worth, so an idle share of it says nothing
#: about the job (a unit test's or a benchmark's setup), only about the profiler's window
MIN_DEVICE_BUSY_US = 100.0


class NothingToDiagnose(Exception):
    """A trace too short or too sparse to diagnose (:data:`MIN_STEP_US`): what it holds and why
    nothing is said about it."""

    def __init__(self, path: str, why: str, facts: dict[str, Any]):
        super().__init__(why)
        self.path, self.why, self.facts = path, why, facts

    def to_dict(self) -> dict[str, Any]:
        return {"name": Path(self.path).name, "source": "trace", "verdict": "nothing to diagnose",
                "leaf": None, "why": self.why, "trace": self.facts,
                "to_decide": "a profile of at least a few full steps (torch.profiler with a schedule, "
                             "ProfilerStep#N ranges) of the job's real work"}


def enough_to_diagnose(path, ot: OpTrace, busy: list[StepWork], gpu: bool) -> None:
    """Raise :class:`NothingToDiagnose` where the steps are too short or too sparse (:data:`MIN_STEP_US`)."""
    n = len(busy)
    mean_us = sum(w.window_us for w in busy) / n
    items = sum(len(w.items) for w in busy) / n
    facts = {"steps": n, "mean_step_us": mean_us, "items_per_step": items, "on_gpu": gpu,
             "busy_us_per_step": sum(w.busy_us for w in busy) / n, "step_source": ot.step_source}
    if mean_us < MIN_STEP_US:
        raise NothingToDiagnose(str(path), f"the mean step lasts {mean_us:.3g} µs, under {MIN_STEP_US:g} µs: a "
                                "kernel launch and the profiler's timer grain are of that order, so no part of it "
                                "can be told from them", facts)
    if gpu and n * facts["busy_us_per_step"] < MIN_DEVICE_BUSY_US:
        raise NothingToDiagnose(str(path), f"{n * facts['busy_us_per_step']:.3g} µs of device work in all, under "
                                f"{MIN_DEVICE_BUSY_US:g} µs: too little work for its idle or its parts to say anything "
                                "about the job", facts)
    lone_us = facts["busy_us_per_step"] if gpu else mean_us
    if items < MIN_ITEMS_PER_STEP and lone_us < MIN_STEP_US:
        raise NothingToDiagnose(str(path), f"{items:.3g} timed item(s) per step of {lone_us:.3g} µs, under "
                                f"{MIN_STEP_US:g} µs: a lone kernel or op that short is the launch's and the "
                                "timer's grain, not a step to split into parts", facts)
