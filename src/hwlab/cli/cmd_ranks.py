"""``hwlab ranks RUN_DIR [--json] [--skip N] [--nccl-log PATH ...] [--save-incident DIR]``.

Exit codes: 0 no tail and no mapping warning, 1 a tail rank or a mapping warning (a finding),
2 bad input (no such folder, no step logs), 3 internal error.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hwlab.diagnosis import incident, ranks
from hwlab.errors import EXIT_FINDING, EXIT_OK, UserInputError


def cmd_ranks(a) -> int:
    if a.save_incident and Path(a.save_incident).exists() and not Path(a.save_incident).is_dir():
        raise UserInputError(f"--save-incident {a.save_incident} is a file: pass a folder for the record")
    if a.skip < 0:
        raise UserInputError("--skip must be 0 or more steps")
    for p in a.nccl_log or []:
        if not Path(p).is_file():
            raise UserInputError(f"--nccl-log {p} is not a file: pass a log written with NCCL_DEBUG=INFO")
    rep = ranks.report(a.run_dir, skip=a.skip, nccl_logs=a.nccl_log)
    if a.save_incident:
        md, js = incident.save(incident.Incident(**rep["incident_draft"]["record"]), a.save_incident)
        rep["incident_saved"] = [str(md), str(js)]
    if a.json:
        print(json.dumps(rep, indent=2, allow_nan=False, default=str))
    else:
        print(ranks.render(rep))
        print()
        print(rep["incident_draft"]["markdown"] if a.incident else
              "draft incident record: --incident to print it, --save-incident DIR to write it")
        if rep.get("incident_saved"):
            print(f"incident written: {' and '.join(rep['incident_saved'])}")
    for p in rep["problems"]:
        print(f"hwlab ranks: skipped {p}", file=sys.stderr)
    return EXIT_FINDING if ranks.has_finding(rep) else EXIT_OK


def add_parser(sub) -> None:
    r = sub.add_parser("ranks", help="per-rank step times, tail ranks, placement and the flowchart walk of a run")
    r.add_argument("run_dir", help="the run directory written by hwlab.core.capture and hwlab.core.steplog")
    r.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    r.add_argument("--skip", type=int, default=ranks.DEFAULT_SKIP, help="start-up steps to leave out")
    r.add_argument("--nccl-log", action="append", metavar="PATH", help="an NCCL_DEBUG=INFO log to parse")
    r.add_argument("--incident", action="store_true", help="print the draft incident record")
    r.add_argument("--save-incident", metavar="DIR", help="write the draft incident record (never overwrites)")
    r.set_defaults(fn=cmd_ranks)
