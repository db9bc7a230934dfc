"""``hwlab ranks RUN_DIR [--json] [--skip N] [--nccl-log PATH ...] [--save-incident DIR]``
and ``hwlab ranks --traces DIR [--link-gbps G]`` (a folder of per-rank profiler traces; a
RUN_DIR holding traces and no step logs is read as one too).

Exit codes: 0 no tail and no mapping warning (traces: no slow rank, no link finding), 1 a
finding, 2 bad input (no such folder, no step logs or traces, an input that is not a regular
file, a --save-incident folder that cannot be written) or a write that failed after the run was
read (the report is printed, the record kept in the rescue folder and its path printed), 3
internal error, 4 undecided (traces: ranks missing against the world size the traces state, or
unreadable; the missing ranks and unreadable files are named).

``--workers N`` reads the traces in N processes, ``--scheduler ADDRESS`` on a Dask cluster
(:mod:`hwlab.traces.rank_pool`); the report is the same either way.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hwlab.diagnosis import incident, ranks, ranks_traces
from hwlab.cli.console import MAX_LINK_GBPS, link_gbps, print_json, stderr_is_terminal, trace_mib, whole_number
from hwlab.traces import rank_pool
from hwlab.core.store import check_folder, check_input_file, rescue
from hwlab.errors import EXIT_FINDING, EXIT_OK, EXIT_UNDECIDED, EXIT_USAGE, UserInputError


def cmd_ranks(a) -> int:
    if a.skip is not None and a.skip < 0:
        raise UserInputError("--skip must be 0 or more steps")
    for p in a.nccl_log or []:
        check_input_file(p, "--nccl-log", "pass a log written with NCCL_DEBUG=INFO")
    if (a.workers is not None or a.scheduler or a.max_trace_mb is not None) and not a.traces \
            and not (a.run_dir and ranks_traces.looks_like_traces(a.run_dir)):
        raise UserInputError("--workers, --scheduler and --max-trace-mb read traces: pass --traces DIR")
    if a.workers is not None and a.workers < 1:
        raise UserInputError("--workers must be 1 or more processes")
    if a.max_trace_mb is not None and a.max_trace_mb < 1:
        raise UserInputError("--max-trace-mb must be 1 or more (MB per rank's trace file)")
    if a.traces and a.run_dir:
        raise UserInputError("pass either RUN_DIR or --traces DIR, not both")
    if not (a.traces or a.run_dir):
        raise UserInputError("pass a run directory (step logs) or --traces DIR (profiler traces)")
    for given in (a.traces, a.run_dir):
        if given and Path(given).is_file() and given.endswith((".json", ".json.gz")):
            raise UserInputError(f"{given} is one trace file: `hwlab ranks --traces` compares the ranks of a "
                                 f"folder of traces; to examine one trace: hwlab examine --trace {given}")
    # the destination is checked before the run is read; a write that still fails keeps the
    # record in the rescue folder and says where (the report is printed either way)
    folder = check_folder(a.save_incident, what="--save-incident folder") if a.save_incident else None
    traces = a.traces or (a.run_dir if ranks_traces.looks_like_traces(a.run_dir) else None)
    if traces:
        skip = 0 if a.skip is None else a.skip
        prog = rank_pool.progress_printer() if stderr_is_terminal() else None
        from hwlab.traces.trace_stream import text_limit

        env_before = os.environ.get("HWLAB_MAX_TRACE_MIB")
        if a.max_trace_mib is not None:  # worker processes read the limit from their environment
            os.environ["HWLAB_MAX_TRACE_MIB"] = repr(float(a.max_trace_mib))
        try:
            with text_limit(a.max_trace_mib):
                rep = ranks_traces.report(traces, link_gbps=a.link_gbps, skip=skip, progress=prog,
                                          workers=a.workers, scheduler=a.scheduler,
                                          max_bytes=a.max_trace_mb * 10**6 if a.max_trace_mb else None)
        finally:
            if env_before is None:
                os.environ.pop("HWLAB_MAX_TRACE_MIB", None)
            else:
                os.environ["HWLAB_MAX_TRACE_MIB"] = env_before
        mod = ranks_traces
    else:
        rep = ranks.report(a.run_dir, skip=ranks.DEFAULT_SKIP if a.skip is None else a.skip, nccl_logs=a.nccl_log)
        mod = ranks
    save_err = None
    if folder is not None:
        record = rep["incident_draft"]["record"]
        try:
            md, js = incident.save(incident.Incident(**record), folder)
            rep["incident_saved"] = [str(md), str(js)]
        except OSError as e:
            save_err = rescue(record, "incident", folder, e)
    if a.json:
        print_json(rep)  # strict: a value that is not finite is null, and null_reasons says where
    else:
        print(mod.render(rep))
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
    if getattr(mod, "is_undecided", None) and mod.is_undecided(rep):
        return EXIT_UNDECIDED
    return EXIT_FINDING if mod.has_finding(rep) else EXIT_OK


def add_parser(sub) -> None:
    r = sub.add_parser("ranks", help="one slow rank? per-rank step times or traces, tail ranks, placement, "
                       "the flowchart walk",
                       description="Compare the ranks of one job: RUN_DIR holds the step logs and captures "
                       "hwlab.core.steplog and hwlab.core.capture wrote; --traces DIR a folder of per-rank "
                       "profiler traces. One trace of one process: hwlab examine --trace FILE. Exit codes: 0 "
                       "no tail rank and no finding, 1 a finding, 2 bad input or a write that failed (the "
                       "record is kept in the rescue folder), 3 internal error, 4 undecided (ranks missing "
                       "or unreadable: they are named).")
    r.add_argument("run_dir", nargs="?", help="the run directory written by hwlab.core.capture and hwlab.core.steplog")
    r.add_argument("--traces", metavar="DIR", help="a folder of per-rank torch.profiler traces (.json / .json.gz); "
                   "one trace alone: hwlab examine --trace FILE")
    r.add_argument("--link-gbps", type=link_gbps, metavar="G",
                   help="traces: the link's bus bandwidth in GB/s (at least 0.001, at most "
                        f"{MAX_LINK_GBPS:,.0f}), to tell a slow link from a busy one")
    r.add_argument("--workers", type=whole_number, default=None, metavar="N",
                   help="traces: processes that read the ranks' traces in parallel (default: the cores this "
                        "process may use, fewer for a small job); the report is the same for any N")
    r.add_argument("--scheduler", metavar="ADDRESS",
                   help="traces: read the ranks on a running Dask distributed cluster (tcp://HOST:8786; "
                        "pip install 'hwlab[dist]'), the traces on a file system its workers mount")
    r.add_argument("--max-trace-mb", type=whole_number, default=None, metavar="MB",
                   help="traces: a rank's trace file over this size is named and left out (default: no limit)")
    r.add_argument("--max-trace-mib", type=trace_mib, metavar="MIB",
                   help="traces: the JSON each trace may expand to (default 2048 MiB, or HWLAB_MAX_TRACE_MIB)")
    r.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    r.add_argument("--skip", type=whole_number, default=None, metavar="N",
                   help=f"start-up steps to leave out (step logs: {ranks.DEFAULT_SKIP}; traces: 0, the "
                        "profiler's schedule already warmed up)")
    r.add_argument("--nccl-log", action="append", metavar="PATH", help="an NCCL_DEBUG=INFO log to parse")
    r.add_argument("--incident", action="store_true", help="print the draft incident record")
    r.add_argument("--save-incident", metavar="DIR", help="write the draft incident record (never overwrites)")
    r.set_defaults(fn=cmd_ranks)
