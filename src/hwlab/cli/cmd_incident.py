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
from hwlab.cli.console import one_line, print_json, read_observations
from hwlab.errors import EXIT_OK, EXIT_USAGE, UserInputError
from hwlab.core.store import check_folder, rescue


def _observations(path: str) -> dict[str, Any]:
    obs = read_observations(path, "observations file")  # type, finite, range, known names
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
    i = sub.add_parser("incident", help="write the minimal incident record (Markdown + JSON)",
                       description="Walk the flowchart on --observations and write the incident record "
                       "(Markdown and JSON, never over another). Exit codes: 0 written, 2 bad input or a "
                       "write that failed (the record is kept in the rescue folder), 3 internal error.")
    i.add_argument("--title", required=True, type=one_line("--title", TITLE_MAX_CHARS),
                   help=f"what happened, on one line (at most {TITLE_MAX_CHARS} characters)")
    i.add_argument("--scope", required=True, help="single-card, multi-GPU, training, inference or bucket")
    i.add_argument("--symptom", required=True, type=one_line("--symptom", FIELD_MAX_CHARS),
                   help="what was seen, on one line (e.g. 'step time up 30%% since Monday')")
    i.add_argument("--fix", required=True, type=one_line("--fix", FIELD_MAX_CHARS),
                   help="what was changed, on one line")
    i.add_argument("--reverify", required=True, type=one_line("--reverify", FIELD_MAX_CHARS),
                   help="which probe or bucket proves recovery")
    i.add_argument("--evidence", help="an evidence/baseline .json of the affected machine")
    i.add_argument("--observations", help="a .json of flowchart metrics (metric -> value; "
                   "`hwlab flowchart` lists them)")
    i.add_argument("--rank-mapping", default="n/a", type=one_line("--rank-mapping", FIELD_MAX_CHARS),
                   help="which rank ran on which GPU and host, if it matters (default n/a)")
    i.add_argument("--out", default="incidents", help="folder for the records (created if absent)")
    i.add_argument("--json", action="store_true", help="strict JSON on stdout")
    i.set_defaults(fn=cmd_incident)


#: an incident title is a heading and part of listings: one line, short
TITLE_MAX_CHARS = 200
#: symptom, fix, re-verification: one table cell each in the Markdown
FIELD_MAX_CHARS = 2000
