"""Rewrite hwlab evidence records in the current schema version (:func:`hwlab.core.evidence.migrate`).

    PYTHONPATH=src .venv/bin/python scripts/migrate_evidence.py [PATH ...] [--check]

PATH is a record or a folder of records (searched recursively); the default is every record
under ``src/hwlab/recorded/``. Files that are not hwlab evidence (run folders' step logs,
topology captures) are skipped. A record already in the current version is left byte-identical;
an older one is brought up to date by the same migrations :func:`hwlab.core.evidence.load` runs and
rewritten atomically in place (:func:`hwlab.core.store.write_json_atomic`). ``--check`` writes
nothing: it lists the records that are not current and exits 1 if there are any.

``tools/results/`` keeps earlier runs as they were recorded; they are migrated when loaded,
and rewritten only if named here.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hwlab.core import evidence
from hwlab.core.store import write_json_atomic


def records(paths: list[Path]) -> list[Path]:
    """Every hwlab evidence record in ``paths`` (files, or folders searched recursively)."""
    out = []
    for p in paths:
        for f in sorted(p.rglob("*.json")) if p.is_dir() else [p]:
            try:
                d = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(d, dict) and d.get("schema") == evidence.SCHEMA:
                out.append(f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("paths", nargs="*", type=Path, default=[evidence.RECORDED_DIR])
    ap.add_argument("--check", action="store_true", help="list records not in the current version; write nothing")
    a = ap.parse_args(argv)
    old = []
    for f in records(a.paths):
        d = json.loads(f.read_text(encoding="utf-8"))
        v = d.get("schema_version")
        if v == evidence.SCHEMA_VERSION:
            continue
        old.append(f)
        if a.check:
            print(f"{f}: schema version {v}, current is {evidence.SCHEMA_VERSION}")
            continue
        new = evidence.migrate(d, f)
        evidence.load(f)  # the loader accepts the file before it is replaced
        write_json_atomic(f, new, overwrite=True)
        evidence.load(f)  # and the rewritten file
        print(f"{f}: version {v} -> {new['schema_version']}")
    if not old:
        print(f"every record is in schema version {evidence.SCHEMA_VERSION}")
    return 1 if a.check and old else 0


if __name__ == "__main__":
    sys.exit(main())
