"""Achieved rates against the measured ceilings, judged by working set against the cache, and
wasted traffic: what an examination may take as DRAM evidence.

**Working set against the cache.** A rate above the copy ceiling (moved bytes over the measured
time) is explained either by a cache (the bytes were re-read from L2 / the CPU's LLC, not DRAM)
or by a ceiling measured low (a quick copy at small sizes, a busy host when it was cached). The
working set decides: with ``working_set >= CACHE_FACTOR x cache`` (:data:`CACHE_FACTOR` = 4), at
most a quarter of the bytes can have been served from the cache, so the DRAM-served rate is at
least three quarters of the achieved rate, at or above 75% of the ceiling when the achieved rate
exceeds it: over F's 60% line either way. Then the rate proves the ceiling low, and the
examination *raises* the ceiling to the achieved rate (for this examination only: not
re-measured, not cached; ``hwlab doctor --remeasure`` measures it again) and says so; the walk
then reads DRAM at 100% of the raised ceiling. Below that factor the refusal stands: a
cache-resident rate is not DRAM evidence.

A FLOP rate above the GEMM ceiling needs no cache test: FLOPs do not come from a cache, so the
achieved rate proves the GEMM ceiling low, and it is raised the same way.

**Wasted traffic** (:func:`traffic_ratio`, :func:`dram_bytes_lower_bound`). A last-level cache
can spare DRAM only what is resident in it: at each op boundary (an op starting after the ops
before it, the first one after the previous call) at most the cache's own size of what earlier
ops left can be handed to the next op, so

    DRAM bytes >= moved bytes - cache bytes x op boundaries

(:data:`CACHE_BOUND_RULE`). That lower bound over the required bytes (each input and output once)
of :data:`WASTE_RATIO` (2) or more means half or more of the DRAM traffic is re-reads of
intermediates or re-fetched sectors, as a sector amplification of 2 does: F answers YES (the
seed's G: bandwidth, layout, fusion). Where the bound is at or under the required bytes (small
tensors, a large cache) no waste is proven and no ratio is given: re-reads may all be cache hits.
"""
from __future__ import annotations

from dataclasses import dataclass

#: a working set this many times the last-level cache keeps at most 1/CACHE_FACTOR of it resident
CACHE_FACTOR = 4.0
#: DRAM bytes at least (the cache bound) over required bytes at or above this is wasted traffic
#: (as a sector amplification of 2)
WASTE_RATIO = 2.0
#: the per-op cache bound on DRAM traffic, as the walk states it
CACHE_BOUND_RULE = "DRAM bytes >= moved - cache x op boundaries"


@dataclass(frozen=True)
class Settled:
    """The ceiling to judge one rate against, and what was decided."""
    ceiling: float
    raised: bool
    note: str | None  # what was done and why (None: the measured ceiling stands)


def past_cache(working_set_bytes: int | float | None, cache_bytes: int | None) -> bool:
    """True when the working set is at least :data:`CACHE_FACTOR` x the cache (both known)."""
    return bool(working_set_bytes and cache_bytes) and working_set_bytes >= CACHE_FACTOR * cache_bytes


def settle_copy(achieved_gbps: float | None, ceiling_gbps: float | None, working_set_bytes: float | None,
                cache_bytes: int | None, what: str = "the function") -> Settled:
    """The copy ceiling to judge ``achieved_gbps`` against (module doc)."""
    if not achieved_gbps or not ceiling_gbps or achieved_gbps <= ceiling_gbps:
        return Settled(ceiling_gbps or 0.0, False, None)
    if not past_cache(working_set_bytes, cache_bytes):
        size = "unknown" if not cache_bytes else f"{cache_bytes / 1e6:,.0f} MB"
        return Settled(ceiling_gbps, False, (
            f"{what} moved {achieved_gbps:,.4g} GB/s, above the measured copy ceiling {ceiling_gbps:,.4g} GB/s, "
            f"with a working set of {(working_set_bytes or 0) / 1e6:,.4g} MB against a cache of {size} (under "
            f"{CACHE_FACTOR:g}x): the bytes may have come from the cache, so the rate is not DRAM evidence"))
    return Settled(achieved_gbps, True, (
        f"copy ceiling RAISED to the achieved {achieved_gbps:,.4g} GB/s for {what} (measured "
        f"{ceiling_gbps:,.4g} GB/s): its working set of {working_set_bytes / 1e6:,.4g} MB is at least "
        f"{CACHE_FACTOR:g}x the {cache_bytes / 1e6:,.4g} MB cache, so the bytes crossed DRAM and the measured "
        "ceiling is low; raised for this examination only (not re-measured, not cached: "
        "`hwlab doctor --remeasure` measures it again)"))


def settle_gemm(achieved_tflops: float | None, ceiling_tflops: float | None, dtype: str | None,
                what: str = "the function") -> Settled:
    """The GEMM ceiling to judge ``achieved_tflops`` against: raised to an achieved rate above it."""
    if not achieved_tflops or not ceiling_tflops or achieved_tflops <= ceiling_tflops:
        return Settled(ceiling_tflops or 0.0, False, None)
    return Settled(achieved_tflops, True, (
        f"{dtype or ''} GEMM ceiling RAISED to the achieved {achieved_tflops:,.4g} TFLOP/s for {what} (measured "
        f"{ceiling_tflops:,.4g} TFLOP/s): FLOPs do not come from a cache, so the measured ceiling is low; raised "
        "for this examination only (not re-measured, not cached: `hwlab doctor --remeasure` measures it again)"))


def dram_bytes_lower_bound(moved_bytes: float | None, cache_bytes: int | None, n_op_boundaries: int | None) -> float | None:
    """The least DRAM traffic ``moved_bytes`` can cost (module doc, :data:`CACHE_BOUND_RULE`):
    moved minus one cache per op boundary, never below 0. None where the cache or the op count
    is unknown."""
    if moved_bytes is None or not cache_bytes or n_op_boundaries is None or n_op_boundaries < 0:
        return None
    return max(0.0, float(moved_bytes) - float(cache_bytes) * n_op_boundaries)


def traffic_ratio(moved_bytes: float | None, required_bytes: float | None, cache_bytes: int | None,
                  n_op_boundaries: int | None) -> float | None:
    """The DRAM lower bound (:func:`dram_bytes_lower_bound`) over the required bytes where it exceeds
    them (waste is then proven whatever the cache held), else None (module doc)."""
    if not moved_bytes or not required_bytes:
        return None
    bound = dram_bytes_lower_bound(moved_bytes, cache_bytes, n_op_boundaries)
    if bound is None or bound <= float(required_bytes):
        return None
    return bound / float(required_bytes)
