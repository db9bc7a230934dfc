"""The timing of one examination, in :data:`~hwlab.examine.repeats.N_REPEATS` blocks sized by the
measured variance (:func:`timed_blocks`), and what it tells the progress estimate.

**Blocks.** Block *r* times single calls (:func:`hwlab.core.measure.time_fn`), then runs the function
back to back (question D), so both halves of D's ratio see the same host load; each block is one
repeat of :mod:`hwlab.examine.repeats`, and the pooled samples give the median the report shows.

**Block size, from the variance.** A block takes at least :data:`MIN_BLOCK_REP` single calls and
:data:`MIN_BLOCK_REP` back-to-back chunks (a median and a range need three), and more only while its
median is not settled: a block of *n* samples whose p10-p90 width is *w* of the median has a median
uncertain by about *w* / sqrt(*n*) (:func:`median_error`), and sampling stops once that is at most
:data:`TARGET_MEDIAN_ERROR`. The width is read from every sample taken so far (all blocks: the
function's spread, better known from more samples than one block holds); the count is the block's
own (each block's median is walked on its own). The target sits far inside the run-to-run spread
(:data:`~hwlab.examine.repeats.RUN_TO_RUN`) every timed verdict is judged with, so more calls would
not move a verdict; a steady function (device events, a quiet host) stops at the floor, a noisy one
samples up to the cap (:data:`MAX_BLOCK_REP`, :data:`MAX_BLOCK_CHUNKS`) or the time budget, and the
report says which
(:meth:`SizedBlocks.sizing`).

**Warm-up once.** The function is warm when the timing starts (its checked call and the probe call
of the estimate ran it), so the first block warms up by the protocol's rule (on a GPU, clocks held
under sustained load, :data:`hwlab.core.measure.GPU_WARMUP_S`, then a sustained timed phase); the
later blocks follow it without a pause (on a GPU, nothing runs between them), so they take no
warm-up of their own, only the one untimed call every timing starts with, and on a GPU a third of
the sustained phase each (:func:`later_block_protocol`).

**Progress.** ``on_left(calls)`` is told the calls the timing has left after every round: those
still planned (the current block's, and the later blocks' at the size the spread so far calls for),
plus the ceilings' re-timings still to come, counted in calls by their measured cost.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hwlab.core import hostwait
from hwlab.examine.repeats import N_REPEATS, Blocks

#: the fewest single calls (and back-to-back chunks) a block takes: a median and a range need three
MIN_BLOCK_REP = 3
#: the most single calls and back-to-back chunks a block takes, whatever its spread: a function
#: noisy enough to want more is told so (its stop reason), and the time budget bounds the rest; no
#: more than a fixed-size block took before blocks were sized, so a noisy host costs no more time
MAX_BLOCK_REP = 7
MAX_BLOCK_CHUNKS = 5
#: a median uncertain by this share of itself is settled: a twentieth of the run-to-run spread a
#: timed verdict is judged with anyway (:data:`~hwlab.examine.repeats.RUN_TO_RUN`), so more calls
#: move no verdict
TARGET_MEDIAN_ERROR = 0.03
#: extra rounds a block may take to reach its size (each starts with one untimed call)
MAX_ROUNDS = 2


def rel_width(samples: list[float]) -> float:
    """p10-p90 width over the median (0 for fewer than two samples or a zero median)."""
    from hwlab.core.measure import quantile

    xs = sorted(samples)
    if len(xs) < 2:
        return 0.0
    med = statistics.median(xs)
    return (quantile(xs, 0.9) - quantile(xs, 0.1)) / med if med > 0 else 0.0


def median_error(width: float, n: int) -> float:
    """How far a median of ``n`` samples may sit from the true one, as a share of it: the spread's
    relative width over sqrt(n) (module doc)."""
    return width / math.sqrt(max(n, 1))


def block_size(spread_samples: list[float], most: int = MAX_BLOCK_REP) -> int:
    """Samples a block needs for its median to be settled (:data:`TARGET_MEDIAN_ERROR`), given the
    spread of ``spread_samples``: between :data:`MIN_BLOCK_REP` and ``most``."""
    w = rel_width(spread_samples)
    need = math.ceil((w / TARGET_MEDIAN_ERROR) ** 2) if w > 0 else MIN_BLOCK_REP
    return max(MIN_BLOCK_REP, min(most, need))


def stop_reason(spread_samples: list[float], n: int, most: int, out_of_time: bool) -> str:
    """Why a block of ``n`` samples stopped (module doc): settled, the cap, or the time budget."""
    w = rel_width(spread_samples)
    err = median_error(w, n)
    if err <= TARGET_MEDIAN_ERROR:
        return "settled"
    return "time budget" if out_of_time else f"the cap of {most}" if n >= most else f"{MAX_ROUNDS} extra rounds"


@dataclass
class SizedBlocks(Blocks):
    """:class:`~hwlab.examine.repeats.Blocks` with how they were sized (module doc)."""

    #: calls of the function the timing made: warm-up, single calls, back-to-back chunks
    n_calls: int = 0
    #: per block, why its single calls stopped, and why its chunks stopped
    stops: list[tuple[str, str]] = field(default_factory=list)

    def sizing(self) -> str:
        """One sentence: how many calls were timed and why the sampling stopped."""
        n_single, n_chunks = len(self.pooled_samples_ms), len(self.pooled_chunks_ms)
        w = rel_width(self.pooled_samples_ms)
        reasons = sorted({r for pair in self.stops for r in pair})
        per = ", ".join(f"{len(s)}+{len(c)}" for s, c in zip(self.samples_ms, self.chunks_ms))
        why = ("every block settled" if reasons == ["settled"] else
               "stopped by " + " and ".join(r for r in reasons if r != "settled"))
        return (f"timing sized by the measured spread: {n_single} single calls and {n_chunks} back-to-back "
                f"chunks in {len(self.samples_ms)} blocks ({per}), {self.n_calls} calls of the function in all; "
                f"{why} (p10-p90 {100 * w:.1f}% of the median; a block stops once its median is within "
                f"~{100 * TARGET_MEDIAN_ERROR:.0f}%, after {MIN_BLOCK_REP} to {MAX_BLOCK_REP} single calls and "
                f"{MIN_BLOCK_REP} to {MAX_BLOCK_CHUNKS} chunks)")


def later_block_protocol(b: int, rounds: int, gpu: bool, n_blocks: int = N_REPEATS) -> dict[str, float]:
    """``time_fn``'s warm-up and minimum run for block ``b``'s round ``rounds`` (module doc, "Warm-up
    once"): the protocol's own in the first block's first round; no warm-up after it; on a GPU each
    later block's first round still runs a share of the sustained phase (a kernel of microseconds
    keeps its thousands of samples), its extra rounds none."""
    if b == 0 and rounds == 0:
        return {}
    if gpu and rounds == 0:
        from hwlab.core.measure import GPU_MIN_RUN_S

        return {"warmup_s": 0.0, "min_run_s": GPU_MIN_RUN_S / n_blocks}
    return {"warmup_s": 0.0, "min_run_s": 0.0}


def timed_blocks(run: Callable[..., Any], arg_sets: list, dev, time_fn: Callable[..., Any],
                 back_to_back: Callable[..., list[float]], max_total_s: float = 20.0,
                 n_blocks: int = N_REPEATS, most: int = MAX_BLOCK_REP, most_chunks: int = MAX_BLOCK_CHUNKS,
                 on_block: Callable[[int], None] | None = None,
                 retime: Callable[[], dict[str, float]] | None = None,
                 on_timed: Callable[[float], None] | None = None,
                 on_left: Callable[[float], None] | None = None) -> SizedBlocks:
    """Time ``run`` in ``n_blocks`` blocks, each single calls (``time_fn``) then back to back
    (``back_to_back``), each sized by the variance (module doc); ``retime()`` re-times the ceilings
    before each block and after the last; ``on_timed(ms)`` gets each round's median wall time per
    call, ``on_left(calls)`` the calls the timing has left (progress)."""
    gpu = getattr(dev, "type", "cpu") == "cuda"
    net = not gpu  # a CPU's timing net of the run-queue wait
    samples: list[list[float]] = []
    chunks: list[list[float]] = []
    waits: list[float | None] = []
    stops: list[tuple[str, str]] = []
    rates: dict[str, list[float]] = {}
    st: dict[str, Any] = {"calls": 0, "call_s": None, "retime_s": 0.0, "per_chunk": 1, "timer": ""}
    t_end = time.perf_counter() + max_total_s

    def retimed() -> None:
        if retime is not None:
            t0 = time.perf_counter()
            for k, v in retime().items():
                rates.setdefault(k, []).append(v)
            st["retime_s"] = time.perf_counter() - t0

    def tell(b: int, calls_left_in_block: int, spread: list[float]) -> None:
        """Calls left: this block's, the later blocks' at the sizes the spreads so far call for
        (``spread``: the single calls'; the chunks' own once there are some), the re-timings to come
        (one before each later block, one after the last) in calls by their measured cost."""
        if on_left is not None and st["call_s"] is not None:
            k = block_size(spread, most) if spread else MIN_BLOCK_REP
            done_ch = [x for blk in chunks for x in blk]
            k_ch = block_size(done_ch, most_chunks) if done_ch else min(k, most_chunks)
            later = (n_blocks - 1 - b) * (1 + k + k_ch * st["per_chunk"])
            retimes = (n_blocks - b) if retime is not None else 0
            on_left(calls_left_in_block + later + retimes * st["retime_s"] / st["call_s"])

    def out_of_time() -> bool:
        return time.perf_counter() >= t_end - 0.2

    for b in range(n_blocks):
        if on_block:
            on_block(b)
        retimed()
        prior = [x for blk in samples for x in blk]
        cur, walls, waited, rounds = [], [], [], 0
        while True:  # single calls, in rounds, until the block's median is settled (module doc)
            want = block_size(prior + cur, most) if prior or cur else MIN_BLOCK_REP
            kw = later_block_protocol(b, rounds, gpu, n_blocks)
            t = time_fn(run, arg_sets, dev, n_warmup=1, n_rep=max(1, want - len(cur)),
                        max_total_s=max(0.2, (t_end - time.perf_counter()) / (n_blocks - b)), net_of_wait=net, **kw)
            cur += list(t.samples_ms)
            walls += list(t.wall_ms or t.samples_ms)
            waited += list(t.wait_ms or [])
            st["calls"] += 1 + len(t.samples_ms)
            st["timer"], st["call_s"] = t.timer, statistics.median(walls) / 1e3
            if on_timed is not None:
                on_timed(statistics.median(walls))
            rounds += 1
            want = block_size(prior + cur, most)
            if len(cur) >= want or rounds > MAX_ROUNDS or out_of_time():
                break
            tell(b, 1 + want - len(cur) + MIN_BLOCK_REP * st["per_chunk"], prior + cur)
        samples.append(cur)
        waits.append(hostwait.wait_share(walls, waited))
        med_ms = statistics.median(cur)
        st["per_chunk"] = max(1, min(20, int(E2E_CHUNK_MS_HINT / max(med_ms, 1e-3))))
        prior_ch = [x for blk in chunks for x in blk]
        ch: list[float] = []
        rounds = 0
        while True:  # back to back, in chunks sized the same way
            want = block_size(prior_ch + ch, most_chunks) if prior_ch or ch else MIN_BLOCK_REP
            tell(b, (want - len(ch)) * st["per_chunk"], prior + cur)
            more = list(back_to_back(run, arg_sets, dev, med_ms, n_chunks=max(1, want - len(ch))))
            st["calls"] += len(more) * st["per_chunk"]
            ch += more
            rounds += 1
            if len(ch) >= block_size(prior_ch + ch, most_chunks) or rounds > MAX_ROUNDS or out_of_time():
                break
        chunks.append(ch)
        stops.append((stop_reason(prior + cur, len(cur), most, out_of_time()),
                      stop_reason(prior_ch + ch, len(ch), most_chunks, out_of_time())))
        tell(b, 0, prior + cur)
    retimed()
    if on_left is not None:
        on_left(0.0)
    return SizedBlocks(samples, chunks, st["timer"], waits, rates, n_calls=st["calls"], stops=stops)


#: question D's chunks last about this many ms (:data:`hwlab.examine.E2E_CHUNK_MS`, the default of
#: :func:`hwlab.examine.back_to_back_ms`): the calls per chunk the progress estimate counts
E2E_CHUNK_MS_HINT = 5.0
