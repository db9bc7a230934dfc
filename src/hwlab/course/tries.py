"""Wrong tries and the reveal: one mechanism for checkpoints and exercise checks alike.

Feedback on a wrong answer teaches without telling (:mod:`hwlab.course.checkpoint`,
:mod:`hwlab.course.exercise_checks`, :mod:`hwlab.course.reading_checks`): it names what to re-read,
never the right leaf, the value, the accepted range nor the measured figure. A learner who is still
stuck after :data:`TRIES_BEFORE_REVEAL` wrong tries at one item (a checkpoint, or one exercise check
by its name) in this kernel may ask for the answer, and the class record marks the item as revealed:

* a checkpoint: :meth:`hwlab.course.checkpoint.Result.reveal` (``print(CP.reveal())``);
* an exercise check: :func:`reveal` (``print(nb.reveal("<the check's name>"))``). Every check is
  declared with :func:`graded`, which names its **reference**: a function of the check's own
  arguments that recomputes, from the same evidence, what a passing answer is
  (:class:`Reference`). The reference is computed only when revealed, and it is what the
  wrong-answer test reads to know what feedback must not print.

A try is an answer graded ``wrong`` or ``too slow``; a blank ("not done yet") and an "environment
problem" (the toolchain, not the learner) are not tries.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from hwlab.diagnosis import flowchart

#: wrong tries after which the learner may ask for the answer: enough to re-read the rows the
#: feedback names twice, few enough that a stuck learner is not left stuck
TRIES_BEFORE_REVEAL = 3
#: the statuses that count as a try at the answer
NOT_PASSED = ("wrong", "too slow")
#: wrong tries per item in this kernel ("checkpoint 01", "exercise warps for the long row")
_wrong: dict[str, int] = {}
#: per exercise check name: its reference, bound to the last wrong call's arguments, and the tries
_pending: dict[str, tuple[Callable[[], "Reference"], int]] = {}
#: exercise checks revealed in this kernel (recorded once each)
_revealed: set[str] = set()
_depth = 0


@dataclass
class Reference:
    """What a passing answer is. ``answer``: the figures and names a wrong answer's feedback must
    not print (the right leaf, value, count, groups, the measured figure, the accepted range's
    ends as separate entries); ``how``: what a passing answer looks like, in words, where the
    answer is code or a choice rather than a figure."""
    answer: dict[str, Any] = field(default_factory=dict)
    how: str = ""

    def render(self) -> str:
        parts = "; ".join(f"{k} = {_fmt(v)}" for k, v in self.answer.items())
        return "; ".join(x for x in (parts, self.how) if x)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def count_wrong(key: str) -> int:
    """One more wrong try at ``key``; how many there have been in this kernel."""
    _wrong[key] = _wrong.get(key, 0) + 1
    return _wrong[key]


def offer(tries: int, how: str) -> str | None:
    """The line that offers the answer once :data:`TRIES_BEFORE_REVEAL` tries were made, else None."""
    if tries < TRIES_BEFORE_REVEAL:
        return None
    # no figure in it: a number here would sit beside the feedback's own and could be read as one
    return (f"You may now ask for the answer: `{how}` shows it (the class record marks it as revealed), "
            "or read the feedback once more.")


def too_early(what: str, tries: int) -> str:
    return (f"{what}: the answer can be revealed after {TRIES_BEFORE_REVEAL} tries (this was try {tries}); "
            "read the feedback and try again")


def rows_of(qid: str) -> str:
    """The rows (metrics) question ``qid`` reads, as the chart names them: where to look again."""
    q = flowchart.QUESTIONS[qid]
    names = dict.fromkeys(c.metric for c in (*q.overrides_no, *q.criteria, *q.not_applicable))
    if q.bool_metric:
        names.setdefault(q.bool_metric)
    return ", ".join(names)


def paths_to(leaf: str, node: str | None = None) -> list[list[tuple[str, str]]]:
    """Every path from the chart's start to ``leaf``: (question, branch) pairs, from the chart alone."""
    node = flowchart.START if node is None else node
    if node in flowchart.LEAVES:
        return [[]] if node == leaf else []
    q = flowchart.QUESTIONS[node]
    return [[(node, b), *rest] for b, nxt in (("yes", q.yes), ("no", q.no)) for rest in paths_to(leaf, nxt)]


def recheck_own_path(leaf: str) -> str:
    """A wrong leaf's feedback: the learner's own path to ``leaf`` (each question, the branch their leaf
    needs there, and the rows it reads), as questions to re-check in order. It is worked out from the
    chart and the learner's leaf alone, so it is the same whatever the right leaf is: it never names
    where the evidence leaves that path, the other branch, nor the right leaf, and an answer found by
    following the message instead of the evidence takes as many tries as guessing leaves at random."""
    paths = paths_to(leaf)
    if not paths:
        return f"leaf {leaf} is not where the evidence above leads"
    ways = " or ".join("; ".join(f"{qid} ({flowchart.QUESTIONS[qid].text}) answered {b}" for qid, b in path)
                       for path in paths)
    rows = "; ".join(dict.fromkeys(f"{qid}: {rows_of(qid)}" for path in paths for qid, _ in path))
    return (f"leaf {leaf} is not where the evidence above leads. Your path to {leaf} needs {ways}. "
            f"Re-check each of those questions in that order against the rows it reads ({rows}) and its "
            "rule in the chart: does the measured value give the answer your path needs? The first one "
            "that does not is where your reading left the evidence; follow the chart from there.")


