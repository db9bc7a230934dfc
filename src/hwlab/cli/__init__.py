"""``hwlab`` command line: the parser, ``main`` and the small commands (probe, topo, evidence, lab).

Each larger subcommand lives in its own ``cli_<name>`` module with ``cmd_<name>`` and
``add_parser(sub)``, registered in :func:`build_parser`: doctor, examine, baseline, incident,
drill, ranks, class, bundle, flowchart. ``hwlab`` alone and ``hwlab --help`` open with the front door
(:data:`FRONT_DOOR`: what you have -> which command, an example each); every subcommand's help ends
with the exit codes (:data:`EXIT_CODES`, added by :func:`_finish`, which also strips docstring markup).
Conventions (like nvidia-smi, dcgmi, nccl-tests), shared by every subcommand:

* exit codes (:mod:`hwlab.errors`): 0 ok, 1 a finding (unhealthy verdict, deviation, failed
  grade), 2 bad input or usage (one line on stderr saying what to do; nothing measured or
  written), 3 internal error (one line asking for a report; the traceback with ``--debug`` or
  ``HWLAB_DEBUG=1``), 4 undecided (``examine``'s flowchart walk stopped at a question whose
  metric was not measured; distinct from a finding);
* ``--json``: strict JSON on stdout (no NaN/Infinity: null, with ``null_reasons``);
* every command that writes checks its destination before it measures
  (:func:`hwlab.core.store.check_destination`) and, if the write fails afterwards, saves the
  result in the rescue folder and prints where.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import textwrap
import traceback
from pathlib import Path

from hwlab import __version__
from hwlab.cli import (
    cmd_baseline as cli_baseline, cmd_bundle as cli_bundle, cmd_class as cli_class,
    cmd_doctor as cli_doctor, cmd_drill as cli_drill, cmd_examine as cli_examine,
    cmd_flowchart as cli_flowchart, cmd_incident as cli_incident, cmd_ranks as cli_ranks, lablaunch)
from hwlab.cli import cmd_hub as cli_hub
from hwlab.core import evidence, probes, topology
from hwlab.cli.console import Steps, print_json, stderr_is_terminal, whole_number
from hwlab.errors import EXIT_BROKEN_PIPE, EXIT_FINDING, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, UserInputError
from hwlab.core.measure import CorrectnessError, InputError, InsufficientMemoryError
from hwlab.core.specs import UnknownGPUError
from hwlab.core.store import read_user_text
from hwlab.core.topology import TopologyParseError

TOPO_HINT = "pass a saved `nvidia-smi topo -m` output"
ANSI = r"\x1b\[[0-9;]*[A-Za-z]"  # terminal styling a captured tool output may carry


# ---------------------------------------------------------------- probe
def cmd_probe(a) -> int:
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
    pr = sub.add_parser("probe", help="run one probe: " + ", ".join(probes.PARAMS),
                        description="Run one probe; `hwlab probe NAME --help` lists its parameters.")
    names = pr.add_subparsers(dest="name", required=True, metavar="NAME", help="the probe to run")
    for name, params in probes.PARAMS.items():
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
    if a.file:  # the user's file: read with the file-specific one-line refusals, then parsed
        t = topology.parse_topo_matrix(read_user_text(a.file, "topology file", TOPO_HINT), source=str(Path(a.file)))
    else:  # this node: nvidia-smi, else NVML (topology.capture, the kit's one capture)
        t = topology.capture().topo
        if t is None:
            raise UserInputError("no nvidia-smi and no NVML here: pass a saved "
                                 "`nvidia-smi topo -m` output with --file")
    if a.json:
        print_json(t.to_dict())
    else:
        print(t.render())
    return EXIT_OK


# ---------------------------------------------------------------- evidence
def cmd_evidence(a) -> int:
    if a.action == "list":
        rows = []
        found = sorted(evidence.RECORDED_DIR.glob("*/*.json"))
        if not found:
            env = " (HWLAB_RECORDED_DIR)" if os.environ.get("HWLAB_RECORDED_DIR") else ""
            raise UserInputError(f"no recorded evidence in {evidence.RECORDED_DIR}{env}: point HWLAB_RECORDED_DIR at "
                                 "a folder of <machine>/<record>.json, or unset it to list the kit's own")
        for p in found:
            ev = evidence.load(p)
            rows.append({"record": f"{p.parent.name}/{p.stem}", "kind": ev.kind, "label": ev.label})
        if a.json:
            print_json(rows)
        else:
            for r in rows:
                print(f"{r['record']}: {r['kind']}, {r['label']}")
        return EXIT_OK
    if a.target is not None and not a.target.strip():
        raise UserInputError("evidence show '': give a record kind (doctor), a name `hwlab evidence list` prints "
                             "(h200/doctor) or a .json path; leave it out for the doctor record")
    target = a.target or "doctor"
    p = Path(target)
    listed = evidence.RECORDED_DIR / f"{target}.json"  # a name `evidence list` prints: h200/doctor
    if p.suffix == ".json" or p.exists():
        ev = evidence.load(p)
    elif "/" in target and listed.is_file():
        ev = evidence.load(listed)
    elif os.sep in target or "/" in target:
        ev = evidence.load(p)  # a path that is not there: the reader's one-line refusal
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
        if isinstance(c.get("copy_gbps"), (int, float)):  # a doctor's ceilings, or a lab's copy ceiling
            gemm = ", ".join(f"{k} {v:,.1f} TFLOP/s" for k, v in (c.get("gemm_tflops") or {}).items())
            print(f"  ceilings: copy {c['copy_gbps']:,.0f} GB/s" + (f"; GEMM {gemm}" if gemm else "")
                  + (f" ({c['source']})" if c.get("source") else ""))
        else:  # a lab's own ceilings, named by their keys (units in the names)
            print("  ceilings:\n" + "\n".join(_outline(c, indent=4)))
    for r in ev.results:
        print("  " + r.summary())
    body = _outline(ev.extra or {}, indent=2)
    if body:
        print("  record body (values as recorded; nested parts summarised):")
        print("\n".join(body))
    print(f"  the whole record: hwlab evidence show {target} --json")
    return EXIT_OK


def _outline(obj, indent: int, depth: int = 0, max_depth: int = 2) -> list[str]:
    """The body of a record as an indented outline: scalars as recorded, nested dicts to
    ``max_depth`` levels, deeper dicts and long lists as their size and first keys."""
    pad, out = " " * (indent + 2 * depth), []
    for k, v in obj.items():
        if isinstance(v, dict) and depth < max_depth and v:
            out.append(f"{pad}{k}:")
            out += _outline(v, indent, depth + 1, max_depth)
        elif isinstance(v, dict) and not v:
            out.append(f"{pad}{k}: {{}}")
        elif isinstance(v, dict):
            keys = ", ".join(map(str, list(v)[:6])) + (", ..." if len(v) > 6 else "")
            out.append(f"{pad}{k}: {{{len(v)} keys: {keys}}}")
        elif isinstance(v, list) and (len(v) > 8 or any(isinstance(x, (dict, list)) for x in v)):
            out.append(f"{pad}{k}: [{len(v)} items]")
        elif isinstance(v, str) and "\n" in v:
            out.append(f"{pad}{k}: |")
            out += [f"{pad}  {re.sub(ANSI, '', ln)}" for ln in v.splitlines()[:40]]
        else:
            text = json.dumps(v, default=str)
            out.append(f"{pad}{k}: {text if len(text) <= 160 else text[:157] + '...'}")
    return out


# ---------------------------------------------------------------- lab
def cmd_lab(a) -> int:
    return lablaunch.run(a)


# ---------------------------------------------------------------- parser
#: (command, option a user gives it by mistake) -> what they meant: the two trace commands
#: spell their option differently (one trace, many traces), so each points to the other
MISTAKEN_OPTIONS = {
    ("hwlab examine", "--traces"): "examine reads one trace: --trace FILE_OR_DIR; to compare the ranks "
                                   "of a job: hwlab ranks --traces DIR",
}


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (argparse prints the whole usage block), exit 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


class _FrontDoor(_Parser):
    """The top-level parser: its help opens with :data:`FRONT_DOOR`, the usage line after it."""

    def format_help(self) -> str:
        return FRONT_DOOR + "\n\n" + super().format_help()


def _port(text: str) -> int:
    v = whole_number(text)
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port {v} is not in 1..65535")
    return v


#: what ``hwlab`` and ``hwlab --help`` open with: from what the user holds to the command, one
#: example line each (the examples are named by their package path, so each line runs as shown
#: from any folder)
FRONT_DOOR = """\
hwlab: hardware-aware GPU troubleshooting. What do you have? -> which command

  a slow job: is the machine slower than on a good day?
      hwlab baseline compare good.json now.json   (each: hwlab baseline record)
  one node slower than its siblings: a table, one row per node's baseline
      hwlab baseline compare good.json node1.json node2.json node3.json
  slower after a driver, CUDA or torch upgrade: compare the job's own traces
      hwlab examine --trace before.json.gz --out before.json  (then: after)
  a slow rank: one GPU of the job lags the others
      hwlab ranks RUN_DIR   (a trace per rank: hwlab ranks --traces DIR)
      RUN_DIR: what hwlab.core.capture and hwlab.core.steplog write in your job
  a trace: torch.profiler's trace of one process
      hwlab examine --trace trace.json.gz
  a model or a function of your own: measure it part by part
      hwlab examine hwlab.examples.small_transformer:model --model
  FP8 or bf16 slower than expected (precision, casts, scaling kernels)
      hwlab examine hwlab.examples.gemm_bf16:gemm_bf16   (then lab 04: FP8)
  a machine to check: new, suspect, after a driver update
      hwlab doctor

