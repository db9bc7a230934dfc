"""On a CPU, the profiled calls' op times without ``record_shapes``, and the shapes from one more call.

With ``record_shapes=True`` the profiler keeps every op's input sizes, strides, types and scalar
values for the whole session, in fresh heap memory: a few KiB per op, so a profiled call of a few
hundred ops takes about a thousand page faults that an unprofiled call does not, inside the ops
(the recording runs when an op starts), and the small, numerous ops (elementwise chains) gain the
most time: their part's share grows against the same calls profiled without shapes.

So on a CPU the calls whose times the parts read are profiled without shapes, and one more call
is profiled with them, in a session of its own: its ops' recorded inputs
(:data:`~hwlab.core.profiling.OP_SHAPE_ARGS`) are copied onto the timed calls' ops, the k-th op of
each call from the k-th op of the shapes call, where every call ran the same ops in the same
order. The trace written then carries both (it is examined alone as before); where the calls ran
different ops nothing is copied and the trace says it has no shapes.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Sequence

from hwlab.core.profiling import OP_SHAPE_ARGS, quiet_profile

#: the range the shapes call runs in (its own session; never read as a timed call)
SHAPES_MARK = "hwlab::examine_shapes_call"


def _ops_in(events: list, lo: float, hi: float) -> list[dict[str, Any]]:
    """The host ops inside [lo, hi], outermost first where two start together (trace order)."""
    ops = [e for e in events if e.get("cat") == "cpu_op" and lo <= e.get("ts", -1) <= hi]
    return sorted(ops, key=lambda e: (e["ts"], -e.get("dur", 0)))


def _ranges(events: list, mark: str) -> list[dict[str, Any]]:
    return sorted((e for e in events if e.get("ph") == "X" and e.get("name") == mark), key=lambda e: e["ts"])


def shapes_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict) -> list[tuple[str, dict]] | None:
    """Profile one call with ``record_shapes`` and return its ops in order as (name, recorded inputs);
    None where its trace could not be read."""
    from torch.profiler import ProfilerActivity, record_function

    with quiet_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function(SHAPES_MARK):
            fn(*args, **kwargs)
    fd, path = tempfile.mkstemp(prefix="hwlab_shapes_", suffix=".trace.json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    except (OSError, ValueError, AttributeError):
        return None
    finally:
        os.unlink(path)
    marks = _ranges(events, SHAPES_MARK)
    if len(marks) != 1:
        return None
    lo, hi = marks[0]["ts"], marks[0]["ts"] + marks[0].get("dur", 0)
    return [(e["name"], {k: e["args"][k] for k in OP_SHAPE_ARGS if k in e.get("args", {})})
            for e in _ops_in(events, lo, hi)]


def merge_shapes(trace: dict[str, Any], call_mark: str, shapes: list[tuple[str, dict]] | None) -> bool:
    """Copy ``shapes`` onto every ``call_mark`` call's ops in ``trace`` (module doc) and mark the trace as
    recorded with shapes; False (the trace unchanged) where a call ran other ops than the shapes call."""
    if not shapes:
        return False
    events = trace.get("traceEvents", [])
    calls = _ranges(events, call_mark)
    per_call = [_ops_in(events, c["ts"], c["ts"] + c.get("dur", 0)) for c in calls]
    names = [n for n, _ in shapes]
    if not calls or any([e["name"] for e in ops] != names for ops in per_call):
        return False
    for ops in per_call:
        for e, (_, recorded) in zip(ops, shapes):
            e.setdefault("args", {}).update(recorded)
    trace["record_shapes"] = 1
    return True
