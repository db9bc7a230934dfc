"""A learner who plays the feedback instead of reading the evidence passes no sooner than one who
guesses (issue 60, item 2): on leaves, a bisecting learner switches to the other branch of the question a
message names; on predictions and counts, a halving learner moves its bounds on any direction a message
gives. Played on every checkpoint's real walk (the notebooks' evidence and the recorded examinations,
which reach every leaf of the chart) and on the exercise checks that grade a leaf or a number."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hwlab.course import checkpoint as C
from hwlab.course import classroom, ex01_checks, ex03_checks, tries
from hwlab.diagnosis import flowchart

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_checkpoint import _checkpoints, _cp, _examine, _lab03, _lab04  # noqa: E402

LEAVES = list(flowchart.LEAVES)
QUESTION = re.compile(r"\b(" + "|".join(flowchart.QUESTIONS) + r")\b \(")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(tries, "_wrong", {})
    monkeypatch.setattr(tries, "_pending", {})
    monkeypatch.delenv(classroom.ENV_DIR, raising=False)


def _walks_to_every_leaf() -> dict[str, C.Checkpoint]:
    """One checkpoint per leaf of the chart, on real walks: the notebooks' and the recorded examinations'."""
    out: dict[str, C.Checkpoint] = {}
    for cp in [*_checkpoints(), _cp(_lab03(), cid="03"), _cp(_lab04(), step="D", cid="04"),
               *(_cp(ev, cid=name) for name, ev in _examine().items())]:
        out.setdefault(cp.walk.leaf_id, cp)
    return out


def _other_branch(qid: str, mine: str) -> set[str]:
    q = flowchart.QUESTIONS[qid]
    yes = classroom.leaves_under(q.yes)
    return classroom.leaves_under(q.no) if mine in yes else yes


def _bisector(grade) -> int:
    """Tries a bisecting learner takes to pass: guess the middle candidate; on a wrong message, keep only
    the leaves on the other branch of the first question the message names (where a message that says
    where the path leaves the evidence sends it), else drop the guess. Falls back to the untried leaves."""
    cands, tried = list(LEAVES), []
    while True:
        pool = [x for x in cands if x not in tried] or [x for x in LEAVES if x not in tried]
        guess = pool[len(pool) // 2]
        tried.append(guess)
        ok, text = grade(guess)
        if ok:
            return len(tried)
        named = QUESTION.findall(text)
        keep = _other_branch(named[0], guess) & set(cands) if named else set()
        cands = [x for x in cands if x in keep] if keep else [x for x in cands if x != guess]


def test_a_bisecting_learner_passes_no_sooner_than_guessing_leaves_at_random():
    walks = _walks_to_every_leaf()
    assert set(walks) == set(LEAVES), f"no real walk reaches {set(LEAVES) - set(walks)}"
    said: dict[str, set[str]] = {}

    def grade_on(cp):
        s = cp.asked()

        def grade(leaf):
            res = C.check(cp, C.Answer(leaf, s.metric, float(s.value),
                                       cp.prediction.actual if cp.prediction else None), record=False)
            if not res.passed:
                said.setdefault(leaf, set()).add(res.messages[0])
            return res.passed, "\n".join(res.messages)
        return grade

    n_tries = {leaf: _bisector(grade_on(cp)) for leaf, cp in walks.items()}
    # random guessing without repeats over N leaves: (N + 1) / 2 tries on average, N/2 of answers by try N/2
    assert sum(n_tries.values()) / len(n_tries) >= (len(LEAVES) + 1) / 2, n_tries
    within = sum(n <= tries.TRIES_BEFORE_REVEAL for n in n_tries.values())
    assert within <= tries.TRIES_BEFORE_REVEAL, n_tries
    # what a wrong leaf is told depends on that leaf alone: no strategy can read the right one from it
    assert all(len(texts) == 1 for texts in said.values()), {k: v for k, v in said.items() if len(v) > 1}


def test_the_crossing_check_tells_a_wrong_leaf_its_own_path_only():
    from test_feedback import DEVICES, _dgx1
    ref = ex03_checks.crossing_reference(_dgx1(), DEVICES, 2).answer
    for leaf in LEAVES:
        if leaf == ref["LEAF"]:
            continue
        res = ex03_checks.check_crossing(_dgx1(), DEVICES, 2, ref["CROSSING"], ref["EVIDENCE"], leaf)
        assert res.status == "wrong" and tries.recheck_own_path(leaf) in res.message, res.message


def _halver(grade, lo: float, hi: float, n: int = tries.TRIES_BEFORE_REVEAL) -> list[tuple[float, bool]]:
    """A halving learner's first ``n`` tries: the middle of its bounds, moved on "too high" / "too low"
    (or higher / lower, more / fewer); a message without a direction leaves the bounds, and it tries the
    middle of the upper half next."""
    out = []
    for _ in range(n):
        x = (lo + hi) / 2
        ok, text = grade(x)
        out.append((x, ok))
        if ok:
            break
        t = text.lower()
        if re.search(r"too high|too many|lower|fewer|smaller", t):
            hi = x
        elif re.search(r"too low|too few|higher|more than|larger", t):
            lo = x
        else:
            lo = x
    return out


def _no_direction(grade, passes, lo, hi, far):
    """Feedback gives no direction: the halving learner's tries are the ones it makes when every wrong try
    is answered with one fixed message (the one a guess far outside gets), i.e. without feedback."""
    played = _halver(grade, lo, hi)
    fixed = grade(far)[1]
    blind = _halver(lambda x: (passes(x), fixed), lo, hi)
    assert played == blind, (played, blind)
    return played


def test_a_halving_learner_gets_no_direction_on_a_checkpoints_prediction():
    for cp in _checkpoints():
        p = cp.prediction
        if p is None:
            continue
        s = cp.asked()

        def grade(x, cp=cp, s=s):
            res = C.check(cp, C.Answer(cp.walk.leaf_id, s.metric, float(s.value), x), record=False)
            return res.passed, "\n".join(res.messages).replace(C._fmt(x), "#")

        lo_b, hi_b = p.bounds()
        above, below = grade(hi_b * 2 + 3)[1], grade(lo_b / 2 - 3)[1]
        assert above == below, (cp.id, above, below)
        _no_direction(grade, p.holds, 0.0, max(64.0, hi_b * 4), hi_b * 2 + 3)


def test_a_halving_learner_gets_no_direction_on_exercise_01s_byte_ratio():
    rows, cols = 96, 160
    ref = ex01_checks.bytes_reference(None, rows, cols).answer
    measured = next(iter(ref.values()))

    def grade(x):
        res = ex01_checks.check_bytes_prediction(x, rows, cols)
        return res.status == "passed", res.message.replace(f"{x:.2f}", "#")

    assert grade(measured * 3 + 7)[1] == grade(measured / 4)[1]
    _no_direction(grade, lambda x: abs(x - measured) <= ex01_checks.PREDICTION_REL_TOL * measured, 0.0, 16.0,
                  measured * 3 + 7)
