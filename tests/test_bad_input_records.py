"""A mutation sweep over the kit's own recorded records and the ceilings cache: every field set to
null, the wrong type, NaN, infinity, a huge integer or an empty container, then read by every
command that reads such a record. Each run must end in a clean refusal (exit 2, one line on
stderr) or a result; never an internal error (exit 3), a traceback or an exception out of
``main``. In-process through ``hwlab.cli.main`` (a parser built once: building it is most of a
run's time), so the sweep stays fast; the fast lane sweeps every field of the baseline and doctor
records, the slow lane every key path (list indices deduplicated) of every recorded kind.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from hwlab import cli
from hwlab.core import evidence

REC = evidence.RECORDED_DIR
BASE = REC / "h200" / "baseline.json"

#: the values every field is set to, in turn (a huge integer within the parser's digit limit)
MUTATIONS = {"null": None, "text": "80", "negative": -1, "fraction": 1.5, "nan": float("nan"),
             "inf": float("inf"), "huge int": 10**300, "empty list": [], "empty object": {}, "true": True}


def field_paths(obj, pre=()):
    """Every JSON path in ``obj`` (a list's first item stands for its items)."""
    if pre:
        yield pre
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from field_paths(v, pre + (k,))
    elif isinstance(obj, list) and obj:
        yield from field_paths(obj[0], pre + (0,))


def mutated(d, path, value):
    out = copy.deepcopy(d)
    cur = out
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return out


@pytest.fixture
def run(monkeypatch, tmp_path):
    """``run(argv) -> (rc, stderr)`` through ``cli.main``; any exception out of main is a failure."""
    monkeypatch.setattr(cli, "build_parser", functools.lru_cache(maxsize=1)(cli.build_parser))
    monkeypatch.setenv("HWLAB_RESCUE_DIR", str(tmp_path / "rescue"))
    monkeypatch.chdir(tmp_path)

    def go(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(argv)
            except SystemExit as e:
                rc = e.code
        return rc, err.getvalue()
    return go


def _commands(kind: str, f: str, out: Path, slow: bool) -> list[list[str]]:
    b = str(BASE)
    cmds = [["evidence", "show", f]]
    if kind == "baseline":
        cmds += [["baseline", "compare", b, f]] + ([["baseline", "compare", f, b]] if slow else [])
    if kind in ("baseline", "doctor") and slow:  # writes a record per run (fsync): the slow lane
        cmds.append(["incident", "--title", "t", "--scope", "single-card", "--symptom", "s", "--fix", "f",
                     "--reverify", "r", "--evidence", f, "--out", str(out)])
    if slow and kind in ("baseline", "doctor"):  # --json prints the record back: the body as recorded
        cmds.append(["evidence", "show", f, "--json"])
        if kind == "baseline":
            cmds.append(["baseline", "compare", b, f, b])  # the fleet table
    return cmds


#: the fast lane's mutations: one of each kind of wrong (the slow lane runs them all)
FAST = ("null", "text", "nan", "huge int", "empty list", "empty object")


def sweep(record: Path, run, tmp_path: Path, slow: bool) -> tuple[int, list[str]]:
    d = json.loads(record.read_text())
    f = tmp_path / "mutated.json"
    failures, n = [], 0
    for path in field_paths(d):
        for name, value in MUTATIONS.items():
            if not slow and name not in FAST:
                continue
            f.write_text(json.dumps(mutated(d, path, value)))
            for argv in _commands(d["kind"], str(f), tmp_path / "inc", slow):
                rc, err = run(argv)
                n += 1
                if rc not in (0, 1, 2, 4) or "Traceback" in err or "internal error" in err:
                    failures.append(f"{'.'.join(map(str, path))} = {name}: hwlab {' '.join(argv[:2])} -> "
                                    f"{rc}: {err.strip()[-200:]}")
                elif rc == 2 and len(err.strip().splitlines()) > 1:  # none: "not comparable" on stdout
                    failures.append(f"{'.'.join(map(str, path))} = {name}: hwlab {' '.join(argv[:2])} refused "
                                    f"in {len(err.strip().splitlines())} lines, not one")
    return n, failures


@pytest.mark.parametrize("name", ["h200/baseline.json", "h200/doctor.json"])
def test_every_field_of_baseline_and_doctor_records_gives_a_clean_answer(name, run, tmp_path):
    n, failures = sweep(REC / name, run, tmp_path, slow=False)
    assert n > 500  # the sweep reached the record's fields
    assert not failures, f"{len(failures)} of {n} runs failed:\n" + "\n".join(failures[:30])


# ---------------------------------------------------------------- the slow lane: every distinct field path
def key_path(path: tuple) -> tuple:
    """A field's path with its list indices dropped: ``results[3].params`` and ``results[0].params``
    are one key path; the sweep mutates one field per key path."""
    return tuple("[]" if isinstance(k, int) else k for k in path)


def _key_paths(obj, pre: tuple):
    yield pre
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _key_paths(v, pre + (k,))
    elif isinstance(obj, list):
        for v in obj:
            yield from _key_paths(v, pre + ("[]",))


def shrunk(obj, pre: tuple = (), seen: set | None = None):
    """``obj`` with each list cut to the items that hold a key path no earlier item holds (the first
    item always kept): every key path of the record is still in it, each list pattern once, so a
    lab's thousands of same-shaped rows cost one."""
    seen = set() if seen is None else seen
    seen.add(pre)
    if isinstance(obj, dict):
        return {k: shrunk(v, pre + (k,), seen) for k, v in obj.items()}
    if isinstance(obj, list):
        out = []
        for v in obj:
            if not out or set(_key_paths(v, pre + ("[]",))) - seen:
                out.append(shrunk(v, pre + ("[]",), seen))
        return out
    return obj


def concrete_paths(obj, pre: tuple = ()):
    if pre:
        yield pre
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from concrete_paths(v, pre + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from concrete_paths(v, pre + (i,))


def _wrong_type(v):
    if isinstance(v, dict):
        return ["x"]
    if isinstance(v, list):
        return {"x": 1}
    return 80 if isinstance(v, str) else "80"


#: the slow lane's classes of wrong: each field set to each (the value chosen from the field's own type)
CLASSES = {"null": lambda v: None, "wrong type": _wrong_type, "nan": lambda v: float("nan"),
           "inf": lambda v: float("inf"), "huge int": lambda v: 10**300,
           "empty container": lambda v: {} if isinstance(v, dict) else []}
_SLOT = "@@hwlab-sweep-slot@@"


def every_key_path_by_kind() -> dict[str, list[tuple[str, dict, list[tuple]]]]:
    """kind -> [(record name, the record shrunk, the paths to mutate in it)]: each key path of each
    kind once, in the first record of that kind that holds it."""
    out: dict[str, list] = {}
    covered: dict[str, set] = {}
    for p in sorted(REC.glob("*/*.json")):
        d = shrunk(json.loads(p.read_text()))
        cov = covered.setdefault(d["kind"], set())
        todo = {}
        for c in concrete_paths(d):
            if key_path(c) not in cov and key_path(c) not in todo:
                todo[key_path(c)] = c
        cov.update(todo)
        if todo:
            out.setdefault(d["kind"], []).append((f"{p.parent.name}/{p.name}", d, list(todo.values())))
    return out


def _readers(kind: str, f: str, out: str) -> list[list[str]]:
    """Every command that reads a record of ``kind``, past the one validation on read."""
    b = str(BASE)
    cmds = [["evidence", "show", f, "--json"], ["evidence", "list"],
            ["incident", "--title", "t", "--scope", "single-card", "--symptom", "s", "--fix", "f",
             "--reverify", "r", "--evidence", f, "--out", out]]
    if kind == "baseline":
        cmds += [["baseline", "compare", b, f], ["baseline", "compare", f, b], ["baseline", "compare", b, f, b]]
    return cmds


def _every_reader(kind: str, path: tuple) -> bool:
    """Whether an accepted mutation of ``path`` goes through every reader, not ``evidence show``
    alone: every field of a baseline or a doctor record (what comparisons and incidents read) and
    every field within two keys of the top of any record (machine, ceilings, snapshot, results[],
    extra.*). A lab's deeper body is only shown, as recorded, by every reader alike; running each
    reader over each of its thousands of fields would take the sweep past five minutes."""
    return kind in ("baseline", "doctor") or len(path) <= 2


def _judge(rc, err, where: str, argv: list[str]) -> str | None:
    if rc not in (0, 1, 2, 4) or "Traceback" in err or "internal error" in err:
        return f"{where}: hwlab {' '.join(argv[:2])} -> {rc}: {err.strip()[-200:]}"
    if rc == 2 and len(err.strip().splitlines()) > 1:
        return f"{where}: hwlab {' '.join(argv[:2])} refused in {len(err.strip().splitlines())} lines, not one"
    return None


@pytest.mark.slow
def test_every_key_path_of_every_recorded_kind_gives_a_clean_answer(run, tmp_path, monkeypatch):
    """Every key path of every record kind (list indices deduplicated, :func:`shrunk`), set to each of
    :data:`CLASSES`, read by every command that reads such a record. ``evidence show`` reads every
    mutation; one it refuses was refused by the one validation on read (:func:`hwlab.core.evidence.load`,
    which every reader calls first, so each would refuse it in the same words); one it accepts is read
    by every other reader too (:func:`_readers`; for the fields :func:`_every_reader` names): ``--json``, ``evidence list`` over a recorded folder
    holding it, an incident citing it and, for a baseline, both sides of a comparison and the fleet
    table. The unmutated shrunk record must give a clean answer first, so the sweep starts from a
    record the commands accept."""
    import os

    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    folder = work / "recorded" / "h200"
    folder.mkdir(parents=True)
    monkeypatch.setattr(evidence, "RECORDED_DIR", work / "recorded")
    failures, n_runs, n_mutations = [], 0, 0
    try:
        for kind, records in every_key_path_by_kind().items():
            f = folder / f"{kind}.json"
            for name, d, paths in records:
                f.write_text(json.dumps(d))
                rc, err = run(["evidence", "show", str(f)])
                assert rc == 0, f"{name} shrunk is refused: {err}"
                for path in paths:
                    cur = d
                    for k in path[:-1]:
                        cur = cur[k]
                    orig = cur[path[-1]]
                    cur[path[-1]] = _SLOT
                    text = json.dumps(d)
                    cur[path[-1]] = orig
                    for cls, make in CLASSES.items():
                        f.write_text(text.replace(json.dumps(_SLOT), json.dumps(make(orig)), 1))
                        n_mutations += 1
                        where = f"{name} {'.'.join(map(str, path))} = {cls}"
                        rc, err = run(["evidence", "show", str(f)])
                        n_runs += 1
                        bad = _judge(rc, err, where, ["evidence", "show"])
                        if bad or rc != 0 or not _every_reader(kind, path):
                            failures += [bad] if bad else []
                            continue
                        for argv in _readers(kind, str(f), str(work / "inc")):
                            rc, err = run(argv)
                            n_runs += 1
                            bad = _judge(rc, err, where, argv)
                            failures += [bad] if bad else []
    finally:
        if work != tmp_path:
            shutil.rmtree(work, ignore_errors=True)
    print(f"record sweep: {n_mutations} mutations, {n_runs} runs, {len(failures)} failures")
    assert n_mutations > 30_000  # every key path of every kind (6,583 at this writing) x 6 classes
    assert not failures, f"{len(failures)} of {n_runs} runs failed:\n" + "\n".join(failures[:30])


def test_the_sweep_sees_a_wrong_type_as_a_refusal(run, tmp_path):
    """The sweep's refusals are real: a mapping where a list belongs is refused, naming the field."""
    d = json.loads(BASE.read_text())
    f = tmp_path / "m.json"
    f.write_text(json.dumps(mutated(d, ("results", 0, "params"), [])))
    rc, err = run(["baseline", "compare", str(BASE), str(f)])
    assert rc == 2 and "results[0].params" in err and "should be an object" in err
    f.write_text(json.dumps(mutated(d, ("extra", "runtime_path", "hit_rate_pct"), "80")))
    rc, err = run(["baseline", "compare", str(BASE), str(f)])
    assert rc == 2 and "hit_rate_pct" in err


# ---------------------------------------------------------------- the ceilings cache
CACHE = {"device": "cpu", "copy_gbps": 12.5, "gemm_tflops": {"fp32": 0.4}, "host_link_gbps": None,
         "measured_at": "2026-01-01T00:00:00+00:00", "source": "measured", "host": "h",
         "bands": {"copy": {"t_ms": 1.0, "t_p10_ms": 0.9, "t_p90_ms": 1.1, "n_rep": 20, "timer": "perf_counter",
                            "params": {"size_mib": 64}}},
         "n_threads": None}


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    from hwlab.core import ceilings

    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(ceilings, "machine_key", lambda device=None: "test")
    return tmp_path / "ceilings-test.json"


def test_every_field_of_the_ceilings_cache_is_checked_like_a_record(cache_file):
    """The cache gets the record's checks: each mutation is refused (InputError naming the cache and
    the remedy) or loads as ceilings every reader can use (label, ridge point, datasheet check)."""
    from hwlab.core import ceilings
    from hwlab.core.measure import InputError

    failures, refused = [], 0
    for path in field_paths(CACHE):
        for name, value in MUTATIONS.items():
            cache_file.write_text(json.dumps(mutated(CACHE, path, value)))
            try:
                c = ceilings.load_cached()
                if c is not None:
                    (c.label, c.ridge_point("fp32"), ceilings.datasheet_check(c), f"{c.copy_gbps:,.0f}")
            except InputError as e:
                refused += 1
                assert "delete the file or run `hwlab doctor --remeasure`" in str(e)
            except Exception as e:  # noqa: BLE001 - the point: anything else is a bug
                failures.append(f"{'.'.join(map(str, path))} = {name}: {type(e).__name__}: {e}")
    assert refused > 50
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("field,value", [("copy_gbps", 1e30), ("gemm_tflops", {"fp32": 1e30}),
                                         ("host_link_gbps", 1e30), ("copy_gbps", 10**300)])
def test_a_cache_past_any_machine_is_refused_not_shown(cache_file, field, value):
    from hwlab.core import ceilings
    from hwlab.core.measure import InputError

    cache_file.write_text(json.dumps({**CACHE, field: value}))
    with pytest.raises(InputError, match="corrupt"):
        ceilings.load_cached()
