"""Checkpoints: the learner reads the evidence and names the diagnosis before the kit shows its walk.

A :class:`Checkpoint` holds the kit's own walk of one piece of evidence, computed in the same run
(never a leaf typed into the notebook), the step it asks about, and optionally a quantity the
learner predicts. :func:`check` grades an :class:`Answer` in this order, and stops at the first miss:

1. **the leaf**: the walk's leaf. A wrong leaf is answered with the learner's own path to it (each
   question and the branch their leaf needs there, with the rows it reads), to re-check in order
   (:func:`hwlab.course.tries.recheck_own_path`): worked out from their leaf alone, so it never says
   where the evidence leaves that path, the other branch, nor the right leaf, and following it blindly
   passes no sooner than guessing leaves at random;
2. **the metric**: one that decides the asked step in this evidence (by default the step that leads
   into the leaf; a checkpoint may ask about another step on the walk): the walk's own deciding metric,
   or any other metric of that question's rule measured here whose own value gives the same branch
   (:func:`accepted_metrics`: a YES needs any one criterion to hold, so each one that holds decides it).
   Another metric of the chart, even a true one, is not what decided there;
3. **the value**: the decided metric's value as read off the evidence shown: inside its measured spread
   (``metric_spreads``; p10-p90 or the repeats' range) widened by :data:`VALUE_TOL_PCT`, or within
   :data:`VALUE_TOL_PCT` of the value where no spread was recorded. The tolerance covers a value
   read from a table printed to three significant digits and rounded by the reader. A miss says it is
   outside the reading's spread, not what the spread is;
4. **the prediction** (where the lesson has one): within the checkpoint's stated band of what the same
   run measured (:class:`Prediction`). A miss says the band's width and what to reconsider (the
   quantity that sets the prediction and where to read it), never which way it misses nor the measured
   figure: a direction would let halving find the band without the reasoning.

Feedback teaches without telling; after :data:`TRIES_BEFORE_REVEAL` wrong tries :meth:`Result.reveal`
shows the answer and the class record marks the checkpoint as revealed.

An answer with blanks (``None``) is not graded: :func:`check` returns status ``"fill in"`` naming
what is missing, and nothing is recorded. Every graded answer (not the blanks) is kept in the class
folder when ``HWLAB_CLASS_DIR`` is set (:func:`hwlab.course.classroom.record_checkpoint`).

The walk is shown only after a pass (or a reveal): :meth:`Result.walk` returns the one-line walk (or
the full text) then, and otherwise says to answer the checkpoint first; :func:`hwlab.nb.gated` holds
back whatever else a later cell would show of the answer the same way.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hwlab.diagnosis import flowchart

from hwlab.course import classroom, gradeclient, tries
from hwlab.diagnosis import flowchart_checks as checks

#: relative tolerance on a value read off the evidence (the tables print three significant digits;
#: a reader may round once more), applied to the spread's ends or, without a spread, to the value
VALUE_TOL_PCT = 5.0
#: absolute tolerance added to it, so a value of zero read as "0.0" or "0.01" is the same reading
VALUE_TOL_ABS = 0.01

FILL_IN, PASSED, WRONG, UNDECIDED, REVEALED = "fill in", "passed", "wrong", "undecided", "revealed"
#: wrong tries after which the learner may ask for the answer (:meth:`Result.reveal`): the one count
#: of :mod:`hwlab.course.tries`, shared with the exercise checks (a learner's answers; the solutions
#: file's never count)
TRIES_BEFORE_REVEAL = tries.TRIES_BEFORE_REVEAL
#: called with a checkpoint's id when its answer is revealed: the notebook layer (:func:`hwlab.nb.release`)
#: shows in place what its cells held back
ON_SHOWN: list = []


@dataclass(frozen=True)
class Answer:
    """What the learner commits: the leaf, the metric that decides the asked step, its value as read
    off the evidence, and the predicted quantity (where the checkpoint asks for one)."""
    leaf: str | None = None
    metric: str | None = None
    value: float | None = None
    prediction: float | None = None


@dataclass(frozen=True)
class Prediction:
    """A quantity the learner predicts and the value the same run measured, with its band: the
    prediction passes when it lies within ``band_pct`` percent of ``actual`` (relative) or, with
    ``band_abs``, within that many units (exact counts such as blocks per SM use ``band_abs=0``)."""
    what: str
    actual: float
    unit: str = ""
    band_pct: float | None = None
    band_abs: float | None = None
    why_band: str = ""
    #: what to reconsider on a miss: the quantity that sets the prediction and where to read it
    reconsider: str = ""

    def bounds(self) -> tuple[float, float]:
        if self.band_abs is not None:
            return self.actual - self.band_abs, self.actual + self.band_abs
        half = abs(self.actual) * (self.band_pct or 0.0) / 100.0
        return self.actual - half, self.actual + half

    def band_text(self) -> str:
        if self.band_abs is not None:
            return "exactly" if self.band_abs == 0 else f"within {self.band_abs:g}{self.unit}"
        return f"within {self.band_pct:g}%"

    def holds(self, p: float) -> bool:
        lo, hi = self.bounds()
        return lo - 1e-9 <= p <= hi + 1e-9


@dataclass
class Checkpoint:
    """One graded question: ``walk`` is the kit's walk of ``evidence`` in this run."""
    id: str
    walk: flowchart.Diagnosis
    evidence: dict[str, Any]
    #: the question whose deciding metric is asked (None: the step leading into the leaf)
    step: str | None = None
    prediction: Prediction | None = None
    source: str = ""

    def asked(self) -> flowchart.Step | None:
        steps = self.walk.steps
        if self.step is not None:
            on = [s for s in steps if s.question == self.step]
            if on:
                return on[0]
        return steps[-1] if steps else None


