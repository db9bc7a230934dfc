"""``hwlab`` command line: doctor, probe, topo, evidence, baseline, incident, drill, lab.

Conventions (like nvidia-smi, dcgmi, nccl-tests), shared by every subcommand including the
``cli_<name>`` modules other parts register:

* exit codes (:mod:`hwlab.errors`): 0 ok, 1 a finding (unhealthy verdict, deviation, failed
  grade), 2 bad input or usage (one line on stderr saying what to do; nothing measured or
  written), 3 internal error (one line asking for a report; the traceback with ``--debug`` or
  ``HWLAB_DEBUG=1``);
* ``--json``: strict JSON on stdout (no NaN/Infinity: null, with ``null_reasons``);
* every command that writes checks its destination before it measures
  (:func:`hwlab.store.check_destination`) and, if the write fails afterwards, saves the
  result in the rescue folder and prints where.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from . import __version__, cli_doctor, cli_examine
from .cli_doctor import doctor_report  # noqa: F401  (benchmarks/refresh_gpu_evidence.py uses it)
from .console import Steps, print_json, stderr_is_terminal
from .errors import EXIT_FINDING, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, UserInputError
from .store import check_destination, check_folder, rescue_json
from . import classroom, cli_class, cli_ranks  # noqa: E402,I001  (issue 20's commands and class results)

EXIT_FAIL = EXIT_FINDING  # the old name, kept for callers


def _read_json(path: str | os.PathLike, what: str) -> Any:
    """A user-given JSON file, or one line saying why it cannot be used."""
    p = Path(path)
    if p.is_dir():
        raise UserInputError(f"{what} {p} is a folder: pass a .json file")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{what} {p} does not exist") from None
    except UnicodeDecodeError:
        raise UserInputError(f"{what} {p} is not text (binary data): pass a .json file") from None
    except OSError as e:
        raise UserInputError(f"cannot read {what} {p} ({e.strerror or e})") from None
    if not text.strip():
        raise UserInputError(f"{what} {p} is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserInputError(f"{what} {p} is not valid JSON (line {e.lineno}, column {e.colno}: "
                             f"{e.msg}); it may be truncated") from None


def _write_or_rescue(write, obj: Any, stem: str, target: Path) -> tuple[Path | None, str | None]:
    """Run ``write()``; if it fails after a measurement, keep ``obj`` in the rescue folder.
    Returns (written path, None) or (None, one line saying where the result went)."""
    try:
        return write(), None
    except OSError as e:
        fb = rescue_json(obj, stem)
        return None, (f"could not write {target} ({e.strerror or e}); the result was saved to "
                      f"{fb} instead")


# ---------------------------------------------------------------- probe
def cmd_probe(a) -> int:
    from . import probes

    kwargs = probes.parse_params(a.name, a.param or [])
    # one step: a spinner in a terminal; no plain line (it would say nothing a log needs)
    with Steps(f"hwlab probe {a.name}", 1, enabled=stderr_is_terminal()) as st:
        st.step("measuring")
        m = probes.PROBES[a.name](**kwargs)
    if a.json:
        print_json(m.to_dict())
    else:
        print(m.summary())
    return EXIT_OK


def _add_probe(sub) -> None:
    from .probes import PARAMS

    pr = sub.add_parser("probe", help="run one probe: " + ", ".join(PARAMS),
                        description="Run one probe; `hwlab probe NAME --help` lists its parameters.")
    names = pr.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, params in PARAMS.items():
        lines = "\n".join("  -p " + p.describe() for p in params)
        q = names.add_parser(name, help=f"parameters: {', '.join(p.name for p in params)}",
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             description=f"probe {name}; parameters (-p KEY=VALUE):\n{lines}")
        q.add_argument("--param", "-p", action="append", metavar="KEY=VALUE",
                       help="a parameter from the list above")
        q.add_argument("--json", action="store_true", help="strict JSON on stdout")
        q.set_defaults(fn=cmd_probe)


# ---------------------------------------------------------------- topo
def cmd_topo(a) -> int:
    from . import topology

    if a.file:
        p = Path(a.file)
        if p.is_dir():
            raise UserInputError(f"{p} is a folder: pass a saved `nvidia-smi topo -m` output")
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserInputError(f"{p} does not exist") from None
        except UnicodeDecodeError:
            raise UserInputError(f"{p} is not text: pass a saved `nvidia-smi topo -m` output") from None
        if not text.strip():
            raise UserInputError(f"{p} is empty: pass a saved `nvidia-smi topo -m` output")
        src = str(p)
    else:
        text = topology.capture_topo_text()
        src = "nvidia-smi topo -m"
        if text is None:
            t = topology.from_nvml()
            if t is None:
                raise UserInputError("no nvidia-smi and no NVML here: pass a saved "
                                     "`nvidia-smi topo -m` output with --file")
            if a.json:
                print_json(t.to_dict())
            else:
                print(t.render())
            return EXIT_OK
    t = topology.parse_topo_matrix(text, source=src)
    if a.json:
        print_json(t.to_dict())
    else:
        print(t.render())
    return EXIT_OK


# ---------------------------------------------------------------- evidence
def cmd_evidence(a) -> int:
    from . import evidence

    if a.action == "list":
        rows = []
        for p in sorted(evidence.RECORDED_DIR.glob("*/*.json")):
            ev = evidence.load(p)
            rows.append({"record": f"{p.parent.name}/{p.stem}", "kind": ev.kind, "label": ev.label})
        if a.json:
            print_json(rows)
        else:
            for r in rows:
                print(f"{r['record']}: {r['kind']}, {r['label']}")
        return EXIT_OK
    target = a.target or "doctor"
    p = Path(target)
    if p.suffix == ".json" or os.sep in target or p.exists():
        ev = evidence.load(p)
    else:
        try:
            ev = evidence.recorded(target, a.device)
        except evidence.EvidenceError:
            ev = evidence.recorded(target, "cpu")
    if a.json:
        print_json(ev.to_dict())
        return EXIT_OK
    print(f"{ev.kind}: {ev.label.upper()} (not measured on this machine)")
    if ev.ceilings:
        c = ev.ceilings
        print(f"  ceilings: copy {c['copy_gbps']:,.0f} GB/s; GEMM " +
              ", ".join(f"{k} {v:,.1f} TFLOP/s" for k, v in c.get("gemm_tflops", {}).items()))
    for r in ev.results:
        print("  " + r.summary())
    return EXIT_OK


# ---------------------------------------------------------------- lab
def cmd_lab(a) -> int:
    from . import lablaunch

    return lablaunch.run(a)


# ---------------------------------------------------------------- baseline
def cmd_baseline(a) -> int:
    from . import baseline, evidence

    if a.action == "record":
        if a.paths:
            raise UserInputError("baseline record takes no paths: use --out FILE.json or --out FOLDER")
        out = Path(a.out) if a.out else None
        if out is not None and out.suffix == ".json":
            check_destination(out, overwrite=a.force)
        else:
            check_folder(out or Path("."), what="--out folder")
        if not baseline.should_record_on_this_rank():
            print("not local rank 0: one process per node records the baseline", file=sys.stderr)
            return EXIT_OK
        with Steps("hwlab baseline", 8) as st:
            ev = baseline.record(quick=a.quick, progress=st.step)
        target = out if out is not None and out.suffix == ".json" else baseline.default_path(out or ".")
        written, err = _write_or_rescue(lambda: ev.save(target, overwrite=a.force), ev.to_dict(),
                                        "baseline", target)
        if err:
            print(f"hwlab baseline: {err}", file=sys.stderr)
            return EXIT_USAGE
        missing = ", ".join(f"{k} ({v})" for k, v in ev.extra["missing"].items()) or "none"
        if a.json:
            print_json({"written": str(written), "probes": len(ev.results), "missing": ev.extra["missing"]})
        else:
            print(f"baseline written to {written} ({len(ev.results)} probes; missing: {missing})")
        return EXIT_OK
    if not a.paths or len(a.paths) < 2:
        raise UserInputError("compare needs BASELINE.json NEW.json [NEW2.json ...]")
    base = evidence.load(a.paths[0])
    if len(a.paths) > 2:
        rows = baseline.fleet_table(a.paths[1:], base)
        if a.json:
            print_json(rows)
        else:
            for row in rows:
                print(json.dumps(row))
        return (EXIT_USAGE if any(r.get("verdict") == "not comparable" for r in rows)
                else EXIT_FINDING if any(r.get("verdict") not in (None, "ok") for r in rows)
                else EXIT_OK)
    c = baseline.compare(base, evidence.load(a.paths[1]))
    if a.json:
        print_json(c.to_dict())
    else:
        print(c.summary())
    if not c.comparable:
        return EXIT_USAGE
    return EXIT_OK if c.ok else EXIT_FINDING


# ---------------------------------------------------------------- incident
def _observations(path: str) -> dict[str, Any]:
    obs = _read_json(path, "observations file")
    if not isinstance(obs, dict):
        raise UserInputError(f"observations file {path} should hold a JSON object of metric -> "
                             f"value, not a {type(obs).__name__}")
    for k, v in obs.items():
        if v is not None and not isinstance(v, (int, float, bool)):
            raise UserInputError(f"observations file {path}: {k!r} should be a number, true/false "
                                 f"or null, not {json.dumps(v)[:40]}")
    return obs


def cmd_incident(a) -> int:
    from . import evidence, flowchart, incident

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
        fb = rescue_json(dataclasses.asdict(inc), "incident")
        print(f"hwlab incident: could not write into {folder} ({e.strerror or e}); the record was "
              f"saved to {fb} instead", file=sys.stderr)
        return EXIT_USAGE
    if a.json:
        print_json({"markdown": str(md), "json": str(js), "leaf": d.leaf_id, "path": d.path,
                    "explanation": d.explain()})
    else:
        print(f"incident written: {md} and {js}\n")
        print(d.explain())
    return EXIT_OK


# ---------------------------------------------------------------- drill
def _load_drill(path: str):
    from . import drills

    raw = _read_json(path, "drill file")
    if not isinstance(raw, dict):
        raise UserInputError(f"drill file {path} is not a drill written by `hwlab drill new` (it holds "
                             f"a JSON {type(raw).__name__}, not an object)")
    try:
        return drills.Drill.load(path)
    except (TypeError, KeyError, AttributeError) as e:
        raise UserInputError(f"drill file {path} is not a drill written by `hwlab drill new` "
                             f"({str(e)[:80]})") from None


def cmd_drill(a) -> int:
    from . import drills
    from .store import write_json_atomic

    if a.action == "new":
        if a.drill:
            raise UserInputError("drill new takes no drill file (it writes one into --dir)")
        if a.fault is not None and a.fault not in drills.FAULTS:
            raise UserInputError(f"unknown fault {a.fault!r}; choose one of {', '.join(drills.FAULTS)}")
        folder = check_folder(a.dir, what="--dir folder")
        d = drills.new(seed=a.seed, fault=a.fault)
        p, err = _write_or_rescue(lambda: d.save(folder), dataclasses.asdict(d), "drill", folder)
        if err:
            print(f"hwlab drill: {err}", file=sys.stderr)
            return EXIT_USAGE
        if a.json:
            print_json({"drill_id": d.drill_id, "file": str(p), "workload": d.workload,
                        "source": d.source, "observations": d.observations})
            return EXIT_OK
        print(f"drill {d.drill_id} written to {p}\nworkload: {d.workload}\nwhat the probes show "
              f"({d.source}):\n{json.dumps(d.observations, indent=2)}\nwalk the flowchart, then: "
              f"hwlab drill submit {p} --leaf LEAF --learner NAME")
        return EXIT_OK
    if a.action == "summary":
        folder = Path(a.dir)
        if not folder.is_dir():
            raise UserInputError(f"--dir {folder} is not a folder of grades: pass the folder "
                                 "`hwlab drill submit` wrote into")
        grades = []
        for x in sorted(folder.glob("grade-*.json")):
            g = _read_json(x, "grade file")
            try:
                grades.append(drills.Grade(**g))
            except TypeError:
                raise UserInputError(f"grade file {x} is not a grade written by `hwlab drill submit`") from None
        print_json(drills.class_summary(grades))
        return EXIT_OK
    if not a.drill:
        raise UserInputError(f"drill {a.action} needs the drill's .json file")
    d = _load_drill(a.drill)
    if a.action == "reveal":
        print_json(drills.reveal(d))
        return EXIT_OK
    from .flowchart import LEAVES

    if not a.leaf:
        raise UserInputError(f"submit needs --leaf ({', '.join(LEAVES)})")
    if a.leaf not in LEAVES:
        raise UserInputError(f"--leaf {a.leaf!r}: leaf must be one of {', '.join(LEAVES)}")
    if not re.fullmatch(r"[\w.-]{1,64}", a.learner) or a.learner.startswith("."):
        raise UserInputError(f"--learner {a.learner!r}: use 1-64 letters, digits, '.', '-' or '_' "
                             "(it becomes part of the grade's file name)")
    ev = _read_json(a.evidence, "evidence file") if a.evidence else None
    if ev is not None and not isinstance(ev, dict):
        raise UserInputError(f"evidence file {a.evidence} should hold a JSON object of metric -> value")
    folder = check_folder(a.dir, what="--dir folder")
    class_folder = check_folder(a.class_dir, what="--class-dir folder") if a.class_dir else None
    g = drills.grade(d, a.leaf, ev, learner=a.learner)
    classroom.record_drill(d, g, class_folder)  # no-op unless --class-dir or HWLAB_CLASS_DIR
    target = folder / f"grade-{d.drill_id}-{a.learner}-{g.at.replace(':', '')}.json"
    _, err = _write_or_rescue(lambda: write_json_atomic(target, dataclasses.asdict(g)),
                              dataclasses.asdict(g), "grade", target)
    if a.json:
        print_json({**dataclasses.asdict(g), "passed": g.passed, "file": None if err else str(target)})
    else:
        print(("PASSED: " if g.passed else "NOT YET: ") + g.explanation)
    if err:
        print(f"hwlab drill: {err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if g.passed else EXIT_FINDING


# ---------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (argparse prints the whole usage block), exit 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range (0 .. 2^63-1)")
    return v


def _port(text: str) -> int:
    v = _positive_int(text)
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port {v} is not in 1..65535")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hwlab", description="hardware-aware GPU troubleshooting kit. Exit codes: "
                "0 ok, 1 finding (unhealthy verdict, deviation, failed grade), 2 bad input or "
                "usage, 3 internal error.")
    p.add_argument("--version", action="version", version=f"hwlab {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = p.add_subparsers(dest="cmd", required=True)
    cli_doctor.add_parser(sub)
    cli_examine.add_parser(sub)
    _add_probe(sub)
    t = sub.add_parser("topo", help="parse and show the GPU topology")
    t.add_argument("--file", help="a saved `nvidia-smi topo -m` output")
    t.add_argument("--json", action="store_true")
    t.set_defaults(fn=cmd_topo)
    e = sub.add_parser("evidence", help="show recorded evidence (labelled as recorded)")
    e.add_argument("action", choices=["show", "list"])
    e.add_argument("target", nargs="?", help="a record kind (doctor, lab01_bandwidth) or a .json path")
    e.add_argument("--device", default="h200")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_evidence)
    b = sub.add_parser("baseline", help="node health baseline: record, or compare against one",
                       description="record: measure this node. compare: exit 0 within tolerance, "
                       "1 a deviation, 2 not comparable (different GPU, count, driver/CUDA major, "
                       "probe sizes) or bad input.")
    b.add_argument("action", choices=["record", "compare"])
    b.add_argument("paths", nargs="*", help="compare: BASELINE.json NEW.json [more NEW for a fleet table]")
    b.add_argument("--out", help="record: a .json path or a folder (default: ./baseline-<host>-<time>.json)")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--force", action="store_true")
    b.add_argument("--json", action="store_true")
    b.set_defaults(fn=cmd_baseline)
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
    dr = sub.add_parser("drill", help="diagnosis drills: a hidden fault to find")
    dr.add_argument("action", choices=["new", "submit", "reveal", "summary"])
    dr.add_argument("drill", nargs="?", help="submit/reveal: the drill .json")
    dr.add_argument("--seed", type=_positive_int)
    dr.add_argument("--fault", help="instructor: choose the fault (see hwlab.drills.FAULTS)")
    dr.add_argument("--leaf")
    dr.add_argument("--evidence", help="submit: a .json of the metrics your diagnosis rests on")
    dr.add_argument("--learner", default="anonymous")
    dr.add_argument("--dir", default="drills", help="where drills and grades are kept")
    dr.add_argument("--json", action="store_true", help="new/submit: strict JSON on stdout "
                    "(reveal and summary always print JSON)")
    dr.add_argument("--class-dir", help="submit: also record the graded result here (default: $HWLAB_CLASS_DIR)")
    dr.set_defaults(fn=cmd_drill)
    lab = sub.add_parser("lab", help="open the labs in JupyterLab")
    lab.add_argument("--dir", help="the notebooks/ folder")
    lab.add_argument("--port", type=_port, default=8888,
                     help="first port to try (default 8888; the next free one is taken)")
    lab.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    lab.add_argument("--no-browser", action="store_true")
    lab.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    lab.set_defaults(fn=cmd_lab)
    cli_ranks.add_parser(sub)
    cli_class.add_parser(sub)
    return p


# ---------------------------------------------------------------- main
def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input wherever they come from (exit 2, one line)."""
    from .measure import InputError, InsufficientMemoryError
    from .specs import UnknownGPUError
    from .topology import TopologyParseError

    return (UserInputError, InputError, InsufficientMemoryError, TopologyParseError,
            UnknownGPUError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
            PermissionError, FileExistsError, json.JSONDecodeError, UnicodeDecodeError)


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return " ".join(x.strip() for x in text.splitlines() if x.strip())


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    debug = a.debug or os.environ.get("HWLAB_DEBUG") not in (None, "", "0")
    try:
        return a.fn(a)
    except KeyboardInterrupt:
        print(f"hwlab {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except _user_errors() as e:
        print(f"hwlab {a.cmd}: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a bug: say so in one line, the traceback only when asked
        from .measure import CorrectnessError

        if isinstance(e, CorrectnessError):  # a kernel disagreed with its reference: a finding
            print(f"hwlab {a.cmd}: {_one_line(e)}", file=sys.stderr)
            return EXIT_FINDING
        if debug:
            import traceback

            traceback.print_exc()
        print(f"hwlab {a.cmd}: internal error ({type(e).__name__}: {_one_line(e)[:200]}); please "
              "report it with the traceback (rerun with --debug or HWLAB_DEBUG=1)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
