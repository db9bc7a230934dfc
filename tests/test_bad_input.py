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

from hwlab import cli, evidence

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
    ("no command", [], "required"),
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
    from hwlab import drills

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
    r = subprocess.run([sys.executable, "-m", "hwlab.cli", *argv], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HWLAB_CACHE=str(area / "cache")))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert _snapshot(area) == before


def test_a_write_that_fails_after_measuring_keeps_the_result(area, capsys, monkeypatch):
    """The destination passed the check, then the disk filled: the doctor record goes to the
    rescue folder, its path is printed, exit 2, and nothing at the destination."""
    from hwlab import evidence as E

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
    from hwlab import incident

    def full(inc, folder):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(incident, "save", full)
    rc, out, err = run_main(["incident", "--title", "t", "--scope", "single-card", "--symptom", "s",
                             "--fix", "f", "--reverify", "r", "--out", "inc"], capsys)
    assert rc == 2 and "Read-only file system" in err and "saved to" in err
    assert list((area / "rescue").glob("incident-*.json"))
