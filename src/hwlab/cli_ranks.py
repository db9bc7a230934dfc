"""``hwlab ranks RUN_DIR [--json] [--skip N] [--nccl-log PATH ...] [--save-incident DIR]``.

Exit codes: 0 no tail and no mapping warning, 1 a tail rank or a mapping warning (a finding),
2 bad input (no such folder, no step logs, an input that is not a regular file, a
--save-incident folder that cannot be written) or a write that failed after the run was read
(the report is printed, the record kept in the rescue folder and its path printed), 3 internal
error.
"""
from __future__ import annotations

import json
import sys

from . import incident, ranks
from .errors import EXIT_FINDING, EXIT_OK, EXIT_USAGE, UserInputError
from .store import check_folder, check_input_file, rescue


def cmd_ranks(a) -> int:
    if a.skip < 0:
        raise UserInputError("--skip must be 0 or more steps")
    for p in a.nccl_log or []:
        check_input_file(p, "--nccl-log", "pass a log written with NCCL_DEBUG=INFO")
    # the destination is checked before the run is read; a write that still fails keeps the
    # record in the rescue folder and says where (the report is printed either way)
    folder = check_folder(a.save_incident, what="--save-incident folder") if a.save_incident else None
    rep = ranks.report(a.run_dir, skip=a.skip, nccl_logs=a.nccl_log)
    save_err = None
    if folder is not None:
        record = rep["incident_draft"]["record"]
        try:
            md, js = incident.save(incident.Incident(**record), folder)
            rep["incident_saved"] = [str(md), str(js)]
        except OSError as e:
            save_err = rescue(record, "incident", folder, e)
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
    if save_err:
        print(f"hwlab ranks: {save_err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_FINDING if ranks.has_finding(rep) else EXIT_OK


def add_parser(sub) -> None:
    r = sub.add_parser("ranks", help="per-rank step times, tail ranks, placement and the flowchart walk of a run")
    r.add_argument("run_dir", help="the run directory written by hwlab.capture and hwlab.steplog")
    r.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    r.add_argument("--skip", type=int, default=ranks.DEFAULT_SKIP, help="start-up steps to leave out")
    r.add_argument("--nccl-log", action="append", metavar="PATH", help="an NCCL_DEBUG=INFO log to parse")
    r.add_argument("--incident", action="store_true", help="print the draft incident record")
    r.add_argument("--save-incident", metavar="DIR", help="write the draft incident record (never overwrites)")
    r.set_defaults(fn=cmd_ranks)
