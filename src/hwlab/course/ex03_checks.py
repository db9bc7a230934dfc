"""Exercise 03 (a job's rank map): on a recorded capture, the rank groups whose GPUs are not linked by
NVLink, the matrix cells that show it and the leaf (:func:`check_crossing`), and better groups over the
job's own GPUs (:func:`check_job_mapping`)."""
from __future__ import annotations

from hwlab.course.exercise import ExerciseResult, not_done
from hwlab.course.tries import Reference, graded, recheck_own_path

#: the leaf a TP group that crosses a link other than NVLink answers (rank mapping)
CROSSING_LEAF = "L"


def crossing_reference(topo, order: list[int], tp: int, crossing=None, evidence=None, leaf=None) -> Reference:
    """What passes :func:`check_crossing`: the crossing rank groups, a cell of each, and the leaf."""
    from hwlab.core.topology import is_nvlink
    from hwlab.diagnosis import flowchart
    from hwlab.labs.crosslink.grader import crossing_groups

    want = crossing_groups(topo, order, tp)
    cells = {}
    for g in want:
        devs = [order[r] for r in g]
        a, b = next((a, b) for j, a in enumerate(devs) for b in devs[j + 1:] if not is_nvlink(topo.link(a, b)))
        cells[(a, b)] = topo.link(a, b)
    return Reference({"CROSSING": want, "EVIDENCE": cells, "LEAF": CROSSING_LEAF},
                     how=f"leaf {CROSSING_LEAF}: {flowchart.LEAVES[CROSSING_LEAF].title}")


@graded(crossing_reference)
def check_crossing(topo, order: list[int], tp: int, crossing, evidence, leaf) -> ExerciseResult:
    """Exercise 03, part 1: which rank groups of the job cross a link that is not NVLink, the
    matrix cells that show it (``{(gpu_a, gpu_b): "CELL"}``, at least one pair of each crossing
    group, each as the matrix prints it), and the flowchart leaf. Everything is recomputed from
    the capture; a wrong answer is told which evidence contradicts it, never the right groups."""
    from hwlab.core.topology import is_nvlink
    from hwlab.diagnosis import flowchart
    from hwlab.labs.crosslink.grader import crossing_groups

    name = "groups on the slow link"
    if crossing is None or evidence is None or leaf is None:
        return not_done(name, "Set CROSSING (rank groups), EVIDENCE ({(gpu, gpu): 'cell'}) and LEAF.")
    want = crossing_groups(topo, order, tp)
    try:
        mine = [sorted(int(r) for r in g) for g in crossing]
    except TypeError:
        return ExerciseResult(name, "wrong", "CROSSING is a list of rank groups, e.g. [[0, 1]]")
    groups = {tuple(range(i, min(i + tp, len(order)))) for i in range(0, len(order), tp)}
    for g in mine:
        if tuple(g) not in groups:
            return ExerciseResult(name, "wrong", f"ranks {g} are not one of the job's TP groups (consecutive ranks, "
                                  f"{tp} per group)")
    for g in mine:
        if g not in want:
            devs = [order[r] for r in g]
            cells = ", ".join(f"GPU{a}-GPU{b} {topo.link(a, b)}" for j, a in enumerate(devs) for b in devs[j + 1:])
            return ExerciseResult(name, "wrong", f"ranks {g} run on GPUs {devs}: the matrix links them by {cells}, "
                                  "all NVLink. Map each rank to its GPU first (rank r runs on the r-th ordinal of "
                                  "the device list).")
    if len(mine) < len(want):
        return ExerciseResult(name, "wrong", f"you named {len(mine)} group(s); another group's GPUs are linked by a "
                              "path that is not NVLink. Read the matrix cell of every pair in every group.")
    if not isinstance(evidence, dict) or not evidence:
        return ExerciseResult(name, "wrong", "EVIDENCE is a dict {(gpu_a, gpu_b): 'CELL'} of matrix cells")
    covered = set()
    for pair, cell in evidence.items():
        try:
            a, b = (int(x) for x in pair)
        except (TypeError, ValueError):
            return ExerciseResult(name, "wrong", f"EVIDENCE key {pair!r}: give a pair of GPU ordinals, e.g. (0, 1)")
        if not (0 <= a < topo.n_gpus and 0 <= b < topo.n_gpus) or a == b:
            return ExerciseResult(name, "wrong", f"EVIDENCE key {pair!r}: not a pair of this machine's GPUs")
        real = topo.link(a, b)
        if str(cell).strip().upper() != real.upper():
            return ExerciseResult(name, "wrong", f"the matrix does not print {cell!r} for GPU{a}-GPU{b}: read its "
                                  f"row GPU{a}, column GPU{b} again")
        if is_nvlink(real):
            return ExerciseResult(name, "wrong", f"GPU{a}-GPU{b} is {real}, NVLink: it is not what makes a group slow")
        covered |= {tuple(g) for g in want if {a, b} <= {order[r] for r in g}}
    if len(covered) < len(want):
        return ExerciseResult(name, "wrong", "cite at least one pair of each group you named, as GPU ordinals "
                              "(a pair inside the group's devices)")
    leaf_id = str(leaf).strip().upper()
    if leaf_id not in flowchart.LEAVES:
        return ExerciseResult(name, "wrong", f"LEAF = {leaf!r}: give a leaf id of the chart ({', '.join(flowchart.LEAVES)})")
    if leaf_id != CROSSING_LEAF:
        return ExerciseResult(name, "wrong", "groups and evidence are right; " + recheck_own_path(leaf_id))
    cells = "; ".join(f"GPU{int(a)}-GPU{int(b)} {c}" for (a, b), c in evidence.items())
    return ExerciseResult(name, "passed", f"ranks {want} cross a link that is not NVLink ({cells}): leaf "
                          f"{leaf_id}, {flowchart.LEAVES[leaf_id].title}.")


def mapping_reference(topo, devices: list[int], groups=None, tp: int = 2) -> Reference:
    """What passes :func:`check_job_mapping`: groups over the job's GPUs whose slowest link is the best."""
    from hwlab.core.mapping import choose_tp_groups, evaluate
    from hwlab.labs.crosslink.grader import job_topology

    job = job_topology(topo, devices)
    best = choose_tp_groups(job, tp)
    ordinals = [[int(str(g).upper().removeprefix("GPU")) for g in grp] for grp in best]
    return Reference({"MY_GROUPS": ordinals, "slowest link in every group": evaluate(job, best).worst})


@graded(mapping_reference)
def check_job_mapping(topo, devices: list[int], groups, tp: int) -> ExerciseResult:
    """Exercise 03, part 2: TP groups over the job's own GPUs (``devices``) whose slowest link is
    the best any partition of those GPUs reaches (Lab 3's :func:`~hwlab.labs.crosslink.grade_mapping`
    on the part of the capture the job sees)."""
    from hwlab.labs.crosslink.grader import grade_mapping, job_topology

    if groups is not None:
        try:
            groups = [[int(str(g).upper().removeprefix("GPU")) for g in grp] for grp in groups]
        except (TypeError, ValueError):
            return ExerciseResult("mapping", "wrong", "MY_GROUPS is a list of groups of GPU ordinals")
        extra = sorted({g for grp in groups for g in grp} - set(devices))
        if extra:
            return ExerciseResult("mapping", "wrong", f"GPU(s) {extra} are not this job's: it was given {devices}")
    return grade_mapping(job_topology(topo, devices), groups, tp)
