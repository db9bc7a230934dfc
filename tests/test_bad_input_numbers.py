"""Bad input, third round: numbers and JSON no file hwlab wrote would hold (integers past any
float and past Python's 4,300-digit limit, nesting 100,000 deep, 1e300 ratios, 1e15 ranks, NaN
and negative step times, an infinite link), text that breaks the Markdown it lands in, a folder
made where a file was asked for, a read-only working-copy home. Each gives one line and exit 2
(a corrupt line of a step log: skipped and named, the run read without it), nothing written,
nothing lost. Run in-process through ``hwlab.cli.main`` with the fixtures of test_bad_input."""
import json
import shutil
from datetime import datetime as real_datetime
from pathlib import Path

import pytest

from hwlab.cli.console import loads_strict
from hwlab.core import evidence, validate
from test_bad_input import B, H200, INC, RUN, _snapshot, area, run_main  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "src" / "hwlab" / "recorded" / "traces"  # the recorded trace runs ship in the package
BIG = "1" + "0" * 400     # an integer past the largest float (1.8e308)
HUGE = "1" + "0" * 5000   # past Python's 4,300-digit int-from-string limit
DEEP = "[" * 100_000 + "]" * 100_000


def _baseline_with(value_text: str) -> str:
    d = json.loads((H200 / "baseline.json").read_text())
    d["results"][0]["t_ms"] = "@@"
    return json.dumps(d).replace('"@@"', value_text)


@pytest.fixture
def nums(area):
    """``area`` (test_bad_input) plus the files of this round's cases."""
    for name, text in {"obs_big.json": '{"slowdown_vs_floor": %s}' % BIG,
                       "obs_huge.json": '{"slowdown_vs_floor": %s}' % HUGE,
                       "obs_deep.json": '{"slowdown_vs_floor": %s}' % DEEP,
                       "obs_1e300.json": '{"slowdown_vs_floor": 1e300}',
                       "obs_ranks.json": '{"n_ranks": 1e15}',
                       "obs_typo.json": '{"slowdown_vs_flor": 3.0}',
                       "bl_big.json": _baseline_with(BIG), "bl_huge.json": _baseline_with(HUGE),
                       "bl_deep.json": _baseline_with(DEEP)}.items():
        (area / name).write_text(text)
    return area


def _drill_file(area: Path) -> str:
    from hwlab.course import drills
    for fault in sorted(drills.FAULTS):  # any fault whose recorded run is here
        try:
            return str(drills.new(seed=5, fault=fault, live=False).save(area / "dr"))
        except evidence.EvidenceError:
            continue
    pytest.skip("no drill fault has a recorded run in this tree")


