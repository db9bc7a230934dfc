"""``hwlab flowchart [--json]``: the diagnosis chart a drill asks the learner to walk.

Everything printed comes from :mod:`hwlab.diagnosis.flowchart` (its questions, criteria, leaves): each
question with its metrics, thresholds and why, the probe that measures it and its two branches;
each leaf with the cause it names and its actions (the fix), never which lab or recording lands on it (that
is a checkpoint's answer). Exit codes: 0 printed, 3 internal error.
"""
from __future__ import annotations

from typing import Any

from hwlab.diagnosis import flowchart
from hwlab.cli.console import print_json
from hwlab.errors import EXIT_OK


def _criterion(c: flowchart.Criterion) -> dict[str, Any]:
    return {"metric": c.metric, "op": c.op, "threshold": c.threshold, "unit": c.unit,
            "rule": c.describe(), "why": c.reason}


def chart() -> dict[str, Any]:
    """The chart as plain data: start, questions (in walk order from the start), leaves."""
    from hwlab.diagnosis.leaf_causes import cause

    order, todo = [], [flowchart.START]
    while todo:  # breadth first from the start, so B comes first and every question once
        qid = todo.pop(0)
        if qid in flowchart.QUESTIONS and qid not in order:
            order.append(qid)
            q = flowchart.QUESTIONS[qid]
            todo += [q.yes, q.no]
    questions = []
    for qid in order:
        q = flowchart.QUESTIONS[qid]
        questions.append({
            "id": q.id, "question": q.text, "yes": q.yes, "no": q.no, "probe": q.probe,
            "answer_yes_if_any": [_criterion(c) for c in q.criteria],
            "no_first_if_any": [_criterion(c) for c in q.overrides_no],
            "by_hand_metric": q.bool_metric})
    leaves = [{"id": lf.id, "title": lf.title, "cause": cause(lf.id), "actions": list(lf.actions)}
              for lf in flowchart.LEAVES.values()]
    return {"start": flowchart.START, "questions": questions, "leaves": leaves,
            "rules": ("a question answers YES when any of its criteria holds on a measured metric; "
                      "'no_first_if_any' criteria are checked first and take the NO branch; a "
                      "question with none of its metrics measured stops the walk (undecided)")}


def render(c: dict[str, Any]) -> str:
    out = [f"hwlab flowchart: start at {c['start']}; {c['rules']}.", ""]
    for q in c["questions"]:
        out.append(f"{q['id']}. {q['question']}   YES -> {q['yes']}   NO -> {q['no']}")
        out.append(f"   measured by: {q['probe']}")
        for cr in q["answer_yes_if_any"]:
            out.append(f"   YES if {cr['rule']}: {cr['why']}")
        for cr in q["no_first_if_any"]:
            out.append(f"   NO first if {cr['rule']}: {cr['why']}")
        if q["by_hand_metric"]:
            out.append(f"   (a yes/no typed as {q['by_hand_metric']} is used only when no metric is "
                       "measured, and is marked BY HAND)")
        out.append("")
    out.append("leaves:")
    for lf in c["leaves"]:
        out.append(f"{lf['id']}: {lf['title']}")
        out.append(f"   cause: {lf['cause']}")
        out += [f"   fix: {a}" for a in lf["actions"]]
    return "\n".join(out)


def cmd_flowchart(a) -> int:
    c = chart()
    if a.json:
        print_json(c)
    else:
        print(render(c))
    return EXIT_OK


def add_parser(sub) -> None:
    f = sub.add_parser("flowchart", help="print the diagnosis flowchart: questions, metrics, thresholds, leaves",
                       description="The chart drills and `examine` walk: each question, the metric and "
                       "threshold that answer it (and why), its branches, and each leaf's cause and actions.")
    f.add_argument("--json", action="store_true", help="strict JSON on stdout")
    f.set_defaults(fn=cmd_flowchart)
