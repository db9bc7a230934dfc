"""What the command line shows while it works: progress of long steps, strict JSON output, and
the argument types its subcommands share (:func:`whole_number`).

Top floor (talks to people; only :mod:`hwlab.cli` and ``cli_*`` modules import it).

:class:`Steps` shows a measurement of several steps (doctor's ceilings, a baseline's probes):
in a terminal a rich bar with the step, count, elapsed time and ETA; otherwise (CI logs, a pipe)
one plain line per step on stderr, ``hwlab doctor: [2/5] ceiling: gemm fp32 (3 s elapsed, ~5 s
left)``, so a log shows where a slow run spent its time. The ETA assumes the remaining steps
take the mean time of those done; it is labelled ``~`` because probe steps differ in length.
Progress goes to stderr only: stdout stays clean for ``--json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from hwlab.core.store import dumps_strict


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


#: a progress label that starts with this is a line within the current step (hwlab.examine.progress)
SUBSTEP = "... "


class Steps:
    """Progress over ``total`` named steps (``total`` grows if more steps come). ``file`` is where the
    lines go (default: ``sys.stderr`` as it is when a line is written); ``eta=False`` leaves the
    time left to the caller's labels (a caller with its own estimate, or none yet)."""

    def __init__(self, title: str, total: int, *, enabled: bool = True,
                 terminal: bool | None = None, file=None, eta: bool = True):
        self.title, self.total, self.enabled = title, max(int(total), 1), enabled
        self.file, self.eta = file, eta
        self.terminal = stderr_is_terminal() if terminal is None else terminal
        self.done = 0
        self._t0 = time.monotonic()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> "Steps":
        if self.enabled and self.terminal:
            # rich loads here, in a terminal only: the commands' start-up does not pay for it
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(),
                                 console=Console(file=self.file) if self.file else Console(stderr=True),
                                 transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total)
        return self

    def __exit__(self, *exc) -> bool:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False

    def step(self, label: str) -> None:
        """A new step starts (the previous one, if any, is done). A label starting with
        :data:`SUBSTEP` is progress within the current step: shown, not counted."""
        if not self.enabled:
            return
        if label.startswith(SUBSTEP) and self._started:
            if self._bar is not None:
                self._bar.update(self._task, description=f"{self.title}: {label[len(SUBSTEP):]}")
            else:
                print(f"{self.title}: [{self.done + 1}/{self.total}] {label}", file=self.file or sys.stderr,
                      flush=True)
            return
        if self._started:
            self.done += 1
        self._started = True
        if self.done >= self.total:
            self.total = self.done + 1
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, total=self.total,
                             description=f"{self.title}: {label}")
            return
        elapsed = time.monotonic() - self._t0
        eta = (f", ~{elapsed / self.done * (self.total - self.done):.0f} s left"
               if self.done and self.eta and "s left" not in label else "")  # the caller's own estimate wins
        print(f"{self.title}: [{self.done + 1}/{self.total}] {label} ({elapsed:.0f} s elapsed{eta})",
              file=self.file or sys.stderr, flush=True)

    _started = False


def print_json(obj: Any) -> None:
    """Strict JSON on stdout: no NaN/Infinity; where a value was not finite it is null and
    ``null_reasons`` (top-level dicts) says where and why."""
    print(dumps_strict(obj))


def loads_strict(text: str) -> Any:
    """Parse JSON the way strict parsers do (refuses NaN / Infinity): used by tests and by
    anyone checking hwlab's output."""
    def refuse(name: str):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def whole_number(text: str) -> int:
    """An argparse type: a whole number 0 .. 2^63-1 (a drill seed, a port before its own range
    check); anything else becomes one usage line naming the argument, exit 2."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range (0 .. 2^63-1)")
    return v


def one_line(field: str, max_chars: int):
    """An argparse type: text on one line, 1..``max_chars`` characters, no control characters
    (an incident's title and fields land in a Markdown heading and table cells, where a line
    break would end the heading or the row, and in file listings where a megabyte title is no
    title)."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("empty: say it in a few words")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
            raise argparse.ArgumentTypeError("holds a line break or control character: give it on one line")
        if len(text) > max_chars:
            raise argparse.ArgumentTypeError(f"{len(text):,} characters: keep it to {max_chars} "
                                             "(details belong in the evidence)")
        return text.strip()
    parse.__name__ = field  # argparse names the type in its messages
    return parse


#: the fastest bus bandwidth ``--link-gbps`` accepts, GB/s: above any GPU link built (NVLink 5
#: moves 1,800 GB/s per GPU, both directions together); a larger figure is a unit slip
MAX_LINK_GBPS = 10_000.0


#: the slowest bus bandwidth ``--link-gbps`` accepts, GB/s: 1 MB/s is slower than any link a GPU
#: job runs over (a 1 Gb/s Ethernet moves 0.125 GB/s); a smaller figure (1e-320) is a unit slip
MIN_LINK_GBPS = 1e-3

#: the most ``--max-trace-mib`` may raise the limit to, MiB: 1 TiB of JSON is past any trace one
#: process writes; a larger figure is a typo
MAX_TRACE_MIB = 2**20


def trace_mib(text: str) -> float:
    """An argparse type: ``--max-trace-mib``, the JSON a trace may expand to, MiB, finite, > 0,
    at most :data:`MAX_TRACE_MIB`."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not (math.isfinite(v) and 0 < v <= MAX_TRACE_MIB):
        raise argparse.ArgumentTypeError(f"{text!r}: give MiB above 0 and at most {MAX_TRACE_MIB:,}")
    return v


def link_gbps(text: str) -> float:
    """An argparse type: a link's bus bandwidth in GB/s, finite, > 0, at most
    :data:`MAX_LINK_GBPS` (``inf`` or ``1e30`` would make every link read slow) and at least
    :data:`MIN_LINK_GBPS` (``1e-320`` every link fast)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GB/s") from None
    if not (math.isfinite(v) and MIN_LINK_GBPS <= v <= MAX_LINK_GBPS):
        raise argparse.ArgumentTypeError(f"{text!r} is not a bus bandwidth: give GB/s from {MIN_LINK_GBPS:g} to "
                                         f"{MAX_LINK_GBPS:,.0f} (e.g. 450 for NVLink 4)")
    return v


def read_observations(path: str, what: str) -> dict[str, Any]:
    """Flowchart metrics from the user's JSON file (``incident --observations``, ``drill submit
    --evidence``): read by :func:`hwlab.core.store.read_user_json`, every value checked by
    :func:`hwlab.core.validate.observations` (type, finiteness, range) and every name checked
    against the metrics the chart reads (a typo would otherwise be dropped without a word, its
    question left unanswered, and a grade given on what was not said)."""
    from hwlab.core import validate
    from hwlab.core.store import read_user_json
    from hwlab.diagnosis import flowchart
    from hwlab.errors import UserInputError

    obs = read_user_json(path, what, "pass a .json file of metric -> value")
    if not isinstance(obs, dict):
        raise UserInputError(f"{what} {path} should hold a JSON object of metric -> value, "
                             f"not a {type(obs).__name__}")
    obs = validate.observations(obs, where=f"{what} {path}: ")
    unknown = sorted(k for k in obs if k not in flowchart.metric_names())
    if unknown:
        raise UserInputError(f"{what} {path}: unknown metric name(s) {', '.join(map(repr, unknown))}; the "
                             "flowchart reads: " + ", ".join(n for n in flowchart.metric_names()
                                                            if n not in flowchart.META_KEYS))
    return obs
