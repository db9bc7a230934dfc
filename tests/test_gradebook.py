"""The server-side gradebook (hwlab.course.gradebook) and the instructor's summary of it: answers graded
on the server on recorded evidence (Lab 1), a body's own claims ignored, reveals only after the counted
tries, quotas, reads that never follow a link nor block on a FIFO nor read past the quota, control
characters replaced; the summary's rows (one per checkpoint, full passes only, non-leaves, SHARED,
instructors left out). The same as learners on a real hub: tests/test_hub_login.py."""
import json
import os
import stat
import subprocess
import sys
import threading
from dataclasses import asdict

import pytest

from hwlab.core import evidence
from hwlab.course import checkpoint as C
from hwlab.course import classroom, gradebook
from hwlab.diagnosis import flowchart
from hwlab.errors import UserInputError


@pytest.fixture(scope="module")
def lab01():
    from hwlab.labs import bandwidth as lab

    r = flowchart.walk_cases(lab.result_from_evidence(evidence.recorded("lab01_bandwidth")))
    ev = r.evidence["unfused"]
    pred = C.Prediction("speed-up", r.speedup("unfused", "fused"), "x", band_pct=40.0)
    cp = C.Checkpoint("01", r.diagnoses["unfused"], ev, prediction=pred)
    m = next(m for m in ("dram_pct_of_peak", "dram_pct_estimated") if m in ev)
    return cp, C.Answer("G", m, float(ev[m]), pred.actual), C.Answer("L", "sm_busy_pct", 50.0, 1.0)


@pytest.fixture
def book(tmp_path):
    return gradebook.make(tmp_path / "book")


def _req(cp, a, **kw):
    return {**json.loads(json.dumps(gradebook.request_checkpoint(cp, a, "01_bandwidth_bound"), default=str)), **kw}


def test_an_answer_is_graded_on_the_server_and_the_bodys_claims_are_ignored(book, lab01):
    cp, right, wrong = lab01
    r = gradebook.grade_checkpoint(book, "ana", _req(cp, wrong, learner="bo", status="passed", passed=True))
    assert r["status"] == "wrong" and r["tries"] == 1 and r["learner"] == "ana"
    assert gradebook.learner_records(book, "bo") == []
    recs = gradebook.learner_records(book, "ana")
    assert [(d["learner"], d["passed"], d["status"], d["graded_by"]) for d in recs] == [("ana", False, "wrong", "server")]
    assert gradebook.grade_checkpoint(book, "ana", _req(cp, right))["status"] == "passed"
    # a blank is not recorded; a non-leaf is a wrong answer shown as not a leaf
    assert gradebook.grade_checkpoint(book, "ana", _req(cp, C.Answer()))["status"] == "fill in"
    gradebook.grade_checkpoint(book, "ana", _req(cp, C.Answer("D", right.metric, right.value, right.prediction)))
    recs = gradebook.learner_records(book, "ana")
    assert len(recs) == 3 and recs[-1]["not_a_leaf"] == "D" and recs[-1]["wrong_leaf"] is None


def test_a_reveal_needs_the_tries_the_service_counted(book, lab01):
    cp, right, wrong = lab01
    for n in (1, 2):
        gradebook.grade_checkpoint(book, "ana", _req(cp, wrong))
        r = gradebook.reveal_checkpoint(book, "ana", {"checkpoint": "01"})
        assert r["revealed"] is False and r["tries"] == n
    assert not any(d.get("revealed") for d in gradebook.learner_records(book, "ana"))
    gradebook.grade_checkpoint(book, "ana", _req(cp, wrong))
    assert gradebook.reveal_checkpoint(book, "ana", {"checkpoint": "01"})["revealed"] is True
    assert gradebook.reveal_checkpoint(book, "ana", {"checkpoint": "01"})["revealed"] is True
    assert sum(bool(d.get("revealed")) for d in gradebook.learner_records(book, "ana")) == 1
    assert gradebook.reveal_checkpoint(book, "bo", {"checkpoint": "01"})["revealed"] is False


