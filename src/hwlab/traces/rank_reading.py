"""One rank's trace, read for the per-rank report: each step's busy, communication, exposed and idle
time, and collectives matched across ranks (``hwlab ranks --traces``, :mod:`hwlab.diagnosis.ranks_traces`).

* **Steps on the device's clock.** A GPU's kernels count in the step whose host ``ProfilerStep``
  window launched them (correlation id). Where the device runs behind the host, a step's window
  on the device starts where the previous step's device work ended (or at its host start, the
  later of the two) and ends with its own last device work, so windows never overlap. Busy and
  communication times are what the step launched; idle and exposed communication are read inside
  its window (idle is the device timeline's, exposed never exceeds the step: own time = step
  minus exposed communication is never negative). Without a launch event a kernel counts in
  the window it ran in.
* **Matching** by process group and sequence number where every rank recorded them; the rest by
  name and order, a pair kept only when the ranks' intervals overlap on one clock; without a
  shared clock by order alone, said (:func:`match`).
* **Collective table**: bus bandwidth by the nccl-tests formula (:func:`collective_table`).
"""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from hwlab.core import comms
from hwlab.core.measure import quantile
from hwlab.errors import UserInputError
from hwlab.traces import kineto

JOB_SPAN_S = 3600.0  # traces of one job are recorded within this of each other (one profiling window)


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _clip(iv: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in iv if b > lo and a < hi]


def _minus(a_iv: list[tuple[float, float]], b_iv: list[tuple[float, float]]) -> float:
    """Length of union(a) not covered by union(b)."""
    return _length(_union(a_iv)) - _length(_union(_clip_all(_union(a_iv), _union(b_iv))))