learning: hwlab lab (the notebooks), hwlab drill new (a hidden fault to find),
hwlab flowchart (the chart every verdict walks). Each command's --help says
what it reads and writes."""

#: the shared ending of every help (hwlab.errors): the same five codes everywhere
EXIT_CODES = ("exit codes: 0 ok; 1 a finding (unhealthy verdict, deviation, failed grade); 2 bad input "
              "or usage (one line on stderr says what to do; nothing measured or written), or a write "
              "that failed after the work (the result kept in the rescue folder, its path printed); "
              "3 internal error (--debug or HWLAB_DEBUG=1 shows the traceback); 4 undecided (a "
              "flowchart question whose metric was not measured, or data missing: the output names it).")

_DOC_MARKUP = re.compile(r":(?:mod|func|class|data|meth|attr):`~?([^`]*)`|``([^`]*)``")


def _clean(text: str | None) -> str | None:
    """Help text without the docstrings' markup (``x``, :mod:`x` -> x)."""
    return text if text is None else _DOC_MARKUP.sub(lambda m: m.group(1) or m.group(2), text)


def _finish(p: argparse.ArgumentParser) -> None:
    """Every subcommand's help, however deep: descriptions and option texts clean, and the
    exit codes as the epilog (one place, so a subcommand added later has them too)."""
    p.description, p.epilog = _clean(p.description), p.epilog or textwrap.fill(EXIT_CODES, 79)
    for act in p._actions:
        act.help = _clean(act.help)
        if isinstance(act, argparse._SubParsersAction):
            for sp in act.choices.values():
                _finish(sp)


