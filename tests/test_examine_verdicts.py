"""Verdicts of `hwlab examine` that must hold on busy machines and odd data: an estimate is
labelled an estimate, rates above a measured ceiling are judged by working set against the
cache, wasted traffic answers F, the host-outside-ops part heads only when it is more than
profiler overhead, and progress goes to stderr."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwlab.core import ceilings
from hwlab.diagnosis.flowchart import diagnose
from hwlab.examine import METRIC_SOURCES, examine

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu_ceilings():
    return ceilings.measure("cpu", quick=True)


def test_an_estimated_sector_amplification_is_labelled_estimated_and_the_walk_never_says_all_measured():
    ev = {"slowdown_vs_floor": 3.0, "sector_amplification": 3.3, "launch_gap_pct": 1.0,
          "metric_sources": {k: METRIC_SOURCES[k] for k in ("slowdown_vs_floor", "sector_amplification",
                                                           "launch_gap_pct")}}
    d = diagnose(ev)
    f = next(s for s in d.steps if s.question == "F")
    assert f.metric == "sector_amplification" and f.answer == "yes" and f.estimated
    assert "[ESTIMATED" in str(f) and "[measured: estimated" not in str(f)
    assert d.to_dict()["steps"][1]["how"] == "estimated"
    assert "every answer on this walk was measured except the estimate at F" in d.explain()
    # counted by Nsight Compute, the same metric is measured
    ev["metric_sources"]["sector_amplification"] = "counted by Nsight Compute (sector_amplification)"
    assert not next(s for s in diagnose(ev).steps if s.question == "F").estimated


@pytest.mark.slow
def test_cli_examine_shows_its_phases_on_stderr_and_keeps_stdout_strict_json(tmp_path):
    from hwlab.cli.console import loads_strict
    from hwlab.examine import PHASES
    r = subprocess.run([sys.executable, "-m", "hwlab", "examine", "examples/unfused_chain.py:unfused_chain",
                        "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "HWLAB_CACHE": str(tmp_path)})
    assert r.returncode in (0, 1, 4), r.stderr[-2000:]
    d = loads_strict(r.stdout)  # stdout is the JSON document and nothing else
    assert d["name"] == "examples/unfused_chain.py:unfused_chain"
    progress = [x for x in r.stderr.splitlines() if x.startswith("hwlab examine: [")]
    assert any("import" in x for x in progress)
    for phase in PHASES:  # every phase, in order
        assert sum(phase in x for x in progress) == 1, (phase, progress)
    order = [next(i for i, x in enumerate(progress) if phase in x) for phase in PHASES]
    assert order == sorted(order)
    assert any("ceiling: copy" in x for x in progress)  # no cache here: the ceilings were measured
