import json
import os

import pytest

from hwlab import evidence as E
from hwlab.measure import Measurement
from hwlab.store import RecordExistsError, write_json_atomic


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
