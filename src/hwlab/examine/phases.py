"""The phases of :func:`hwlab.examine.examine` that are not the walk: the checked call, the
rotating input sets, counting bytes and FLOPs, the moved bytes, and the ceilings settled against
achieved rates (the order and the rules are in :mod:`hwlab.examine`'s module doc)."""
from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any, Callable

from hwlab.core import ceilings as ceilings_mod
from hwlab.core.measure import InsufficientMemoryError, l2_bytes_of, n_rotating_sets, require_memory, synchronize
from hwlab.errors import UserInputError
from hwlab.examine.rates import settle_copy, settle_gemm

if TYPE_CHECKING:
    from hwlab.examine.estimate import Traffic


def checked_call(fn: Callable[..., Any], name: str, args: tuple, kwargs: dict, dev,
                 notes: list[str]) -> tuple[float, int, int]:
    """One call that must run, return a tensor and leave its inputs unchanged: ``(first_call_s,
    required read bytes, required written bytes)``."""
    import torch

    from hwlab.examine.estimate import required_bytes, tensors_of
    from hwlab.examine.inputs import call, fingerprint

    in_tensors = tensors_of((args, kwargs))
    before = fingerprint(in_tensors)
    t0 = time.perf_counter()
    out = call(fn, name, args, kwargs)
    synchronize(dev)
    first_call_s = time.perf_counter() - t0
    if out is None:
        raise UserInputError(f"{name} returned None: examine counts the bytes a function writes from "
                             "what it returns; return the result tensor(s)")
    if not tensors_of(out):
        raise UserInputError(f"{name} returned {type(out).__name__} with no tensor in it: return the "
                             "result tensor(s)")
    changed = [i for i, (a, b) in enumerate(zip(before, fingerprint(in_tensors)))
               if a[0] != b[0] or not (a[1] == b[1] or (math.isnan(a[1]) and math.isnan(b[1])))]
    if changed:
        raise UserInputError(f"{name} changed its input tensor(s) #{', #'.join(map(str, changed))} in place: "
                             "every repetition would run on different data. Write results to new tensors "
                             "(or clone inside the function), then examine it")
    if any(t.is_floating_point() and not torch.isfinite(t).all() for t in tensors_of(out)):
        notes.append("the output holds NaN or inf on these inputs: check the function before trusting its speed")
    read_b, written_b = required_bytes((args, kwargs), out)  # the caller's figures win, later
    return first_call_s, read_b, written_b


def probe_call(run: Callable[..., Any], arg_sets: list, dev) -> tuple[float, float]:
    """The wall and CPU seconds (this process's) of one plain call after the checked one (which may
    pay for compiling, a device's lazy start, first-touch allocation): the progress estimate's first
    unit (:mod:`hwlab.examine.progress`), and a call of warm-up the timing need not make again
    (:mod:`hwlab.examine.timing_blocks`)."""
    synchronize(dev)
    t0, c0 = time.perf_counter(), time.process_time()
    run(*arg_sets[-1])
    synchronize(dev)
    return time.perf_counter() - t0, time.process_time() - c0


def rotating_sets(args: tuple, make_inputs: Callable[[], Any] | None, kwargs: dict, dev, read_b: int,
                  notes: list[str]) -> list:
    """The argument sets the timing rotates through: enough fresh sets from ``make_inputs`` to
    pass 2x L2, else the one set (said in the notes when it may sit in L2)."""
    from hwlab.examine.inputs import check_inputs, make

    arg_sets = [args]
    l2 = l2_bytes_of(dev)
    if make_inputs is not None:
        n_sets = n_rotating_sets(max(read_b, 1), l2)
        try:
            require_memory(read_b * (n_sets - 1), dev, what="the rotating input sets")
        except InsufficientMemoryError:
            notes.append(f"{n_sets} rotating input sets do not fit in free memory: timed on one set")
            n_sets = 1
        arg_sets += [make(make_inputs, "make_inputs") for _ in range(n_sets - 1)]
        for s in arg_sets[1:]:
            check_inputs(s, kwargs)
    elif l2 and read_b < 2 * l2:
        notes.append(f"inputs not rotated (no input factory): {read_b / 2**20:.1f} MiB read per call may be "
                     f"served from the {l2 / 2**20:.0f} MiB L2; pass an input factory (--inputs)")
    return arg_sets


def count(fn: Callable[..., Any], args: tuple, kwargs: dict, want_flops: bool,
          notes: list[str]) -> tuple[Traffic, int, str]:
    """The traffic model and the FLOP count of one call each, under ``force_eager`` where torch
    has it (so counting never changes how a compiled function runs afterwards)."""
    import torch

    from hwlab.examine.estimate import Traffic, count_flops, count_traffic

    stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    guard = stance("force_eager") if stance else contextlib.nullcontext()
    flops, src = 0, ("estimated: torch.utils.flop_counter (matmul family only; none inside Triton or "
                     "compiled graphs)")
    with guard:
        try:
            traffic = count_traffic(fn, args, kwargs)
        except Exception as e:  # a function that will not run under a dispatch mode: no traffic model
            traffic = Traffic()
            notes.append(f"the traffic model could not run the function ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:150]}); moved bytes = required bytes")
        if want_flops:
            try:
                flops = count_flops(fn, args, kwargs)
            except Exception as e:
                src = f"not counted: FlopCounterMode failed ({type(e).__name__}); pass n_flops"
    return traffic, flops, src


