"""Numbers checked where they enter: type, finiteness and physical range.

Core floor: imports only :mod:`hwlab.errors` and :mod:`hwlab.core.specs`. Every number hwlab did
not compute itself in this process passes through here before anything judges it: evidence
and baseline records (:func:`measurement`, :func:`ceilings`), flowchart observations
(:func:`observations`) and counts a user types (:func:`count_arg`, :func:`implied_rate`).

A bad number given by the user is refused with the field named (:class:`NumberError`, a
:class:`~hwlab.errors.UserInputError`: exit 2). Inside a recorded file the same check raises
with ``corrupt=True`` wording, so a corrupt record is reported as corrupt and never
classified healthy.

Ranges, and why:

* a time (``t_ms``) is finite, > 0 and at most :data:`MAX_T_MS` (a day): a zero or negative
  time means no measurement, and any rate over it is undefined; its p10 and p90 are finite,
  >= 0, and bracket the median (``p10 <= median <= p90``), as quantiles of one sample do;
* counts of bytes, FLOPs, repetitions and spills are whole numbers >= 0 (repetitions >= 1);
* a bandwidth or FLOP rate is finite and > 0; on a GPU with a datasheet entry
  (:mod:`hwlab.core.specs`) a *measured ceiling* cannot exceed the datasheet peak, which is the
  vendor's upper bound for the part;
* a percentage of a theoretical capacity (a datasheet peak counted by Nsight Compute, the
  time the GPU sits idle, a pipe's active cycles) is in 0..100;
* a percentage of a *measured* ceiling is in 0..:data:`MEASURED_PCT_MAX`: the ceiling is a
  median with a spread, so a kernel may pass it a little (and caches serve a small working set
  faster than the copy probe); but a measured ceiling is a reachable fraction of the datasheet
  peak, well over half of it on the parts the kit knows, so twice the ceiling is beyond any
  part;
* a ratio (``x``: slowdown, sector amplification) and a percentage of a median
  (``rank_tail_pct``) are finite, >= 0 and at most :data:`MAX_TIME_RATIO` (a ratio of two
  times past that is a unit slip, not a timing); a rank count is whole, 1..:data:`MAX_RANKS`;
* a count the user gives for their own function (``--n-bytes``, ``--n-flops``) is refused
  after timing when the rate it implies exceeds the datasheet peak of the GPU it ran on, or
  (no datasheet: a CPU) :data:`CPU_RATE_FACTOR` times the machine's measured ceiling; caches
  serve a CPU far faster than its measured DRAM copy, so only a count no cache explains is
  refused there.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hwlab.errors import UserInputError

#: on a machine without a datasheet entry (a CPU), a rate more than this many times the
#: measured ceiling is refused: caches serve small working sets tens of times faster than a
#: DRAM copy (and a busy machine measures its copy low), but not a hundred times
CPU_RATE_FACTOR = 100.0

#: the most a rate may be, in % of a *measured* ceiling (see the module docstring)
MEASURED_PCT_MAX = 200.0

#: the largest ratio of two times a record may hold (a slowdown, a tail in % of a median): a
#: floor of a nanosecond (a few bytes at a datasheet bandwidth) against a run of a whole second is
#: 1e9; a ratio past that is not a timing (a unit slip, a corrupt value)
MAX_TIME_RATIO = 1e9

#: the longest time one measurement may take, ms: a day; the kit times kernels and steps, and a
#: longer figure is a unit slip (seconds or microseconds written as ms) or a corrupt value
MAX_T_MS = 86_400_000.0

#: the fastest ceilings any device may hold where no datasheet bounds them (a CPU, an unknown
#: GPU): a memory copy of 100,000 GB/s is past every memory system built (HBM3e moves about
#: 8,000 GB/s per GPU), a GEMM of 100,000 TFLOP/s past every chip (sparse FP4 is about 20,000),
#: a host link of 10,000 GB/s past every bus; a larger cached or recorded ceiling is corrupt, and
#: shown as a measurement it would make every kernel read as slow
MAX_COPY_GBPS = 1e5
MAX_GEMM_TFLOPS = 1e5
MAX_HOST_LINK_GBPS = 1e4

#: the most ranks a job may have: the largest training jobs run on about 1e5 GPUs; 1e7 leaves a
#: hundredfold margin and refuses a count that is a unit slip (n_ranks: 1e15)
MAX_RANKS = 10**7

#: the most a count of spilled registers or of bytes/FLOPs may be: past 2^63 no counter holds it
MAX_COUNT = float(2**63)

#: flowchart metric -> (low, high, whole number?) for observations; None: no bound that side
OBSERVATION_RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    "slowdown_vs_floor": (0.0, MAX_TIME_RATIO, False),
    "dram_pct_of_peak": (0.0, 100.0, False),
    "dram_pct_estimated": (0.0, MEASURED_PCT_MAX, False),
    "sector_amplification": (0.0, MAX_TIME_RATIO, False),
    "tensor_pct_of_peak": (0.0, MEASURED_PCT_MAX, False),
    "tensor_pipe_pct": (0.0, 100.0, False),
    "n_spills": (0.0, MAX_COUNT, True),
    "launch_gap_pct": (0.0, 100.0, False),
    "e2e_slowdown": (0.0, MAX_TIME_RATIO, False),
    "rank_tail_pct": (0.0, 100.0 * MAX_TIME_RATIO, False),
    "n_ranks": (1.0, float(MAX_RANKS), True),
}


class NumberError(UserInputError):
    """A number that is not a number, not finite, or outside its physical range."""


def number(value: Any, field: str, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, whole: bool = False, where: str = "") -> float:
    """``value`` as a float, or :class:`NumberError` naming ``field`` (prefixed by ``where``).

    Refused: anything that is not an int or float (a string, a bool, null), NaN, +-Infinity,
    a value under ``lo`` (or equal to it when ``lo_open``), over ``hi``, or, with ``whole``,
    a fraction."""
    name = f"{where}{field}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NumberError(f"{name} should be a number, not {_show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(f"{name} is {value!r}, not a finite number")
    try:
        v = float(value)
    except OverflowError:  # an integer past the largest float (1.8e308)
        raise NumberError(f"{name} is an integer of {len(str(abs(value))):,} digits, too large for any "
                          "measurement") from None
    if whole and v != int(value):
        raise NumberError(f"{name} is {value!r}: it should be a whole number")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise NumberError(f"{name} is {value!r}: it should be {'>' if lo_open else '>='} {lo:g}")
    if hi is not None and v > hi:
        raise NumberError(f"{name} is {value!r}: it should be <= {hi:g}")
    return v


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else ("null" if value is None else repr(value))
    return (text[:40] + "...") if len(text) > 43 else text


def observations(obs: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """Flowchart observations (metric -> number, true/false or null), each checked against
    :data:`OBSERVATION_RANGES`; a metric not listed there must still be a finite number
    (or true/false/null). Returns the mapping unchanged when every value passes."""
    for k, v in obs.items():
        if v is None or isinstance(v, bool):
            continue
        if k == "metric_sources":  # what measured each metric: text, not a number
            continue
        lo, hi, whole = OBSERVATION_RANGES.get(k, (None, None, False))
        if isinstance(v, (int, float)):
            number(v, repr(k), lo=lo, hi=hi, whole=whole, where=where)
        else:
            raise NumberError(f"{where}{k!r} should be a number, true/false or null, not {_show(v)}")
    return dict(obs)


def datasheet(device: str | None):
    """The datasheet entry for ``device`` (a GPU name), or None (a CPU, an unknown part)."""
    if not device:
        return None
    from hwlab.core.specs import try_lookup  # core floor; deferred: specs is only needed for a GPU name
    return try_lookup(str(device))


def measurement(d: Mapping[str, Any], where: str = "") -> None:
    """Check one measurement record (a :class:`hwlab.core.measure.Measurement` as a dict)."""
    number(d.get("t_ms"), "t_ms", lo=0.0, lo_open=True, hi=MAX_T_MS, where=where)
    t = float(d["t_ms"])
    p10 = d.get("t_p10_ms", t)
    p90 = d.get("t_p90_ms", t)
    number(p10, "t_p10_ms", lo=0.0, hi=t, where=where)
    number(p90, "t_p90_ms", lo=t, hi=MAX_T_MS, where=where)
    for k in ("n_bytes", "n_flops"):
        number(d.get(k), k, lo=0.0, hi=MAX_COUNT, whole=True, where=where)
    if "n_rep" in d:
        number(d["n_rep"], "n_rep", lo=1.0, whole=True, where=where)
    spec = datasheet(d.get("device"))
    for k, peak in (("ceiling_gbps", spec.hbm_gbps if spec else MAX_COPY_GBPS), ("ceiling_tflops", MAX_GEMM_TFLOPS)):
        if d.get(k) is not None:
            number(d[k], k, lo=0.0, lo_open=True, hi=peak, where=where)


def ceilings(c: Mapping[str, Any], device: str | None = None, where: str = "ceilings.") -> None:
    """Check a ceilings dict (``copy_gbps``, ``gemm_tflops`` per dtype, ``host_link_gbps``):
    finite and > 0; on a GPU with a datasheet entry, at most its peaks."""
    spec = datasheet(device or c.get("device"))
    if c.get("copy_gbps") is not None:
        number(c["copy_gbps"], "copy_gbps", lo=0.0, lo_open=True, hi=spec.hbm_gbps if spec else MAX_COPY_GBPS,
               where=where)
    g = c.get("gemm_tflops") or {}
    if not isinstance(g, Mapping):
        raise NumberError(f"{where}gemm_tflops should be a dtype -> TFLOP/s object, not {_show(g)}")
    for dtype, v in g.items():
        peak = MAX_GEMM_TFLOPS
        if spec is not None:
            try:
                peak = spec.peak_tflops(str(dtype))
            except KeyError:
                peak = MAX_GEMM_TFLOPS
        number(v, f"gemm_tflops.{dtype}", lo=0.0, lo_open=True, hi=peak, where=where)
    if c.get("host_link_gbps") is not None:
        number(c["host_link_gbps"], "host_link_gbps", lo=0.0, lo_open=True, hi=MAX_HOST_LINK_GBPS, where=where)


#: the per-GPU counters of an NVML snapshot a comparison reads (ECC errors, row remaps):
#: whole numbers >= 0 where recorded (NVML's "unsupported" text and null are kept as given)
SNAPSHOT_COUNTERS = ("ecc_errors_volatile", "ecc_errors_aggregate", "remapped_rows")


def snapshot(snap: Any, where: str = "snapshot") -> None:
    """Check the parts of an NVML snapshot that comparisons judge: ``gpus`` a list of objects,
    each one's :data:`SNAPSHOT_COUNTERS` whole numbers >= 0 (or text: NVML said unsupported, or
    null) and its ``temperature_c`` a number in -50..150 C (a GPU outside that range is off or
    the value is not a temperature)."""
    if snap is None:
        return
    if not isinstance(snap, Mapping):
        raise NumberError(f"{where} should be an object, not {_show(snap)}")
    gpus = snap.get("gpus") or []
    if not isinstance(gpus, list):
        raise NumberError(f"{where}.gpus should be a list, not {_show(gpus)}")
    for i, g in enumerate(gpus):
        if not isinstance(g, Mapping):
            raise NumberError(f"{where}.gpus[{i}] should be an object, not {_show(g)}")
        if g.get("temperature_c") is not None:
            number(g["temperature_c"], "temperature_c", lo=-50.0, hi=150.0, where=f"{where}.gpus[{i}].")
        for key in SNAPSHOT_COUNTERS:
            c = g.get(key)
            if c is None or isinstance(c, str):
                continue
            if not isinstance(c, Mapping):
                raise NumberError(f"{where}.gpus[{i}].{key} should be an object, not {_show(c)}")
            for k, v in c.items():
                if v is None or (k == "unsupported" and isinstance(v, str)):
                    continue
                number(v, f"{key}.{k}", lo=0.0, hi=MAX_COUNT, whole=True, where=f"{where}.gpus[{i}].")


def count_arg(text: str) -> int:
    """argparse ``type=`` for a count the user types (``--n-bytes 4096``, ``--n-bytes 1e9``):
    a finite whole number >= 0, written as an integer or in e-notation."""
    import argparse

    if len(text.strip()) > 40:  # 2^63 has 19 digits; Python refuses to convert past 4,300
        raise argparse.ArgumentTypeError(f"{text[:20]}... ({len(text):,} characters) is past any counter "
                                         "(2^63): give the count of bytes or FLOPs one call moves")
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a whole number >= 0") from None
        if not math.isfinite(f) or f != int(f):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite whole number: give one >= 0") from None
        v = int(f)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative: give a whole number >= 0")
    if v > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:20]}... ({len(text):,} characters) is past any counter "
                                         f"(2^63): give the count of bytes or FLOPs one call moves")
    return v


def implied_rate(field: str, rate: float, unit: str, device: str | None, datasheet_peak: float | None,
                 measured_ceiling: float | None) -> None:
    """Refuse a user-given count whose implied ``rate`` no device could reach: above the
    datasheet peak of a known GPU, else above :data:`CPU_RATE_FACTOR` times the measured
    ceiling (see the module docstring)."""
    if not math.isfinite(rate):
        raise NumberError(f"{field} implies a rate of {rate!r} {unit}: check the count")
    if datasheet_peak:
        bound, what = datasheet_peak, f"the datasheet peak of {device} ({datasheet_peak:,.0f} {unit})"
    elif measured_ceiling:
        bound = CPU_RATE_FACTOR * measured_ceiling
        what = (f"{CPU_RATE_FACTOR:g} times this machine's measured ceiling "
                f"({measured_ceiling:,.3g} {unit}; no datasheet for {device or 'this device'})")
    else:
        return
    if rate > bound:
        raise NumberError(f"{field} implies {rate:,.4g} {unit}, above {what}: no device reaches that; "
                          "check the count, or leave it out to have it estimated")
