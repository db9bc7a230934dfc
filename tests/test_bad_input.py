"""Bad input to every command: one line on stderr saying what is wrong, exit code 2, nothing
measured (stdout empty) and nothing already written changed (every file in the working folder
byte-identical, no file added). Run in-process through ``hwlab.cli.main`` (fast); a few through
a subprocess, as a user runs them. A write that fails *after* a measurement keeps the result
in the rescue folder and says where."""
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwlab import cli
from hwlab.core import evidence

ROOT = Path(__file__).resolve().parents[1]
H200 = evidence.RECORDED_DIR / "h200"
TRUNCATED = '{"schema": "hwlab.evidence", "schema_version": 1, "kind": "baseline", "mach'
WRONG_SHAPE = json.dumps({"schema": "hwlab.evidence", "schema_version": 1, "kind": "baseline",
                          "machine": [], "results": {}, "recorded_at": "2026"})


def _unwritable() -> str:
    """A folder this user cannot create files in (root writes through permissions: /sys)."""
    return "/sys" if os.geteuid() == 0 else "/proc/1"


@pytest.fixture
def area(tmp_path, monkeypatch):
    """A working folder holding one file of each kind of bad input, and records already written."""
    files = {
        "existing.json": '{"already": "written"}\n',
        "empty.json": "",
        "truncated.json": TRUNCATED,
        "list.json": "[1, 2, 3]",
        "wrong_shape.json": WRONG_SHAPE,
        "not_a_drill.json": '{"drill_id": 1}',
        "notes.txt": "a file where a folder is expected\n",
        "bad_value.json": '{"achieved_pct_of_copy_ceiling": "fast"}',
        "topo_truncated.txt": "        GPU0    GPU1\nGPU0     X      NV4\nGPU1    NV",
        "topo_garbage.txt": "hello world\nthis is not a topology\n",
        "grades/grade-x.json": '{"nope": 1}',
        "incidents/incident-2026-01-01-001.json": '{"kept": true}',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 20)
    (tmp_path / "folder").mkdir()
    doctor = tmp_path / "doctor.json"
    doctor.write_text((H200 / "doctor.json").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HWLAB_RESCUE_DIR", str(tmp_path / "rescue"))
    return tmp_path


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def run_main(argv, capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


B = str(H200 / "baseline.json")
BAD_FILES = [("missing", "missing.json", "does not exist"), ("empty", "empty.json", "empty"),
             ("binary", "binary.json", "not text"), ("directory", "folder", "folder"),
             ("truncated", "truncated.json", "not valid JSON")]

CASES = [
    # top level
    ("no command, an option only", ["--debug"], "required"),  # `hwlab` alone: the front door (test_cli_help)
    ("unknown command", ["frobnicate"], "invalid choice"),
    # evidence
    *[(f"evidence show {k}", ["evidence", "show", f], m) for k, f, m in BAD_FILES],
    ("evidence show wrong shape (list)", ["evidence", "show", "list.json"], "not an hwlab evidence record"),
    ("evidence show wrong shape (fields)", ["evidence", "show", "wrong_shape.json"], "should be a dict"),
    ("evidence show unknown name", ["evidence", "show", "no_such_record"], "no recorded"),
    ("evidence unknown action", ["evidence", "frob"], "invalid choice"),
    # probe
    ("probe unknown name", ["probe", "warp_drive"], "invalid choice"),
    ("probe negative", ["probe", "hbm_copy", "-p", "size_mib=-1"], "integer 1.."),
    ("probe zero", ["probe", "hbm_copy", "-p", "size_mib=0"], "integer 1.."),
    ("probe non-numeric", ["probe", "gemm", "-p", "size=big"], "integer 1.."),
    ("probe float", ["probe", "gemm", "-p", "size=1e3"], "integer 1.."),
    ("probe huge (out of range)", ["probe", "gemm", "-p", "size=99999999999"], "integer 1.."),
    ("probe huge (does not fit)", ["probe", "hbm_copy", "-p", "size_mib=1048576"], "choose a smaller size"),
    ("probe huge gemm (does not fit)", ["probe", "gemm", "-p", "size=1048576", "-p", "dtype=fp32"],
     "choose a smaller size"),
    ("probe n_rep zero", ["probe", "launch_overhead", "-p", "n_rep=0"], "integer 1.."),
    ("probe launches huge", ["probe", "launch_overhead", "-p", "n_launches=10000001"], "integer 1.."),
    ("probe unknown dtype", ["probe", "gemm", "-p", "dtype=fp9"], "one of fp32"),
    ("probe unknown param", ["probe", "gemm", "-p", "warp=9"], "has no parameter 'warp'"),
    ("probe no equals", ["probe", "gemm", "-p", "size"], "KEY=VALUE"),
    ("probe twice", ["probe", "gemm", "-p", "size=8", "-p", "size=9"], "given twice"),
    ("probe bad bool", ["probe", "host_link", "-p", "pinned=maybe"], "true or false"),
    ("probe bad choice", ["probe", "host_link", "-p", "direction=sideways"], "one of h2d"),
    # topo
    *[(f"topo {k}", ["topo", "--file", f], m.replace("not valid JSON", "line"))
      for k, f, m in BAD_FILES if k != "truncated"],
    ("topo truncated", ["topo", "--file", "topo_truncated.txt"], "line"),
    ("topo wrong shape", ["topo", "--file", "topo_garbage.txt"], "GPU"),
    # doctor: the destination is refused before anything is measured
    ("doctor save exists", ["doctor", "--save", "existing.json"], "already exists"),
    ("doctor save is a folder", ["doctor", "--save", "folder"], "is a folder"),
    ("doctor save under a file", ["doctor", "--save", "notes.txt/d.json"], "is a file, not a folder"),
    ("doctor save unwritable", ["doctor", "--save", f"{_unwritable()}/d.json"], "cannot"),
    # baseline
    ("baseline record out exists", ["baseline", "record", "--out", "existing.json"], "already exists"),
    ("baseline record out is a file", ["baseline", "record", "--out", "notes.txt"], "is a file"),
    ("baseline record out unwritable", ["baseline", "record", "--out", f"{_unwritable()}/b.json"], "cannot"),
    ("baseline record stray path", ["baseline", "record", "x.json"], "takes no paths"),
    ("baseline compare one path", ["baseline", "compare", B], "needs BASELINE.json NEW.json"),
    *[(f"baseline compare {k}", ["baseline", "compare", B, f], m) for k, f, m in BAD_FILES],
    ("baseline compare wrong shape", ["baseline", "compare", B, "wrong_shape.json"], "should be a dict"),
    ("baseline compare not a baseline", ["baseline", "compare", B, "doctor.json"], "'doctor' record"),
    ("baseline compare base missing", ["baseline", "compare", "missing.json", B], "does not exist"),
    ("baseline fleet with a bad file", ["baseline", "compare", B, B, "truncated.json"], "not valid JSON"),
    # incident
    *[(f"incident observations {k}", ["incident", "--title", "t", "--scope", "single-card", "--symptom", "s",
                                      "--fix", "f", "--reverify", "r", "--observations", f], m)
      for k, f, m in BAD_FILES],
    ("incident observations wrong shape", ["incident", "--title", "t", "--scope", "single-card",
                                           "--symptom", "s", "--fix", "f", "--reverify", "r",
                                           "--observations", "list.json"], "JSON object"),
    ("incident observations non-numeric", ["incident", "--title", "t", "--scope", "single-card",
                                           "--symptom", "s", "--fix", "f", "--reverify", "r",
                                           "--observations", "bad_value.json"], "should be a number"),
    ("incident evidence missing", ["incident", "--title", "t", "--scope", "single-card", "--symptom", "s",
                                   "--fix", "f", "--reverify", "r", "--evidence", "missing.json"],
     "does not exist"),
    ("incident unknown scope", ["incident", "--title", "t", "--scope", "galaxy", "--symptom", "s",
                                "--fix", "f", "--reverify", "r"], "is not one of"),
    ("incident out is a file", ["incident", "--title", "t", "--scope", "single-card", "--symptom", "s",
                                "--fix", "f", "--reverify", "r", "--out", "notes.txt"], "is a file"),
    ("incident missing title", ["incident", "--scope", "single-card"], "required"),
    # drill
    ("drill unknown fault", ["drill", "new", "--fault", "gremlins"], "unknown fault"),
    ("drill seed negative", ["drill", "new", "--seed", "-3"], "seed"),
    ("drill seed non-numeric", ["drill", "new", "--seed", "three"], "seed"),
    ("drill seed huge", ["drill", "new", "--seed", "9" * 30], "seed"),
    ("drill new dir is a file", ["drill", "new", "--dir", "notes.txt"], "is a file"),
    ("drill new stray file", ["drill", "new", "x.json"], "takes no drill file"),
    *[(f"drill submit {k}", ["drill", "submit", f, "--leaf", "G"], m) for k, f, m in BAD_FILES],
    ("drill submit wrong shape (list)", ["drill", "submit", "list.json", "--leaf", "G"], "hwlab drill new"),
    ("drill submit wrong shape (fields)", ["drill", "submit", "not_a_drill.json", "--leaf", "G"],
     "hwlab drill new"),
    ("drill submit no file", ["drill", "submit", "--leaf", "G"], "needs the drill's .json"),
    ("drill reveal missing", ["drill", "reveal", "missing.json"], "does not exist"),
    ("drill summary missing dir", ["drill", "summary", "--dir", "nowhere"], "is not a folder"),
    ("drill summary bad grade", ["drill", "summary", "--dir", "grades"], "not a grade"),
    ("drill unknown action", ["drill", "grade"], "invalid choice"),
    # lab
    ("lab port zero", ["lab", "--dry-run", "--port", "0"], "port"),
    ("lab port negative", ["lab", "--dry-run", "--port", "-1"], "port"),
    ("lab port huge", ["lab", "--dry-run", "--port", "70000"], "port"),
    ("lab port non-numeric", ["lab", "--dry-run", "--port", "http"], "port"),
    ("lab dir without notebooks", ["lab", "--dry-run", "--dir", "folder"], "00_start_here"),
    ("lab dir missing", ["lab", "--dry-run", "--dir", "nowhere"], "00_start_here"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(area, capsys, argv, message):
    before = _snapshot(area)
    rc, out, err = run_main(argv, capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert message.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in err and out == ""  # refused before measuring or printing anything
    assert _snapshot(area) == before


def test_bad_drill_submission_with_a_real_drill(area, capsys):
    from hwlab.course import drills

    made = None
    for fault in sorted(drills.FAULTS):  # any fault whose recorded run is here
        try:
            made = drills.new(seed=5, fault=fault, live=False)
            break
        except evidence.EvidenceError:
            continue
    if made is None:
        pytest.skip("no drill fault has a recorded run in this tree")
    p = made.save(area / "d")
    before = _snapshot(area)
    for argv, message in [(["drill", "submit", str(p)], "needs --leaf"),
                          (["drill", "submit", str(p), "--leaf", "Z"], "leaf must be one of"),
                          (["drill", "submit", str(p), "--leaf", "I", "--evidence", "list.json"], "JSON object"),
                          (["drill", "submit", str(p), "--leaf", "I", "--evidence", "binary.json"], "not text"),
                          (["drill", "submit", str(p), "--leaf", "I", "--dir", "notes.txt"], "is a file"),
                          (["drill", "submit", str(p), "--leaf", "I", "--learner", "../../etc/x"], "--learner"),
                          (["drill", "submit", str(p), "--leaf", "I", "--learner", ""], "--learner")]:
        rc, out, err = run_main(argv, capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, (argv, rc, err)
    assert _snapshot(area) == before


@pytest.mark.slow
@pytest.mark.parametrize("argv,message", [
    (["doctor", "--quick", "--save", "existing.json"], "already exists"),
    (["probe", "gemm", "-p", "size=-1"], "integer 1.."),
    (["baseline", "compare", B, "binary.json"], "not text"),
])
def test_bad_input_from_a_shell(area, argv, message):
    before = _snapshot(area)
    r = subprocess.run([sys.executable, "-m", "hwlab", *argv], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HWLAB_CACHE=str(area / "cache")))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert _snapshot(area) == before


def test_a_write_that_fails_after_measuring_keeps_the_result(area, capsys, monkeypatch):
    """The destination passed the check, then the disk filled: the doctor record goes to the
    rescue folder, its path is printed, exit 2, and nothing at the destination."""
    from hwlab.core import evidence as E

    def full(self, path, *, overwrite=False):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(E.Evidence, "save", full)
    rc, out, err = run_main(["doctor", "--quick", "--save", "new/doctor.json"], capsys)
    assert rc == 2 and "verdict" in out  # the report was shown
    line = err.strip().splitlines()[-1]
    assert "No space left on device" in line and "saved to" in line
    rescued = Path(line.rsplit("saved to ", 1)[1].split(" instead")[0])
    assert rescued.parent == area / "rescue" and rescued.exists()
    rec = E.load(rescued)
    assert rec.kind == "doctor" and rec.results and rec.ceilings["copy_gbps"] > 0
    assert not (area / "new" / "doctor.json").exists()


def test_incident_write_failure_is_rescued(area, capsys, monkeypatch):
    from hwlab.diagnosis import incident

    def full(inc, folder):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(incident, "save", full)
    rc, out, err = run_main(["incident", "--title", "t", "--scope", "single-card", "--symptom", "s",
                             "--fix", "f", "--reverify", "r", "--out", "inc"], capsys)
    assert rc == 2 and "Read-only file system" in err and "saved to" in err
    assert list((area / "rescue").glob("incident-*.json"))


# first contact: CLI details
DETAIL_FILES = {
    "drills/drill-0000000005.json": '{"already": "a drill of seed 5"}\n',
    "exiter.py": "import sys\nsys.exit(0)\n\n\ndef f(x):\n    return x\n",
}
DETAIL_CASES = [
    ("drill new over an existing drill", ["drill", "new", "--seed", "5", "--dir", "drills"], "--force"),
    ("examine target exits on import (module)", ["examine", "exiter:f"], "sys.exit(0)"),
    ("examine target exits on import (path)", ["examine", "exiter.py:f"], "sys.exit(0)"),
    ("examine module not importable here", ["examine", "no_such_module_hwlab:f"], "cannot import"),
    ("evidence show listed-style name not recorded", ["evidence", "show", "h200/no_such_record"], "does not exist"),
    ("flowchart stray argument", ["flowchart", "B"], "unrecognized arguments"),
    ("flowchart unknown option", ["flowchart", "--leaf", "G"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in DETAIL_CASES], ids=[c[0] for c in DETAIL_CASES])
def test_cli_detail_bad_input_is_one_line_and_changes_nothing(area, capsys, argv, message):
    for name, text in DETAIL_FILES.items():
        (area / name).parent.mkdir(parents=True, exist_ok=True)
        (area / name).write_text(text)
    before = _snapshot(area)
    rc, out, err = run_main(argv, capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert message.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in err and out == ""
    assert _snapshot(area) == before
    assert "exiter" not in sys.modules
# first contact: streams, writes, numbers
# Inputs are files, not streams (a FIFO, a device, an oversize file: refused unopened, one line,
# exit 2; the FIFO cases run with a subprocess timeout so a regression fails instead of hanging);
# nothing lost to an unwritable place (checked before the work; a write that still fails keeps
# the result in the rescue folder and says where); numbers validated where they enter.
from hwlab.core import store as _store  # noqa: E402

RUN = evidence.RECORDED_DIR / "runs" / "straggler_nccl_h200"
INC = ["incident", "--title", "t", "--scope", "single-card", "--symptom", "s", "--fix", "f", "--reverify", "r"]


def _unwritable_place() -> str:
    """A folder no user, root included, can create a file in: /proc refuses new files."""
    return "/proc"


def _baseline_with(value_text: str) -> str:
    """The recorded H200 baseline with its first probe's t_ms replaced by ``value_text`` (raw JSON)."""
    d = json.loads((H200 / "baseline.json").read_text())
    d["results"][0]["t_ms"] = "@@"
    return json.dumps(d).replace('"@@"', value_text)


def _unblock_later(fifo: Path, stop, after_s: float = 20.0) -> None:
    """If a reader ever blocks on ``fifo`` (a regression), open it for writing after
    ``after_s`` and close it: the reader sees an empty file, and the test fails instead of
    hanging."""
    if stop.wait(after_s):
        return
    while not stop.wait(0.2):
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while nobody reads
        except OSError:
            continue


@pytest.fixture
def fc_area(area):
    """``area`` plus a FIFO, an oversize (sparse) file, corrupt baselines, absurd observations,
    a drill and a class folder with one result."""
    import threading
    stop = threading.Event()
    for name in ("pipe.json", "pipe.py"):
        os.mkfifo(area / name)
        threading.Thread(target=_unblock_later, args=(area / name, stop), daemon=True).start()
    with open(area / "huge.json", "wb") as f:  # sparse: no disk used
        f.truncate(_store.MAX_INPUT_BYTES + 1)
    (area / "nan_baseline.json").write_text(_baseline_with("NaN"))
    (area / "str_baseline.json").write_text(_baseline_with('"fast"'))
    (area / "neg_baseline.json").write_text(_baseline_with("-1.0"))
    d = json.loads((H200 / "baseline.json").read_text())
    d["ceilings"]["copy_gbps"] = 1e9  # beyond the H200's datasheet HBM bandwidth
    (area / "fast_baseline.json").write_text(json.dumps(d))
    for name, text in {"obs_nan.json": '{"slowdown_vs_floor": NaN}',
                       "obs_inf.json": '{"slowdown_vs_floor": Infinity}',
                       "obs_neg.json": '{"rank_tail_pct": -5}',
                       "obs_pct.json": '{"dram_pct_of_peak": 250}',
                       "obs_frac_spills.json": '{"n_spills": 1.5}'}.items():
        (area / name).write_text(text)
    from hwlab.course import classroom, drills
    made = None
    for fault in sorted(drills.FAULTS):
        try:
            made = drills.new(seed=5, fault=fault, live=False)
            break
        except evidence.EvidenceError:
            continue
    if made is not None:
        made.save(area / "dr")
    classroom.write_result({"kind": "exercise", "item": "q1", "learner": "ann", "passed": True}, area / "class")
    yield area
    stop.set()


def _drill_file(area: Path) -> str:
    found = sorted((area / "dr").glob("*.json")) if (area / "dr").is_dir() else []
    if not found:
        pytest.skip("no drill fault has a recorded run in this tree")
    return str(found[0])


FC_CASES = [
    # streams and oversize files, everywhere the CLI reads a file
    ("topo --file FIFO", ["topo", "--file", "pipe.json"], "FIFO"),
    ("topo --file /dev/zero", ["topo", "--file", "/dev/zero"], "character device"),
    ("topo --file oversize", ["topo", "--file", "huge.json"], "MiB"),
    ("evidence show FIFO", ["evidence", "show", "pipe.json"], "FIFO"),
    ("evidence show /dev/zero", ["evidence", "show", "/dev/zero"], "character device"),
    ("evidence show oversize", ["evidence", "show", "huge.json"], "MiB"),
    ("baseline compare FIFO", ["baseline", "compare", B, "pipe.json"], "FIFO"),
    ("baseline compare /dev/zero", ["baseline", "compare", "/dev/zero", B], "character device"),
    ("incident --evidence FIFO", [*INC, "--evidence", "pipe.json"], "FIFO"),
    ("incident --observations FIFO", [*INC, "--observations", "pipe.json"], "FIFO"),
    ("incident --observations /dev/zero", [*INC, "--observations", "/dev/zero"], "character device"),
    ("drill submit FIFO", ["drill", "submit", "pipe.json", "--leaf", "G"], "FIFO"),
    ("drill reveal /dev/zero", ["drill", "reveal", "/dev/zero"], "character device"),
    ("ranks RUN is a FIFO", ["ranks", "pipe.json"], "not a folder"),
    ("ranks --nccl-log FIFO", ["ranks", str(RUN), "--nccl-log", "pipe.json"], "FIFO"),
    ("class summary DIR is a FIFO", ["class", "summary", "pipe.json"], "not a folder"),
    ("examine module is a FIFO", ["examine", "pipe.py:f"], "FIFO"),
    # unwritable places, refused before the work
    ("ranks --save-incident unwritable", ["ranks", str(RUN), "--save-incident", _unwritable_place()], "cannot"),
    ("ranks --save-incident under a file", ["ranks", str(RUN), "--save-incident", "notes.txt/inc"], "cannot"),
    ("class summary --plot unwritable", ["class", "summary", "class", "--plot", f"{_unwritable_place()}/p.png"],
     "cannot write"),
    ("class summary --plot under a file", ["class", "summary", "class", "--plot", "notes.txt/p.png"],
     "is a file"),
    # numbers: corrupt records, absurd observations, impossible counts
    ("baseline compare t_ms NaN", ["baseline", "compare", B, "nan_baseline.json"], "corrupt"),
    ("baseline compare t_ms a string", ["baseline", "compare", "str_baseline.json", B], "corrupt"),
    ("baseline compare t_ms negative", ["baseline", "compare", B, "neg_baseline.json"], "t_ms"),
    ("baseline compare copy above datasheet", ["baseline", "compare", B, "fast_baseline.json"], "copy_gbps"),
    ("evidence show t_ms NaN", ["evidence", "show", "nan_baseline.json"], "corrupt"),
    ("incident --evidence t_ms NaN", [*INC, "--evidence", "nan_baseline.json"], "corrupt"),
    ("incident observations NaN", [*INC, "--observations", "obs_nan.json"], "slowdown_vs_floor"),
    ("incident observations Infinity", [*INC, "--observations", "obs_inf.json"], "not a finite number"),
    ("incident observations negative", [*INC, "--observations", "obs_neg.json"], "rank_tail_pct"),
    ("incident observations pct above 100", [*INC, "--observations", "obs_pct.json"], "<= 100"),
    ("incident observations fractional count", [*INC, "--observations", "obs_frac_spills.json"], "whole number"),
    ("examine --n-bytes negative", ["examine", "x.py:f", "--n-bytes", "-1"], "negative"),
    ("examine --n-bytes not finite", ["examine", "x.py:f", "--n-bytes", "inf"], "finite"),
    ("examine --n-flops not a number", ["examine", "x.py:f", "--n-flops", "lots"], "not a number"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in FC_CASES], ids=[c[0] for c in FC_CASES])
def test_first_contact_bad_input(fc_area, capsys, argv, message):
    test_bad_input_is_one_line_exit_2_and_changes_nothing(fc_area, capsys, argv, message)


@pytest.mark.parametrize("extra,message", [
    (["--evidence", "obs_nan.json"], "slowdown_vs_floor"),
    (["--evidence", "pipe.json"], "FIFO"),
])
def test_first_contact_drill_submit_bad_evidence(fc_area, capsys, extra, message):
    argv = ["drill", "submit", _drill_file(fc_area), "--leaf", "G", *extra]
    test_bad_input_is_one_line_exit_2_and_changes_nothing(fc_area, capsys, argv, message)


def test_first_contact_unwritable_class_dir_is_refused_before_grading(fc_area, capsys, monkeypatch):
    """HWLAB_CLASS_DIR=/proc: refused in one line before grading, no grade file, no class record."""
    monkeypatch.setenv("HWLAB_CLASS_DIR", _unwritable_place())
    test_bad_input_is_one_line_exit_2_and_changes_nothing(
        fc_area, capsys, ["drill", "submit", _drill_file(fc_area), "--leaf", "G"], "HWLAB_CLASS_DIR")


@pytest.mark.slow  # a subprocess each (imports torch): seconds, more on a busy 2-core machine
@pytest.mark.parametrize("argv", [["topo", "--file", "pipe.json"], ["baseline", "compare", B, "pipe.json"]])
def test_first_contact_fifo_from_a_shell_does_not_hang(fc_area, argv):
    """As a user runs it: a FIFO nobody writes to is refused at once (a timeout, not a hang,
    if that ever regresses)."""
    before = _snapshot(fc_area)
    r = subprocess.run([sys.executable, "-m", "hwlab", *argv], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, HWLAB_CACHE=str(fc_area / "cache")))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "FIFO" in r.stderr, r.stderr
    assert _snapshot(fc_area) == before


def _rescued_line(err: str) -> Path:
    line = [x for x in err.splitlines() if "saved to" in x][-1]
    return Path(line.rsplit("saved to ", 1)[1].split(" instead")[0])


def test_first_contact_class_record_failing_after_grading_is_rescued(fc_area, capsys, monkeypatch):
    """The class folder passed the check, then its write failed: the grade is printed, the
    learner's own grade file is written, the class record is in the rescue folder, exit 2."""
    from hwlab.course import classroom

    def fails(rec, folder):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(classroom, "write_result", fails)
    rc, out, err = run_main(["drill", "submit", _drill_file(fc_area), "--leaf", "G",
                             "--class-dir", "class2"], capsys)
    assert rc == 2 and ("PASSED" in out or "NOT YET" in out), (rc, out, err)
    assert len(err.strip().splitlines()) == 1 and "Read-only file system" in err
    kept = json.loads(_rescued_line(err).read_text())
    assert kept["kind"] == "drill" and kept["submitted_leaf"] == "G"
    assert _rescued_line(err).parent == fc_area / "rescue"
    assert list((fc_area / "drills").glob("grade-*.json"))  # the learner's own copy


def test_first_contact_ranks_incident_failing_after_the_report_is_rescued(fc_area, capsys, monkeypatch):
    from hwlab.diagnosis import incident

    def fails(inc, folder):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(incident, "save", fails)
    rc, out, err = run_main(["ranks", str(RUN), "--save-incident", "inc"], capsys)
    assert rc == 2 and "flowchart" in out.lower(), (rc, err)  # the report was printed
    assert "No space left on device" in err.splitlines()[-1]
    kept = json.loads(_rescued_line(err).read_text())
    assert kept["title"] and _rescued_line(err).parent == fc_area / "rescue"
    assert not list((fc_area / "inc").glob("incident-*"))


def test_first_contact_plot_failing_after_the_summary_is_rescued(fc_area, capsys, monkeypatch):
    from hwlab.course import classroom

    real = classroom.plot

    def fails_at_target(s, path):
        if Path(path).resolve().parent == fc_area:
            raise OSError(errno.EIO, "Input/output error")
        return real(s, path)
    monkeypatch.setattr(classroom, "plot", fails_at_target)
    rc, out, err = run_main(["class", "summary", "class", "--plot", "p.png"], capsys)
    assert rc == 2 and "q1" in out, (rc, err)  # the summary was printed
    kept = _rescued_line(err)
    assert kept.suffix == ".png" and kept.read_bytes().startswith(b"\x89PNG")
    assert not (fc_area / "p.png").exists()


def test_first_contact_rescue_folder_unwritable_too_says_the_printed_copy_is_the_only_one(
        fc_area, capsys, monkeypatch):
    from hwlab.diagnosis import incident

    def fails(inc, folder):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(incident, "save", fails)
    monkeypatch.setenv("HWLAB_RESCUE_DIR", "/proc/hwlab-rescue")
    rc, out, err = run_main([*INC, "--out", "inc"], capsys)
    assert rc == 2 and out.strip()  # the walk was printed
    assert len(err.strip().splitlines()) == 1 and "only copy" in err


def test_first_contact_a_fifo_in_a_run_or_class_folder_is_skipped_not_read(fc_area, capsys):
    """Files found inside a folder are checked like named ones: a FIFO is reported and skipped."""
    os.mkfifo(fc_area / "class" / "stuck.json")
    rc, out, err = run_main(["class", "summary", "class"], capsys)
    assert rc == 0 and "q1" in out and "FIFO" in err
    from hwlab.core import steplog
    os.mkfifo(fc_area / "steps-rank-00009.jsonl")
    header, steps, problems = steplog.read_log(fc_area / "steps-rank-00009.jsonl")
    assert header is None and steps == [] and "FIFO" in problems[0]


@pytest.mark.slow  # measures the function and this machine's ceilings: tens of seconds on a busy CPU
@pytest.mark.parametrize("flag,value", [("--n-bytes", "1e30"), ("--n-flops", "1e30")])
def test_first_contact_examine_impossible_count_is_refused_after_timing(fc_area, capsys, monkeypatch,
                                                                        tmp_path_factory, flag, value):
    """A count no device reaches is refused with the flag named, exit 2, nothing printed or
    written (the ceilings cache lives outside the working folder here)."""
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    test_bad_input_is_one_line_exit_2_and_changes_nothing(
        fc_area, capsys, ["examine", str(ROOT / "examples" / "shuffled_gather.py:shuffled_gather"), flag, value],
        flag)


def test_first_contact_drill_key_that_is_a_device_is_refused(fc_area, capsys, monkeypatch):
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", "/dev/zero")
    test_bad_input_is_one_line_exit_2_and_changes_nothing(
        fc_area, capsys, ["drill", "reveal", _drill_file(fc_area)], "character device")