def test_bad_requests_are_refused_in_one_line(book, lab01):
    cp, right, _ = lab01
    for req in ({}, {**_req(cp, right), "checkpoint": "\x1b[2J"}, {**_req(cp, right), "evidence": []},
                {**_req(cp, right), "prediction": {"actual": "x"}}):
        with pytest.raises(UserInputError):
            gradebook.grade_checkpoint(book, "ana", req)
    with pytest.raises(UserInputError):
        gradebook.grade_checkpoint(book, "../ana", _req(cp, right))
    assert os.listdir(book) == [gradebook.MARKER]


def test_the_quota_stops_a_flood_of_one_learner_only(book, lab01, monkeypatch):
    cp, _, wrong = lab01
    monkeypatch.setattr(gradebook, "MAX_RECORDS_PER_LEARNER", 5)
    for _ in range(5):
        gradebook.grade_checkpoint(book, "ana", _req(cp, wrong))
    with pytest.raises(gradebook.QuotaExceeded):
        gradebook.grade_checkpoint(book, "ana", _req(cp, wrong))
    assert len(gradebook.learner_records(book, "ana")) == 5
    gradebook.grade_checkpoint(book, "bo", _req(cp, wrong))
    monkeypatch.setattr(gradebook, "MAX_RECORDS_PER_LEARNER", 500)
    monkeypatch.setattr(gradebook, "MAX_BYTES_PER_LEARNER", 4000)
    with pytest.raises(gradebook.QuotaExceeded):
        for _ in range(10):
            gradebook.grade_checkpoint(book, "bo", _req(cp, wrong))
    assert os.path.getsize(book / "bo.jsonl") <= 4000


def test_a_gradebook_that_others_can_reach_is_refused(tmp_path):
    b = gradebook.make(tmp_path / "b")
    for mode in (0o777, 0o755, 0o770):
        os.chmod(b, mode)
        with pytest.raises(UserInputError, match="mode"):
            gradebook.check(b)
    os.chmod(b, 0o700)
    link = tmp_path / "link"
    link.symlink_to(b)
    with pytest.raises(UserInputError, match="link"):
        gradebook.check(link)


