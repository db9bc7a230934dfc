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


# ---------------------------------------------------------------- every exercise and reading check
#: words that give a direction: what the halving learner moves its bounds on, and what no message says
DIRECTION = re.compile(r"too high|too low|too many|too few|more than|\b(lower|higher|fewer|smaller|larger|"
                       r"slower|faster)\b", re.I)


def _play_number(label, grade, ref: float, lo: float = 0.0, hi: float | None = None):
    """A halving learner on one number of a check (the others answered right): it gets the same message
    above and below the answer (the number masked), no message it sees gives a direction, and it passes no
    sooner than it would with one fixed message."""
    hi = max(16.0, ref * 4) if hi is None else hi
    far_above, far_below = ref * 3 + 7, lo + (ref - lo) / 4
    above = grade(far_above)
    assert not above[0], label
    if ref > lo:  # a count of zero has nothing below it
        below = grade(far_below)
        assert not below[0] and above[1] == below[1], (label, above[1], below[1])
    played = _halver(grade, lo, hi)
    assert not any(DIRECTION.search(grade(x)[1]) for x, ok in played if not ok), (label, played)
    _no_direction(grade, lambda x: grade(x)[0], lo, hi, far_above)


def _masked(res, x) -> tuple[bool, str]:
    text = res.message
    forms = {f"{x:g}", f"{x:.2f}", f"{x:.1f}", f"{x:.0f}", f"{x!r}", str(int(x)) if float(x).is_integer() else "@"}
    for form in sorted(forms, key=len, reverse=True):  # the whole number, never a part of it
        text = re.sub(rf"(?<![\w.]){re.escape(form)}(?!\d|\.\d)", "#", text)
    return res.status == "passed", text


