"""Evidence schema versions: an old record is brought up to date once, on load, by a named
migration; the files the kit ships are in the current version.

``data/evidence_v1_lab04_fp8_h200.json`` is a real version-1 record: Lab 4 as recorded on the
H200 and committed in 27b2d9f (``src/hwlab/recorded/h200/lab04_fp8.json`` at that commit),
copied here unchanged. Its profiles counted every marked quant/dequant range twice (the host
range and its mirror on the GPU timeline).
"""
import copy
import json
from pathlib import Path

import pytest

from hwlab.core import evidence as E

V1_LAB04 = Path(__file__).parent / "data" / "evidence_v1_lab04_fp8_h200.json"


def _profiles(d):
    return {p: v["profile"] for p, v in d["extra"]["run"]["paths"].items()}


def test_the_fixture_is_a_real_version_1_record_with_doubled_counts():
    raw = json.loads(V1_LAB04.read_text())
    assert raw["schema_version"] == 1 and raw["machine"]["is_gpu"]
    prof = _profiles(raw)
    assert not any("ranges_counted_on" in r for r in prof.values())
    # one weight dequant feeds one fallback GEMM (counted from the model, not the profiler):
    # the profiler's range count was twice that
    for r in prof.values():
        assert r["dequant_ranges"] == 2 * r["fallback_gemms"]
    assert prof["fp8_dequant"]["fallback_gemms"] > 0


def test_loading_a_version_1_record_counts_each_range_once():
    raw = json.loads(V1_LAB04.read_text())
    ev = E.load(V1_LAB04)
    prof = _profiles({"extra": ev.extra})
    for p, r in prof.items():
        assert r["ranges_counted_on"] == "host timeline"
        assert r["dequant_ranges"] == r["fallback_gemms"], p
        # decode_profile's step has 2 rows: per token = (requant + dequant ranges) / 2
        assert r["dequant_requant_per_token"] == (r["quant_ranges"] + r["dequant_ranges"]) / 2, p
        old = _profiles(raw)[p]
        assert r["dequant_requant_per_token"] == old["dequant_requant_per_token"] / 2
    assert prof["mixed"]["quant_ranges"] == prof["mixed"]["fp8_hits"]  # one requant per FP8 GEMM
    assert [m.to_dict() for m in ev.results] == raw["results"]


def _without_range_counts(d):
    """``d`` with the fields the migration may change taken out of every profile."""
    d = copy.deepcopy(d)
    d.pop("schema_version")
    for r in _profiles(d).values():
        for k in ("quant_ranges", "dequant_ranges", "dequant_requant_per_token", "ranges_counted_on"):
            r.pop(k, None)
    return d


def test_migration_is_named_pure_and_runs_once():
    raw = json.loads(V1_LAB04.read_text())
    keep = copy.deepcopy(raw)
    v2 = E.migrate_v1_to_v2(raw)
    assert raw == keep  # the input is left as it was
    assert _without_range_counts(v2) == _without_range_counts(raw)  # nothing else moved
    assert v2["schema_version"] == 2 == E.SCHEMA_VERSION
    assert E.migrate(v2) is v2  # a current record is not touched again (no second halving)
    assert E.migrate(raw) == v2


def test_a_cpu_version_1_profile_keeps_its_counts():
    """A CPU profile has no device timeline to mirror ranges onto: nothing was doubled."""
    raw = json.loads(V1_LAB04.read_text())
    raw["machine"]["is_gpu"] = False
    v2 = E.migrate_v1_to_v2(raw)
    for p, r in _profiles(v2).items():
        assert r["dequant_ranges"] == _profiles(raw)[p]["dequant_ranges"]
        assert r["ranges_counted_on"] == "host timeline"


def test_a_record_the_migration_does_not_fit_is_refused(tmp_path):
    raw = json.loads(V1_LAB04.read_text())
    raw["extra"]["run"]["paths"]["mixed"]["profile"]["dequant_ranges"] = 3  # not a doubled count
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(E.EvidenceError, match="cannot bring schema version 1 up to date.*odd"):
        E.load(p)
    raw["schema_version"] = E.SCHEMA_VERSION + 1
    p.write_text(json.dumps(raw))
    with pytest.raises(E.EvidenceError, match="Upgrade hwlab"):
        E.load(p)


def test_a_saved_record_is_in_the_current_version(tmp_path):
    p = E.Evidence(kind="x", machine={"device": "CPU"}).save(tmp_path / "r.json")
    assert json.loads(p.read_text())["schema_version"] == E.SCHEMA_VERSION


def test_the_kits_recorded_files_are_in_the_current_version():
    """The files shipped under recorded/ are stored in the current version (scripts/
    migrate_evidence.py rewrites older ones), so what a reader opens is what the kit loads."""
    files = sorted(E.RECORDED_DIR.glob("*/*.json"))
    assert files
    old = [f"{f.parent.name}/{f.name}" for f in files
           if json.loads(f.read_text()).get("schema_version") != E.SCHEMA_VERSION]
    assert not old, f"run scripts/migrate_evidence.py on: {', '.join(old)}"


@pytest.mark.slow
def test_the_migration_script_rewrites_old_records_and_leaves_current_ones(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    old = tmp_path / "old.json"
    shutil.copy(V1_LAB04, old)
    current = E.Evidence(kind="x", machine={"device": "CPU"}).save(tmp_path / "current.json")
    (tmp_path / "not_evidence.json").write_text('{"schema": "something else"}')
    before = current.read_bytes()
    script = [sys.executable, str(root / "scripts" / "migrate_evidence.py")]
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    check = subprocess.run([*script, "--check", str(tmp_path)], capture_output=True, text=True, env=env)
    assert check.returncode == 1 and "old.json: schema version 1" in check.stdout
    assert "current.json" not in check.stdout and "not_evidence" not in check.stdout
    r = subprocess.run([*script, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(old.read_text()) == E.migrate(json.loads(V1_LAB04.read_text()))
    assert current.read_bytes() == before  # a current record is left byte-identical
    assert subprocess.run([*script, "--check", str(tmp_path)], env=env, capture_output=True).returncode == 0
