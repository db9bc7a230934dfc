"""Copies from or to pageable host memory, named from a trace's kernel names (``hwlab examine --trace``).

CUDA names a copy whose host side is pageable (not pinned) ``Memcpy HtoD (Pageable -> Device)`` or
``Memcpy DtoH (Device -> Pageable)``. The driver stages such a copy through a pinned buffer of its own,
so it runs at a fraction of the link's rate and the host call does not return until the data is
staged: ``non_blocking=True`` cannot overlap it with compute. Per busy step the device time of those
copies is summed from the timeline; where it is at least :data:`PAGEABLE_NOTE_PCT` of the copy part,
the part notes it and, where it is half the part or more, its first fix is to pin the host memory.
Under that share the copies are named in the note only (they are not what the part's time is).
"""
from __future__ import annotations

from hwlab.examine.parts import Parts
from hwlab.traces.trace_ops import StepWork

#: pageable copies under this share of the copy part are not worth a note (a few setup bytes)
PAGEABLE_NOTE_PCT = 5.0
#: at half the copy part or more, pinning is the part's first fix
PAGEABLE_ACTION_PCT = 50.0
PIN_ACTION = ("pin the host memory of the copies from pageable memory (DataLoader(pin_memory=True), or "
              "tensor.pin_memory()) and copy with .to(device, non_blocking=True): a pageable copy is staged by "
              "the driver and blocks the host")


def _pageable(name: str) -> bool:
    n = name.lower()
    return n.startswith("memcpy") and "pageable" in n


def pageable_copies(works: list[StepWork], parts: Parts, notes: list[str]) -> float | None:
    """Name the pageable copies on the copy part and in the trace's notes (module doc); their ms per
    busy step, or None."""
    busy = [w for w in works if w.items]
    if not busy:
        return None
    us = sum(it["us"] for w in busy for it in w.items if _pageable(it.get("kernel") or ""))
    part = next((p for p in parts.parts if p.name == "copy/concat"), None)
    if us <= 0 or part is None or part.t_ms <= 0:
        return None
    ms = us / len(busy) / 1e3
    pct = min(100.0, 100.0 * ms / part.t_ms)
    if pct < PAGEABLE_NOTE_PCT:
        return ms
    what = (f"{ms:.4g} ms per step ({pct:.0f}% of the copy part) are copies to or from pageable host memory "
            "(kernel names 'Memcpy ... Pageable'): staged by the driver at a fraction of the link's rate, and the "
            "host waits for each [device timeline: kernel names]")
    part.notes.append(what)
    notes.append(what + ("; fix: " + PIN_ACTION if pct >= PAGEABLE_ACTION_PCT else ""))
    if pct >= PAGEABLE_ACTION_PCT and PIN_ACTION not in part.actions:
        part.actions.insert(0, PIN_ACTION)
    return ms