def _refused(area, capsys, argv, message):
    before = _snapshot(area)
    rc, out, err = run_main(argv, capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1, (argv, rc, err[:500])
    assert message.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in err and out == "" and len(lines[0]) < 600
    assert _snapshot(area) == before


ONE_TRACE = str(sorted((TRACES / "slow_rank").iterdir())[0])
CASES = [
    # integers too big for a float, past the 4,300-digit limit, JSON nested 100k deep
    *[(f"{what} {k}", [*argv, f], m) for k, f, m in [("int past a float", "obs_big.json", "401 digits"),
                                                    ("int past 4300 digits", "obs_huge.json", "5,001 digits"),
                                                    ("nested 100k deep", "obs_deep.json", "nested deeper")]
      for what, argv in [("incident --observations", [*INC, "--observations"])]],
    *[(f"{cmd} {k}", argv, m) for cmd, k, argv, m in [
        ("baseline compare", "int past a float", ["baseline", "compare", B, "bl_big.json"], "401 digits"),
        ("baseline compare", "int past 4300 digits", ["baseline", "compare", "bl_huge.json", B], "5,001 digits"),
        ("baseline compare", "nested 100k deep", ["baseline", "compare", B, "bl_deep.json"], "nested deeper"),
        ("evidence show", "int past a float", ["evidence", "show", "bl_big.json"], "401 digits"),
        ("evidence show", "int past 4300 digits", ["evidence", "show", "bl_huge.json"], "5,001 digits"),
        ("incident --evidence", "int past 4300 digits", [*INC, "--evidence", "bl_huge.json"], "5,001 digits")]],
    # numbers in range: a ratio of 1e300, 1e15 ranks
    ("incident slowdown 1e300", [*INC, "--observations", "obs_1e300.json"], "slowdown_vs_floor"),
    ("incident n_ranks 1e15", [*INC, "--observations", "obs_ranks.json"], "n_ranks"),
    # incident text: empty, huge, multi-line (it would land unescaped in the Markdown)
    ("incident title empty", ["incident", "--title", "", *INC[3:]], "empty"),
    ("incident title blank", ["incident", "--title", "   ", *INC[3:]], "empty"),
    ("incident title huge", ["incident", "--title", "x" * 100_000, *INC[3:]], "100,000 characters"),
    ("incident title multi-line", ["incident", "--title", "disk\n# injected heading", *INC[3:]], "one line"),
    ("incident symptom multi-line", [*INC[:5], "--symptom", "a\n| b |", *INC[7:]], "one line"),
    ("incident fix with a control char", [*INC[:7], "--fix", "a\x1b[31mred", *INC[9:]], "control"),
    # --link-gbps: not finite, beyond any link, not positive
    *[(f"ranks --link-gbps {v}", ["ranks", "--traces", str(TRACES / "slow_link"), "--link-gbps", v, "--json"],
       "GB/s") for v in ("inf", "nan", "1e30", "0", "-5", "fast")],
    # a file where a folder would be made
    ("baseline record --out bl.txt", ["baseline", "record", "--out", "bl.txt"], ".json"),
    # each trace command points to the other
    ("ranks --traces one file", ["ranks", "--traces", ONE_TRACE], "hwlab examine --trace"),
    ("ranks RUN_DIR one trace file", ["ranks", ONE_TRACE], "hwlab examine --trace"),
    ("examine --trace a folder of ranks", ["examine", "--trace", str(TRACES / "slow_rank")], "hwlab ranks --traces"),
    ("examine --trace a run directory", ["examine", "--trace", str(RUN)], f"hwlab ranks {RUN}"),
    ("examine --traces (ranks's option)", ["examine", "--traces", str(TRACES / "slow_rank")], "hwlab ranks --traces"),
    ("ranks --trace one file (examine's option)", ["ranks", "--trace", ONE_TRACE], "hwlab examine --trace"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_third_round_bad_input(nums, capsys, argv, message):
    _refused(nums, capsys, argv, message)


@pytest.mark.parametrize("evidence_file,message", [
    ("obs_big.json", "401 digits"), ("obs_huge.json", "5,001 digits"), ("obs_deep.json", "nested deeper"),
    ("obs_1e300.json", "slowdown_vs_floor"), ("obs_typo.json", "unknown metric name(s) 'slowdown_vs_flor'")])
def test_drill_submit_evidence_is_checked_as_incident_checks_it(nums, capsys, evidence_file, message):
    """Values and names, as `incident` refuses them: a typo is not graded as evidence."""
    _refused(nums, capsys, ["drill", "submit", _drill_file(nums), "--leaf", "G", "--evidence", evidence_file],
             message)
    _refused(nums, capsys, [*INC, "--observations", evidence_file], message)


def test_two_identical_submissions_in_one_second_each_keep_their_grade(nums, capsys, monkeypatch):
    """The second grade gets its own file (…-2.json), none goes to the rescue folder, and no
    message suggests a --force `submit` does not take."""
    from hwlab.course import drills

    class Frozen(real_datetime):
        @classmethod
        def now(cls, tz=None):
            return real_datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)
    monkeypatch.setattr(drills, "datetime", Frozen)
    argv = ["drill", "submit", _drill_file(nums), "--leaf", "G", "--learner", "ann", "--json"]
    results = [run_main(argv, capsys) for _ in range(3)]
    assert [r[0] for r in results] == [results[0][0]] * 3 and results[0][0] in (0, 1)
    assert all(err == "" for _, _, err in results), results
    files = [json.loads(out)["file"] for _, out, _ in results]
    assert len(set(files)) == 3 and all(Path(f).is_file() for f in files)
    assert Path(files[1]).name == Path(files[0]).stem + "-2.json"
    assert not (nums / "rescue").exists()


@pytest.mark.parametrize("line,reason", [
    ('{"step": 99, "colls": [], "t_start_s": 1796281745.0, "step_ms": NaN}', "step_ms is nan"),
    ('{"step": 99, "colls": [], "t_start_s": 1796281745.0, "step_ms": -5}', "step_ms is -5"),
    ('{"step": 99, "colls": [], "t_start_s": 1796281745.0, "step_ms": 1e300}', "step_ms is 1e+300"),
    ('{"step": 99, "colls": [["tp", Infinity]], "step_ms": 5.0}', "not a finite number"),
    ('{"step": 99, "colls": [], "step_ms": %s}' % BIG, "401 digits"),
    ('{"step": 99, "colls": [], "step_ms": %s}' % HUGE, "5,001 digits"),
    (DEEP, "nested deeper"),
])
def test_a_corrupt_step_line_is_skipped_and_named_the_run_read_without_it(area, capsys, tmp_path, line, reason):
    """A line the writer never writes (it refuses NaN) is skipped with one line naming the file,
    the line and why; the report is the one the run gives without it, and --json stays strict."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    log = run / "vm" / "steps-rank-00000.jsonl"
    clean = json.loads(run_main(["ranks", str(run), "--json"], capsys)[1])
    n_lines = len(log.read_text().splitlines())
    log.write_text(log.read_text() + line + "\n")
    rc, out, err = run_main(["ranks", str(run), "--json"], capsys)
    rep = loads_strict(out)
    assert rc in (0, 1, 4) and rep["per_rank"] == clean["per_rank"]
    lines = [x for x in err.splitlines() if str(log) in x]
    assert len(lines) == 1 and f":{n_lines + 1}:" in lines[0] and reason in lines[0] and "skipped" in lines[0]


#: how `hwlab lab` reaches the working copy: its --dir, --refresh, and the default (found from the folder)
LAB_PATHS = {"--dir": ["lab", "--no-browser", "--dir", str(ROOT / "notebooks")],
             "--refresh": ["lab", "--refresh", "--no-browser", "--dir", str(ROOT / "notebooks")],
             "default": ["lab", "--no-browser"]}
#: errnos a kernel answers for a home no file can be made in (which one depends on the machine)
HOME_ERRNOS = ("ENOENT", "EACCES", "EROFS", "ENOSPC", "EPERM")


def _no_lab(monkeypatch):
    import importlib.util
    if importlib.util.find_spec("jupyterlab") is None:  # found, not imported (seconds)
        pytest.skip("JupyterLab is not installed")
    from hwlab.cli import lablaunch

    def no_server(*args, **kwargs):
        raise AssertionError("the lab was started")
    monkeypatch.setattr(lablaunch, "serve", no_server)
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("path", sorted(LAB_PATHS))
@pytest.mark.parametrize("errno_name", HOME_ERRNOS)
def test_an_unwritable_home_is_refused_naming_HWLAB_HOME_whatever_the_errno(area, capsys, monkeypatch, tmp_path,
                                                                            path, errno_name):
    """The kernel's answer for a folder that cannot be made or written differs by machine (under
    /proc one answers ENOENT, another EACCES; a read-only mount EROFS; a full disk ENOSPC): each,
    on the folder's creation and on its first file, from each path into the lab, is one line naming
    HWLAB_HOME, nothing written, no server started; with and without the venv's kernelspec (an
    install without one writes its own under the copy, which must not be reached first)."""
    import errno as errno_mod
    import os
    import tempfile

    from hwlab.cli import workcopy
    _no_lab(monkeypatch)
    home = Path(tempfile.mkdtemp(prefix="hwlab-home-")) / "home"  # outside the watched area: folders may be made
    monkeypatch.setenv("HWLAB_HOME", str(home))
    code = getattr(errno_mod, errno_name)
    real_mkdir, real_mkstemp = os.mkdir, tempfile.mkstemp

    def mkdir(p, *a, **k):  # the home's folders cannot be made
        if str(p).startswith(str(home)):
            raise OSError(code, os.strerror(code), str(p))
        return real_mkdir(p, *a, **k)

    def mkstemp(*a, dir=None, **k):  # or made, but no file can be created in them
        if dir is not None and str(dir).startswith(str(home)):
            raise OSError(code, os.strerror(code), str(dir))
        return real_mkstemp(*a, dir=dir, **k)

    for where, patch in (("mkdir", ("mkdir", mkdir)), ("first file", ("mkstemp", mkstemp))):
        with monkeypatch.context() as m:
            m.setattr(os if patch[0] == "mkdir" else tempfile, patch[0], patch[1])
            for kernel in (workcopy.kit_kernel(), None):
                m.setattr(workcopy, "kit_kernel", lambda k=kernel: k)
                _refused(area, capsys, LAB_PATHS[path], "HWLAB_HOME")
        assert not [p for p in home.rglob("*") if not p.is_dir()] if home.exists() else True, where
    shutil.rmtree(home.parent)


@pytest.mark.parametrize("path", sorted(LAB_PATHS))
def test_a_home_the_kernel_refuses_or_a_file_in_the_way_is_refused(area, capsys, monkeypatch, tmp_path, path):
    """Real refusals, no injection: /proc (whatever errno this kernel answers), a file where the home
    or its work/ folder should be, a ~user of no such user (never a folder named '~nosuchuser' made
    under the working folder); the corrupt-manifest refusals keep their own words."""
    from hwlab.cli import workcopy
    _no_lab(monkeypatch)
    argv = LAB_PATHS[path]
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a folder")
    (tmp_path / "h2").mkdir()
    (tmp_path / "h2" / "work").write_text("not a folder")
    for home in ("/proc/hwlab-home", str(in_the_way), str(tmp_path / "h2"), "~nosuchuser-hwlab/x"):
        monkeypatch.setenv("HWLAB_HOME", home)
        _refused(area, capsys, argv, "HWLAB_HOME")
    assert not (ROOT / "~nosuchuser-hwlab").exists() and in_the_way.read_text() == "not a folder"
    monkeypatch.setenv("HWLAB_HOME", str(tmp_path / "home"))
    root = workcopy.copy_root(ROOT)
    root.mkdir(parents=True)
    (root / workcopy.MANIFEST).write_text(DEEP)
    _refused(area, capsys, argv, "nested deeper")
    (root / workcopy.MANIFEST).write_text('{"files": [1, 2]}')
    _refused(area, capsys, argv, "not one hwlab wrote")
    assert sorted(p.name for p in root.iterdir()) == [workcopy.MANIFEST]  # nothing copied


def test_numbers_are_checked_for_size_before_use(tmp_path):
    """validate.number on integers past a float, the new upper bounds, and a record holding an
    integer of 5,001 digits refused by the one reader of users' JSON."""
    for value in (10 ** 400, -(10 ** 400)):
        with pytest.raises(validate.NumberError, match="401 digits"):
            validate.number(value, "x")
    validate.observations({"slowdown_vs_floor": 1e8, "n_ranks": 131072})  # a slow tiny kernel, a big job
    for obs in ({"slowdown_vs_floor": 1e10}, {"n_ranks": 10 ** 8}, {"e2e_slowdown": 1e300}):
        with pytest.raises(validate.NumberError, match="<="):
            validate.observations(obs)
    d = json.loads((ROOT / "tests" / "data" / "baseline_cpu_a.json").read_text())
    d["results"][0]["t_ms"] = "@@"
    (tmp_path / "rec.json").write_text(json.dumps(d).replace('"@@"', HUGE))
    with pytest.raises(evidence.EvidenceError, match="5,001 digits"):
        evidence.load(tmp_path / "rec.json")


