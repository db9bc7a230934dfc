"""CLI details a newcomer meets (#35): every name `evidence list` prints can be shown, with its
body; `hwlab flowchart` prints the chart from hwlab.diagnosis.flowchart's own data; `drill new --force`
exists and a drill's label follows its file's `live` flag. In-process through ``hwlab.cli.main``."""
import json

import pytest

from hwlab import cli
from hwlab.course import drills
from hwlab.core import evidence
from hwlab.diagnosis import flowchart as F
from hwlab.cli.console import loads_strict


def _run(argv, capsys):
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_listed_record_can_be_shown_with_its_body(capsys):
    rc, out, _ = _run(["evidence", "list", "--json"], capsys)
    rows = loads_strict(out)
    assert rc == 0 and rows
    for row in rows:
        rc, text, err = _run(["evidence", "show", row["record"]], capsys)
        assert rc == 0, (row, err)
        ev = evidence.load(evidence.RECORDED_DIR / f"{row['record']}.json")
        lines = text.splitlines()
        assert lines[0].startswith(f"{ev.kind}: RECORDED")
        # the body: each result's line and each top-level part of the record's extra
        for m in ev.results:
            assert any(ln.strip().startswith(m.name) for ln in lines), (row, m.name)
        for key in ev.extra:
            assert any(ln.startswith(f"  {key}:") for ln in lines), (row, key)
        assert len(lines) > 2 + len(ev.results)


def test_a_name_with_a_folder_that_is_not_recorded_is_one_line(capsys):
    rc, out, err = _run(["evidence", "show", "h200/no_such_record"], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_flowchart_json_is_the_modules_chart(capsys):
    rc, out, _ = _run(["flowchart", "--json"], capsys)
    chart = loads_strict(out)
    assert rc == 0 and chart["start"] == F.START
    qs = {q["id"]: q for q in chart["questions"]}
    assert set(qs) == set(F.QUESTIONS) and chart["questions"][0]["id"] == F.START
    for qid, q in F.QUESTIONS.items():
        got = qs[qid]
        assert (got["question"], got["yes"], got["no"]) == (q.text, q.yes, q.no)
        assert [(c["metric"], c["op"], c["threshold"], c["why"]) for c in got["answer_yes_if_any"]] == \
            [(c.metric, c.op, c.threshold, c.reason) for c in q.criteria]
        assert [c["metric"] for c in got["no_first_if_any"]] == [c.metric for c in q.overrides_no]
    leaves = {lf["id"]: lf for lf in chart["leaves"]}
    assert set(leaves) == set(F.LEAVES)
    for lid, leaf in F.LEAVES.items():
        assert leaves[lid]["actions"] == list(leaf.actions)
    # every branch ends at a question or a leaf, and every leaf is reachable from the start
    targets = {t for q in qs.values() for t in (q["yes"], q["no"])}
    assert targets <= set(qs) | set(leaves) and set(leaves) <= targets


def test_flowchart_text_shows_every_rule_and_action(capsys):
    rc, out, _ = _run(["flowchart"], capsys)
    assert rc == 0
    for q in F.QUESTIONS.values():
        assert q.text in out
        for c in q.criteria + q.overrides_no:
            assert c.describe() in out and c.reason in out
    for leaf in F.LEAVES.values():
        assert all(a in out for a in leaf.actions)


def _recorded_fault():
    for fault in sorted(drills.FAULTS):
        try:
            return fault, drills.new(seed=11, fault=fault, live=False)
        except evidence.EvidenceError:
            continue
    pytest.skip("no drill fault has a recorded run in this tree")


def test_drill_new_twice_then_force(tmp_path, monkeypatch, capsys):
    fault, _ = _recorded_fault()
    monkeypatch.chdir(tmp_path)
    argv = ["drill", "new", "--seed", "11", "--fault", fault, "--dir", "d", "--json"]
    rc, out, _ = _run(argv, capsys)
    made = json.loads(out)
    assert rc == 0 and made["live"] is False
    p = tmp_path / made["file"]
    p.write_text(p.read_text().replace('"seed": 11', '"seed": 11 '))  # marks this copy
    before = p.read_bytes()
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == "" and "--force" in err and len(err.strip().splitlines()) == 1
    assert p.read_bytes() == before
    rc, out, err = _run(argv + ["--force"], capsys)
    assert rc == 0 and p.read_bytes() != before
    assert drills.Drill.load(p).seed == 11


def test_a_drill_that_is_not_live_is_never_labelled_measured_live(tmp_path, monkeypatch, capsys):
    fault, d = _recorded_fault()
    assert d.live is False and "measured live" not in d.label
    monkeypatch.chdir(tmp_path)
    rc, out, _ = _run(["drill", "new", "--seed", "11", "--fault", fault, "--dir", "d"], capsys)
    assert rc == 0 and "measured live" not in out
    # a drill file written before the label rule: its source still says "measured live"
    old = drills.Drill(**{**{k: getattr(d, k) for k in ("drill_id", "seed", "salt", "sealed",
                                                       "workload", "observations")},
                          "source": "measured live on NVIDIA H200, GPU", "live": False})
    assert old.label.startswith("recorded on NVIDIA H200") and "measured live" not in old.label
    live = drills.Drill(**{**old.__dict__, "live": True})
    assert live.label == "measured live on NVIDIA H200, GPU"
