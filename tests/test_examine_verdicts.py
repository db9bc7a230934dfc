"""Verdicts of `hwlab examine` that must hold on busy machines and odd data: an estimate is
labelled an estimate, rates above a measured ceiling are judged by working set against the
cache, wasted traffic answers F, the host-outside-ops part heads only when it is more than
profiler overhead, and progress goes to stderr."""
import json
import re
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
    """This CPU's quick ceilings, measured again (up to three times) while a band says the
    measurement was unstable (a busy host): the walks below need a ceiling that is this CPU's."""
    for _ in range(3):
        c = ceilings.measure("cpu", quick=True)
        if not ceilings.to_cache(c, None)[2]:
            break
    return c


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
    lines = [x for x in r.stderr.splitlines() if x.startswith("hwlab examine: [")]
    assert len({re.search(r"\[\d+/(\d+)\]", x).group(1) for x in lines}) == 1  # the step count fixed at the start
    progress = [x for x in lines if "] ... " not in x]  # steps; "... " lines are progress within a step
    assert any("import" in x for x in progress)
    for phase in PHASES:  # every phase, in order
        assert sum(phase in x for x in progress) == 1, (phase, progress)
    order = [next(i for i, x in enumerate(progress) if phase in x) for phase in PHASES]
    assert order == sorted(order)
    assert any("] ... ceiling: copy" in x for x in lines)  # no cache here: the ceilings were measured


# ------------------------------------------------------------- rates above a measured ceiling (item 2)
EXECUTED_08 = ROOT / "tests" / "data" / "h200_outputs" / "notebook08_unfused_chain_2026-12-04.txt"


def _executed_08_copy_ceiling_gbps() -> float:
    """The quick copy ceiling notebook 08's 2026-12-04 H200 run judged `unfused_chain` against, read
    from that run's own output (kept under tests/data/h200_outputs when its executed copy was replaced)."""
    import re
    text = EXECUTED_08.read_text()
    assert "hwlab examine: unfused_chain" in text
    return float(re.search(r"ceilings: measured on NVIDIA H200[^:]*: copy ([\d,.]+) GB/s", text).group(1).replace(",", ""))


def test_recorded_h200_unfused_chain_above_a_low_copy_ceiling_walks_to_g_by_its_working_set():
    """The recorded H200 `unfused_chain` part (examine_parts.json: its counts and time) against the
    quick copy ceiling of notebook 08's 2026-12-04 H200 run, which its achieved rate exceeds. Its working
    set (the fused floor bytes) is past 4x the H200's L2, so the ceiling is raised and the walk
    lands on G (it landed on J). The same part with a cache as large as its working set keeps the
    refusal: a cache-resident rate is not DRAM evidence."""
    from hwlab.core import evidence, specs
    from hwlab.examine.parts import rewalk
    from hwlab.examine.rates import CACHE_FACTOR
    rec = evidence.recorded("examine_parts")
    entry = next(e for e in rec.extra["entries"] if e["name"] == "chain_only") \
        if isinstance(rec.extra["entries"], list) else rec.extra["entries"]["chain_only"]
    d = next(p for p in entry["parts"]["parts"] if p["name"] == "elementwise/reduction")
    quick = _executed_08_copy_ceiling_gbps()
    l2 = int(specs.lookup(rec.machine["device"]).l2_mib * 2**20)
    achieved = d["moved_bytes"] / (d["t_ms"] * 1e6)
    assert achieved > quick and d["floor_bytes"] >= CACHE_FACTOR * l2  # the case of the issue
    p = rewalk(d, copy_gbps=quick, cache_bytes=l2, e2e_slowdown=entry["evidence"].get("e2e_slowdown"))
    assert p.leaf_id == "G" and p.walk.path[:2] == ["B", "F"], p.walk.explain()
    f = next(s for s in p.walk.steps if s.question == "F")
    assert f.answer == "yes" and not p.walk.invalid
    assert p.ceiling_gbps == pytest.approx(achieved) and "RAISED" in p.ceilings_raised[0]
    inside = rewalk(d, copy_gbps=quick, cache_bytes=d["floor_bytes"])
    assert not inside.ceilings_raised and "dram_pct_estimated" not in inside.evidence
    assert inside.leaf_id != "G"