def _clip_all(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for lo, hi in a:
        out += _clip(b, lo, hi)
    return out


def _in_step(launch: float | None, lo: float, hi: float, iv: tuple[float, float]) -> list[tuple[float, float]]:
    """The part of device interval ``iv`` that belongs to the step [lo, hi): all of it when its host
    launch lies in the step (attributed by correlation id), else (no launch event) the part that ran in
    the step's window."""
    if launch is not None:
        return [iv] if lo <= launch < hi else []
    return _clip([iv], lo, hi)


def rank_steps(t: kineto.RankTrace) -> list[dict[str, Any]]:
    """Per step: step time; busy, communication, exposed communication and idle (module doc: on a
    GPU, device work counts in the step that launched it and a lagging device's step is its own
    window on the device timeline; idle is that window minus its work). A reduced trace
    (:mod:`hwlab.traces.rank_summary`) brings its rows, computed by this function in a worker."""
    if hasattr(t, "step_rows"):
        return t.step_rows()
    launches = t.kernel_launch_us or [None] * len(t.kernels)
    if t.on_gpu:
        busy_src = [(la, (ts, ts + d)) for (ts, d, _), la in zip(t.kernels, launches)]
        comm_src = [(c.launch_us, (c.ts_us, c.ts_us + c.dur_us)) for c in t.collectives]
    else:
        busy_src = [(None, (ts, ts + d)) for ts, d in t.host_ops]
        comm_src = [(None, (c.ts_us, c.ts_us + c.dur_us)) for c in t.collectives]
    rows = []
    prev_end = None
    for sid, ts, dur in sorted(t.steps, key=lambda s: s[1]):
        lo, hi = ts, ts + dur
        busy = _union([x for la, iv in busy_src for x in _in_step(la, lo, hi, iv)])
        comm = _union([x for la, iv in comm_src for x in _in_step(la, lo, hi, iv)])
        work = _union(busy + comm)
        end = max(hi, work[-1][1]) if t.on_gpu and work else hi
        start = lo
        if t.on_gpu and prev_end is not None and prev_end > lo:  # the device lags: its window (module doc)
            start = min(prev_end, end)
        prev_end = end
        step_us = end - start
        comm_us, busy_us = _length(comm), _length(busy)  # what the step launched, wherever it ran
        in_b, in_c = _clip(busy, start, end), _clip(comm, start, end)  # what ran in its window
        exposed_us = _minus(in_c, in_b)
        both = _length(_union(in_b + in_c))
        rows.append({"step": sid, "step_ms": step_us / 1e3, "host_step_ms": dur / 1e3, "busy_ms": busy_us / 1e3,
                     "comm_ms": comm_us / 1e3, "exposed_comm_ms": exposed_us / 1e3,
                     "idle_ms": max(0.0, step_us - both) / 1e3, "own_ms": max(0.0, step_us - exposed_us) / 1e3,
                     "device_after_step_ms": _length(_clip(work, hi, float("inf"))) / 1e3,
                     "device_lag_ms": max(0.0, (work[-1][1] - hi) / 1e3) if work else 0.0})
    return rows


def device_outside(t: kineto.RankTrace) -> dict[str, Any] | None:
    """How much device time ran outside the host step windows, and how much of it the launch
    correlation attributed to a step (the rest is unattributed: reported, not guessed)."""
    if hasattr(t, "step_rows"):  # a reduced trace: computed by this function in a worker
        return t.device_outside()
    if not t.on_gpu or not t.steps:
        return None
    wins = _union([(ts, ts + d) for _, ts, d in t.steps])
    launches = t.kernel_launch_us or [None] * len(t.kernels)
    items = [(la, ts, ts + d) for (ts, d, _), la in zip(t.kernels, launches)] + \
        [(c.launch_us, c.ts_us, c.ts_us + c.dur_us) for c in t.collectives if c.on == "gpu"]
    total = sum(b - a for _, a, b in items)
    if total <= 0:
        return None
    inside = sum(_length(_clip(wins, a, b)) for _, a, b in items)
    outside = total - inside
    unattributed = sum((b - a) - _length(_clip(wins, a, b)) for la, a, b in items
                       if la is None or not any(lo <= la < hi for lo, hi in wins))
    last_end = wins[-1][1]
    after_last = sum(_length(_clip([(a, b)], last_end, float("inf"))) for _, a, b in items)
    return {"outside_steps_pct": 100.0 * outside / total, "after_last_step_pct": 100.0 * after_last / total,
            "unattributed_pct": 100.0 * unattributed / total,
            "n_launch_ids_pct": 100.0 * sum(la is not None for la, _, _ in items) / len(items)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("step_ms", "busy_ms", "comm_ms", "exposed_comm_ms", "idle_ms", "own_ms")}
    steps = [r["step_ms"] for r in rows]
    comm = sum(r["comm_ms"] for r in rows)
    hidden = comm - sum(r["exposed_comm_ms"] for r in rows)
    return {**med, "n_steps": len(rows), "step_p10_ms": quantile(steps, 0.1), "step_p90_ms": quantile(steps, 0.9),
            "busy_p10_ms": quantile([r["busy_ms"] for r in rows], 0.1),
            "overlap_hidden_pct": 100.0 * hidden / comm if comm > 0 else None}


#: on one clock the ranks' intervals of one collective share a moment (every rank is inside it when the last
#: one arrives); no slack for a strict overlap: kernels that merely abut (one ends 15 us before the other
#: starts) are not one collective by overlap alone
CLOCK_SLACK_US = 0.0
#: clock jitter tolerated between the ranks' timestamps of one collective: recorded timestamps of one host
#: carry tens of µs of skew between processes (CUPTI buffers, clock reads), so heads that miss a strict
#: overlap by at most this are one collective, unless the earliest-ending rank's next collective of the
#: same name overlaps the others strictly (then that rank's head had no partner: back-to-back buckets)
CLOCK_JITTER_US = 50.0
BY_ID = "process group + sequence number"
BY_OVERLAP = "name and order, overlapping on one clock"
BY_ORDER = "name and order (no shared clock to check overlap)"


def shared_clock(traces: dict[int, kineto.RankTrace]) -> bool:
    """True when the traces' clocks can be compared: every step number the ranks share overlaps in
    time on every rank (each rank's ``ProfilerStep#N`` is the same step of one job)."""
    wins = [{n: (ts, ts + d) for n, ts, d in t.steps} for t in traces.values()]
    common = set.intersection(*(set(w) for w in wins)) if wins else set()
    return bool(common) and all(max(w[n][0] for w in wins) <= min(w[n][1] for w in wins) + CLOCK_JITTER_US
                                for n in common)


def _overlap(cs: list[kineto.Collective], slack_us: float = CLOCK_SLACK_US) -> bool:
    return max(c.ts_us for c in cs) < min(c.ts_us + c.dur_us for c in cs) + slack_us


def match(traces: dict[int, kineto.RankTrace], one_clock: bool = False) -> dict[str, Any]:
    """Collectives matched across ranks by the trace's own identity (module docstring): first by
    process group and sequence number where every rank recorded them; the rest by name and process
    group in order, a pair kept only when the ranks' intervals overlap on one clock (else left
    unmatched and counted, never guessed); without a shared clock by order alone, said."""
    colls = {r: t.collectives for r, t in traces.items()}
    ranks = sorted(colls)
    matched: list[tuple[dict[int, kineto.Collective], str]] = []
    used: set[int] = set()
    ids = {r: {(c.pg, c.seq): c for c in cs if c.pg is not None and c.seq is not None} for r, cs in colls.items()}
    common = set.intersection(*(set(v) for v in ids.values())) if ids else set()
    id_no_overlap = 0
    for key in common:
        m = {r: ids[r][key] for r in ranks}
        if one_clock and not _overlap(list(m.values())):
            id_no_overlap += 1
        matched.append((m, BY_ID))
        used.update(id(c) for c in m.values())
    rest: dict[int, dict[tuple, list[kineto.Collective]]] = {}
    for r, cs in colls.items():
        g: dict[tuple, list[kineto.Collective]] = {}
        for c in cs:
            if id(c) not in used:
                g.setdefault((c.name, c.pg or ""), []).append(c)
        rest[r] = g
    keys = set.intersection(*(set(g) for g in rest.values())) if rest else set()
    for key in sorted(keys):
        lists = {r: rest[r][key] for r in ranks}
        pos = {r: 0 for r in ranks}
        while all(pos[r] < len(lists[r]) for r in ranks):
            heads = {r: lists[r][pos[r]] for r in ranks}
            if not one_clock:
                matched.append((heads, BY_ORDER))
            elif _overlap(list(heads.values())):
                matched.append((heads, BY_OVERLAP))
            else:
                r0 = min(ranks, key=lambda r: heads[r].ts_us + heads[r].dur_us)
                nxt = lists[r0][pos[r0] + 1] if pos[r0] + 1 < len(lists[r0]) else None
                alt = [nxt] + [heads[r] for r in ranks if r != r0] if nxt is not None else None
                if _overlap(list(heads.values()), CLOCK_JITTER_US) and not (alt and _overlap(alt)):
                    matched.append((heads, BY_OVERLAP))  # within the clocks' jitter (CLOCK_JITTER_US)
                else:  # the one that ends first has no partner on some rank: unmatched, counted
                    pos[r0] += 1
                    continue
            for r in ranks:
                pos[r] += 1
    on_rank = Counter(r for m, _ in matched for r in m)
    unmatched = {r: len(colls[r]) - on_rank[r] for r in ranks}
    methods = Counter(how for _, how in matched)
    first = min(ranks)
    matched.sort(key=lambda mh: mh[0][first].ts_us)
    notes = []
    if any(unmatched.values()):
        notes.append("collectives without a partner on every rank, left unmatched: "
                     + ", ".join(f"rank {r} {n} of {len(colls[r])}" for r, n in unmatched.items()))
    if id_no_overlap:
        notes.append(f"{id_no_overlap} collectives matched by process group + sequence number do not overlap "
                     "in time on the shared clock: the clocks or the recorded sequence numbers disagree")
    if methods.get(BY_ORDER):
        notes.append(f"{methods[BY_ORDER]} collectives matched by order only: the ranks share no clock to "
                     "check that they overlap, and the trace records no sequence numbers")
    return {"matched": matched, "methods": dict(methods), "unmatched": unmatched, "notes": notes}


def collective_table(t: kineto.RankTrace, n_ranks: int) -> list[dict[str, Any]]:
    """One rank's collectives, grouped by name, process group and size: count, time in them and
    bus bandwidth by the nccl-tests formula (algbw = bytes / time, busbw = algbw x the collective's
    factor for its group size; an all-gather's bytes are its output, as nccl-tests counts them).
    The time is the rank's time inside the collective, waiting included: a lower bound on the
    link's bandwidth when ranks arrive apart."""
    groups: dict[tuple, list[kineto.Collective]] = {}
    for c in t.collectives:
        groups.setdefault((c.name, c.pg, c.n_bytes, c.group_size), []).append(c)
    out = []
    for (name, pg, nb, gs), cs in sorted(groups.items(), key=lambda kv: -sum(c.dur_us for c in kv[1])):
        durs = [c.dur_us for c in cs]
        med_us = statistics.median(durs)
        size = cs[0].n_bytes_out if name == "allgather" and cs[0].n_bytes_out else nb
        n = gs or n_ranks
        alg = size / (med_us * 1e-6) / 1e9 if size and med_us > 0 else None
        f = comms.busbw_factor(cs[0].name, n)
        bus = alg * f if alg is not None and f is not None and n > 1 else None
        out.append({"name": name, "pg": pg, "n_bytes": nb, "group_size": gs, "count": len(cs),
                    "total_ms": sum(durs) / 1e3, "median_ms": med_us / 1e3, "algbw_gbps": alg, "busbw_gbps": bus,
                    "busbw_note": None if bus is not None else (
                        "size not recorded (profile with record_shapes=True, or a torch that records "
                        "record_param_comms)" if not size else "one rank in the group: no bus traffic"),
                    "on": cs[0].on, "meta_source": Counter(c.meta_source or "kernel name only" for c in cs).most_common(1)[0][0]})
    return out


def busbw_gbps(c: kineto.Collective, n_ranks: int, t_us: float) -> float | None:
    if not c.n_bytes or t_us <= 0:
        return None
    f = comms.busbw_factor(c.name, c.group_size or n_ranks)
    return c.n_bytes * f / (t_us * 1e-6) / 1e9 if f is not None else None


#: the most ranks a report lists as missing against the stated world size: a job traces some of
#: its ranks, but a world of 10^9 stated by four traces is a corrupt field, and listing it would
#: hold the reader for minutes
MAX_MISSING_RANKS = 100_000


def one_job(read: list[kineto.RankTrace]) -> None:
    """Refuse traces of several jobs in one folder: different devices (``deviceProperties`` names,
    a vendor included), different world sizes, different process-group configurations, or
    recording times more than :data:`JOB_SPAN_S` apart (the files are named)."""
    def name(t: kineto.RankTrace) -> str:
        return Path(t.path).name

    def refuse(what: str, groups: dict[Any, list[str]]) -> None:
        raise UserInputError(f"these traces come from different jobs ({what}: " + "; ".join(
            f"{k}: {', '.join(v)}" for k, v in groups.items()) + "): put each job's traces in a folder of its own")

    devs: dict[Any, list[str]] = {}
    for t in read:
        if t.device_names:
            devs.setdefault(", ".join(t.device_names), []).append(name(t))
    if len(devs) > 1:  # one job's ranks run on one kind of device (every rank of a host lists the same)
        refuse("different devices", devs)
    worlds: dict[Any, list[str]] = {}
    for t in read:
        if t.world_size:
            worlds.setdefault(t.world_size, []).append(name(t))
    if len(worlds) > 1:
        refuse("world sizes", {f"world size {k}": v for k, v in worlds.items()})
    for world, names in worlds.items():
        if world - len(read) > MAX_MISSING_RANKS:
            raise UserInputError(f"the traces state a world of {world:,} ranks but the folder holds {len(read)} "
                                 f"({', '.join(names[:3])}): more than {MAX_MISSING_RANKS:,} ranks would be missing; "
                                 "check distributedInfo.world_size, or collect the traces of the ranks to compare")
    # one job's ranks may each list only the groups they belong to; a contradiction is the same
    # process group named with a different description or size in two traces
    seen: dict[str, tuple[Any, ...]] = {}
    where: dict[str, str] = {}
    for t in read:
        for g in t.pg_config:
            if not isinstance(g, dict) or g.get("pg_name") is None:
                continue
            k = str(g["pg_name"])
            v = (g.get("pg_desc"), g.get("pg_size") or len(g.get("ranks") or []))
            if k in seen and seen[k] != v:
                refuse(f"process group {k} differs", {f"{seen[k][0]} of {seen[k][1]} ranks": [where[k]],
                                                      f"{v[0]} of {v[1]} ranks": [name(t)]})
            seen.setdefault(k, v)
            where.setdefault(k, name(t))
    when = sorted((t.recorded_unix_s, name(t)) for t in read if t.recorded_unix_s)
    if len(when) > 1 and when[-1][0] - when[0][0] > JOB_SPAN_S:
        import datetime as _dt

        def day(x: float) -> str:
            return _dt.datetime.fromtimestamp(x, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        refuse(f"recorded {(when[-1][0] - when[0][0]) / 86400:.1f} days apart, more than {JOB_SPAN_S / 3600:g} h",
               {f"recorded {day(w)}": [n] for w, n in (when[0], when[-1])})

def read_all(files: list[Path], progress, problems: list[str], unreadable: list[dict[str, str]],
              notes: list[str]) -> list[kineto.RankTrace]:
    """Read each file once; a file whose content repeats one already read (the same process, first
    event, event count, steps and kernels: :attr:`~hwlab.traces.kineto.RankTrace.fingerprint`) is
    one trace given twice: read once, the copy named."""
    read: list[kineto.RankTrace] = []
    seen: dict[tuple, str] = {}
    for f in files:
        cb = (lambda done, total, f=f: progress(str(f), done, total)) if progress else None
        try:
            t = kineto.read_trace(f, progress=cb)
        except kineto.TraceError as e:
            problems.append(str(e))
            unreadable.append({"file": str(f), "why": str(e)})
            continue
        if t.fingerprint in seen:
            notes.append(f"{Path(t.path).name} is the same trace as {Path(seen[t.fingerprint]).name} (same process, "
                         "events and times): read once")
            continue
        seen[t.fingerprint] = t.path
        if t.n_bad_times:
            notes.append(f"{Path(t.path).name}: {t.n_bad_times} event(s) with a NaN, infinite or negative time "
                         "left out")
        read.append(t)
    return read

def by_rank(read: list[kineto.RankTrace], problems: list[str], notes: list[str]) -> dict[int, kineto.RankTrace]:
    """Traces by rank: one step for a trace without ProfilerStep spans (said), ranks numbered by
    file order where no trace states one (said, a guess), a second trace of one rank left out."""
    traces: dict[int, kineto.RankTrace] = {}
    unranked: list[kineto.RankTrace] = []
    for t in read:
        if not t.steps:
            ends = [ts + d for ts, d, _ in t.kernels] + [c.ts_us + c.dur_us for c in t.collectives] + \
                [ts + d for ts, d in t.host_ops]
            los = [ts for ts, _, _ in t.kernels] + [c.ts_us for c in t.collectives] + [ts for ts, _ in t.host_ops]
            if not los:
                problems.append(f"{t.path}: no ProfilerStep#N spans and no kernels, collectives or operators, left out")
                continue
            t.steps = [(0, min(los), max(ends) - min(los))]
            notes.append(f"{Path(t.path).name}: no ProfilerStep#N spans (profile with a schedule and call "
                         "prof.step()): the whole trace is read as one step")
        if t.rank is None:
            unranked.append(t)
        elif t.rank in traces:
            problems.append(f"{t.path}: rank {t.rank} already read from {traces[t.rank].path}, left out")
        else:
            traces[t.rank] = t
    if unranked:
        free = (r for r in range(10 ** 6) if r not in traces)
        for t in unranked:
            t.rank, t.rank_source = next(free), "file order (no distributedInfo and no rank in the file name)"
            traces[t.rank] = t
        notes.append(f"{len(unranked)} trace(s) carry no rank: numbered by file order, a guess")
    return traces
