"""How much of a trace's communication ran under compute (``hwlab examine --trace``).

A collective kernel on its own stream overlaps the compute kernels of the same step; the step is
longer only by the part of it that ran while no compute kernel ran (its *exposed* time). One rank's
trace measures that split exactly on its device timeline: per busy step, the union of the
communication kernels' intervals (classed by kernel name, :func:`hwlab.core.profiling.part_class`),
and the part of it inside the union of every other kernel's intervals (hidden). The communication
part's share of the step counts time it shares with compute, so without this split a part that is
mostly hidden reads as the step's largest; the note gives both, per step, and says that only the
exposed time is what a faster collective (or a faster link) can take off the step.
"""
from __future__ import annotations

from hwlab.core.profiling import part_class
from hwlab.examine.parts import Parts
from hwlab.traces.trace_ops import StepWork


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _inside_us(a_iv: list[tuple[float, float]], b_iv: list[tuple[float, float]]) -> float:
    """Time of the disjoint sorted intervals ``a_iv`` inside the disjoint sorted ``b_iv``."""
    tot, j = 0.0, 0
    for a, b in a_iv:
        while j < len(b_iv) and b_iv[j][1] <= a:
            j += 1
        k = j
        while k < len(b_iv) and b_iv[k][0] < b:
            tot += max(0.0, min(b, b_iv[k][1]) - max(a, b_iv[k][0]))
            k += 1
    return tot


def comm_split_us(works: list[StepWork]) -> tuple[float, float, int] | None:
    """(communication us, of it hidden under other kernels us, steps) summed over the busy steps,
    or None where no step ran a communication kernel."""
    comm_us = hidden_us = 0.0
    n = 0
    for w in works:
        if not w.items:
            continue
        comm, other = [], []
        for it in w.items:
            pc = part_class(it["stack"][0] if it.get("stack") else None, it.get("kernel"))
            (comm if pc == "communication" else other).append((it["ts"], it["ts_end"]))
        n += 1
        cu = _union(comm)
        comm_us += sum(b - a for a, b in cu)
        hidden_us += _inside_us(cu, _union(other))
    return (comm_us, hidden_us, n) if comm_us > 0 else None


def comm_overlap(works: list[StepWork], parts: Parts) -> dict[str, float] | None:
    """Note on the communication part how much of it ran under compute (module doc); the figures,
    per step in ms, or None where the trace has no communication kernel."""
    split = comm_split_us(works)
    part = next((p for p in parts.parts if p.name == "communication"), None)
    if split is None or part is None:
        return None
    comm_us, hidden_us, n = split
    comm_ms, hidden_ms = comm_us / n / 1e3, hidden_us / n / 1e3
    exposed_ms = comm_ms - hidden_ms
    part.notes.append(
        f"{comm_ms:.4g} ms of communication kernels per step: {hidden_ms:.4g} ms of it "
        f"({100 * hidden_ms / comm_ms:.0f}%) ran while other kernels ran (hidden under compute), "
        f"{exposed_ms:.4g} ms exposed; only the exposed time is what a faster collective or link takes off "
        "the step [device timeline: communication kernels (by name) against every other kernel]")
    return {"comm_ms": comm_ms, "hidden_ms": hidden_ms, "exposed_ms": exposed_ms}
