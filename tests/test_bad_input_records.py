"""A mutation sweep over the kit's own recorded records and the ceilings cache: every field set to
null, the wrong type, NaN, infinity, a huge integer or an empty container, then read by every
command that reads such a record. Each run must end in a clean refusal (exit 2, one line on
stderr) or a result; never an internal error (exit 3), a traceback or an exception out of
``main``. In-process through ``hwlab.cli.main`` (a parser built once: building it is most of a
run's time), so the sweep stays fast; the fast lane sweeps the baseline and doctor records, the
slow lane every record kind and the fleet table.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
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


#: a record's fields beyond this many are sampled evenly (a lab's body holds thousands of rows of the
#: same shape; the fields every reader reads sit near the top and are all swept)
MAX_PATHS = 150


#: a record larger than this (bytes) is swept with the fast lane's mutations and fewer paths: each
#: run parses, copies and writes it whole
BIG_RECORD_BYTES = 100_000


def chosen_paths(d, max_paths: int = MAX_PATHS) -> list[tuple]:
    """Every path of depth <= 3 (up to ``max_paths``), then an even sample of the deeper ones."""
    paths = list(field_paths(d))
    top = [p for p in paths if len(p) <= 3][:max_paths]
    deep = [p for p in paths if len(p) > 3]
    room = max(max_paths - len(top), 0)
    return top + (deep[:: max(len(deep) // room, 1)][:room] if room else [])


def sweep(record: Path, run, tmp_path: Path, slow: bool) -> tuple[int, list[str]]:
    d = json.loads(record.read_text())
    f = tmp_path / "mutated.json"
    failures, n = [], 0
    big = record.stat().st_size > BIG_RECORD_BYTES
    paths = (field_paths(d) if d["kind"] in ("baseline", "doctor") else
             chosen_paths(d, MAX_PATHS // 3 if big else MAX_PATHS))
    for path in paths:
        for name, value in MUTATIONS.items():
            if (not slow or big) and name not in FAST:
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


def _one_per_kind() -> list[str]:
    seen, out = set(), []
    for p in sorted(REC.glob("*/*.json")):
        kind = json.loads(p.read_text()).get("kind")
        if kind not in seen:
            seen.add(kind)
            out.append(f"{p.parent.name}/{p.name}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", _one_per_kind())
def test_every_field_of_every_recorded_kind_gives_a_clean_answer(name, run, tmp_path):
    n, failures = sweep(REC / name, run, tmp_path, slow=True)
    assert not failures, f"{len(failures)} of {n} runs failed:\n" + "\n".join(failures[:30])


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