@dataclass
class Result:
    checkpoint: str
    status: str
    messages: list[str] = field(default_factory=list)
    answer: Answer = field(default_factory=Answer)
    #: the walk, kept to be shown once the answer passed
    _walk: flowchart.Diagnosis | None = field(default=None, repr=False)
    #: the checkpoint graded, kept for :meth:`reveal`
    _cp: Checkpoint | None = field(default=None, repr=False)
    #: wrong tries at this checkpoint so far in this kernel, this one included
    tries: int = 0

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __str__(self) -> str:
        head = {PASSED: "checkpoint {id}: passed", FILL_IN: "checkpoint {id}: fill in your answer",
                WRONG: "checkpoint {id}: not yet", UNDECIDED: "checkpoint {id}: the walk does not decide",
                REVEALED: "checkpoint {id}: answer revealed (recorded as revealed)"}
        return "\n".join([head[self.status].format(id=self.checkpoint)] + [f"  {m}" for m in self.messages])

    def walk(self, full: bool = False) -> str:
        """The kit's walk (one line, or the full text with ``full``) once this answer passed, or at once
        where the walk reaches no leaf (nothing to grade; it names what to measure); before that, a line
        saying the walk waits for the checkpoint."""
        if self.status in (PASSED, UNDECIDED, REVEALED) and self._walk is not None:  # undecided: it says what to measure
            return self._walk.render(full=full)
        return (f"[walk hidden: answer the checkpoint above first (checkpoint {self.checkpoint}: {self.status}); "
                "it shows once the checkpoint passes or is revealed]")

    def reveal(self, *, learner: str | None = None) -> str:
        """The answer (leaf, deciding metric and value, the measured figure predicted) once
        :data:`TRIES_BEFORE_REVEAL` wrong tries were made; the class record marks the checkpoint as
        revealed, and what the checkpoint gates is shown from then on. Before that, how many tries are left."""
        if self.status not in (WRONG, REVEALED) or self._cp is None:
            return f"checkpoint {self.checkpoint}: {self.status}; nothing to reveal"
        if self.tries < TRIES_BEFORE_REVEAL:
            return tries.too_early(f"checkpoint {self.checkpoint}", self.tries)
        cp, s = self._cp, self._cp.asked()
        first = self.status != REVEALED
        if first and gradeclient.url():  # the service reveals only what it has counted and recorded
            try:
                got = gradeclient.call("reveal", {"checkpoint": cp.id, "notebook": classroom._notebook()})
            except gradeclient.GraderUnavailable as e:
                return f"checkpoint {cp.id}: not revealed: {e}"
            if not got.get("revealed"):
                return str(got.get("message"))
            self.status = REVEALED
        elif first:
            self.status = REVEALED
            classroom.record_checkpoint(cp, self, learner=learner)
            for shown in ON_SHOWN:
                shown(cp.id)
        leaf = flowchart.LEAVES[cp.walk.leaf_id]
        p = cp.prediction
        return (f"checkpoint {cp.id}, revealed: leaf {leaf.id} ({leaf.title}); {s.metric} = {_fmt(s.value)} decides "
                f"{s.question}" + (f"; this run measured {_fmt(p.actual)}{p.unit} for {p.what}" if p else "")
                + f"\n  walk: {cp.walk.compact()}")

    def to_record(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "status": self.status, "passed": self.passed,
                "messages": list(self.messages), **asdict(self.answer)}


