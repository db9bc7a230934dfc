"""The class gradebook on the server: answers graded, and tries, reveals and passes recorded, by a
process the learner cannot write as.

The grading service (``hwlab class serve``, a JupyterHub service: :mod:`hwlab.cli.gradeservice`)
runs as the class's own user and owns this folder. A learner's kernel sends the answer and the
evidence it was shown (:mod:`hwlab.course.gradeclient`); the hub says who the learner is (their
token); the service re-walks the chart on that evidence, grades the answer with the kit's own
checkpoint check (:func:`hwlab.course.checkpoint.check`) and appends the result here. A learner's
own files, kernel and drop-box records never count: only this folder does.

Layout and modes (checked by :func:`check` before every read and write):

* the folder: owned by the service's user, no write for group or other, nothing for other
  (mode 0o2750 with the instructors' group, or 0o700): learners cannot list, read, add, edit
  or delete a record;
* one file per learner, ``<login>.jsonl``, appended by the service (mode 0o640), opened with
  ``O_NOFOLLOW`` and refused unless it is a regular file owned by the folder's owner.

Limits, and why:

* :data:`MAX_RECORDS_PER_LEARNER` records and :data:`MAX_BYTES_PER_LEARNER` bytes per learner: far
  above a course's graded answers (a dozen checkpoints and checks, a few tries each), low enough
  that a flood fills one learner's quota and not the disk nor the instructor's summary;
* :data:`MAX_RECORD_BYTES` per record (free text is cut to :data:`MAX_TEXT_CHARS`): one answer
  with its feedback;
* readers take at most the quota (plus one record) from each file, so the summary's memory is
  bounded by the roster, not by what is on disk; every string read has its control characters
  replaced (:func:`clean`) so nothing in a record reaches the instructor's terminal raw.

A reveal is recorded only when the service has counted :data:`hwlab.course.tries.TRIES_BEFORE_REVEAL`
wrong tries of that learner at that checkpoint; the learner's kernel shows the answer only after the
service recorded it.

Drills (:func:`new_drill`, :func:`submit_drill`, :func:`reveal_drill`) are drawn and sealed with the
service's own drill key, so the fault is out of the learner's reach until the service reveals it,
records the reveal, and counts any later submission of that drill as made after the reveal.

The evidence is the one the learner's kernel was shown (recorded or measured in their session):
the service grades the answer against it and keeps its sha256 beside the result; it cannot prove
a measurement it did not make.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import stat
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hwlab.course import checkpoint, classroom, tries
from hwlab.diagnosis import flowchart
from hwlab.errors import UserInputError
from hwlab.core.store import UserJSONError, loads_user_json

MARKER = ".hwlab-gradebook"
MAX_RECORDS_PER_LEARNER = 500
MAX_BYTES_PER_LEARNER = 1 << 20
MAX_RECORD_BYTES = 8192
MAX_TEXT_CHARS = 600
#: the largest request body the service reads (an answer and the evidence table it was shown)
MAX_REQUEST_BYTES = 256 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


class QuotaExceeded(UserInputError):
    """A learner's records reached the per-learner quota."""


clean = classroom.clean


def _short(v: Any) -> Any:
    return v[:MAX_TEXT_CHARS] if isinstance(v, str) else v


def make(folder: str | os.PathLike, group: str | None = None) -> Path:
    """Create the gradebook ``folder`` for this (the service's) user; ``group`` (the instructors')
    may read it. Returns the folder after :func:`check`."""
    import grp

    top = Path(folder)
    top.mkdir(mode=0o700, exist_ok=True)
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise UserInputError(f"no group {group!r} on this machine: make the instructors' group first") from None
        st = os.lstat(top)
        try:
            if st.st_gid != gid:
                os.chown(top, -1, gid)
            # a chmod by a user outside the folder's group clears its setgid bit (the kernel's rule):
            # a folder root made right (install -d -g GROUP -m 2750) is left as it is
            if st.st_gid != gid or not st.st_mode & stat.S_ISGID or stat.S_IMODE(st.st_mode) & 0o027:
                os.chmod(top, stat.S_ISGID | 0o750)
        except PermissionError:
            raise UserInputError(f"gradebook {top}: this user cannot give it group {group}; make it as root first: "
                                 f"install -d -o $(id -un) -g {group} -m 2750 {top}") from None
    else:
        os.chmod(top, 0o700)
    fd = os.open(top / MARKER, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o640)
    os.close(fd)
    return check(top)


