"""Checking a learner's answer in ``exercises/``: correctness first, then a pass band.

Pass bands are relative to what *this* machine measured (e.g. "at least 70% of your
measured copy bandwidth"), so the same exercise is fair on an L4 and on an H200. On a CPU,
kernels run in the Triton interpreter, which says nothing about GPU speed: the speed band is
skipped there and the result says so.

An unfinished exercise (the learner's function still raises ``NotImplementedError`` or
returns ``None``) is reported as "not done yet", never as an error, so the notebook runs
to the end.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from hwlab.core.grading import ExerciseResult, not_done  # noqa: F401  (the result type lives in the core; re-exported)
from hwlab.core.measure import CorrectnessError, bench, check_close, device_of
from hwlab.course.tries import Reference, graded


def kernel_reference(name: str, learner_fn, reference, make_inputs, *, tol: float, min_pct: float = 70.0,
                     **kw) -> Reference:
    """What passes :func:`check_kernel`: described (its answer is code)."""
    return Reference(how=f"a passing kernel matches the reference within {tol:g} on fresh random inputs and, on a "
                         f"GPU, reaches at least {min_pct:.0f}% of this machine's measured copy bandwidth")


def value_reference(name: str, answer: Any, expected: Any, explain: str) -> Reference:
    """What passes :func:`check_value`: the expected answer."""
    return Reference({"answer": expected}, how=explain)


@graded(kernel_reference)
def check_kernel(name: str, learner_fn: Callable[..., Any], reference: Callable[..., Any],
                 make_inputs: Callable[[], Sequence[Any]], *, tol: float, n_bytes: int,
                 n_flops: int = 0, ceiling_gbps: float | None = None, min_pct: float = 70.0,
                 device=None, n_trials: int = 3, hint: str = "") -> ExerciseResult:
    """Grade a learner's kernel on ``n_trials`` fresh random inputs, then against a band.

    The band: achieved GB/s >= ``min_pct`` % of ``ceiling_gbps`` (this machine's measured
    copy bandwidth). Without a GPU only correctness is graded.
    """
    dev = device_of(device)
    try:
        for _ in range(n_trials):
            args = make_inputs()
            out = learner_fn(*args)
            if out is None:
                return not_done(name, hint)
            ref = reference(*args)
            if isinstance(out, torch.Tensor) and out.shape != ref.shape:
                return ExerciseResult(name, "wrong", f"your output has shape {tuple(out.shape)}; the reference's "
                                      f"is {tuple(ref.shape)}.")
            check_close(out, ref, tol, what=name)
    except NotImplementedError:
        return not_done(name, hint)
    except CorrectnessError as e:
        return ExerciseResult(name, "wrong", f"{e}. Check indexing, masking and the dtype of "
                              "the accumulation on fresh random data.")
    if dev.type != "cuda" or not ceiling_gbps:
        return ExerciseResult(name, "passed (correctness only)",
                              f"correct on {n_trials} fresh random inputs; speed is graded only "
                              "on a GPU (the Triton interpreter is not a performance model).")
    m = bench(name, learner_fn, make_inputs, n_bytes=n_bytes, n_flops=n_flops,
              reference=reference, tol=tol, device=dev).with_ceilings(
                  gbps=ceiling_gbps, source="this machine's measured copy")
    pct = m.pct_of_bw_ceiling or 0.0
    if pct < min_pct:
        return ExerciseResult(name, "too slow", f"{m.gbps:,.0f} GB/s is {pct:.0f}% of your "
                              f"measured {ceiling_gbps:,.0f} GB/s; the band starts at {min_pct:.0f}%. "
                              + hint, m)
    return ExerciseResult(name, "passed", f"{m.gbps:,.0f} GB/s = {pct:.0f}% of your measured "
                          f"copy bandwidth (band >= {min_pct:.0f}%).", m)


@graded(value_reference)
def check_value(name: str, answer: Any, expected: Any, explain: str) -> ExerciseResult:
    """Grade a short answer (a flowchart leaf, a config choice)."""
    if answer is None or answer is Ellipsis:
        return not_done(name)
    if answer == expected:
        return ExerciseResult(name, "passed", explain, answer=answer, expected=expected)
    return ExerciseResult(name, "wrong", f"you answered {answer!r}. {explain}", answer=answer, expected=expected)