def _ruled_out_by(walk: flowchart.Diagnosis, leaf: str) -> flowchart.Step | None:
    """The first step of ``walk`` whose measured branch cannot reach ``leaf``."""
    for s in walk.steps:
        q = flowchart.QUESTIONS[s.question]
        took_yes = s.answer == "yes" and not s.overridden
        if leaf not in classroom.leaves_under(q.yes if took_yes else q.no):
            return s
    return None



def borderline_alternative(cp: Checkpoint, leaf: str) -> Checkpoint | None:
    """The checkpoint re-walked with one BORDERLINE step's metric at an end of its measured spread, where
    that walk reaches ``leaf``; None if no such end does. A step whose spread contains its threshold is
    one re-run from its other branch (the chart's borderline rule), so a leaf on that branch is a reading
    of this evidence, not a mistake, and is graded on that walk (its asked step, metric and value)."""
    if not cp.walk.borderline or flowchart.diagnose(cp.evidence).leaf_id != cp.walk.leaf_id:
        return None  # the walk is not this evidence's own: nothing to re-walk
    for s in cp.walk.borderline:
        q = flowchart.QUESTIONS[s.question]
        for c in (*q.overrides_no, *q.criteria):
            sp = checks.spreads_of(cp.evidence).get(c.metric, (None, ""))[0]
            for end in sp or ():
                alt = flowchart.diagnose({**cp.evidence, c.metric: end})
                if alt.leaf_id == leaf:
                    return replace(cp, walk=alt)
    return None

def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def accepted_metrics(cp: Checkpoint) -> dict[str, flowchart.Step]:
    """The metrics that decide the asked step (module doc, item 2), each with the step as graded on it:
    the walk's own, and every other metric of that question's rule measured here (not outside its
    physical range) whose value alone gives the branch the walk took: a YES criterion that holds, or on a
    NO taken first by an override, an override that holds. A plain NO needs every criterion to fail, so
    only the walk's own metric is asked there."""
    s = cp.asked()
    if s is None or s.by_hand:
        return {}
    out = {s.metric: s}
    q = flowchart.QUESTIONS[s.question]
    crits = q.overrides_no if s.overridden else (q.criteria if s.answer == "yes" else ())
    invalid = {iv.metric for iv in cp.walk.invalid}
    spreads = checks.spreads_of(cp.evidence)
    for c in crits:
        v = cp.evidence.get(c.metric)
        if c.metric in out or c.metric in invalid or v is None or isinstance(v, bool):
            continue
        try:
            holds = c.holds(float(v))
        except (TypeError, ValueError):
            continue
        if holds:
            sp = spreads.get(c.metric, (None, ""))[0]
            out[c.metric] = replace(s, metric=c.metric, value=v, spread=tuple(sp) if sp else None)
    return out


def value_bounds(s: flowchart.Step) -> tuple[float, float]:
    """The values accepted as read off the evidence for step ``s`` (module doc, item 3)."""
    v = float(s.value)
    lo, hi = (min(v, s.spread[0]), max(v, s.spread[1])) if s.spread else (v, v)
    return (lo - abs(lo) * VALUE_TOL_PCT / 100 - VALUE_TOL_ABS, hi + abs(hi) * VALUE_TOL_PCT / 100 + VALUE_TOL_ABS)


def _missing(cp: Checkpoint, a: Answer) -> list[str]:
    need = [("leaf", f"the leaf: one of the chart's leaves ({', '.join(flowchart.LEAVES)})"),
            ("metric", "the metric that decides the asked step, as it is named in the evidence table"),
            ("value", "that metric's value, read off the evidence table")]
    if cp.prediction is not None:
        need.append(("prediction", f"your prediction: {cp.prediction.what}"))
    return [f"{k} = ...  ({why})" for k, why in need if getattr(a, k) is None]


