"""Exercise 03's checkers: name the straggler ranks, propose TP groups for a topology."""
from __future__ import annotations

from typing import Any

from ...exercise import ExerciseResult, not_done
from ...mapping import choose_tp_groups, evaluate
from ...topology import link_rank


def grade_straggler(answer: list[int] | None, report: dict[str, Any]):
    if answer is None:
        return not_done("straggler", "List the tail ranks, e.g. [1, 5].")
    want = sorted(report["tail_ranks"])
    if sorted(answer) == want:
        return ExerciseResult("straggler", "passed", f"ranks {want} are the tail: their own work "
                              f"(compute + TP all-reduce) is {report['tail_pct']:.0f}% over the others.")
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
        return ExerciseResult("mapping", "wrong", f"a group crosses {mine.worst} ({mine.crossings}); "
                              f"groups whose slowest link is {best.worst} exist on this machine.")
    return ExerciseResult("mapping", "passed", f"slowest link {mine.worst} in every group, the best "
                          f"this topology allows; predicted all-reduce {mine.step_us:,.0f} us.")