def _fused_flops(prof, n_flops: int | None, flops_est: int, flops_src: str) -> dict[str, Any]:
    """The counter's FLOPs plus the matmul work inside fused native ops (the encoder fast path), which
    the counter sees as one op with none (:func:`hwlab.examine.fused_ops.fused_matmul_flops`); nothing
    where the caller gave the count or no fused op ran."""
    from hwlab.examine.fused_ops import fused_matmul_flops

    extra = fused_matmul_flops(getattr(prof, "calls", None) or []) if n_flops is None else 0
    if not extra:
        return {}
    return {"n_flops": flops_est + extra,
            "n_flops_source": f"{flops_src}: {flops_est:,}; plus {extra:,} inside fused native ops (the encoder "
                              "fast path: their GEMMs and attention counted from the shapes the profiler recorded)"}


def counts_of(traffic: Traffic, prof, args: tuple, kwargs: dict, read_b: int, written_b: int,
              n_bytes: int | None, n_flops: int | None, flops_est: int, flops_src: str, first_call_s: float,
              composite_ops: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """The examination's counts (required, captured and moved bytes, FLOPs, ops), each with its
    source; the dominating kernels get their op's dtypes."""
    by_op = traffic.by_op()
    for k in prof.top:  # the dtypes of each dominating kernel's op, from that op's real tensors
        op = k.get("launched_by") or ""
        for op_seen in (op, *composite_ops.get(op, ())):  # a CPU profile names composites (matmul)
            if op_seen in by_op:
                k["dtypes"] = by_op[op_seen]["dtypes"]
                break
    captured_b = traffic.captured_read_bytes((args, kwargs))
    if traffic.ops:  # inputs only read through gathers need only what the gathers touched
        read_b = min(read_b, traffic.input_read_bytes((args, kwargs)))
    counts: dict[str, Any] = {
        "required_read_bytes": read_b, "required_written_bytes": written_b,
        "captured_read_bytes": captured_b,
        "n_bytes": int(n_bytes) if n_bytes is not None else read_b + captured_b + written_b,
        "n_bytes_source": "given by the caller" if n_bytes is not None else
        "estimated: inputs (and tensors it captured: weights, closures) read once + outputs written "
        "once (unique storages)",
        "n_flops": int(n_flops) if n_flops is not None else flops_est,
        "n_flops_source": "given by the caller" if n_flops is not None else flops_src,
        **_fused_flops(prof, n_flops, flops_est, flops_src),
        "ops": traffic.counts(), "by_op": by_op, "first_call_s": first_call_s,
    }
    # moved bytes: the traffic model where it saw the kernels, else the required bytes (labelled)
    seen_all = prof.attributable_pct is None or prof.attributable_pct >= 95.0
    if prof.compiled_region or not seen_all or traffic.unamplified_bytes < read_b + captured_b + written_b:
        counts["moved_bytes"] = counts["n_bytes"]
        counts["moved_bytes_source"] = (
            "not attributable: kernels ran outside aten ops (Triton / torch.compile), so the traffic "
            "model did not see them; moved bytes = required bytes")
        counts["sector_amplification_estimated"] = None
    else:
        counts["moved_bytes"] = max(traffic.moved_bytes, counts["n_bytes"])
        counts["moved_bytes_source"] = "estimated: each aten op's tensors, reads x estimated sector amplification"
        counts["sector_amplification_estimated"] = traffic.sector_amplification
    counts["n_ops"] = len(traffic.ops)
    return counts


def settle(m, c, peak: str | None, counts: dict[str, Any], cache_b: int | None, notes: list[str]):
    """A rate above a measured ceiling: the ceiling raised where the rate proves it low
    (:mod:`hwlab.examine.rates`). Returns the measurement and ceilings to judge against."""
    s_copy = settle_copy(counts["moved_bytes"] / (m.t_ms * 1e6) if m.t_ms > 0 else None, c.copy_gbps,
                         counts["n_bytes"], cache_b)
    s_gemm = settle_gemm(m.tflops if m.n_flops and m.t_ms > 0 else None, c.gemm(peak) if peak else None, peak)
    counts["ceilings_raised"] = [x.note for x in (s_copy, s_gemm) if x.raised]
    notes += [x.note for x in (s_copy, s_gemm) if x.note]
    if s_copy.raised or s_gemm.raised:
        label = c.label
        c = ceilings_mod.Ceilings.from_dict(c.to_dict())
        if s_copy.raised:
            c.copy_gbps = s_copy.ceiling * (1 + 1e-9)  # the achieved rate reads 100%, not a rounding over it
        if s_gemm.raised:
            c.gemm_tflops[peak] = s_gemm.ceiling * (1 + 1e-9)
        c.source = (f"{label}; RAISED for this examination to the achieved "
                    + " and ".join(w for w, x in (("copy rate", s_copy), (f"{peak} GEMM rate", s_gemm)) if x.raised)
                    + " (not re-measured, not cached)")
        m = m.with_ceilings(gbps=c.copy_gbps, tflops=c.gemm(peak) if peak else None, source=c.label)
    return m, c
