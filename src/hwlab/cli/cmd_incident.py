"""``hwlab incident``: write the minimal incident record (Markdown + JSON) from a flowchart walk.

The walk takes its answers from ``--observations`` (a JSON object of flowchart metric -> number,
true/false or null); ``--evidence`` names the affected machine's record. Exit codes: 0 written,
2 bad input or a write that failed (the record is kept in the rescue folder), 3 internal error.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

from hwlab.core import evidence
from hwlab.diagnosis import flowchart, incident
from hwlab.cli.console import print_json
from hwlab.errors import EXIT_OK, EXIT_USAGE, UserInputError
from hwlab.core.store import check_folder, read_user_json, rescue_json
from hwlab.core import validate
from hwlab.core.store import rescue


def _observations(path: str) -> dict[str, Any]:
    obs = read_user_json(path, "observations file", "pass a .json file of metric -> value")
    if not isinstance(obs, dict):
        raise UserInputError(f"observations file {path} should hold a JSON object of metric -> "
                             f"value, not a {type(obs).__name__}")
    obs = validate.observations(obs, where=f"observations file {path}: ")  # type, finite, range
    unknown = sorted(k for k in obs if k not in flowchart.metric_names())
    if unknown:  # a typo would otherwise be dropped without a word, and its question left unanswered
        raise UserInputError(f"observations file {path}: unknown metric name(s) {', '.join(map(repr, unknown))}; "
                             f"the flowchart reads: {', '.join(n for n in flowchart.metric_names() if n not in flowchart.META_KEYS)}")
    # typed by the user: shown as given, never as measured (the file's metric_sources say by what)
    return {**obs, "metric_given": [k for k in obs if k not in flowchart.META_KEYS]}


def cmd_incident(a) -> int:
    if a.scope not in incident.SCOPES:
        raise UserInputError(f"--scope {a.scope!r} is not one of {', '.join(incident.SCOPES)}")
    ev = evidence.load(a.evidence) if a.evidence else None
    obs = _observations(a.observations) if a.observations else {}
    folder = check_folder(a.out, what="--out folder")  # inputs first: a refusal creates nothing
    d = flowchart.diagnose(obs)
    inc = incident.from_diagnosis(a.title, ev, d, symptom_scope=a.scope, symptom=a.symptom, fix=a.fix,
                                  reverify=a.reverify, rank_mapping=a.rank_mapping)
    try:
        md, js = incident.save(inc, folder)
    except OSError as e:
        print(d.explain())
        print(f"hwlab incident: {rescue(dataclasses.asdict(inc), 'incident', folder, e)}", file=sys.stderr)
        return EXIT_USAGE
    if a.json:
        print_json({"markdown": str(md), "json": str(js), "leaf": d.leaf_id, "path": d.path,
                    "explanation": d.explain(), "walk": d.to_dict()})
    else:
        print(f"incident written: {md} and {js}\n")
        print(d.explain())
    return EXIT_OK


def add_parser(sub) -> None:
    i = sub.add_parser("incident", help="write the minimal incident record (Markdown + JSON)")
    i.add_argument("--title", required=True)
    i.add_argument("--scope", required=True, help="single-card, multi-GPU, training, inference or bucket")
    i.add_argument("--symptom", required=True)
    i.add_argument("--fix", required=True)
    i.add_argument("--reverify", required=True, help="which probe or bucket proves recovery")
    i.add_argument("--evidence", help="an evidence/baseline .json of the affected machine")
    i.add_argument("--observations", help="a .json of flowchart metrics (metric -> value)")
    i.add_argument("--rank-mapping", default="n/a")
    i.add_argument("--out", default="incidents", help="folder for the records (created if absent)")
    i.add_argument("--json", action="store_true", help="strict JSON on stdout")
    i.set_defaults(fn=cmd_incident)