def test_the_summary_reads_no_link_no_fifo_no_more_than_the_quota_and_no_escape(book, lab01, tmp_path, monkeypatch):
    cp, right, wrong = lab01
    gradebook.grade_checkpoint(book, "ana", _req(cp, right))
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"schema": classroom.SCHEMA, "kind": "checkpoint", "item": "01", "learner": "x",
                                  "passed": True, "at": "t"}) + "\n")
    (book / "eve.jsonl").symlink_to(secret)
    os.mkfifo(book / "fifo.jsonl")
    rec = {"schema": classroom.SCHEMA, "kind": "checkpoint", "item": "01\x1b[2J\x1b]0;x\x07", "learner": "cy",
           "passed": False, "status": "wrong", "at": "t", "wrong_leaf": "L"}
    big = (json.dumps(rec) + "\n").encode()
    with open(book / "cy.jsonl", "wb") as f:  # far over the quota: only the quota is read
        f.write(big * (3 * gradebook.MAX_BYTES_PER_LEARNER // len(big)))
    done = []
    t = threading.Thread(target=lambda: done.append(gradebook.read_all(book)), daemon=True)
    t.start()
    t.join(30)
    assert done, "reading the gradebook blocked (a FIFO opened for reading waits for a writer)"
    good, bad = done[0]
    why = {os.path.basename(b["path"]): b["why"] for b in bad}
    assert set(why) == {"eve.jsonl", "fifo.jsonl", "cy.jsonl"}, why
    assert {d["learner"] for d in good} == {"ana", "cy"}
    assert sum(d["learner"] == "cy" for d in good) <= gradebook.MAX_RECORDS_PER_LEARNER + 1
    assert not any("\x1b" in json.dumps(d, ensure_ascii=False) or "\x07" in d["item"] for d in good)
    text = classroom.render(classroom.summary(good))
    assert "\x1b" not in text and "\x07" not in text


def _r(learner, item, passed, status, kind="checkpoint", notebook=None, **kw):
    return {"schema": classroom.SCHEMA, "kind": kind, "item": item, "learner": learner, "passed": passed,
            "status": status, "at": "t", "notebook": notebook, **kw}


def test_summary_rows_one_per_checkpoint_full_passes_non_leaves_shared_and_no_instructors():
    res = [_r("ana", "01", True, "passed", notebook="01_bandwidth_bound"),
           _r("bo", "01", False, "wrong", notebook="01_bandwidth_bound-Copy1", wrong_leaf="L", gpu_shared=True),
           _r("cy", "01", False, "wrong", notebook=None, not_a_leaf="D"),
           _r("ana", "bytes", True, "too slow", kind="exercise", notebook="ex05"),
           _r("cy", "bytes", True, "passed (correctness only)", kind="exercise", notebook="ex05"),
           _r("bo", "bytes", True, "passed", kind="exercise", notebook="09_x"),
           _r("teach", "01", True, "passed", notebook="01_bandwidth_bound")]
    s = classroom.summary(res, exclude={"teach"})
    assert sorted(s["per_learner"]) == ["ana", "bo", "cy"]
    cp = s["items"]["checkpoint: 01"]
    assert s["per_learner"]["cy"]["items"]["exercise: ex05 / bytes"]["passed"] is True
    assert [k for k in s["items"] if k.startswith("checkpoint")] == ["checkpoint: 01"]
    assert (cp["attempts"], cp["passed"], cp["learners"], cp["shared"]) == (3, 1, 3, 1)
    assert cp["wrong_leaves"] == {"L": 1} and cp["not_leaves"] == {"D": 1}
    assert s["items"]["exercise: ex05 / bytes"]["passed"] == 1  # "too slow" is not a pass; "correctness only" is
    assert s["items"]["exercise: 09_x / bytes"]["passed"] == 1
    assert s["per_learner"]["ana"]["items"]["exercise: ex05 / bytes"]["passed"] is False
    assert "SHARED" in classroom.render(s)


@pytest.mark.slow
def test_the_summary_plot_is_private(book, lab01, tmp_path):
    cp, right, _ = lab01
    gradebook.grade_checkpoint(book, "ana", _req(cp, right))
    out = tmp_path / "plot.png"
    r = subprocess.run([sys.executable, "-m", "hwlab", "class", "summary", str(book), "--plot", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_check_inside_another_is_not_recorded_as_the_answer(tmp_path, monkeypatch):
    """A kernel that is correct but moves too many bytes: the inner correctness check passes, the outer
    check says wrong; only the outer result is the learner's answer in the class record."""
    from hwlab.core.grading import ExerciseResult
    from hwlab.course import tries

    monkeypatch.setenv(classroom.ENV_DIR, str(tmp_path / "class"))
    (tmp_path / "class").mkdir(mode=0o700)

    @tries.graded(lambda: tries.Reference({"bytes": 1}))
    def inner():
        return ExerciseResult("traffic", "passed (correctness only)", "correct")

    @tries.graded(lambda: tries.Reference({"bytes": 1}))
    def outer():
        assert inner().passed
        return ExerciseResult("traffic", "wrong", "correct, but it moves too many bytes")

    outer()
    results, bad = classroom.load_results(tmp_path / "class")
    assert bad == [] and [(d["status"], d["passed"]) for d in results] == [("wrong", False)]
    assert classroom.summary(results)["items"]["exercise: traffic"]["passed"] == 0


def test_a_class_folder_file_over_the_result_size_is_refused_by_its_size(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir(mode=0o700)
    rec = _r("ana", "01", False, "wrong", message="x" * (classroom.MAX_RESULT_BYTES + 10))
    (folder / "big.json").write_text(json.dumps(rec))
    (folder / "ok.json").write_text(json.dumps(_r("bo", "01", True, "passed")))
    good, bad = classroom.load_results(folder)
    assert [d["learner"] for d in good] == ["bo"] and [os.path.basename(b["path"]) for b in bad] == ["big.json"]


@pytest.mark.slow
def test_a_class_folder_record_with_escape_sequences_is_printed_clean(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir(mode=0o700)
    rec = _r("ana\x1b[2J", "01\x1b]0;x\x07", False, "wrong", wrong_leaf="L")
    (folder / "checkpoint-ana.json").write_text(json.dumps(rec))
    (folder / "bad\x1b[31m.json").write_text("{")
    r = subprocess.run([sys.executable, "-m", "hwlab", "class", "summary", str(folder)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
    assert "ana\ufffd[2J" in r.stdout and "malformed" in r.stdout


def test_a_drill_is_sealed_with_the_services_key_and_a_reveal_is_recorded_before_a_submission(book, tmp_path,
                                                                                           monkeypatch):
    from hwlab.course import drills

    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "service.key"))
    d = gradebook.new_drill(book, "ana", {"seed": 3})["drill"]
    right = drills.Drill.from_dict(d).fault().leaf
    # the learner's own key cannot read the seal nor re-sign an edited drill
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "learner.key"))
    with pytest.raises(UserInputError):
        drills.Drill.from_dict(dict(d))
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "service.key"))
    edited = {**d, "observations": {**d["observations"], "forged_pct": 1.0}}
    with pytest.raises(UserInputError):
        gradebook.submit_drill(book, "ana", {"drill": edited, "leaf": right})
    assert gradebook.submit_drill(book, "ana", {"drill": d, "leaf": right})["passed"] is True
    # bo reveals first, then submits the revealed leaf: recorded, never as passed
    assert gradebook.reveal_drill(book, "bo", {"drill": d})["leaf"] == right
    gradebook.reveal_drill(book, "bo", {"drill": d})
    got = gradebook.submit_drill(book, "bo", {"drill": d, "leaf": right})
    assert got["passed"] is False and got["status"] == "submitted after reveal"
    good, _ = gradebook.read_all(book)
    s = classroom.summary(good)
    (row,) = [r for k, r in s["items"].items() if k.startswith("drill:")]
    assert (row["attempts"], row["passed"], row["revealed"], row["learners_passed"]) == (2, 1, 1, 1)


def test_value_checks_are_graded_again_on_the_server_and_kernel_checks_are_only_learner_reported(book, tmp_path):
    ex = "hwlab.course.exercise.check_value"
    # the learner's status is never read for a check the service re-runs: a wrong leaf sent as passed is wrong
    r = gradebook.grade_exercise(book, "ana", {"check": ex, "name": "leaf of case 2", "status": "passed",
                                               "notebook": "ex05", "args": ["leaf of case 2", "L", "G", "why"],
                                               "kwargs": {}})
    assert (r["status"], r["passed"], r["graded_by"]) == ("wrong", False, "server")
    r = gradebook.grade_exercise(book, "ana", {"check": ex, "name": "leaf of case 2", "status": "wrong",
                                               "notebook": "ex05", "args": ["leaf of case 2", "G", "G", "why"],
                                               "kwargs": {}})
    assert (r["status"], r["passed"], r["graded_by"]) == ("passed", True, "server")
    # a kernel check (its answer is code, so no arguments are sent): recorded as the learner reports it, never a pass
    kern = {"check": "hwlab.course.exercise.check_kernel", "name": "copy kernel", "status": "passed",
            "notebook": "ex01", "args": None, "kwargs": None}
    r = gradebook.grade_exercise(book, "ana", kern)
    assert (r["status"], r["passed"], r["graded_by"]) == ("passed", False, "learner-reported")
    # a check outside the service's list is never run, whatever arguments come with it
    marker = tmp_path / "ran"
    r = gradebook.grade_exercise(book, "bo", {**kern, "check": "os.system", "args": [f"touch {marker}"], "kwargs": {}})
    assert r["graded_by"] == "learner-reported" and not marker.exists()
    for bad in ({**kern, "status": "\x1b[2Jpassed"}, {**kern, "name": ""}, {"check": ex, "name": "x", "status": "wrong",
                                                                             "args": [1], "kwargs": {}}):
        with pytest.raises(UserInputError):
            gradebook.grade_exercise(book, "bo", bad)
    good, _ = gradebook.read_all(book)
    s = classroom.summary(good)
    row, krow = s["items"]["exercise: ex05 / leaf of case 2"], s["items"]["exercise: ex01 / copy kernel"]
    assert (row["attempts"], row["passed"], row["wrong_leaves"], row.get("learner_reported")) == (2, 1, {"L": 1}, None)
    assert (krow["attempts"], krow["passed"], krow["learners_passed"]) == (2, 0, 0)
    assert (krow["learner_reported"], krow["learner_reported_passed"]) == (2, 2)
    assert s["per_learner"]["ana"]["items"]["exercise: ex01 / copy kernel"]["passed"] is False
    text = classroom.render(s)
    assert "learner-reported (not re-checked by the service, never counted as passed): 2 results, 2 reported passed" in text


def test_a_drop_box_over_its_per_learner_quota_is_not_read_and_is_pruned_by_its_owner(tmp_path, monkeypatch):
    import grp as _grp

    from hwlab.course import dropbox

    box = tmp_path / "box"
    dropbox.make(box, _grp.getgrgid(os.getgid()).gr_name)
    rec = {"kind": "exercise", "item": "leaf", "passed": True, "status": "passed", "learner": dropbox.login_name()}
    kept = [classroom.write_result(dict(rec), box) for _ in range(3)]
    assert len(classroom.load_results(box)[0]) == 3
    big = box / "inbound" / "result-big.json"
    with open(big, "wb") as f:  # 1 GiB by its size (sparse): never read
        f.truncate(1 << 30)
    good, bad = classroom.load_results(box)
    assert good == [] and any("over the drop box's quota" in b["why"] for b in bad)
    monkeypatch.setattr(dropbox, "MAX_FILES_PER_LEARNER", 2)
    newest = max(kept, key=lambda p: (p.stat().st_mtime, p.name))
    gone = dropbox.prune(box)
    # the oversized file first, then the newest result past the file quota; the two oldest stay
    assert sorted(g["name"] for g in gone) == sorted([big.name, newest.name])
    assert not big.exists() and not newest.exists() and sum(p.exists() for p in kept) == 2
    assert dropbox.over_quota(box) == {} and len(classroom.load_results(box)[0]) == 2


def test_an_exercise_reveal_needs_the_wrong_tries_the_service_counted(book):
    ex = "hwlab.course.exercise.check_value"
    req = {"check": ex, "name": "leaf of case 3", "status": "passed", "notebook": "ex05",
           "args": ["leaf of case 3", "L", "G", "why"], "kwargs": {}}
    for n in (1, 2, 3):
        r = gradebook.reveal_exercise(book, "ana", {"name": "leaf of case 3", "notebook": "ex05"})
        assert r["revealed"] is False and r["tries"] == n - 1
        gradebook.grade_exercise(book, "ana", req)  # wrong each time, whatever status the kernel sent
    # a kernel's own "wrong" sent for a learner-reported check in another notebook is not these tries
    assert gradebook.reveal_exercise(book, "ana", {"name": "leaf of case 3", "notebook": "ex06"})["revealed"] is False
    for _ in range(2):
        assert gradebook.reveal_exercise(book, "ana", {"name": "leaf of case 3", "notebook": "ex05"})["revealed"] is True
    assert gradebook.reveal_exercise(book, "bo", {"name": "leaf of case 3", "notebook": "ex05"})["revealed"] is False
    s = classroom.summary(gradebook.read_all(book)[0])
    row = s["items"]["exercise: ex05 / leaf of case 3"]
    assert (row["attempts"], row["revealed"], row["passed"]) == (3, 1, 0)
    assert s["per_learner"]["ana"]["items"]["exercise: ex05 / leaf of case 3"]["revealed"] is True