def check(cp: Checkpoint, answer: Answer | None, *, record: bool = True, learner: str | None = None) -> Result:
    """Grade ``answer`` on ``cp`` (module doc); record it in the class folder when one is set."""
    a = answer or Answer()
    res = Result(cp.id, FILL_IN, answer=a, _walk=cp.walk, _cp=cp)
    missing = _missing(cp, a)
    if missing:
        res.messages = ["still blank: " + m for m in missing]
        return res
    res.status = WRONG
    leaf = str(a.leaf).strip().upper()
    if cp.walk.leaf is None:
        res.status = UNDECIDED
        res.messages = ["this evidence does not reach a leaf (a question could not be measured); "
                        "there is nothing to grade: re-measure as the walk says"]
    elif leaf not in flowchart.LEAVES:
        res.messages = [f"{a.leaf!r} is not a leaf of the chart: give one of its leaf letters"]
    elif leaf != cp.walk.leaf_id and (alt := borderline_alternative(cp, leaf)) is not None:
        res.messages = _grade_reading(alt, a)
        res.status = WRONG if res.messages else PASSED
        if res.passed:
            b = ", ".join(x.question for x in cp.walk.borderline)
            res.messages = [f"leaf, metric and value agree with the evidence at one end of its measured spread: "
                            f"BORDERLINE at {b} (the spread contains the threshold), so this run cannot tell your "
                            "branch from the other one; the walk below follows the median. Re-run with more "
                            "repeats before acting on either branch"]
    elif leaf != cp.walk.leaf_id:
        res.messages = [tries.recheck_own_path(leaf)]
    else:
        res.messages = _grade_reading(cp, a)
        res.status = WRONG if res.messages else PASSED
        if res.passed:
            s = accepted_metrics(cp).get(str(a.metric).strip()) or cp.asked()
            res.messages = [f"leaf, metric ({s.metric} at {s.question}) and value agree with the evidence"
                            + (f"; prediction {_fmt(a.prediction)}{cp.prediction.unit} against "
                               f"{_fmt(cp.prediction.actual)}{cp.prediction.unit} from this run" if cp.prediction else "")
                            + (f"; BORDERLINE at {', '.join(b.question for b in cp.walk.borderline)}: the measured "
                               "spread contains the threshold, one re-run from the other branch" if cp.walk.borderline else "")]
    if shared_run(cp) and res.status in (PASSED, WRONG):
        res.messages.append("graded on a SHARED GPU (another process ran on it while this was measured): "
                            "the figures may differ from a quiet run's")
    if record and res.status in (PASSED, WRONG) and gradeclient.url():
        return _graded_on_server(cp, a, res)
    if record and res.status == WRONG:
        res.tries = tries.count_wrong(f"checkpoint {cp.id}")
        line = tries.offer(res.tries, "print(CP.reveal())")
        if line:
            res.messages.append(line)
    if record and res.status in (PASSED, WRONG):
        classroom.record_checkpoint(cp, res, learner=learner)
    return res


def _graded_on_server(cp: Checkpoint, a: Answer, res: Result) -> Result:
    """The class's grading service grades ``a`` again and records it (:mod:`hwlab.course.gradeclient`);
    its status and its count of tries are the result's. A service that does not answer leaves the
    answer ungraded (status ``wrong``, not recorded anywhere) and says so."""
    from hwlab.course import gradebook

    try:
        got = gradeclient.call("checkpoint", gradebook.request_checkpoint(cp, a, classroom._notebook()))
    except gradeclient.GraderUnavailable as e:
        res.status, res.messages = WRONG, [f"not graded: {e}; run this cell again, or tell the instructor"]
        return res
    res.status = got.get("status") if got.get("status") in (PASSED, WRONG) else WRONG
    res.messages = [str(m) for m in got.get("messages", [])]
    res.tries = int(got.get("tries", 0))
    if res.status == WRONG:
        line = tries.offer(res.tries, "print(CP.reveal())")
        if line:
            res.messages.append(line)
    return res


def shared_run(cp: Checkpoint) -> bool:
    """Whether the checkpoint's evidence was measured on a SHARED GPU (:mod:`hwlab.core.gpu_share`)."""
    ev = (cp.evidence or {}).get("gpu_shared")
    return bool(getattr(cp.walk, "shared", None) or (isinstance(ev, dict) and ev.get("shared")))


