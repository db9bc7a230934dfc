"""Class results: every graded exercise and drill submission, kept for the instructor.

Where: the folder named by ``HWLAB_CLASS_DIR`` (or the ``--class-dir`` flag of
``hwlab drill submit``); without either nothing is written. Each result is one small JSON
file (``<kind>-<learner>-<item>-<time>-<n>.json``) written atomically under a new name, so
many learners can share one folder (a network share, a course directory) without locks and
nothing is ever overwritten.

Who: ``HWLAB_LEARNER``, else the login name.

What: exercises (every :class:`hwlab.core.grading.ExerciseResult` built is passed to
:func:`record_exercise`, registered in ``hwlab/__init__.py``; "not done yet" is not recorded): the checker's status, and for a flowchart question the leaf given
and the right one. Drills (:func:`record_drill`, after :func:`hwlab.course.drills.grade`): the fault,
the leaf submitted and the fault's leaf, whether the evidence supported it and whether the
fix removed the slowdown. Checkpoints (:func:`record_checkpoint`, from
:func:`hwlab.course.checkpoint.check`; blanks are not recorded): the checkpoint, the leaf, metric, value
and prediction given, pass or not, and the walk's leaf. Reveals (:mod:`hwlab.course.tries`, after three
wrong tries at a checkpoint or an exercise check): a result marked ``revealed``, counted apart from the
tries.

The **first wrong branch** of a wrong leaf: walking the flowchart's tree from its start
toward the right leaf, the first question whose right branch cannot reach the submitted
leaf; the learner answered that question the other way. It is read from the chart's
structure alone, so exercises and drills count it the same way.

:func:`summary` groups results per exercise, fault or checkpoint: attempts, learners, pass rate, the
common wrong leaves and first wrong branches, how many answers were revealed, and for a checkpoint every
leaf picked and every metric cited (the misconception map); :func:`load_results` reports malformed files
and skips them.
"""
from __future__ import annotations

import getpass
import os
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hwlab.course import dropbox, tries
from hwlab.diagnosis import flowchart
from hwlab.errors import UserInputError
from hwlab.core.store import RecordExistsError, write_json_atomic
from hwlab.core.store import check_input_folder, loads_user_json, read_user_text, rescue

