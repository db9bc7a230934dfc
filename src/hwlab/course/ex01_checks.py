"""Exercise 01 (the transposed chain, :mod:`hwlab.labs.bandwidth.transposed`): the learner predicts the
bytes the eager version moves over the floor (:func:`check_bytes_prediction`, against the access meter's
count, :mod:`hwlab.core.access_meter`), then writes the kernel (:func:`check_transposed_kernel`): it must
run *the learner's* Triton kernel (:mod:`hwlab.course.own_kernel_check`). Allocation and copies are
allowed, and then counted: in the interpreter the bytes the call moves must be within
:data:`TRANSPOSED_MAX_BYTES_X` of the floor and its warp requests must use
:data:`TRANSPOSED_MIN_SECTOR_USE` of the sectors they touch; on a GPU, the speed band."""
from __future__ import annotations

import torch

from hwlab.course.exercise import ExerciseResult, not_done
from hwlab.course.own_kernel_check import check_own_kernel
from hwlab.course.tries import Reference, graded

#: the fused kernel's bytes moved may exceed the floor by this factor (edge sectors of a tile,
#: the bias read per tile); the eager chain moves several times the floor
TRANSPOSED_MAX_BYTES_X = 1.1
#: the share of every fetched sector's bytes the kernel must use: a tile whose rows span at least
#: one sector uses all of them; lanes striding down a column use 2 bytes of 32 (fp16)
TRANSPOSED_MIN_SECTOR_USE = 0.8
#: a predicted bytes ratio passes within this relative distance of the measured one: counting
#: passes gives the ratio to a few %, the bias vector being the only part that does not scale
PREDICTION_REL_TOL = 0.1
#: GPU pass band of the transposed chain, % of the measured copy bandwidth: below Lab 1's chain's
#: 70% because a transpose goes through shared memory; a band set from the kit's reasoning, not yet
#: from an H200 run of a learner's kernel
TRANSPOSED_MIN_PCT = 60.0


def _traffic_lines(tr) -> str:
    parts = []
    for row in tr.per_launch():
        if "kernel" in row:
            lu, su = row["load_sector_use"], row["store_sector_use"]
            parts.append(f"kernel {row['kernel']}: {row['dram_bytes']:,} B, loads use "
                         f"{'-' if lu is None else f'{100 * lu:.0f}%'} and stores "
                         f"{'-' if su is None else f'{100 * su:.0f}%'} of their sectors' bytes")
        else:
            parts.append(f"torch op aten::{row['torch_op']}: {row['dram_bytes']:,} B")
    return "; ".join(parts)


def _eager_traffic(n_rows: int, n_cols: int, dtype):
    """The access meter's count of the eager transposed chain: (its traffic, the floor in bytes)."""
    from hwlab.core import access_meter
    from hwlab.labs.bandwidth import transposed

    args = transposed.make_inputs(n_rows, n_cols, dtype)
    _, tr = access_meter.meter(transposed.eager, args)
    return tr, transposed.traffic(n_rows, n_cols, args[0].element_size())["bytes_required"]


def bytes_reference(ratio, n_rows: int, n_cols: int, dtype=torch.float16) -> Reference:
    """What passes :func:`check_bytes_prediction`: the metered ratio and the band around it."""
    tr, floor = _eager_traffic(n_rows, n_cols, dtype)
    m = tr.dram_bytes / floor
    return Reference({"bytes moved / bytes required (access meter)": m,
                      "accepted from": m * (1 - PREDICTION_REL_TOL), "accepted to": m * (1 + PREDICTION_REL_TOL)},
                     how=f"the eager chain ran {_traffic_lines(tr)}, over a floor of {floor:,} B")


@graded(bytes_reference)
def check_bytes_prediction(ratio, n_rows: int, n_cols: int, dtype=torch.float16) -> ExerciseResult:
    """Exercise 01, part 1: the learner's predicted ratio of the bytes the eager transposed chain
    moves to the floor, against the ratio the access meter counts (:mod:`hwlab.core.access_meter`)
    on this machine, within :data:`PREDICTION_REL_TOL`. The message on a miss names the passes the
    meter saw and how to count them, never the ratio nor which way the prediction misses (a direction
    would let halving find the band without the count)."""
    name = "bytes the eager chain moves"
    if ratio is None:
        return not_done(name, "Set MY_BYTES_RATIO to your predicted (bytes moved) / (bytes required).")
    try:
        ratio = float(ratio)
    except (TypeError, ValueError):
        return ExerciseResult(name, "wrong", f"MY_BYTES_RATIO = {ratio!r}: give one number, e.g. 1.5")
    tr, floor = _eager_traffic(n_rows, n_cols, dtype)
    measured = tr.dram_bytes / floor
    if abs(ratio - measured) <= PREDICTION_REL_TOL * measured:
        return ExerciseResult(name, "passed", f"you predicted {ratio:.2f}x; the eager chain moved {tr.dram_bytes:,} B "
                              f"over a floor of {floor:,} B = {measured:.2f}x ({_traffic_lines(tr)}; counted "
                              "on this machine's CPU by the access meter, an estimate from the tensors each op "
                              "reads and writes).", answer=ratio, expected=round(measured, 3))
    ops = ", ".join("aten::" + o.name for o in tr.torch_ops)
    return ExerciseResult(name, "wrong", f"you predicted {ratio:.2f}x, outside the band (within "
                          f"{100 * PREDICTION_REL_TOL:.0f}% of what the meter counted). The eager chain ran {len(tr.torch_ops)} ops ({ops}): "
                          "count, for each, the tensors it reads and the tensor it writes, in elements "
                          "(bias is cols, the rest rows x cols), and divide by what the work must read and write.",
                          answer=ratio)