def test_a_halving_learner_gets_no_direction_on_any_reading_checks_number():
    from hwlab.course import reading_checks as R
    from test_reading_checks import (GPU_TRACE as trace, NB_RANKS, NCCL_LOG, RAW_CASES, RAW_TILES, _gaps_from_raw,
                                     _gloo_ms, _lab01, _raw_right)

    gaps = _gaps_from_raw()
    ms = _gloo_ms(NB_RANKS)
    med = {r: v[len(v) // 2] for r, v in ms.items()}
    late = min(med, key=med.get)
    early = sorted(v for r, vs in ms.items() if r != late for v in vs)
    log = NCCL_LOG.read_text()
    gbps, typ = re.search(r"INFO GPU/\S+ :.*NET/\S+ \(\d+/([\d.]+)/(\w+)\)", log).groups()
    lab01, _ = _lab01("unfused")
    lab02 = {"registers": 208, "spills": 0, "achieved_occupancy_pct": 12.44,
             "binding_metric": "launch__occupancy_limit_shared_mem"}
    raw = _raw_right()
    plays = [
        ("trace gap_us", lambda a: R.check_gpu_trace(trace, a),
         {"gap_us": gaps[len(gaps) // 2], "row": "GPU 0 stream 7", "sync_call": "cudaDeviceSynchronize"}, "gap_us"),
        ("ranks wait_ms", lambda a: R.check_rank_wait(NB_RANKS, a),
         {"late_rank": late, "wait_ms": early[len(early) // 2], "span": "gloo:all_reduce"}, "wait_ms"),
        ("nccl gbps", lambda a: R.check_nccl_path(log, a), {"gbps": float(gbps), "type": typ}, "gbps"),
        ("raw local_sectors", lambda a: R.check_ncu_raw(RAW_CASES, RAW_TILES, a), raw, "local_sectors"),
        *((f"ncu lab01 {k}", lambda a: R.check_ncu_lab01("unfused", a), lab01, k) for k in lab01),
        *((f"ncu lab02 {k}", lambda a: R.check_ncu_lab02("128x128x64 w4 s3", a), lab02, k)
          for k in ("registers", "spills", "achieved_occupancy_pct")),
    ]
    for label, check, right, key in plays:
        assert check(right).status == "passed", label

        def grade(x, check=check, right=right, key=key):
            return _masked(check({**right, key: x}), x)
        _play_number(label, grade, float(right[key]))


def test_every_wrong_name_in_a_reading_check_is_answered_without_a_direction():
    """The checks whose answer is a name (a limit row, GPU pairs, a link class, a path type): every wrong
    one is told what to re-read, never which way the right one lies."""
    from hwlab.course import reading_checks as R
    from test_reading_checks import NCCL_LOG, TOPO

    said = []
    lab02 = {"registers": 208, "spills": 0, "achieved_occupancy_pct": 12.44}
    for lim in ("registers", "shared_mem", "warps", "blocks", "nonsense"):
        said.append(R.check_ncu_lab02("128x128x64 w4 s3", {**lab02, "binding_metric": f"launch__occupancy_limit_{lim}"}))
    text = (TOPO / "dgx1_v100_hybrid_cube_mesh.txt").read_text()
    group = [0, 1, 4, 5]
    pairs = [(a, b) for a in group for b in group if a < b]
    for p in pairs:
        for link in ("SYS", "NV1", "NV2", "PIX"):
            said.append(R.check_slow_pairs(text, group, {"pairs": [p], "link": link}))
    log = NCCL_LOG.read_text()
    for p in R.facts.nccl_paths(log):
        for t in ("NET", "SYS", "NVL", "PHB"):
            said.append(R.check_nccl_path(log, {"gbps": p["gbps"], "type": t}))
    wrong = [r.message for r in said if r.status == "wrong"]
    assert len(wrong) > len(said) // 2
    assert not [m for m in wrong if DIRECTION.search(m)], [m for m in wrong if DIRECTION.search(m)][:3]


def _toolchain():
    from hwlab.course import toolchain_check
    problem = toolchain_check.toolchain_problem(static_compile=True)
    if problem:
        pytest.skip(problem)


@pytest.mark.slow
def test_a_halving_learner_gets_no_direction_on_exercise_02():
    """Exercise 02's count (blocks per SM) played by halving; its limiter and its warps played by a
    learner who tries every name and count: no message gives a direction."""
    _toolchain()
    from hwlab.course import ex02_checks as E
    from hwlab.labs.registers.occupancy import HOPPER, occupancy

    rep = E.softmax_report(256, 1)
    occ = occupancy(rep.n_regs, rep.shared_bytes, 1, HOPPER)
    limiter = E._LIMIT_WORDS[occ.binding[0]]

    def grade(x):
        return _masked(E.check_occupancy_prediction(256, 1, int(x), limiter), int(x))
    _play_number("ex02 blocks per SM", grade, float(occ.blocks_per_sm), hi=64.0)
    named = [E.check_occupancy_prediction(256, 1, occ.blocks_per_sm, w) for w in E._LIMIT_WORDS.values()]
    warps = [E.check_warps_choice(4096, w) for w in E.SOFTMAX_WARPS]
    wrong = [r.message for r in named + warps if r.status == "wrong"]
    assert wrong and not [m for m in wrong if DIRECTION.search(m)], wrong


@pytest.mark.slow
def test_a_halving_learner_gets_no_direction_on_exercise_04s_batches():
    """Exercise 04's batch per bucket, re-profiled at each try: a batch that still falls back and one
    padded past the fix are each told what to re-read, neither which way to move."""
    from hwlab.course import ex04_checks as E
    from hwlab.labs.fp8 import bucket_case as case

    fix = E.case_batches_reference(None).answer["MY_BATCHES"]
    orig = dict(case.CASE_BUCKETS)
    ctx = next(c for c in fix if fix[c] > orig[c])  # a bucket the fix changes
    said = [E.check_case_batches({**fix, ctx: b}) for b in range(orig[ctx], fix[ctx] + 4) if b != fix[ctx]]
    wrong = [r.message for r in said if r.status == "wrong"]
    assert len(wrong) == len(said)
    assert not [m for m in wrong if DIRECTION.search(m)], wrong


@pytest.mark.slow
def test_a_halving_learner_gets_no_direction_on_exercise_04s_dequant_count():
    """Exercise 04 part 1's count of dequantized weights per step, played by halving (the bucket, layer
    and shape answered right): every wrong count is told to count again in the same table."""
    from hwlab.course import ex04_checks as E
    from test_exercise_cases import _answers

    buckets = E.case_buckets()
    sol = _answers("04", 0)

    def grade(x):
        return _masked(E.check_case_fallback(sol["MY_BUCKET"], sol["MY_MODULE"], int(x), sol["MY_SHAPE"], buckets),
                       int(x))
    assert grade(sol["MY_DEQUANTS"])[0]
    _play_number("ex04 dequants", grade, float(sol["MY_DEQUANTS"]), hi=64.0)


def test_every_wrong_grouping_in_exercise_03_is_answered_without_a_direction():
    """Exercise 03 part 2, played over every way to pair the job's GPUs: a wrong grouping is told
    which class it crosses and what to re-read, never which way a better one lies."""
    from hwlab.course import ex03_checks
    from test_feedback import DEVICES, _dgx1

    def pairings(gpus):
        if not gpus:
            yield []
            return
        first, rest = gpus[0], gpus[1:]
        for i, other in enumerate(rest):
            for tail in pairings(rest[:i] + rest[i + 1:]):
                yield [[first, other], *tail]

    said = [ex03_checks.check_job_mapping(_dgx1(), DEVICES, groups, 2) for groups in pairings(list(DEVICES))]
    wrong = [r.message for r in said if r.status == "wrong"]
    assert wrong and any(r.status == "passed" for r in said)
    assert not [m for m in wrong if DIRECTION.search(m)], [m for m in wrong if DIRECTION.search(m)][:3]


def test_a_bisecting_learner_passes_a_drill_no_sooner_than_guessing(tmp_path, monkeypatch):
    """Notebook 07's drills, one per fault the recordings carry: the bisecting learner (switching to
    the other branch of the first question a message names) takes as many tries as guessing leaves at
    random, and what a wrong leaf is told depends on that leaf alone."""
    from hwlab.core.evidence import recorded
    from hwlab.course import drills

    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "k"))
    rec = recorded("drills").extra["runs"]
    n_tries, said = {}, {}
    for name, f in drills.FAULTS.items():
        if f"{f.scenario}/{f.case}" not in rec and f.scenario != "slowlink":
            continue
        d = drills.new(seed=7, fault=name, live=False)

        def grade(leaf, d=d, f=f):
            if leaf == f.leaf:
                return True, ""
            told = drills.contradiction(d.observations, leaf)
            said.setdefault(leaf, set()).add(told)
            return False, told
        n_tries[name] = _bisector(grade)
    assert n_tries
    assert sum(n_tries.values()) / len(n_tries) >= (len(LEAVES) + 1) / 2, n_tries
    assert all(len(texts) == 1 for texts in said.values()), said