def build_parser() -> argparse.ArgumentParser:
    p = _FrontDoor(prog="hwlab", epilog=textwrap.fill(EXIT_CODES, 79),
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"hwlab {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser,
                           help="what to do (above: what you have -> which command)")
    cli_doctor.add_parser(sub)
    cli_examine.add_parser(sub)
    _add_probe(sub)
    t = sub.add_parser("topo", help="parse and show the GPU topology")
    t.add_argument("--file", help="a saved `nvidia-smi topo -m` output")
    t.add_argument("--json", action="store_true", help="strict JSON on stdout")
    t.set_defaults(fn=cmd_topo)
    e = sub.add_parser("evidence", help="show recorded evidence (labelled as recorded)")
    e.add_argument("action", choices=["show", "list"], help="list the recorded evidence, or show one record")
    e.add_argument("target", nargs="?", help="a record kind (doctor, lab01_bandwidth), a name `evidence list` "
                   "prints (h200/doctor) or a .json path")
    e.add_argument("--device", default="h200", help="show KIND: the machine it was recorded on (default h200; "
                   "cpu where h200 has none)")
    e.add_argument("--json", action="store_true", help="strict JSON on stdout")
    e.set_defaults(fn=cmd_evidence)
    cli_baseline.add_parser(sub)
    cli_incident.add_parser(sub)
    cli_drill.add_parser(sub)
    lab = sub.add_parser("lab", help="open the labs in JupyterLab (your working copy, outside the checkout)")
    lab.add_argument("--dir", help="the notebooks/ folder")
    lab.add_argument("--port", type=_port, default=8888,
                     help="first port to try (default 8888; the next free one is taken)")
    lab.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser (print the URL only)")
    lab.add_argument("--refresh", action="store_true",
                     help="take the checkout's new notebook versions into your working copy (files you "
                          "modified are kept; the new version goes beside them as NAME.kit-DATE.ipynb)")
    lab.add_argument("--instructor", action="store_true",
                     help="show nbgrader's menus, Create Assignment and formgrader (hidden from learners)")
    lab.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    lab.set_defaults(fn=cmd_lab)
    cli_ranks.add_parser(sub)
    cli_class.add_parser(sub)
    cli_bundle.add_parser(sub)
    cli_flowchart.add_parser(sub)
    cli_hub.add_parser(sub)
    _finish(p)
    return p