def is_gradebook(folder: str | os.PathLike) -> bool:
    return os.path.lexists(Path(folder) / MARKER)


def check(folder: str | os.PathLike) -> Path:
    """The gradebook folder after checking it is a folder (not a link), with no write for group or
    other and nothing for other; raises :class:`UserInputError` (one line) otherwise."""
    top = Path(folder)
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        raise UserInputError(f"no gradebook at {top}: the grading service makes it (hwlab class serve)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UserInputError(f"gradebook {top} is a link or a file, not a folder: point it at the service's folder")
    if stat.S_IMODE(st.st_mode) & 0o027:
        raise UserInputError(f"gradebook {top} has mode {stat.S_IMODE(st.st_mode):#o}: learners could reach the "
                             f"records; run `chmod 2750 {top}` as its owner")
    return top


def _file(folder: Path, learner: str) -> Path:
    if not _NAME.match(learner):
        raise UserInputError(f"learner name {learner!r} is not a login name the gradebook keeps")
    return folder / f"{learner}.jsonl"


def _open(path: Path, flags: int, owner: int) -> int:
    """``path`` opened without following a link or blocking on a FIFO; a regular file of ``owner`` only."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o640)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
        os.close(fd)
        raise UserInputError(f"{path} is not a regular file of the gradebook's owner: remove it")
    return fd


def _read_fd(fd: int) -> tuple[list[dict], bool]:
    """(records, cut): at most the quota plus one record is read from ``fd``."""
    cap = MAX_BYTES_PER_LEARNER + MAX_RECORD_BYTES
    chunks, n = [], 0
    while n < cap:
        b = os.read(fd, min(65536, cap - n))
        if not b:
            break
        chunks.append(b)
        n += len(b)
    cut = n >= cap and bool(os.read(fd, 1))
    out = []
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines()[:MAX_RECORDS_PER_LEARNER + 1]:
        try:
            d = loads_user_json(line)
        except UserJSONError:
            continue
        if isinstance(d, dict):
            out.append(clean(d))
    return out, cut


def learner_records(folder: str | os.PathLike, learner: str) -> list[dict]:
    top = check(folder)
    try:
        fd = _open(_file(top, learner), os.O_RDONLY, os.lstat(top).st_uid)
    except FileNotFoundError:
        return []
    try:
        return _read_fd(fd)[0]
    finally:
        os.close(fd)


def append(folder: str | os.PathLike, learner: str, rec: dict[str, Any]) -> dict[str, Any]:
    """Append ``rec`` (the learner's name and the time set here) to ``learner``'s file under a lock;
    raises :class:`QuotaExceeded` past the quotas. Returns the record as written."""
    top = check(folder)
    rec = clean({"schema": classroom.SCHEMA, "schema_version": classroom.SCHEMA_VERSION,
                 "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 **{k: _short(v) for k, v in rec.items()}, "learner": learner,
                 "graded_by": rec.get("graded_by", "server")})  # set only by this module's own callers
    line = (json.dumps(rec, allow_nan=False, sort_keys=True) + "\n").encode()
    if len(line) > MAX_RECORD_BYTES:
        raise UserInputError(f"a record of {len(line)} bytes is over the gradebook's {MAX_RECORD_BYTES}")
    fd = _open(_file(top, learner), os.O_RDWR | os.O_CREAT | os.O_APPEND, os.geteuid())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        n = sum(1 for _ in _read_fd(fd)[0]) if size else 0
        if n >= MAX_RECORDS_PER_LEARNER or size + len(line) > MAX_BYTES_PER_LEARNER:
            raise QuotaExceeded(f"{learner} has {n} graded records ({size} bytes): the quota is "
                                f"{MAX_RECORDS_PER_LEARNER} records, {MAX_BYTES_PER_LEARNER} bytes; ask the instructor")
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return rec


def read_all(folder: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(results, problems) of every learner's file: at most the quota from each, no link followed,
    only regular files of the folder's owner; each result's learner is its file's."""
    top = check(folder)
    owner = os.lstat(top).st_uid
    good, bad = [], []
    try:
        names = sorted(os.listdir(top))
    except PermissionError:
        raise UserInputError(f"only the instructors' group reads the gradebook {top}: run hwlab class summary "
                             "as an instructor") from None
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        learner, path = name[:-len(".jsonl")], top / name
        try:
            fd = _open(path, os.O_RDONLY, owner)
        except (UserInputError, OSError) as e:
            bad.append({"path": clean(str(path)), "why": clean(str(e))})
            continue
        try:
            recs, cut = _read_fd(fd)
        finally:
            os.close(fd)
        if cut:
            bad.append({"path": clean(str(path)), "why": "over the per-learner quota: only the first part was read"})
        for d in recs:
            d["learner"] = clean(learner)
            if classroom.invalid(d) is None:
                good.append(d)
    return good, bad


# ---- grading --------------------------------------------------------------------------------

def _checkpoint_from(req: dict[str, Any]) -> tuple[checkpoint.Checkpoint, checkpoint.Answer]:
    """The checkpoint and answer a request names; raises :class:`UserInputError` on a malformed one."""
    cid, ev = req.get("checkpoint"), req.get("evidence")
    if not isinstance(cid, str) or not _ID.match(cid):
        raise UserInputError("checkpoint: give the checkpoint's id (letters, digits, . _ -)")
    if not isinstance(ev, dict) or not ev:
        raise UserInputError("evidence: give the evidence table the checkpoint was answered on")
    p = req.get("prediction")
    pred = None
    if p is not None:
        if not isinstance(p, dict) or not isinstance(p.get("actual"), (int, float)):
            raise UserInputError("prediction: give what, actual, unit and band_pct or band_abs")
        pred = checkpoint.Prediction(str(p.get("what", ""))[:200], float(p["actual"]), str(p.get("unit", ""))[:16],
                                     _opt_float(p.get("band_pct")), _opt_float(p.get("band_abs")))
    a = req.get("answer") or {}
    if not isinstance(a, dict):
        raise UserInputError("answer: give leaf, metric, value and prediction")
    ans = checkpoint.Answer(_opt_str(a.get("leaf")), _opt_str(a.get("metric")), _opt_float(a.get("value")),
                            _opt_float(a.get("prediction")))
    step = req.get("step")
    walk = flowchart.diagnose(ev)
    return checkpoint.Checkpoint(cid, walk, ev, step=step if isinstance(step, str) else None,
                                 prediction=pred, source=str(req.get("source", ""))[:200]), ans


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)[:64]


def _opt_float(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def counts(recs: list[dict], kind: str, item: str) -> dict[str, int]:
    """Wrong tries, passes and reveals of one item in one learner's records."""
    mine = [d for d in recs if d.get("kind") == kind and d.get("item") == item]
    return {"wrong": sum(d.get("status") in tries.NOT_PASSED for d in mine),
            "passed": sum(d.get("status") == checkpoint.PASSED for d in mine),
            "revealed": sum(bool(d.get("revealed")) for d in mine)}


def grade_checkpoint(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """Grade a checkpoint answer here and record it (blanks and undecided walks are not recorded);
    returns the status, feedback, the learner's wrong tries so far and whether a reveal may be asked."""
    try:
        cp, ans = _checkpoint_from(req)
        res = checkpoint.check(cp, ans, record=False)
    except UserInputError:
        raise
    except Exception as e:  # noqa: BLE001 (evidence the chart cannot walk is bad input, not a crash)
        raise UserInputError(f"evidence cannot be walked: {type(e).__name__}") from None
    recs = learner_records(folder, learner)
    n_wrong = counts(recs, "checkpoint", cp.id)["wrong"]
    if res.status in (checkpoint.PASSED, checkpoint.WRONG):
        rec = classroom.checkpoint_record(cp, res, learner)
        rec["evidence_sha256"] = hashlib.sha256(json.dumps(cp.evidence, sort_keys=True, default=str)
                                                .encode()).hexdigest()
        append(folder, learner, rec)
        n_wrong += res.status == checkpoint.WRONG
    return {"checkpoint": cp.id, "status": res.status, "messages": res.messages, "tries": n_wrong,
            "may_reveal": n_wrong >= tries.TRIES_BEFORE_REVEAL, "learner": learner}


def reveal_checkpoint(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """Record a reveal of checkpoint ``req["checkpoint"]`` if the service counted enough wrong tries;
    returns ``revealed`` (whether the kernel may show the answer) and a message."""
    cid = req.get("checkpoint")
    if not isinstance(cid, str) or not _ID.match(cid):
        raise UserInputError("checkpoint: give the checkpoint's id (letters, digits, . _ -)")
    c = counts(learner_records(folder, learner), "checkpoint", cid)
    if c["wrong"] < tries.TRIES_BEFORE_REVEAL:
        return {"revealed": False, "message": tries.too_early(f"checkpoint {cid}", c["wrong"]), "tries": c["wrong"]}
    if not c["revealed"]:
        append(folder, learner, {"kind": "checkpoint", "item": cid, "notebook": _opt_str(req.get("notebook")),
                                 "passed": False, "status": checkpoint.REVEALED, "revealed": True})
    return {"revealed": True, "message": f"checkpoint {cid}: answer revealed (recorded by the class's service)",
            "tries": c["wrong"]}


# ---- exercise checks: answers that are values re-checked here; kernels recorded as learner-reported ----

#: the exercise checks the service re-runs itself: their arguments are the learner's answers (values,
#: leaves, counts) and the evidence the kit gives them, never the learner's code; a check of the kit's own
#: kernel compile (the occupancy checks) runs in the kit's time-limited child, as in the learner's kernel
SERVER_CHECKS = ("hwlab.course.exercise.check_value", "hwlab.course.ex02_checks.check_occupancy_prediction",
                 "hwlab.course.ex02_checks.check_warps_choice")
_STATUSES = ("passed", "passed (correctness only)", "wrong", "too slow", "environment problem")


def _server_check(name: str):
    import importlib

    mod, fn = name.rsplit(".", 1)
    return getattr(importlib.import_module(mod), fn).__wrapped__  # the check alone: no kernel-side record


def grade_exercise(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """Record an exercise check's result: one of :data:`SERVER_CHECKS` with its arguments sent is graded
    again here from those arguments (the learner's status is not read); any other (a kernel check: its
    answer is code the service never runs) is recorded as ``graded_by`` "learner-reported", shown apart
    in the summary and never counted as passed."""
    check, name, status = req.get("check"), req.get("name"), req.get("status")
    if not isinstance(check, str) or not isinstance(name, str) or not name or len(name) > 120:
        raise UserInputError("check and name: give the check's function and its result's name")
    args, kwargs = req.get("args"), req.get("kwargs")
    if check in SERVER_CHECKS and isinstance(args, list) and isinstance(kwargs, dict):
        try:
            res = _server_check(check)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (arguments the check cannot take are bad input, not a crash)
            raise UserInputError(f"{check.rsplit('.', 1)[1]} cannot be graded on these arguments: "
                                 f"{type(e).__name__}") from None
        if res.status == "not done yet":
            return {"status": res.status, "graded_by": "server", "learner": learner}
        rec = classroom.exercise_record(res, learner, _opt_str(req.get("notebook")))
        rec["message"] = _short(rec["message"])
    else:
        if status not in _STATUSES:
            raise UserInputError(f"status: one of {', '.join(_STATUSES)}")
        rec = {"kind": "exercise", "item": name, "notebook": _opt_str(req.get("notebook")), "passed": False,
               "status": status, "revealed": False, "graded_by": classroom.LEARNER_REPORTED,
               "check": check[:120]}
    out = append(folder, learner, rec)
    return {"status": out["status"], "passed": out["passed"], "graded_by": out["graded_by"], "learner": learner}


def reveal_exercise(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """Record a reveal of exercise check ``req["name"]`` (of ``req["notebook"]``) once the service counted
    :data:`hwlab.course.tries.TRIES_BEFORE_REVEAL` wrong tries of it; ``revealed`` says whether the
    kernel may show the answer."""
    name, nb = req.get("name"), _opt_str(req.get("notebook"))
    if not isinstance(name, str) or not name or len(name) > 120:
        raise UserInputError("name: give the exercise check's name, as its result names it")
    name = clean(name)
    mine = [d for d in learner_records(folder, learner)
            if d.get("kind") == "exercise" and d.get("item") == name and d.get("notebook") == nb]
    n_wrong = sum(d.get("status") in tries.NOT_PASSED for d in mine)
    if n_wrong < tries.TRIES_BEFORE_REVEAL:
        return {"revealed": False, "message": tries.too_early(name, n_wrong), "tries": n_wrong}
    if not any(d.get("revealed") for d in mine):
        append(folder, learner, {"kind": "exercise", "item": name, "notebook": nb, "passed": False,
                                 "status": "revealed", "revealed": True})
    return {"revealed": True, "message": f"{name}: answer revealed (recorded by the class's service)", "tries": n_wrong}


# ---- drills: drawn, graded and revealed with the service's own drill key ------------------------

def _drill_from(req: dict[str, Any]):
    from hwlab.course import drills

    return drills.Drill.from_dict(req.get("drill"), "the drill sent")  # its seal verified: edits refused


def new_drill(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """A drill drawn and sealed here, with the service's drill key (the learner never holds it, so the
    fault stays sealed to them); its observations come from the kit's recorded runs."""
    from hwlab.course import drills

    seed, fault = req.get("seed"), req.get("fault")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31):
        raise UserInputError("seed: give a whole number from 0 to 2**31-1, or none")
    if fault is not None:
        raise UserInputError("fault: the service draws the fault; leave it out")
    return {"drill": asdict(drills.new(seed, None, live=False))}


def submit_drill(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """Grade a leaf for a drill the service drew (its seal verified) and record it; a drill whose answer
    this learner had revealed is recorded as submitted after the reveal, never as passed."""
    from hwlab.course import drills

    d, leaf, ev = _drill_from(req), req.get("leaf"), req.get("evidence")
    if not isinstance(leaf, str):
        raise UserInputError("leaf: give the leaf you reached")
    if ev is not None and not isinstance(ev, dict):
        raise UserInputError("evidence: give the probes' metrics you walked, or none")
    g = drills.grade(d, leaf, ev, learner=learner)
    rec = classroom.drill_record(d, g)
    mine = [r for r in learner_records(folder, learner) if r.get("kind") == "drill" and r.get("drill_id") == d.drill_id]
    if any(r.get("revealed") for r in mine):
        rec.update(passed=False, status="submitted after reveal")
    else:
        rec["status"] = "passed" if g.passed else "wrong"
    append(folder, learner, rec)
    return {"drill_id": d.drill_id, "passed": rec["passed"], "status": rec["status"], "explanation": g.explanation}


def reveal_drill(folder: str | os.PathLike, learner: str, req: dict[str, Any]) -> dict[str, Any]:
    """The drill's answer, recorded as revealed (once) before it is returned."""
    from hwlab.course import drills

    d = _drill_from(req)
    mine = [r for r in learner_records(folder, learner) if r.get("kind") == "drill" and r.get("drill_id") == d.drill_id]
    if not any(r.get("revealed") for r in mine):
        append(folder, learner, {"kind": "drill", "item": d.fault().name, "drill_id": d.drill_id, "passed": False,
                                 "status": "revealed", "revealed": True})
    return {"drill_id": d.drill_id, **drills.reveal(d)}


def summary_of(folder: str | os.PathLike, exclude: set[str] = frozenset()) -> dict[str, Any]:
    """The instructor's summary of the gradebook (:func:`hwlab.course.classroom.summary`)."""
    good, bad = read_all(folder)
    s = classroom.summary([d for d in good if d["learner"] not in exclude])
    s["malformed"] = bad
    return s


def request_checkpoint(cp: Any, a: Any, notebook: str | None) -> dict[str, Any]:
    """The request body a learner's kernel sends for checkpoint ``cp`` answered with ``a``."""
    return {"checkpoint": cp.id, "notebook": notebook, "evidence": cp.evidence, "step": cp.step,
            "prediction": asdict(cp.prediction) if cp.prediction else None, "source": cp.source,
            "answer": asdict(a)}
