"""Every complete span of one small Chrome/Kineto trace, by timeline row, and its timeline plot.

:mod:`hwlab.traces.kineto` streams gigabyte traces and keeps only what the rank analysis needs; a
reader of the raw trace (notebook 09) needs every row a viewer such as Perfetto draws: the host
threads with their CUDA runtime calls (``cudaDeviceSynchronize`` is where the host waits), and each
GPU stream with its kernels and copies. :func:`read_spans` loads the ``ph == "X"`` events of a
trace of at most :data:`MAX_TRACE_BYTES` (larger traces go through ``kineto.read_trace``) and
names each row as Perfetto does: ``host tid N`` for CPU threads, ``GPU D stream S`` for device
work (torch writes the device as ``pid`` and the stream as ``tid`` of GPU events).

No analysis package is used: HolisticTraceAnalysis pulls pandas and a notebook stack for what is
a list of spans here.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hwlab.traces.kineto import iter_trace
from hwlab.errors import UserInputError

#: larger traces are read streaming by :func:`hwlab.traces.kineto.read_trace`, not loaded whole
MAX_TRACE_BYTES = 64 << 20
#: event categories that run on the device (a GPU stream row)
DEVICE_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
#: host runtime calls that block until device work is done: a sync point on the timeline
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cudaStreamWaitEvent", "cudaMemcpy")


@dataclass(frozen=True)
class Span:
    row: str        # "host tid N" or "GPU D stream S"
    name: str
    cat: str
    ts_us: float
    dur_us: float

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass
class TraceSpans:
    path: str
    rank: int | None
    spans: list[Span]

    def rows(self) -> list[str]:
        """Host rows first, then device rows, each in first-seen order."""
        seen = list(dict.fromkeys(s.row for s in self.spans))
        return [r for r in seen if r.startswith("host")] + [r for r in seen if not r.startswith("host")]

    def device(self) -> list[Span]:
        return sorted((s for s in self.spans if s.cat in DEVICE_CATS), key=lambda s: s.ts_us)

    def steps(self) -> list[Span]:
        """``ProfilerStep#N`` spans on the host (the device copy torch also writes is left out)."""
        return sorted((s for s in self.spans if s.name.startswith("ProfilerStep#") and s.row.startswith("host")),
                      key=lambda s: s.ts_us)

    def named(self, prefix: str) -> list[Span]:
        return [s for s in self.spans if s.name.startswith(prefix)]


def _row(ev: dict[str, Any]) -> str:
    if ev.get("cat") in DEVICE_CATS or ev.get("cat") == "gpu_user_annotation":
        return f"GPU {ev.get('pid')} stream {ev.get('tid')}"
    return f"host tid {ev.get('tid')}"


def read_spans(path: str | os.PathLike) -> TraceSpans:
    """The complete (``X``) spans of a ``.json`` or ``.json.gz`` trace, by row (module docstring)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise UserInputError(f"{p}: cannot read ({e.strerror}): pass a trace file") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserInputError(f"{p} is not a regular file: pass a saved trace file")
    if st.st_size > MAX_TRACE_BYTES:
        raise UserInputError(f"{p} is {st.st_size:,} bytes, over {MAX_TRACE_BYTES:,}: read it "
                             "streaming with hwlab.traces.kineto.read_trace (or `hwlab ranks --traces`)")
    spans, rank = [], None
    for key, ev in iter_trace(p):
        if key == "distributedInfo" and isinstance(ev, dict):
            rank = ev.get("rank")
        if key != "event" or not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        spans.append(Span(_row(ev), str(ev.get("name", "")), str(ev.get("cat", "")), ts, dur))
    return TraceSpans(str(p), rank if isinstance(rank, int) else None, spans)


#: bar colours by what a span is: device compute, communication, copies, the host waiting, host operators
COLOURS = {"kernel": "tab:blue", "comm": "tab:orange", "copy": "tab:green", "sync": "tab:red", "host": "0.6"}


def colour(s: Span) -> str:
    """The :data:`COLOURS` entry for a span (NCCL/gloo by name, sync calls by :data:`SYNC_CALLS`)."""
    low = s.name.lower()
    if "nccl" in low or low.startswith("gloo:") or "onerank" in low:
        return COLOURS["comm"]
    if s.name in SYNC_CALLS:
        return COLOURS["sync"]
    if s.cat in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset"):
        return COLOURS["copy"]
    return COLOURS["kernel"] if s.cat in DEVICE_CATS else COLOURS["host"]


def timeline_figure(rows: dict[str, Iterable[Span]], *, t0_us: float | None = None,
                    window_us: tuple[float, float] | None = None, colour_of=None, title: str = ""):
    """One horizontal bar per span, one row per key of ``rows`` (top to bottom), time in ms from
    ``t0_us``; ``colour_of(span)`` picks each bar's colour (default :func:`colour`). Returns the figure."""
    import matplotlib.pyplot as plt

    keys = list(rows)
    all_spans = [s for k in keys for s in rows[k]]
    t0 = t0_us if t0_us is not None else min((s.ts_us for s in all_spans), default=0.0)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(keys) + 1.2))
    for i, k in enumerate(keys):
        for s in rows[k]:
            if window_us and (s.end_us < window_us[0] or s.ts_us > window_us[1]):
                continue
            ax.broken_barh([((s.ts_us - t0) / 1e3, max(s.dur_us, 0.5) / 1e3)], (i - 0.4, 0.8),
                           color=(colour_of or colour)(s), edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(keys)), keys)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    if window_us:
        ax.set_xlim((window_us[0] - t0) / 1e3, (window_us[1] - t0) / 1e3)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], fontsize=7, ncol=5,
              loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    return fig
