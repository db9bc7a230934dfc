"""``hwlab bundle OUT.tar.gz [--run-dir DIR] [--no-doctor] [--force] [--json]``: one archive for a
bug report (:mod:`hwlab.cli.bundle`).

Exit codes: 0 written, 2 bad input (the destination exists, is a folder or cannot be written;
the run directory is missing; nothing gathered or written) or a write that failed after gathering
(the archive kept in the rescue folder, its path printed), 3 internal error.
"""
from __future__ import annotations

import sys

from hwlab.cli import bundle
from hwlab.cli.console import print_json, stderr_is_terminal
from hwlab.errors import EXIT_OK, EXIT_USAGE


def cmd_bundle(a) -> int:
    prog = (lambda msg: print(f"hwlab bundle: {msg}", file=sys.stderr)) if stderr_is_terminal() else None
    man = bundle.build(a.out, run_dir=a.run_dir, doctor=not a.no_doctor, force=a.force, progress=prog)
    rescued = man.pop("rescued", None)
    if a.json:
        print_json(man)
    elif rescued is None:
        print(f"hwlab bundle: wrote {a.out}")
    if rescued is not None:  # the write failed after gathering: where the archive went instead, one line
        print(f"hwlab bundle: {rescued}", file=sys.stderr)
        return EXIT_USAGE
    if a.json:
        return EXIT_OK
    for p in man["parts"]:
        if p["status"] == "included":
            print(f"  included  {p['part']} ({p['n_bytes']} bytes)")
        elif p["status"] == "listed":
            print(f"  listed    {p['part']} ({p['n_bytes']} bytes): {p['why']}; {p['how_to_get']}")
        else:
            print(f"  MISSING   {p['part']}: {p['why']}; to get it: {p['how_to_get']}")
    return EXIT_OK


def add_parser(sub) -> None:
    b = sub.add_parser("bundle", help="one archive with versions, topology, NVML, NCCL settings, doctor, "
                       "the run's captures, logs, traces and the ranks report",
                       description=__doc__.split("\n\n")[0])
    b.add_argument("out", help="the archive to write, *.tar.gz (never overwritten without --force)")
    b.add_argument("--run-dir", help="the job's run directory (capture, step logs, traces, NCCL logs)")
    b.add_argument("--no-doctor", action="store_true", help="leave out `hwlab doctor --quick` (it measures)")
    b.add_argument("--force", action="store_true", help="replace OUT if it exists")
    b.add_argument("--json", action="store_true", help="print the manifest as strict JSON")
    b.set_defaults(fn=cmd_bundle)
