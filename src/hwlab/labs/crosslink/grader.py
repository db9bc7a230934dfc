"""Exercise 03's checkers: name the straggler ranks, propose TP groups for a topology."""
from __future__ import annotations

from typing import Any

from hwlab.core.grading import ExerciseResult, not_done
from hwlab.core.mapping import choose_tp_groups, evaluate
from hwlab.core.topology import link_rank
from hwlab.labs.crosslink.report import rank_tail_pct


def grade_straggler(answer: list[int] | None, report: dict[str, Any]):
    if answer is None:
        return not_done("straggler", "List the tail ranks, e.g. [1, 5].")
    want = sorted(report["tail_ranks"])
    if sorted(answer) == want:
        return ExerciseResult("straggler", "passed", f"ranks {want} are the tail: the slowest one's own work "
                              f"(compute + TP all-reduce) exceeds the others' by {rank_tail_pct(report):.0f}% of "
                              "the step.")
    return ExerciseResult("straggler", "wrong", f"you named {sorted(answer)}. Compare each rank's "
                          "compute + TP all-reduce time, not its step time (every rank's step "
                          "includes waiting for the slowest).")


def grade_mapping(topo, groups: list[list[int]] | None, tp: int):
    """The learner's TP groups must cover every GPU once, in groups of ``tp``, and their slowest
    link must be as fast as the best any partition can reach on this topology."""
    if groups is None:
        return not_done("mapping", "Give TP groups as lists of GPU ordinals, e.g. [[0, 1], [2, 3]].")
    if any(len(g) != tp for g in groups):
        return ExerciseResult("mapping", "wrong", f"every TP group needs {tp} GPUs")
    try:
        mine = evaluate(topo, groups)
    except ValueError as e:
        return ExerciseResult("mapping", "wrong", str(e))
    if len({g for grp in mine.groups for g in grp}) != topo.n_gpus:
        return ExerciseResult("mapping", "wrong", "every GPU must be in exactly one group")
    best = evaluate(topo, choose_tp_groups(topo, tp))
    if link_rank(mine.worst) > link_rank(best.worst):
        # the best grouping's slowest link is not named: it is the answer's half (issue 49, item 3)
        return ExerciseResult("mapping", "wrong", f"a group crosses {mine.worst} ({mine.crossings}), which is not "
                              "the best these GPUs allow: read the matrix cells between each pair you could group "
                              "and rank their classes by the legend under the matrix.")
    return ExerciseResult("mapping", "passed", f"slowest link {mine.worst} in every group, the best "
                          f"this topology allows; predicted all-reduce {mine.step_us:,.0f} us.")


#: the flowchart's B threshold (a kernel over 1.5x its floor is slow by itself)
SLOW_KERNEL_X = 1.5


def grade_suspect(answer: str | None, signature_row: dict[str, Any]):
    """'mapping' or 'kernel' for one measured signature (:func:`~.report.signature_row`). The
    right answer comes from the measurements: a rank tail with the single-device baseline within
    1.5x of its floor is the mapping (the seed's topology signature); no tail with the baseline
    slow is the kernel (the seed's counter-example)."""
    if answer is None:
        return not_done("suspect", "Answer 'mapping' or 'kernel'.")
    if answer not in ("mapping", "kernel"):
        return ExerciseResult("suspect", "wrong", f"answer 'mapping' or 'kernel', not {answer!r}")
    tail, slow = bool(signature_row["tail_ranks"]), signature_row["slowdown_vs_floor"] >= SLOW_KERNEL_X
    want = "mapping" if tail and not slow else "kernel" if slow and not tail else None
    if want is None:
        return ExerciseResult("suspect", "wrong", "this signature is mixed (tail and slow kernel): fix the "
                              "kernel first, then re-measure the tail")
    why = (f"ranks {signature_row['tail_ranks']} finish late while one rank's compute alone is "
           f"{signature_row['slowdown_vs_floor']:.2f}x its floor (normal)" if want == "mapping" else
           f"no rank tail, and one rank's compute alone is {signature_row['slowdown_vs_floor']:.2f}x its floor")
    if answer == want:
        return ExerciseResult("suspect", "passed", f"{want}: {why}.")
    return ExerciseResult("suspect", "wrong", f"not {answer}: {why}. Every rank waits in collectives in both "
                          "cases; the tail and the single-device baseline tell them apart.")


# ---------------------------------------------------------------- exercise 03: a job's rank map
def job_topology(topo, devices: list[int]):
    """The part of ``topo`` a job sees: only the GPUs it was given (links between them kept)."""
    from hwlab.core.topology import Topology

    names = [topo._name(d) for d in devices]
    links = {(a, b): c for (a, b), c in topo.links.items() if a in names and b in names}
    return Topology(gpus=names, links=links, source=topo.source)


def job_groups(order: list[int], tp: int) -> list[list[int]]:
    """TP groups of consecutive ranks, as device ordinals: rank r runs on ``order[r]``."""
    return [list(order[i:i + tp]) for i in range(0, len(order), tp)]


def crossing_groups(topo, order: list[int], tp: int) -> list[list[int]]:
    """Rank groups (lists of ranks) whose devices include a pair not linked by NVLink."""
    from hwlab.core.topology import is_nvlink

    out = []
    for i in range(0, len(order), tp):
        ranks = list(range(i, min(i + tp, len(order))))
        devs = [order[r] for r in ranks]
        if any(not is_nvlink(topo.link(a, b)) for j, a in enumerate(devs) for b in devs[j + 1:]):
            out.append(ranks)
    return out