@pytest.mark.slow
def test_a_gemm_above_a_low_gemm_ceiling_raises_it_and_walks_to_a_leaf(cpu_ceilings):
    """A GEMM ceiling cached low (a busy host): the GEMM's achieved rate is above it. FLOPs do not
    come from a cache, so the ceiling is raised to the achieved rate (said in the notes, the
    ceilings' label and the JSON) and the GEMM part's B is answered at the raised ceiling instead
    of "faster than its floor -> undecided" (what follows B is D, which a busy host may answer
    either way)."""
    low = ceilings.Ceilings.from_dict(cpu_ceilings.to_dict())
    low.gemm_tflops = {k: v / 20 for k, v in low.gemm_tflops.items()}
    ex = examine(lambda a, b: a @ b, make_inputs=lambda: (torch.randn(512, 512), torch.randn(512, 512)),
                 ceilings=low, max_total_s=1.0, name="gemm")
    g = next(p for p in ex.parts.parts if p.name == "gemm float32")
    assert g.walk is not None and g.walk.steps and g.walk.steps[0].question == "B", g.notes  # B answered
    assert "slowdown_vs_floor" in g.evidence and not any("faster than its floor" in n for n in g.notes)
    d = ex.to_dict()
    assert g.pct_of_floor == pytest.approx(100.0, rel=0.05)  # at the raised ceiling (the whole's, or its own)
    assert d["counts"]["ceilings_raised"] and "RAISED" in d["ceilings"]["label"] and "RAISED" in ex.report()
    assert ex.diagnosis.steps[0].metric == "slowdown_vs_floor" and ex.diagnosis.steps[0].value == pytest.approx(
        1.0, rel=1e-6)


# ------------------------------------------------------------- wasted traffic: tests/test_examine_repeats.py
# (the per-op cache bound, on both sides of it, and the 12-op chain past a 32 MiB cache)


# ------------------------------------------------------------- the host-outside-ops headline (item 13)
@pytest.mark.slow
def test_shuffled_gather_example_heads_g_not_the_profilers_host_time(cpu_ceilings):
    """`examples/shuffled_gather.py` on a CPU: the whole function walks to G; the time outside ops
    under the profiler is mostly the profiler's own, so it never heads (host_headline_refusal)."""
    from hwlab.examine.target import load
    fn, mod = load(str(ROOT / "examples" / "shuffled_gather.py") + ":shuffled_gather")
    ex = examine(fn, make_inputs=mod.inputs, ceilings=cpu_ceilings, max_total_s=1.0)
    host = next(p for p in ex.parts.parts if p.name == "host outside ops")
    assert host.not_headline  # by either half of the rule: inside its spread, or the whole walk is not J
    assert ex.headline is None or ex.headline.name != "host outside ops"
    if ex.diagnosis.leaf_id == "G":  # as on an idle CPU (a busy one can measure its ceilings low)
        assert ex.leaf_id == "G", [(p.name, p.share_pct, p.leaf_id, p.not_headline) for p in ex.parts.parts]


def test_host_outside_ops_heads_only_beyond_its_spread_and_with_a_whole_walk_on_j():
    from hwlab.examine.parts import host_headline_refusal
    assert host_headline_refusal(0.2, [0.1, 0.5, 0.3], "J") is not None       # inside its spread
    assert host_headline_refusal(2.0, [1.9, 2.1, 2.0], "G") is not None       # the whole walk says G
    assert host_headline_refusal(2.0, [1.9, 2.1, 2.0], "J") is None


def test_recorded_h200_model_gemm_above_its_gemm_ceiling_is_walked_not_undecided():
    """The recorded H200 model's bf16 GEMM part (examine_parts.json) ran above the bf16 GEMM ceiling
    of the same record: recorded "faster than its floor -> undecided at B". FLOPs do not come from a
    cache, so the ceiling is raised to the achieved rate and the walk decides B at 1x its floor."""
    from hwlab.core import evidence, specs
    from hwlab.examine.parts import rewalk
    rec = evidence.recorded("examine_parts")
    entries = rec.extra["entries"]
    entry = entries["model"] if isinstance(entries, dict) else next(e for e in entries if e["name"] == "model")
    d = next(p for p in entry["parts"]["parts"] if p["name"] == "gemm bfloat16")
    bf16 = rec.ceilings["gemm_tflops"]["bf16"]
    assert d["tflops"] > bf16 and d["leaf"] is None  # the recorded case: above the ceiling, undecided
    l2 = int(specs.lookup(rec.machine["device"]).l2_mib * 2**20)
    p = rewalk(d, copy_gbps=rec.ceilings["copy_gbps"], gemm_tflops=bf16, cache_bytes=l2,
               e2e_slowdown=entry["evidence"].get("e2e_slowdown"))
    assert p.ceiling_tflops == pytest.approx(d["tflops"]) and "RAISED" in p.ceilings_raised[-1]
    b = p.walk.steps[0]
    assert b.question == "B" and b.value == pytest.approx(1.0) and p.leaf_id is not None, p.walk.explain()