# ---- exercise checks --------------------------------------------------------------------------

def graded(reference: Callable[..., Reference]):
    """Declare an exercise check: ``reference(*args, **kwargs)`` (the check's own arguments) gives
    what a passing answer is. A wrong try is counted under the result's name; from the
    :data:`TRIES_BEFORE_REVEAL`-th on the feedback offers :func:`reveal`. A check called by another
    check counts once, as the outer one."""
    def wrap(fn):
        @functools.wraps(fn)
        def check(*args, **kwargs):
            global _depth
            _depth += 1
            try:
                res = fn(*args, **kwargs)
            finally:
                _depth -= 1
            if _depth == 0 and getattr(res, "status", None) in NOT_PASSED:
                _note(res, lambda: reference(*args, **kwargs))
            if _depth == 0:
                _record(res, fn, args, kwargs)
            return res
        check.reference = reference
        return check
    return wrap


def inside_check() -> bool:
    """Whether a graded check is running: the results built inside it are steps of its answer (a
    correctness step that passes inside a check that then finds too many bytes); the one it returns
    is recorded when it returns (:func:`_record`)."""
    return _depth > 0


def _plain(v: Any) -> bool:
    """Whether ``v`` goes to the grading service and back unchanged (JSON's own values only)."""
    import json

    try:
        return json.loads(json.dumps(v, allow_nan=False)) == v
    except (TypeError, ValueError):
        return False


def _record(res: Any, fn: Callable[..., Any] | None = None, args: tuple = (), kwargs: dict | None = None) -> None:
    """Record the result a graded check returned: with the class's grading service
    (:mod:`hwlab.course.gradeclient`), the check's name and its arguments are sent there and the service
    re-checks the answers it can (values and leaves) and records the rest as learner-reported; else in
    the class folder (where one is set)."""
    from hwlab.course import classroom, gradeclient

    if not hasattr(res, "status") or not hasattr(res, "name"):
        return
    if gradeclient.url() and fn is not None:
        if res.status == "not done yet":
            return
        kwargs = kwargs or {}
        plain = _plain(list(args)) and _plain(kwargs)
        body = {"check": f"{fn.__module__}.{fn.__name__}", "name": res.name, "status": res.status,
                "notebook": classroom._notebook(), "args": list(args) if plain else None,
                "kwargs": kwargs if plain else None}
        try:
            got = gradeclient.call("exercise", body)
        except gradeclient.GraderUnavailable as e:
            print(f"hwlab: the class's grading service did not record this result ({e})")
            return
        if got.get("graded_by") == "server" and got.get("status") != res.status:
            print(f"hwlab: the class's grading service graded this {got.get('status')!r}: that is the one recorded")
        return
    try:
        classroom.record_exercise(res)
    except (OSError, ValueError) as e:  # the learner's grade stands; the instructor's copy is what failed
        print(f"hwlab: could not record this result in the class folder ({e})")


def _note(res: Any, ref: Callable[[], Reference]) -> None:
    n = count_wrong(f"exercise {res.name}")
    _pending[res.name] = (ref, n)
    res.tries = n
    line = offer(n, f"print(nb.reveal({res.name!r}))")
    if line:
        res.message = f"{res.message} {line}"


def reveal(name: str, *, learner: str | None = None) -> str:
    """The answer of exercise check ``name`` (as its result names it) once :data:`TRIES_BEFORE_REVEAL`
    wrong tries were made in this kernel, recorded as revealed in the class record (once); before
    that, how many tries are left."""
    from hwlab.course import classroom

    got = _pending.get(name)
    if got is None:
        return f"{name}: no wrong try of this check in this kernel; nothing to reveal"
    ref, n = got
    if n < TRIES_BEFORE_REVEAL:
        return too_early(name, n)
    from hwlab.course import gradeclient

    if gradeclient.url():  # the service records the reveal (after the tries it counted) before it is shown
        try:
            got = gradeclient.call("exercise/reveal", {"name": name, "notebook": classroom._notebook()})
        except gradeclient.GraderUnavailable as e:
            return f"{name}: not revealed ({e})"
        if not got.get("revealed"):
            return str(got.get("message", f"{name}: not revealed yet"))
        return f"{name}, revealed: {ref().render()}"
    text = f"{name}, revealed: {ref().render()}"
    if name not in _revealed:
        _revealed.add(name)
        classroom.record_revealed(name, text, learner=learner)
    return text
