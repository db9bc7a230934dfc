"""``hwlab baseline record|compare``: measure this node's health baseline, or compare against one.

Exit codes: 0 recorded, or within tolerance or within both runs' spread (borderline changes are
listed; on a CPU baseline, changes with the host's load are listed too); 1 a deviation beyond
spread (a finding); 2 bad input, or runs
that are not comparable (different GPU, count, driver/CUDA major, probe sizes, no probe in common:
an empty record), or a write that failed after measuring (the result is kept in the rescue folder);
3 internal error; 4 undecided: nothing failed, but baseline probes missing from the new record were
not compared (they are listed; nothing compared is not a match).
"""
from __future__ import annotations

import sys
from pathlib import Path

from hwlab.cli.console import Steps, print_json
from hwlab.errors import EXIT_FINDING, EXIT_OK, EXIT_UNDECIDED, EXIT_USAGE, UserInputError
from hwlab.core.store import RecordExistsError, check_destination, check_folder, write_or_rescue


def cmd_baseline(a) -> int:
    if a.action == "record":
        return _record(a)
    from hwlab.core import evidence  # loaded by the command that runs (start-up of the others)
    from hwlab.diagnosis import baseline_compare  # comparing reads records: no torch

    if not a.paths or len(a.paths) < 2:
        raise UserInputError("compare needs BASELINE.json NEW.json [NEW2.json ...]")
    base = evidence.load(a.paths[0])
    if len(a.paths) > 2:
        rows = baseline_compare.fleet_table(a.paths[1:], base)
        if a.json:
            print_json(rows)
        else:
            print(render_fleet(rows, a.paths[0]))
        verdicts = {r.get("verdict") for r in rows} - {None}
        return (EXIT_USAGE if "not comparable" in verdicts
                else EXIT_FINDING if verdicts - {"ok", "incomplete"}
                else EXIT_UNDECIDED if "incomplete" in verdicts else EXIT_OK)
    c = baseline_compare.compare(base, evidence.load(a.paths[1]))
    if a.json:
        print_json(c.to_dict())
    else:
        print(c.summary())
    if not c.comparable:
        return EXIT_USAGE
    if c.undecided:  # some baseline probes were not measured now: no verdict on them
        return EXIT_UNDECIDED
    return EXIT_OK if c.ok else EXIT_FINDING


def render_fleet(rows: list[dict], base: str) -> str:
    """The fleet table as text: one row per node, one column per probe (its unit in the header),
    the verdict against ``base`` last; a value a node lacks is ``-``."""
    fixed = ("host", "device", "recorded_at", "verdict", "not_comparable")
    probes = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in fixed]
    head = ["host", *probes, "verdict"]

    def cell(r: dict, k: str) -> str:
        v = r.get(k)
        if v is None:
            return "-"
        return f"{v:,.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    table = [head] + [[cell(r, k) for k in head] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"fleet against {base} (per node: each probe's figure; verdict as `baseline compare` gives it)"]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
              for row in table]
    for r in rows:
        if r.get("not_comparable"):
            lines.append(f"{r.get('host')}: not comparable: " + "; ".join(map(str, r["not_comparable"][:3])))
    return "\n".join(lines)


def _record(a) -> int:
    from hwlab.diagnosis import baseline  # measures (torch): loaded only to record

    if a.paths:
        raise UserInputError("baseline record takes no paths: use --out FILE.json or --out FOLDER")
    out = Path(a.out) if a.out else None
    if out is not None and out.suffix not in ("", ".json") and not out.exists():
        raise UserInputError(f"--out {a.out}: a baseline is a .json record; give FILE.json, or a folder "
                             "(a name without a suffix) to hold baseline-<host>-<time>.json")
    if out is not None and out.suffix == ".json":
        check_destination(out, overwrite=a.force)
    else:
        check_folder(out or Path("."), what="--out folder")
    if not baseline.should_record_on_this_rank():
        print("not local rank 0: one process per node records the baseline", file=sys.stderr)
        return EXIT_OK
    with Steps("hwlab baseline", 8) as st:
        ev = baseline.record(quick=a.quick, progress=st.step)
    named = out is not None and out.suffix == ".json"
    target = out if named else baseline.default_path(out or ".")

    def save() -> Path:
        if named:
            return ev.save(target, overwrite=a.force)
        for n in range(1000):  # a name of its own, even for records written in the same second
            try:
                return ev.save(baseline.default_path(out or ".", n))
            except RecordExistsError:
                continue
        raise RecordExistsError(f"1000 baselines of this host were written into {out or '.'} this second")
    written, err = write_or_rescue(save, ev.to_dict(), "baseline", target)
    if err:
        print(f"hwlab baseline: {err}", file=sys.stderr)
        return EXIT_USAGE
    missing = ", ".join(f"{k} ({v})" for k, v in ev.extra["missing"].items()) or "none"
    if a.json:
        print_json({"written": str(written), "probes": len(ev.results), "missing": ev.extra["missing"]})
    else:
        print(f"baseline written to {written} ({len(ev.results)} probes; missing: {missing})")
    return EXIT_OK


def add_parser(sub) -> None:
    b = sub.add_parser("baseline", help="node health baseline: record, or compare against one",
                       description="record: measure this node. compare: exit 0 within tolerance "
                       "or within both runs' p10-p90 spread (borderline), 1 a deviation beyond spread, "
                       "2 not comparable (different GPU, count, driver/CUDA major, "
                       "probe sizes, no probe in common) or bad input, 4 undecided (baseline probes "
                       "missing from the new record, listed).")
    b.add_argument("action", choices=["record", "compare"], help="record (measure this node) or compare")
    b.add_argument("paths", nargs="*", help="compare: BASELINE.json NEW.json [more NEW for a fleet table]")
    b.add_argument("--out", help="record: a .json path or a folder (default: ./baseline-<host>-<time>.json)")
    b.add_argument("--quick", action="store_true", help="record: small sizes (seconds, less accurate)")
    b.add_argument("--force", action="store_true", help="record: replace --out FILE.json if it exists")
    b.add_argument("--json", action="store_true", help="strict JSON on stdout")
    b.set_defaults(fn=cmd_baseline)