# ---------------------------------------------------------------- main
def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input wherever they come from (exit 2, one line)."""
    return (UserInputError, InputError, InsufficientMemoryError, TopologyParseError,
            UnknownGPUError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
            PermissionError, FileExistsError, json.JSONDecodeError, UnicodeDecodeError)


#: errno -> what to do, for a file system's refusal met while reading or writing: the line names
#: the path and the cause in words, never a bare ``[Errno 28]``
_OS_TODO = {
    errno.ENOSPC: "the disk is full: free space there or choose another destination",
    errno.EDQUOT: "the disk quota is used up: free space or choose another destination",
    errno.EFBIG: "the file system or a size limit (ulimit -f) refuses a file this large: choose another destination",
    errno.EROFS: "the file system is read-only: choose a folder you can write to",
    errno.EACCES: "check its permissions or choose another path",
    errno.EPERM: "check its permissions or choose another path",
    errno.ENOENT: "check the path (a folder on the way may be missing)",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "it is a folder: give a file",
    errno.ENAMETOOLONG: "a name is too long for the file system: choose a shorter one",
    errno.ELOOP: "a symbolic link on the way loops back on itself: fix or remove it",
    errno.EIO: "the device reported an I/O error: check the disk, or choose another path",
}


def _os_line(e: OSError) -> str:
    """One line for a file system's refusal: what, where, and what to do."""
    where = f" ({e.filename})" if e.filename else ""
    return f"{e.strerror or type(e).__name__}{where}: {_OS_TODO[e.errno]}"


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return " ".join(x.strip() for x in text.splitlines() if x.strip())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # `hwlab` alone: the front door, not an error
        parser.print_help()
        return EXIT_OK
    a, extra = parser.parse_known_args(argv)
    if extra:  # named after the subcommand, with what was meant where the mistake is a known one
        prog = f"hwlab {a.cmd}"
        hint = MISTAKEN_OPTIONS.get((prog, extra[0].split("=")[0]))
        parser.exit(EXIT_USAGE, f"{prog}: unrecognized arguments: {' '.join(extra)}"
                    + (f": {hint}\n" if hint else f" (see `{prog} --help`)\n"))
    debug = a.debug or os.environ.get("HWLAB_DEBUG") not in (None, "", "0")
    try:
        rc = a.fn(a)
        sys.stdout.flush()  # a reader gone early (``| head``) shows here, not at interpreter exit
        return rc
    except BrokenPipeError:
        # like a C tool killed by SIGPIPE: silent, 128 + 13; stdout now points at /dev/null so the
        # interpreter's own flush at exit finds nothing to complain about
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"hwlab {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if not isinstance(e, UserInputError) and e.errno in _OS_TODO:
            print(f"hwlab {a.cmd}: {_os_line(e)}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(e, _user_errors()):
            print(f"hwlab {a.cmd}: {_one_line(e)}", file=sys.stderr)
            return EXIT_USAGE
        return _internal(a, e, debug)
    except _user_errors() as e:
        print(f"hwlab {a.cmd}: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a bug: say so in one line, the traceback only when asked
        if isinstance(e, CorrectnessError):  # a kernel disagreed with its reference: a finding
            print(f"hwlab {a.cmd}: {_one_line(e)}", file=sys.stderr)
            return EXIT_FINDING
        return _internal(a, e, debug)


def _internal(a, e: BaseException, debug: bool) -> int:
    """A bug: one line asking for a report; the traceback only when asked."""
    if debug:
        traceback.print_exception(e)
    print(f"hwlab {a.cmd}: internal error ({type(e).__name__}: {_one_line(e)[:200]}); please "
          "report it with the traceback (rerun with --debug or HWLAB_DEBUG=1)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