def transposed_reference(learner_fn, learner_kernels, n_rows: int, n_cols: int, dtype=torch.float16, **kw) -> Reference:
    """What passes :func:`check_transposed_kernel`: a kernel, described (its answer is code)."""
    from hwlab.labs.bandwidth import transposed

    floor = transposed.traffic(n_rows, n_cols, torch.tensor([], dtype=dtype).element_size())["bytes_required"]
    return Reference(how=(
        "a passing answer is one @triton.jit kernel of your own, launched from your function with no torch op "
        "computing beside it: each program loads a 2-D tile of x with its lanes along x's rows (the contiguous "
        "axis), adds the bias, applies gelu_tanh(t) * scale + shift in fp32, transposes the tile in registers "
        "(tl.trans) and stores it with its lanes along y's rows, cast to y's dtype; it reads x and bias and "
        f"writes y once, about 1.00x the floor of {floor:,} B, with every fetched sector used"))


@graded(transposed_reference)
def check_transposed_kernel(learner_fn, learner_kernels, n_rows: int, n_cols: int, dtype=torch.float16, *,
                            ceiling_gbps: float | None = None, min_pct: float = TRANSPOSED_MIN_PCT,
                            device=None) -> ExerciseResult:
    """Exercise 01, part 2: the learner's own Triton kernel for ``gelu_tanh(x + bias).T``
    (:mod:`hwlab.labs.bandwidth.transposed`): their kernel runs and nothing else computes
    (:func:`check_own_kernel`), the output matches float64 on fresh data, then (interpreter)
    the bytes it moves are within :data:`TRANSPOSED_MAX_BYTES_X` of the floor and its warp
    requests use at least :data:`TRANSPOSED_MIN_SECTOR_USE` of the sectors they touch; on a GPU
    the speed band against this machine's copy bandwidth instead."""
    from hwlab.core import access_meter, tritonenv
    from hwlab.core.measure import TOL_BY_DTYPE
    from hwlab.labs.bandwidth import transposed

    name = "transposed chain"
    itemsize = torch.tensor([], dtype=dtype).element_size()
    floor = transposed.traffic(n_rows, n_cols, itemsize)["bytes_required"]
    res = check_own_kernel(name, learner_fn, learner_kernels, transposed.reference,
                           lambda: transposed.make_inputs(n_rows, n_cols, dtype, device),
                           tol=TOL_BY_DTYPE[str(dtype).replace("torch.", "")], n_bytes=floor,
                           ceiling_gbps=ceiling_gbps, min_pct=min_pct, device=device,
                           hint="y is (cols, rows); compute in fp32 and cast on store.")
    if not res.passed or not tritonenv.INTERPRETED:
        return res
    _, tr = access_meter.meter(learner_fn, transposed.make_inputs(n_rows, n_cols, dtype))
    moved_x, use = tr.dram_bytes / floor, tr.sector_use
    facts = (f"bytes moved {tr.dram_bytes:,} over a floor of {floor:,} = {moved_x:.2f}x; {_traffic_lines(tr)} "
             "[counted in the Triton interpreter on this machine's CPU: an estimate from the addresses]")
    if moved_x > TRANSPOSED_MAX_BYTES_X:
        return ExerciseResult(name, "wrong", f"correct, but it moves too many bytes: {facts}. The band is "
                              f"<= {TRANSPOSED_MAX_BYTES_X:.2f}x: each pass beyond one writes an intermediate "
                              "and reads it back.")
    if use is None or use < TRANSPOSED_MIN_SECTOR_USE:
        return ExerciseResult(name, "wrong", f"correct and one pass, but its warp requests use "
                              f"{0 if use is None else 100 * use:.0f}% of the bytes of the sectors they touch "
                              f"(band >= {100 * TRANSPOSED_MIN_SECTOR_USE:.0f}%): {facts}. A side under the band "
                              "has lanes whose neighbours sit a whole row apart in memory.")
    return ExerciseResult(name, "passed (correctness and traffic)",
                          f"correct on fresh random inputs; {facts}. Speed is graded on a GPU (the "
                          "interpreter is not a performance model).")