@pytest.mark.parametrize("key,value,reason", [
    ("rank", None, "rank should be a number"), ("rank", -1, "rank is -1"), ("rank", "0", "rank should be a number"),
    ("n_flops_per_step", float("nan"), "n_flops_per_step is nan"), ("n_bytes_per_step", 1.5, "n_bytes_per_step is 1.5")])
def test_a_corrupt_step_log_header_is_named_not_an_internal_error(area, capsys, tmp_path, key, value, reason):
    """The run's one rank has a header no writer wrote: one line naming the file, line and field."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    log = run / "vm" / "steps-rank-00000.jsonl"
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    header[key] = value
    log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    _refused(area, capsys, ["ranks", str(run), "--json"], f"{log}:1: header {reason}")


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


@pytest.mark.parametrize("path,value,message", [
    (("results", 0, "name"), [], "results[0].name"),
    (("snapshot", "gpus", 0, "ecc_errors_volatile", "uncorrected"), "x", "should be a number"),
    (("snapshot", "gpus", 0, "ecc_errors_volatile", "uncorrected"), -2, "uncorrected is -2"),
    (("snapshot", "gpus", 0, "temperature_c"), 1e300, "temperature_c"),
    (("snapshot", "gpus"), {"0": 1}, "should be a list")])
def test_a_record_field_of_the_wrong_kind_is_refused_as_corrupt(area, capsys, path, value, message):
    """Fields a comparison judges (a probe's name, ECC counters, temperature) of a kind no record
    holds: one line naming the field, not an internal error deep in the comparison."""
    d = json.loads((H200 / "baseline.json").read_text())
    _set(d, path, value)
    (area / "odd.json").write_text(json.dumps(d))
    _refused(area, capsys, ["baseline", "compare", B, "odd.json"], message)


@pytest.mark.parametrize("name,path,value,problem", [
    ("rank-00000.json", ("device", "gpu"), "GPU7", "'GPU7' is not a GPU of vm's topology"),
    ("rank-00000.json", ("device", "gpu"), 3.5, "device.gpu should be a GPU name"),
    ("rank-00000.json", ("probe", 0, "name"), None, "probe[0] is not a probe result"),
    ("rank-00000.json", ("probe", 0, "derived", "gbps"), "fast", "derived.gbps should be a number"),
    ("rank-00000.json", ("pid",), [], "pid should be a number"),
    ("node.json", ("topology", "links", "GPU0|GPU0"), [], "topology is not one"),
])
def test_a_corrupt_capture_record_is_skipped_and_named(area, capsys, tmp_path, name, path, value, problem):
    """The run is still read (step logs are the evidence); the capture that cannot be used is
    named on stderr, its placement reported as unknown."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    f = run / "vm" / name
    d = json.loads(f.read_text())
    _set(d, path, value)
    f.write_text(json.dumps(d))
    rc, out, err = run_main(["ranks", str(run), "--json"], capsys)
    assert rc in (0, 1, 4) and "internal error" not in err, err
    assert problem in err and loads_strict(out)["per_rank"]


@pytest.mark.parametrize("key,value,message", [("seconds", "NaN", "seconds is nan"), ("learner", "[]", "learner"),
                                               ("correct_leaf", "null", "correct_leaf")])
def test_drill_summary_refuses_a_grade_of_the_wrong_kind(nums, capsys, key, value, message):
    drill = _drill_file(nums)
    assert run_main(["drill", "submit", drill, "--leaf", "G", "--dir", "g"], capsys)[0] in (0, 1)
    grade = next((nums / "g").glob("grade-*.json"))
    d = json.loads(grade.read_text())
    d[key] = "@@"
    grade.write_text(json.dumps(d).replace('"@@"', value))
    _refused(nums, capsys, ["drill", "summary", "--dir", "g"], message)


@pytest.mark.slow  # a subprocess each: the command as a user types it
def test_third_round_from_a_shell(nums, tmp_path):
    """As a user runs them: `--json` alone on a NaN step line and on --link-gbps inf (both were
    exit 3), a multi-line incident title, an observations file with a 5,001-digit integer."""
    import os
    import subprocess
    import sys
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    log = run / "vm" / "steps-rank-00000.jsonl"
    log.write_text(log.read_text() + '{"step": 99, "colls": [], "step_ms": NaN}\n')

    def hwlab(*argv):
        return subprocess.run([sys.executable, "-m", "hwlab", *argv], capture_output=True, text=True, timeout=300,
                              cwd=nums, env=dict(os.environ, HWLAB_CACHE=str(nums / "cache")))
    before = _snapshot(nums)
    r = hwlab("ranks", str(run), "--json")
    assert r.returncode in (0, 1, 4) and loads_strict(r.stdout)["per_rank"], r.stderr
    assert "step_ms is nan" in r.stderr and "internal error" not in r.stderr
    for argv, message in [(["ranks", "--traces", str(TRACES / "slow_link"), "--link-gbps", "inf", "--json"], "GB/s"),
                          (["incident", "--title", "a\nb", *INC[3:]], "one line"),
                          ([*INC, "--observations", "obs_huge.json"], "5,001 digits")]:
        r = hwlab(*argv)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
        assert message in r.stderr
    assert _snapshot(nums) == before