def _grade_reading(cp: Checkpoint, a: Answer) -> list[str]:
    s = cp.asked()
    if s is None:
        return ["the walk has no measured step to ask about"]
    if s.by_hand:
        return []  # a typed yes/no has no metric to read: the leaf is the answer
    metric = str(a.metric).strip()
    s = accepted_metrics(cp).get(metric, s)
    if metric != s.metric:
        invalid = {iv.metric for iv in cp.walk.invalid}
        on_walk = {x.metric: x.question for x in cp.walk.steps}
        if metric in invalid:
            why = "is outside its physical range here, so it is not evidence"
        elif metric not in cp.evidence:
            why = "is not in this evidence"
        elif metric in on_walk:
            why = f"decides {on_walk[metric]}, not {s.question} ({s.text})"
        else:
            why = f"is in the evidence, but it does not decide {s.question} ({s.text}) here"
        return [f"{metric} {why}: which of the rows decides {s.question}? (the chart's rule for {s.question} "
                "names its metrics)"]
    try:
        v = float(a.value)
    except (TypeError, ValueError):
        return [f"value {a.value!r} is not a number: read it off the evidence table"]
    lo, hi = value_bounds(s)
    if not (math.isfinite(v) and lo <= v <= hi):
        return [f"{metric} = {_fmt(v)} is outside the reading's spread (the spread, or the value where none "
                f"was recorded, widened by {VALUE_TOL_PCT:g}% for rounding): read the row again"]
    p = cp.prediction
    if p is not None:
        try:
            pv = float(a.prediction)
        except (TypeError, ValueError):
            return [f"prediction {a.prediction!r} is not a number"]
        if not p.holds(pv) or not math.isfinite(pv):
            band = ("it must equal what this run measured" if p.band_abs == 0
                    else f"{p.band_text()} of what this run measured")
            return [f"prediction {_fmt(pv)}{p.unit} for {p.what} is outside the band ({band}). Reconsider "
                    + (p.reconsider or "the quantity that sets it and where you read it")
                    + (f" ({p.why_band})" if p.why_band else "")
                    + ", then work it out again: the band is not found by moving the number."]
    return []


def evidence_rows(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics of ``evidence`` the chart reads (every question's rules), each with its spread,
    source, whether it is an estimate and whether it lies outside its physical range (then it is not
    evidence: :data:`hwlab.diagnosis.flowchart_checks.PHYSICAL_RANGES`), in the chart's order: what the
    learner reads, no verdict."""
    spreads = checks.spreads_of(evidence)
    est = checks.estimated_metrics(evidence)
    sources = evidence.get("metric_sources") or {}
    names: dict[str, str] = {}  # metric -> the question that reads it
    for q in flowchart.QUESTIONS.values():
        for c in (*q.criteria, *q.overrides_no, *q.not_applicable):
            names.setdefault(c.metric, q.id)
        if q.bool_metric:
            names.setdefault(q.bool_metric, q.id)
    rows = []
    for m, qid in names.items():
        if evidence.get(m) is None:
            continue
        sp = spreads.get(m, (None, ""))
        bad = None if isinstance(evidence[m], bool) else checks.check_range(qid, m, evidence[m], sp[0])
        rows.append({"metric": m, "value": evidence[m], "spread": list(sp[0]) if sp[0] else None,
                     "spread_what": sp[1] or None, "estimated": m in est, "source": sources.get(m),
                     "outside_physical_range": bad is not None})
    return rows


def render_evidence(evidence: dict[str, Any], source: str = "") -> str:
    """:func:`evidence_rows` as a table (three significant digits), headed by where it comes from."""
    lines = [f"evidence the walk will read [{source}]" if source else "evidence the walk will read"]
    for r in evidence_rows(evidence):
        sp = f"{_fmt(r['spread'][0])}-{_fmt(r['spread'][1])}" if r["spread"] else "not recorded"
        kind = ("OUTSIDE its physical range, not evidence; " if r["outside_physical_range"] else "") + (
            "estimated" if r["estimated"] else "measured")
        lines.append(f"  {r['metric']:<28} {_fmt(r['value']):>10}  spread {sp:<20} {kind}"
                     + (f"; {r['source']}" if r["source"] else ""))
    shared = evidence.get("gpu_shared")
    if isinstance(shared, dict) and shared.get("shared"):
        from hwlab.core.gpu_share import note
        lines.append("  " + note(shared))
    return "\n".join(lines)
