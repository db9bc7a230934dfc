"""The device-side scripts keep what finished when a part or a notebook fails: a lent device call
is short (600 s, 8 files back), so one failure must not cost the parts after it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_refresh_keep_going_runs_the_parts_after_a_failure(tmp_path, monkeypatch, capsys):
    mod = _load("refresh_gpu_evidence")
    ran = []

    def bad(out, summary):
        ran.append("bad")
        raise RuntimeError("this part broke")

    def good(out, summary):
        ran.append("good")
        (out / "good.json").write_text("{}")
        summary.append("good part summary")

    monkeypatch.setattr(mod, "PARTS", {"bad": bad, "good": good})
    assert mod.main(["--out", str(tmp_path), "--only", "bad,good", "--cpu-check", "--keep-going"]) == 1
    assert ran == ["bad", "good"] and (tmp_path / "good.json").exists()
    out, err = capsys.readouterr()
    assert "== bad FAILED" in out and "this part broke" in out and "good part summary" in out
    assert "failed parts: bad" in err
    ran.clear()  # without --keep-going the first failure stops the run, as before
    try:
        mod.main(["--out", str(tmp_path), "--only", "bad,good", "--cpu-check"])
    except RuntimeError as e:
        assert "this part broke" in str(e)
    else:
        raise AssertionError("a failing part must stop a run without --keep-going")
    assert ran == ["bad"]


def test_execute_notebooks_selects_by_folder_and_name(tmp_path, monkeypatch):
    pytest.importorskip("nbclient", reason="nbclient missing: pip install -e '.[dev,lab]'")
    mod = _load("execute_notebooks")
    seen = []

    def fake_execute(nb, *, cwd, **kw):  # records which notebooks would run; real execution is tested elsewhere
        seen.append(str(cwd))
        if len(seen) == 1:
            raise TimeoutError("a cell ran past its limit")

    monkeypatch.setattr(mod, "execute_notebook", fake_execute)
    rc = mod.main(["--out", str(tmp_path), "--only", "notebooks/07,exercises/ex01"])
    import json
    summary = json.loads((tmp_path / "notebooks_summary.json").read_text())
    assert [s["notebook"] for s in summary] == ["notebooks/07_drills.ipynb", "exercises/ex01_bandwidth_bound.ipynb"]
    assert rc == 1 and summary[0]["error"].startswith("TimeoutError") and summary[1]["ok"]