ENV_DIR, ENV_LEARNER = "HWLAB_CLASS_DIR", "HWLAB_LEARNER"
SCHEMA, SCHEMA_VERSION = "hwlab.class_result", 1
KINDS = ("exercise", "drill", "checkpoint", "joined")
#: ``graded_by`` of an exercise result the grading service could not re-check (a kernel check run by the
#: learner's own kernel, whose code the service never runs as the class account): shown, never a pass
LEARNER_REPORTED = "learner-reported"
#: the largest class result read: one graded answer with its feedback is a few KiB; a bigger file is
#: refused unread (by its size), so the summary's memory stays bounded by the number of files
MAX_RESULT_BYTES = 256 * 1024
_REQUIRED = {"schema": str, "kind": str, "item": str, "learner": str, "passed": bool, "at": str}


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(v: Any) -> Any:
    """``v`` with every string's control characters (C0 but tab and newline, DEL, C1: terminal escape
    sequences start with ESC or CSI) replaced by U+FFFD, recursively, keys too: what a learner wrote
    never reaches the instructor's terminal raw."""
    if isinstance(v, str):
        return _CONTROL.sub("\ufffd", v)
    if isinstance(v, dict):
        return {clean(k): clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [clean(x) for x in v]
    return v


def class_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The class folder: the explicit one, else ``$HWLAB_CLASS_DIR``, else None (do not record)."""
    d = explicit or os.environ.get(ENV_DIR)
    return Path(d) if d else None


def learner_name(explicit: str | None = None) -> str:
    if explicit and explicit != "anonymous":
        return explicit
    env = os.environ.get(ENV_LEARNER)
    if env:
        return env
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return explicit or "anonymous"


def _path_to(leaf: str) -> list[tuple[str, str]]:
    """[(question, branch)] from the chart's start to ``leaf``: the flowchart is a tree."""
    def walk(node: str, acc: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
        if node == leaf:
            return acc
        if node not in flowchart.QUESTIONS:
            return None
        q = flowchart.QUESTIONS[node]
        return walk(q.yes, acc + [(node, "yes")]) or walk(q.no, acc + [(node, "no")])
    return walk(flowchart.START, []) or []


def leaves_under(node: str) -> set[str]:
    """The leaves reachable from ``node`` (a question or a leaf) in the chart's tree."""
    if node in flowchart.LEAVES:
        return {node}
    q = flowchart.QUESTIONS[node]
    return leaves_under(q.yes) | leaves_under(q.no)


def first_wrong_branch(right_leaf: str, submitted_leaf: str) -> dict[str, str] | None:
    """The first question on the way to ``right_leaf`` answered the other way by
    ``submitted_leaf`` (None if the leaf is right or either is not a leaf)."""
    if right_leaf == submitted_leaf or {right_leaf, submitted_leaf} - set(flowchart.LEAVES):
        return None
    for qid, branch in _path_to(right_leaf):
        q = flowchart.QUESTIONS[qid]
        if submitted_leaf not in leaves_under(q.yes if branch == "yes" else q.no):
            return {"question": qid, "text": q.text, "right": branch,
                    "taken": "no" if branch == "yes" else "yes"}
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:40] or "x"


def write_result(record: dict[str, Any], folder: str | os.PathLike) -> Path:
    """Write one result atomically under a new name in ``folder``; returns its path."""
    rec = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
           "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **record}
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserInputError(f"class folder {folder} is a file: point {ENV_DIR} / --class-dir at a folder")
    if dropbox.is_dropbox(folder):  # a class's drop box: the learner is who writes the file
        rec["learner"] = dropbox.login_name()
        stem = f"{rec['kind']}-{_slug(rec['learner'])}-{_slug(rec['item'])}-{rec['at'].replace(':', '')}"
        return dropbox.submit(rec, folder, stem)
    _refuse_open_folder(folder)
    stem = f"{rec['kind']}-{_slug(rec['learner'])}-{_slug(rec['item'])}-{rec['at'].replace(':', '')}"
    for n in range(1000):
        try:
            return write_json_atomic(folder / f"{stem}-{n:03d}.json", rec)
        except RecordExistsError:
            continue
    raise RecordExistsError(f"{folder} already holds 1000 results named {stem}-*")


def _notebook() -> str | None:
    """The notebook a kernel runs (Jupyter server sets JPY_SESSION_NAME), or HWLAB_EXERCISE."""
    name = os.environ.get("HWLAB_EXERCISE") or os.environ.get("JPY_SESSION_NAME")
    return Path(name).stem if name else None


def record_exercise(result: Any, folder: str | os.PathLike | None = None, learner: str | None = None) -> Path | None:
    """Record a graded :class:`hwlab.course.exercise.ExerciseResult`; None where no class folder is set."""
    folder = class_dir(folder)
    if folder is None or result.status == "not done yet" or tries.inside_check():
        return None  # built inside a graded check: the check records the result it returns
    rec = exercise_record(result, learner_name(learner), _notebook())
    try:
        return write_result(rec, folder)
    except OSError as e:  # kept in the rescue folder; the message (printed by grading) says where
        raise OSError(e.errno, rescue(rec, "class-result", folder, e)) from None


def exercise_record(result: Any, learner: str, notebook: str | None) -> dict[str, Any]:
    """The class result of one graded exercise check (what :func:`record_exercise` writes)."""
    answer, expected = getattr(result, "answer", None), getattr(result, "expected", None)
    leafy = isinstance(answer, str) and isinstance(expected, str) and {answer, expected} <= set(flowchart.LEAVES)
    return {"kind": "exercise", "item": result.name, "notebook": notebook, "learner": learner,
            "passed": bool(result.passed), "status": result.status, "revealed": False, "message": result.message,
            "answer": answer if isinstance(answer, (str, int, float, bool, type(None))) else repr(answer),
            "expected": expected if isinstance(expected, (str, int, float, bool, type(None))) else repr(expected),
            "wrong_leaf": answer if leafy and answer != expected else None, "right_leaf": expected if leafy else None,
            "first_wrong_branch": first_wrong_branch(expected, answer) if leafy else None}


def record_revealed(item: str, text: str, folder: str | os.PathLike | None = None,
                    learner: str | None = None) -> Path | None:
    """Record that exercise check ``item``'s answer was revealed to the learner
    (:func:`hwlab.course.tries.reveal`, after its wrong tries); None without a class folder."""
    folder = class_dir(folder)
    if folder is None:
        return None
    rec = {"kind": "exercise", "item": item, "notebook": _notebook(), "learner": learner_name(learner),
           "passed": False, "status": "revealed", "revealed": True, "message": text}
    try:
        return write_result(rec, folder)
    except OSError as e:
        raise OSError(e.errno, rescue(rec, "class-result", folder, e)) from None


def record_drill(drill: Any, grade: Any, folder: str | os.PathLike | None = None) -> Path | None:
    """Record a :class:`hwlab.course.drills.Grade` with its drill's fault (read from the drill's seal);
    None without a class folder. Called after :func:`hwlab.course.drills.grade` by ``hwlab drill
    submit`` and notebook 07 (this module does not import drills: every ``import hwlab`` loads this
    one to record graded results, and need not load drills with it)."""
    folder = class_dir(folder)
    if folder is None:
        return None
    return write_result(drill_record(drill, grade), folder)


def record_checkpoint(cp: Any, res: Any, folder: str | os.PathLike | None = None,
                      learner: str | None = None) -> Path | None:
    """Record a graded checkpoint answer (:func:`hwlab.course.checkpoint.check`): the learner, the
    checkpoint, the leaf, metric, value and prediction given, pass or not, whether the answer was revealed
    (after the tries :meth:`hwlab.course.checkpoint.Result.reveal` asks for), and the first wrong branch of a
    wrong leaf; None without a class folder."""
    folder = class_dir(folder)
    if folder is None:
        return None
    rec = checkpoint_record(cp, res, learner_name(learner))
    try:
        return write_result(rec, folder)
    except OSError as e:
        raise OSError(e.errno, rescue(rec, "class-result", folder, e)) from None


def checkpoint_record(cp: Any, res: Any, learner: str) -> dict[str, Any]:
    """The class result of one graded checkpoint answer (what :func:`record_checkpoint` writes and the
    grading service appends to its gradebook)."""
    a, right = res.answer, cp.walk.leaf_id
    leaf = str(a.leaf).strip().upper() if a.leaf is not None else None
    rec = {"kind": "checkpoint", "item": cp.id, "notebook": _notebook(), "learner": learner,
           "passed": bool(res.passed), "status": res.status, "revealed": res.status == "revealed",
           "leaf": leaf, "metric": a.metric,
           "value": _num(a.value), "prediction": _num(a.prediction), "right_leaf": right,
           "wrong_leaf": leaf if right and leaf != right and leaf in flowchart.LEAVES else None,
           "not_a_leaf": leaf if leaf is not None and leaf not in flowchart.LEAVES else None,
           "first_wrong_branch": first_wrong_branch(right, leaf) if right and leaf else None,
           "asked_step": getattr(cp.asked(), "question", None), "source": cp.source,
           "gpu_shared": _shared(cp),
           "message": "\n".join(res.messages)}
    return rec


def _shared(cp: Any) -> bool:
    """Whether the checkpoint's evidence was measured on a SHARED GPU (its walk or its evidence says so)."""
    ev = (getattr(cp, "evidence", None) or {}).get("gpu_shared")
    return bool(getattr(cp.walk, "shared", None) or (isinstance(ev, dict) and ev.get("shared")))


def join(folder: str | os.PathLike | None = None) -> Path | None:
    """Enter this learner on the class's roster (kind ``joined``; the hub's server start calls it), so
    the instructor's summary lists a learner who has not answered yet; None without a class folder."""
    folder = class_dir(folder)
    if folder is None:
        return None
    return write_result({"kind": "joined", "item": "class", "learner": learner_name(), "passed": False}, folder)


def _refuse_open_folder(folder: Path) -> None:
    """A plain class folder that others may write is refused: every learner could read and replace the
    others' answers there. A class shares a drop box (:mod:`hwlab.course.dropbox`) instead."""
    try:
        st = folder.stat()
    except FileNotFoundError:
        return
    mode = st.st_mode
    if mode & 0o002 or (mode & 0o020 and not dropbox.private_group(st.st_gid, st.st_uid)):
        raise UserInputError(f"class folder {folder} is writable by others ({mode & 0o7777:#o}) and is not a drop "
                             f"box: make one with `hwlab class init DIR --group INSTRUCTORS` and point {ENV_DIR} there")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def drill_record(drill: Any, grade: Any) -> dict[str, Any]:
    """The class result of one graded drill (what :func:`record_drill` writes)."""
    fault = drill.fault()
    return {"kind": "drill", "item": fault.name, "learner": grade.learner, "passed": bool(grade.passed),
            "drill_id": drill.drill_id, "source": drill.label, "submitted_leaf": grade.submitted_leaf,
            "right_leaf": fault.leaf, "wrong_leaf": None if grade.correct_leaf else grade.submitted_leaf,
            "evidence_supports": grade.evidence_supports, "fix_removes_slowdown": grade.fix_removes_slowdown,
            "first_wrong_branch": first_wrong_branch(fault.leaf, grade.submitted_leaf),
            "seconds": grade.seconds, "explanation": grade.explanation}


def load_results(folder: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(valid results, malformed files with why): a malformed file is reported and skipped."""
    # a missing path, a file, a looping link: each named for what it is (core.store)
    folder = check_input_folder(folder, "class folder", f"pass the class folder ({ENV_DIR})")
    good, bad = [], []
    box = dropbox.is_dropbox(folder)
    over = dropbox.over_quota(folder) if box else {}
    for uid, u in over.items():  # none of their files is read: the summary's memory stays bounded
        bad.append({"path": clean(str(folder / dropbox.INBOUND)),
                    "why": clean(f"learner {dropbox.owner_name_of(uid)} is over the drop box's quota ({u['files']} "
                                 f"files, {u['bytes']} bytes; the quota is {dropbox.MAX_FILES_PER_LEARNER} files, "
                                 f"{dropbox.MAX_BYTES_PER_LEARNER} bytes): their results are not read; "
                                 f"`hwlab class prune {folder}` (as the drop box's owner) removes the excess")})
    files = [p for p in dropbox.files(folder) if os.lstat(p).st_uid not in over] if box else []
    for p in sorted(folder.glob("*.json")) + files:
        try:  # a FIFO, a device or an oversize file named *.json is refused unopened
            d = loads_user_json(read_user_text(p, "class result", "remove it from the class folder",
                                               max_bytes=MAX_RESULT_BYTES))
        except UserInputError as e:
            bad.append({"path": clean(str(p)), "why": clean(str(e))})
            continue
        d = clean(d)
        why = invalid(d)
        if not why and box and p.parent.name == dropbox.INBOUND and d["learner"] != dropbox.owner_name(p):
            why = f"names learner {d['learner']!r} but was written by {dropbox.owner_name(p)!r}"
        if why:
            bad.append({"path": clean(str(p)), "why": clean(why)})
        else:
            good.append(d)
    return good, bad


def invalid(d: Any) -> str | None:
    if not isinstance(d, dict):
        return "not a JSON object"
    if d.get("schema") != SCHEMA:
        return f"not a class result (schema {SCHEMA!r} missing)"
    for k, typ in _REQUIRED.items():
        if not isinstance(d.get(k), typ):
            return f"field {k!r} missing or not a {typ.__name__}"
    if d["kind"] not in KINDS:
        return f"kind {d['kind']!r} is not one of {KINDS}"
    return None


def _key(d: dict[str, Any]) -> str:
    """A checkpoint is one row whatever notebook file or console kernel answered it (its id is the
    kit's); an exercise check keeps the notebook it came from, so same-named checks stay apart."""
    if d["kind"] == "checkpoint" or not d.get("notebook"):
        return f"{d['kind']}: {d['item']}"
    return f"{d['kind']}: {d['notebook']} / {d['item']}"


def full_pass(d: dict[str, Any]) -> bool:
    """Only a full pass counts: a result marked passed whose status is not a pass ("too slow": right
    but over its budget) is not one, nor one the grading service could not re-check (``graded_by``
    "learner-reported": a kernel check the learner's own kernel ran)."""
    return (bool(d["passed"]) and str(d.get("status") or "passed").startswith("passed")
            and d.get("graded_by") != LEARNER_REPORTED)


def summary(results: list[dict[str, Any]], exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Per exercise and fault: attempts, learners, passes, pass rate, wrong leaves, first wrong branches,
    answers that are not leaves, and how many were graded on a SHARED GPU; ``exclude`` (the
    instructors) are left out."""
    rows: dict[str, dict[str, Any]] = {}
    people: dict[str, dict[str, Any]] = {}
    for d in results:
        if d["learner"] in exclude:
            continue
        who = people.setdefault(d["learner"], {"attempts": 0, "items": {}})
        if d["kind"] == "joined":
            continue
        who["attempts"] += 1
        mine = who["items"].setdefault(_key(d), {"attempts": 0, "passed": False})
        mine["attempts"] += 1
        mine["passed"] = mine["passed"] or full_pass(d)
        if d.get("revealed"):
            mine["revealed"] = True
        r = rows.setdefault(_key(d), {"kind": d["kind"], "item": d["item"], "attempts": 0, "passed": 0,
                                      "revealed": 0, "learners": set(), "wrong_leaves": Counter(),
                                      "not_leaves": Counter(), "shared": 0, "first_wrong_branches": Counter()})
        if d.get("revealed"):  # a reveal is not an answer: counted apart, not as a try
            r["revealed"] += 1
            who["attempts"] -= 1
            mine["attempts"] -= 1
            r["learners"].add(d["learner"])
            continue
        r["attempts"] += 1
        r["passed"] += full_pass(d)
        if d.get("graded_by") == LEARNER_REPORTED:  # shown apart, never a server-graded pass
            r["learner_reported"] = r.get("learner_reported", 0) + 1
            r["learner_reported_passed"] = r.get("learner_reported_passed", 0) + str(d.get("status")).startswith("passed")
            mine["learner_reported"] = True
        r["shared"] += bool(d.get("gpu_shared"))
        r["learners"].add(d["learner"])
        if d.get("wrong_leaf") in flowchart.LEAVES:
            r["wrong_leaves"][d["wrong_leaf"]] += 1
        elif d.get("wrong_leaf") or d.get("not_a_leaf"):
            r["not_leaves"][str(d.get("not_a_leaf") or d.get("wrong_leaf"))] += 1
        if d["kind"] == "checkpoint":
            r.setdefault("leaves_picked", Counter())[str(d.get("leaf"))] += 1
            r.setdefault("metrics_cited", Counter())[str(d.get("metric"))] += 1
        fb = d.get("first_wrong_branch")
        if isinstance(fb, dict) and {"question", "taken"} <= fb.keys():
            r["first_wrong_branches"][f"{fb['question']}: answered {str(fb['taken']).upper()}"] += 1
    out = {}
    for k in sorted(rows):
        r = rows[k]
        passed_by = {n for n, w in people.items() if w["items"].get(k, {}).get("passed")}
        out[k] = {**r, "learners": len(r["learners"]),
                  "pass_rate_pct": 100.0 * r["passed"] / r["attempts"] if r["attempts"] else 0.0,
                  "learners_passed": len(passed_by),
                  "wrong_leaves": dict(r["wrong_leaves"].most_common()),
                  "not_leaves": dict(r["not_leaves"].most_common()),
                  "first_wrong_branches": dict(r["first_wrong_branches"].most_common())}
        for extra in ("leaves_picked", "metrics_cited"):
            if extra in r:
                out[k][extra] = dict(r[extra].most_common())
    return {"n_results": sum(d["kind"] != "joined" and d["learner"] not in exclude for d in results), "items": out,
            "per_learner": {n: people[n] for n in sorted(people)}}


def render(s: dict[str, Any]) -> str:
    """The summary as a table for the terminal."""
    lines = [f"{'exercise / fault / checkpoint':<44} {'tries':>5} {'pass %':>7} {'passed/people':>13} "
             f"{'revealed':>8} {'SHARED':>6}  wrong leaves; not leaves; first wrong branch"]
    for k, r in s["items"].items():
        wl = ", ".join(f"{leaf} x{n}" for leaf, n in r["wrong_leaves"].items()) or "-"
        fb = ", ".join(f"{b} x{n}" for b, n in r["first_wrong_branches"].items()) or "-"
        nl = ", ".join(f"{x!r} x{n}" for x, n in r.get("not_leaves", {}).items()) or "-"
        lines.append(f"{k[:44]:<44} {r['attempts']:>5} {r['pass_rate_pct']:>6.0f}% "
                     f"{str(r['learners_passed']) + '/' + str(r['learners']):>13} {r.get('revealed', 0):>8} "
                     f"{r.get('shared', 0):>6}  {wl}; {nl}; {fb}")
        if r.get("learner_reported"):
            lines.append(f"{'':<4}learner-reported (not re-checked by the service, never counted as passed): "
                         f"{r['learner_reported']} results, {r.get('learner_reported_passed', 0)} reported passed")
        if "leaves_picked" in r:
            lines.append(f"{'':<4}leaves picked: " + ", ".join(f"{leaf} x{n}" for leaf, n in r["leaves_picked"].items()))
            lines.append(f"{'':<4}evidence cited: " + ", ".join(f"{m} x{n}" for m, n in r["metrics_cited"].items()))
    for name, w in s.get("per_learner", {}).items():
        done = ", ".join(f"{k} ({'passed' if r['passed'] else 'not passed'}, {r['attempts']} tries"
                         + (", learner-reported" if r.get("learner_reported") else "")
                         + (", answer revealed)" if r.get("revealed") else ")")
                         for k, r in w["items"].items()) or "nothing graded yet"
        lines.append(f"learner {name}: {done}")
    lines.append(f"{s['n_results']} results from {len(s.get('per_learner', {}))} learners")
    return "\n".join(lines)


def plot(s: dict[str, Any], path: str | os.PathLike) -> Path:
    """Pass rate per exercise/fault (bars, attempts written on them) beside the wrong leaves taken."""
    import matplotlib  # deferred on purpose: only the --plot path needs it, and it is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = list(s["items"].items())
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 0.45 * max(4, len(items)) + 1.2))
    names = [k for k, _ in items]
    ax.barh(names, [r["pass_rate_pct"] for _, r in items], color="#4c72b0")
    for i, (_, r) in enumerate(items):
        ax.text(1, i, f"{r['passed']}/{r['attempts']}", va="center", color="white", fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel("pass rate (%)")
    ax.invert_yaxis()
    leaves = sorted({leaf for _, r in items for leaf in r["wrong_leaves"]})
    left = [0] * len(items)
    for leaf in leaves:
        vals = [r["wrong_leaves"].get(leaf, 0) for _, r in items]
        bx.barh(names, vals, left=left, label=f"wrong leaf {leaf}")
        left = [a + b for a, b in zip(left, vals)]
    for i, (_, r) in enumerate(items):  # the most common first wrong branch, where learners turned off
        if r["first_wrong_branches"]:
            branch, n = next(iter(r["first_wrong_branches"].items()))
            bx.text(0.05, i, f"first wrong branch: {branch} (x{n})", va="center", fontsize=8, color="white")
    bx.set_yticks([])
    bx.invert_yaxis()
    bx.set_xlabel("wrong submissions")
    bx.xaxis.get_major_locator().set_params(integer=True)
    if leaves:
        bx.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"class results: {s['n_results']} graded attempts", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
