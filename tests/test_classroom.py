"""Class results made by the real checkers (exercise.check_value/check_kernel, drills.grade,
`hwlab drill submit --class-dir`), summarised by `hwlab class summary` with a plot; malformed
files reported and skipped."""
import grp
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwlab.course import classroom, drills, exercise

BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def drill_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "drill.key"))


def _double(x):
    return x * 2


def _inputs():
    return (torch.randn(64),)


@pytest.fixture
def class_dir(tmp_path, monkeypatch):
    d = tmp_path / "class"
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    return d


def _as(monkeypatch, who):
    monkeypatch.setenv(classroom.ENV_LEARNER, who)


def test_first_wrong_branch_from_the_chart():
    assert classroom.first_wrong_branch("G", "J")["question"] == "F"      # B yes, then F answered NO
    assert classroom.first_wrong_branch("G", "L") == {"question": "B", "text": classroom.flowchart.QUESTIONS["B"].text,
                                                      "right": "yes", "taken": "no"}
    assert classroom.first_wrong_branch("L", "M")["question"] == "K"
    assert classroom.first_wrong_branch("L", "OK")["question"] == "D"
    assert classroom.first_wrong_branch("G", "G") is None


def test_no_class_dir_records_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(classroom.ENV_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    exercise.check_value("flowchart leaf", "J", "G", "why")
    assert list(tmp_path.iterdir()) == []


def test_checkers_write_results_and_summary_counts_them(class_dir, monkeypatch, tmp_path):
    _as(monkeypatch, "ana")
    assert not exercise.check_value("flowchart leaf", "J", "G", "DRAM is saturated").passed
    assert exercise.check_value("flowchart leaf", "G", "G", "DRAM is saturated").passed
    exercise.check_value("flowchart leaf", None, "G", "")  # not done yet: not an attempt
    _as(monkeypatch, "bo")
    assert not exercise.check_value("flowchart leaf", "L", "G", "DRAM is saturated").passed
    assert exercise.check_kernel("double", lambda x: x + x, _double, _inputs, tol=1e-6, n_bytes=512,
                                 device="cpu").passed
    assert exercise.check_kernel("double", lambda x: x * 3, _double, _inputs, tol=1e-6, n_bytes=512,
                                 device="cpu").status == "wrong"
    # drills graded by drills.grade, recorded by classroom.record_drill (what `hwlab drill submit` does)
    d = drills.new(seed=7, fault="slow_link_rank", live=False)  # its recorded CPU run, on any machine
    for who, leaf in (("ana", "L"), ("bo", "M"), ("cy", "G")):
        g = drills.grade(d, leaf, learner=who)
        assert classroom.record_drill(d, g) is not None
    files = sorted(class_dir.glob("*.json"))
    assert len(files) == 8
    results, bad = classroom.load_results(class_dir)
    assert bad == []
    s = classroom.summary(results)["items"]
    leaf_q = s["exercise: flowchart leaf"]
    assert (leaf_q["attempts"], leaf_q["passed"], leaf_q["learners"]) == (3, 1, 2)
    assert leaf_q["wrong_leaves"] == {"J": 1, "L": 1}
    assert leaf_q["first_wrong_branches"] == {"F: answered NO": 1, "B: answered NO": 1}
    assert s["exercise: double"]["attempts"] == 2 and s["exercise: double"]["pass_rate_pct"] == 50.0
    drill = s["drill: slow_link_rank"]
    assert drill["attempts"] == 3 and drill["passed"] == 1 and drill["wrong_leaves"] == {"M": 1, "G": 1}
    assert drill["first_wrong_branches"] == {"K: answered NO": 1, "B: answered YES": 1}


@pytest.mark.slow
def test_cli_summary_table_plot_and_malformed_files(class_dir, monkeypatch, tmp_path):
    _as(monkeypatch, "ana")
    exercise.check_value("flowchart leaf", "J", "G", "why")
    exercise.check_value("flowchart leaf", "G", "G", "why")
    (class_dir / "garbage.json").write_text("{not json")
    (class_dir / "list.json").write_text("[1, 2]")
    (class_dir / "other.json").write_text(json.dumps({"schema": "hwlab.evidence"}))
    good = json.loads(sorted(class_dir.glob("exercise-*.json"))[0].read_text())
    del good["passed"]
    (class_dir / "nopass.json").write_text(json.dumps(good))
    plot = tmp_path / "class.png"
    r = subprocess.run([str(BIN / "hwlab"), "class", "summary", str(class_dir), "--json", "--plot", str(plot)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["n_results"] == 2 and len(s["malformed"]) == 4
    assert {Path(m["path"]).name for m in s["malformed"]} == {"garbage.json", "list.json", "other.json", "nopass.json"}
    assert r.stderr.count("skipped") == 4
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    t = subprocess.run([str(BIN / "hwlab"), "class", "summary", str(class_dir)], capture_output=True, text=True,
                       timeout=120)
    assert t.returncode == 0 and "exercise: flowchart leaf" in t.stdout and "50%" in t.stdout and "J x1" in t.stdout
    again = subprocess.run([str(BIN / "hwlab"), "class", "summary", str(class_dir), "--plot", str(plot)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already exists" in again.stderr  # never overwritten silently


@pytest.mark.slow
def test_cli_summary_of_an_empty_or_missing_folder(tmp_path):
    for d in (tmp_path / "missing", tmp_path):
        r = subprocess.run([str(BIN / "hwlab"), "class", "summary", str(d)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_drill_submit_writes_to_the_class_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(classroom.ENV_DIR, raising=False)
    hw = str(BIN / "hwlab")
    r = subprocess.run([hw, "drill", "new", "--seed", "3", "--fault", "slow_link_rank", "--dir", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    drill = next((tmp_path / "d").glob("drill-*.json"))
    s = subprocess.run([hw, "drill", "submit", str(drill), "--leaf", "J", "--learner", "dee", "--dir",
                        str(tmp_path / "d"), "--class-dir", str(tmp_path / "c")], capture_output=True, text=True,
                       timeout=300)
    assert s.returncode == 1  # a failed grade is a finding
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "c").glob("*.json")]
    assert rec["kind"] == "drill" and rec["item"] == "slow_link_rank" and rec["learner"] == "dee"
    assert rec["passed"] is False and rec["wrong_leaf"] == "J" and rec["first_wrong_branch"]["question"] == "B"


def _dropbox(tmp_path):
    from hwlab.course import dropbox
    top = tmp_path / "klass"
    dropbox.make(top, grp.getgrgid(os.getgid()).gr_name)
    return top


def test_a_drop_box_keeps_each_answer_its_writers_and_counts_per_learner(tmp_path, monkeypatch):
    from hwlab.course import dropbox
    top = _dropbox(tmp_path)
    monkeypatch.setenv(classroom.ENV_DIR, str(top))
    monkeypatch.setenv(classroom.ENV_LEARNER, "somebody-else")  # ignored: the writer's login is the learner
    me = dropbox.login_name()
    classroom.join()
    exercise.check_value("flowchart leaf", "J", "G", "why")
    exercise.check_value("flowchart leaf", "G", "G", "why")
    files = sorted((top / "inbound").glob("*.json"))
    assert len(files) == 3 and all(stat.S_IMODE(p.stat().st_mode) == 0o640 for p in files)
    assert {json.loads(p.read_text())["learner"] for p in files} == {me}
    forged = json.loads(files[0].read_text()) | {"learner": "ana", "kind": "exercise", "item": "x"}
    (top / "inbound" / "forged.json").write_text(json.dumps(forged))
    results, bad = classroom.load_results(top)
    assert [b["path"] for b in bad] == [str(top / "inbound" / "forged.json")] and "written by" in bad[0]["why"]
    s = classroom.summary(results)
    row = s["items"]["exercise: flowchart leaf"]
    assert (row["attempts"], row["learners"], row["learners_passed"]) == (2, 1, 1)
    assert s["per_learner"] == {me: {"attempts": 2, "items": {"exercise: flowchart leaf":
                                                              {"attempts": 2, "passed": True}}}}
    assert s["n_results"] == 2


@pytest.mark.parametrize("where, mode", [("inbound", 0o3777), ("inbound", 0o1733), ("top", 0o2777), ("top", 0o2750)])
def test_a_drop_box_with_wrong_modes_is_refused_in_one_line(tmp_path, monkeypatch, capsys, where, mode):
    top = _dropbox(tmp_path)
    os.chmod(top / "inbound" if where == "inbound" else top, mode)
    monkeypatch.setenv(classroom.ENV_DIR, str(top))
    with pytest.raises(classroom.UserInputError) as e:
        classroom.join()
    assert "\n" not in str(e.value) and f"{mode:#o}" in str(e.value) and "chmod" in str(e.value)
    assert exercise.check_value("flowchart leaf", "J", "G", "why").status == "wrong"  # graded, not recorded
    assert f"{mode:#o}" in capsys.readouterr().out
    assert list((top / "inbound").iterdir()) == []
    r = subprocess.run([str(BIN / "hwlab"), "class", "summary", str(top)], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and f"{mode:#o}" in r.stderr


def test_a_plain_class_folder_that_others_write_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    with pytest.raises(classroom.UserInputError, match="hwlab class init"):
        classroom.join()
    exercise.check_value("flowchart leaf", "J", "G", "why")
    assert list(d.iterdir()) == []
