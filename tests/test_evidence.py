import json
import os

import pytest

from hwlab.core import evidence as E
from hwlab.core.measure import Measurement
from hwlab.core.store import RecordExistsError, write_json_atomic


def _m(name="copy"):
    return Measurement(name=name, t_ms=1.0, t_p10_ms=0.9, t_p90_ms=1.2, n_bytes=10**9,
                       n_flops=0, device="CPU", timer="cpu-perf-counter", n_rep=5)


def test_round_trip(tmp_path):
    ev = E.Evidence(kind="probe", machine={"device": "CPU (x86_64)", "is_gpu": False},
                    results=[_m()], ceilings={"copy_gbps": 10.0}, extra={"k": [1, 2]})
    p = ev.save(tmp_path / "r.json")
    back = E.load(p)
    assert back.results == ev.results and back.extra == {"k": [1, 2]}
    assert back.label == f"recorded on CPU (x86_64), {ev.recorded_at[:10]}"
    assert back.result("copy").gbps == pytest.approx(1000.0)
    with pytest.raises(KeyError, match="has: copy"):
        back.result("gemm")


def test_never_overwrites_silently(tmp_path):
    p = tmp_path / "r.json"
    E.Evidence(kind="a", machine={"device": "x"}).save(p)
    before = p.read_text()
    with pytest.raises(RecordExistsError, match="left untouched"):
        E.Evidence(kind="b", machine={"device": "x"}).save(p)
    assert p.read_text() == before
    E.Evidence(kind="b", machine={"device": "x"}).save(p, overwrite=True)
    assert E.load(p).kind == "b"
    assert [f.name for f in tmp_path.iterdir()] == ["r.json"]  # no temp files left


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    p = tmp_path / "r.json"
    write_json_atomic(p, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(p, {"a": object()}, overwrite=True)
    assert json.loads(p.read_text()) == {"a": 1}
    assert len(os.listdir(tmp_path)) == 1


@pytest.mark.parametrize("content,match", [
    ('{"schema": "hwlab.evidence", "schema_version": 1, "kind": "x", "mach', "not valid JSON"),
    ('{"hello": 1}', "not an hwlab evidence record"),
    ('{"schema": "hwlab.evidence", "schema_version": 99}', "schema version 99"),
    ('{"schema": "hwlab.evidence", "schema_version": 1, "kind": "x"}', "lacks the field 'machine'"),
    ('{"schema": "hwlab.evidence", "schema_version": 1, "kind": "x", "machine": {}, '
     '"recorded_at": "2026", "results": [{"name": "a"}]}', "a result is malformed"),
])
def test_corrupt_files_give_clear_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(E.EvidenceError, match=match):
        E.load(p)


def test_missing_recorded_kind():
    with pytest.raises(E.EvidenceError, match="have: "):
        E.recorded("no_such_lab")


def test_every_recorded_file_loads_and_is_labelled():
    files = sorted(E.RECORDED_DIR.glob("*/*.json"))
    assert files
    for f in files:
        ev = E.load(f)
        if f.parent.name == "h200":
            assert ev.label.startswith("recorded on NVIDIA H200, 2026-") and ev.is_gpu
        else:
            assert f.parent.name == "cpu" and ev.label.startswith("recorded on CPU") and not ev.is_gpu


def _strict(text):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_records_are_strict_json(tmp_path):
    """A probe that moves no bytes has an unbounded FLOP/byte: written as null, not Infinity."""
    m = Measurement(name="launch_overhead", t_ms=1.0, t_p10_ms=0.9, t_p90_ms=1.2, n_bytes=0,
                    n_flops=0, device="CPU", timer="cpu-perf-counter", n_rep=5)
    p = E.Evidence(kind="probe", machine={"device": "CPU"}, results=[m]).save(tmp_path / "r.json")
    d = _strict(p.read_text())
    assert d["results"][0]["derived"]["arithmetic_intensity"] is None
    assert E.load(p).results[0] == m


def test_every_recorded_file_is_strict_json():
    for f in sorted(E.RECORDED_DIR.glob("*/*.json")):
        _strict(f.read_text())


@pytest.mark.parametrize("content,match", [
    ("", "is empty"),
    (b"\x00\xff\xfe binary", "not text"),
    ('{"schema": "hwlab.evidence", "schema_version": 1, "kind": "x", "machine": [], "results": [], '
     '"recorded_at": "2026"}', "should be a dict"),
])
def test_empty_binary_and_wrong_shape_give_clear_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(E.EvidenceError, match=match):
        E.load(p)
    with pytest.raises(E.EvidenceError, match="is a folder"):
        E.load(tmp_path)


def test_destination_checks(tmp_path):
    from hwlab.core.store import DestinationError, check_destination, check_folder

    (tmp_path / "f.json").write_text("x")
    with pytest.raises(DestinationError, match="already exists"):
        check_destination(tmp_path / "f.json")
    assert check_destination(tmp_path / "f.json", overwrite=True)
    with pytest.raises(DestinationError, match="is a folder"):
        check_destination(tmp_path)
    with pytest.raises(DestinationError, match="is a file, not a folder"):
        check_destination(tmp_path / "f.json" / "x.json")
    assert check_destination(tmp_path / "new" / "deeper" / "x.json")
    assert (tmp_path / "new" / "deeper").is_dir()  # the parent is created
    assert not (tmp_path / "new" / "deeper" / "x.json").exists()
    assert sorted(x.name for x in (tmp_path / "new" / "deeper").iterdir()) == []  # probe file removed
    with pytest.raises(DestinationError, match="cannot"):
        check_folder("/sys" if os.geteuid() == 0 else "/proc/1")


def test_rescue_never_overwrites(tmp_path, monkeypatch):
    from hwlab.core.store import rescue_json

    monkeypatch.setenv("HWLAB_RESCUE_DIR", str(tmp_path))
    a, b = rescue_json({"a": 1}, "doctor"), rescue_json({"a": 2}, "doctor")
    assert a != b and json.loads(a.read_text()) == {"a": 1} and json.loads(b.read_text()) == {"a": 2}


# ---------------------------------------------------------------- what `evidence show` prints
def _show(capsys, *args):
    from hwlab.cli import main

    rc = main(["evidence", "show", *args])
    return rc, capsys.readouterr().out.splitlines()


def test_launch_overhead_shows_the_per_launch_figure_with_its_unit(capsys):
    """The probe times n_launches together; the headline is one launch's cost in us (the batch's
    ms beside it, named as the batch), not the batch time read as if it were one launch."""
    m = E.recorded("doctor").result("launch_overhead")
    us, n = m.params["us_per_launch"], m.params["n_launches"]
    rc, lines = _show(capsys, "doctor")
    line = next(x for x in lines if x.strip().startswith("launch_overhead"))
    assert rc == 0 and line.strip().startswith(f"launch_overhead: {us:.3g} us per launch"), line
    lo, hi = m.t_p10_ms * 1e3 / n, m.t_p90_ms * 1e3 / n
    assert f"p10-p90 {lo:.3g}-{hi:.3g} us" in line and f"{n:,} launches timed together" in line
    assert f"{m.t_ms:.4g} ms per batch" in line


@pytest.mark.parametrize("kind", ["lab01_bandwidth", "lab04_fp8", "doctor"])
def test_ceilings_line_names_only_the_ceilings_the_record_holds(capsys, kind):
    c = E.recorded(kind).ceilings
    rc, lines = _show(capsys, kind)
    line = next(x for x in lines if x.strip().startswith("ceilings:"))
    assert rc == 0 and f"copy {c['copy_gbps']:,.0f} GB/s" in line
    assert not line.rstrip().endswith(("GEMM", ";", ",")), line
    if c.get("gemm_tflops"):
        assert all(f"{k} {v:,.1f} TFLOP/s" in line for k, v in c["gemm_tflops"].items())
    else:
        assert "GEMM" not in line
    if c.get("source"):
        assert c["source"] in line


@pytest.mark.slow
def test_the_examples_are_found_through_the_package_from_any_folder(tmp_path):
    """Notebook 08's examples (issue 49, item 1): read from the package, whatever the current folder holds;
    the checkout's examples/ is a link to the same files."""
    import subprocess
    import sys
    from pathlib import Path

    import hwlab

    code = ("from hwlab.core import evidence; from hwlab.examine.target import load; "
            "p = evidence.example('unfused_chain.py'); fn, mod = load(f'{p}:unfused_chain'); "
            "print(p, fn.__name__, callable(mod.inputs))")
    env = {**os.environ, "PYTHONPATH": str(Path(hwlab.__file__).parents[1])}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    where, name, has_inputs = r.stdout.split()
    assert Path(where).parent == Path(hwlab.__file__).parent / "examples" and name == "unfused_chain"
    assert has_inputs == "True"
    root = Path(__file__).resolve().parents[1]
    assert (root / "examples").resolve() == E.EXAMPLES_DIR.resolve()
    with pytest.raises(E.EvidenceError, match="no example 'nope.py' in the package"):
        E.example("nope.py")
