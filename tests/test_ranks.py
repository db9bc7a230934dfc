"""``hwlab ranks`` on real torchrun runs of examples/straggler_torchrun.py (4 CPU ranks over gloo,
one injected slow rank), with and without the startup capture; the report's rules on their own."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hwlab.diagnosis import ranks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "straggler_torchrun.py"
PCIE = ROOT / "src" / "hwlab" / "recorded" / "topology" / "pcie4_2socket_pix_sys.txt"
BIN = Path(sys.executable).parent


def _torchrun(run_dir, *args, n=4):
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n), str(EXAMPLE),
           "--run-dir", str(run_dir), "--steps", "24", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _ranks_cli(*args):
    r = subprocess.run([str(BIN / "hwlab"), "ranks", *map(str, args)], capture_output=True, text=True, timeout=120)
    return r


@pytest.fixture(scope="module")
def crosslink_run(tmp_path_factory):
    """Slow rank 2, TP groups {0,2} {1,3} on the recorded 2-socket PCIe box: both cross SYS."""
    d = tmp_path_factory.mktemp("run") / "crosslink"
    r = _torchrun(d, "--slow-rank", "2", "--spike-every", "4", "--topo-file", str(PCIE), "--tp-groups", "0,2;1,3",
                  "--infer-groups")  # the capture reads the TP groups from the process groups
    return d, r


@pytest.mark.slow
def test_names_exactly_the_slow_rank_and_walks_to_the_mapping_leaf(crosslink_run):
    d, run = crosslink_run
    assert "crosses SYS" in run.stderr  # the capture warned at startup
    r = _ranks_cli(d, "--json")
    assert r.returncode == 1, r.stderr  # a finding
    rep = json.loads(r.stdout)
    assert rep["n_ranks"] == 4 and rep["tail_ranks"] == [2] and rep["basis"] == "compute"
    fc = rep["flowchart"]
    assert fc["path"] == ["B", "D", "K", "L"] and fc["leaf"] == "L" and fc["unmeasured"] == {}
    assert set(fc["evidence"]) >= {"slowdown_vs_floor", "e2e_slowdown", "rank_tail_pct", "n_ranks"}
    assert "every answer on this walk was measured" in fc["explain"]
    p = rep["placement"]["2"]
    assert p["gpu"] == "GPU2" and p["numa_node"] == 1 and p["tp_group"] == [0, 2]
    assert p["tp_group_slowest_link"] == "SYS" and "PIX" in p["mapping_warnings"][0]
    assert len(rep["mapping_warnings"]) == 2
    assert rep["spikes"]["local"]["2"]["period"] == 4  # the injected spike every 4th step
    inc = rep["incident_draft"]["record"]
    assert inc["diagnosis_path"] == ["B", "D", "K", "L"] and "2->" in inc["rank_mapping"]
    assert "injected" in json.dumps(rep["capture"]["topology"])
    caps = [json.loads(p.read_text()) for p in sorted(d.glob("*/rank-*.json"))]
    assert [c["tp_group"] for c in caps] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert {c["tp_group_source"] for c in caps} == {"inferred from process groups"}
    mapping = json.loads((d / "mapping.json").read_text())
    assert [r["device"]["gpu"] for r in mapping["ranks"]] == ["GPU0", "GPU1", "GPU2", "GPU3"]


@pytest.mark.slow
def test_text_report_and_saved_incident(crosslink_run, tmp_path):
    d, _ = crosslink_run
    r = _ranks_cli(d, "--save-incident", tmp_path / "inc")
    assert r.returncode == 1
    assert "TAIL: ranks [2]" in r.stdout and "MAPPING:" in r.stdout and "=> L:" in r.stdout
    saved = sorted((tmp_path / "inc").glob("incident-*.md"))
    assert len(saved) == 1 and "rank tail" in saved[0].read_text()


@pytest.mark.slow
def test_without_the_capture_says_so_and_does_not_guess_b(tmp_path):
    d = tmp_path / "nocap"
    _torchrun(d, "--slow-rank", "1", "--no-capture")
    r = _ranks_cli(d, "--json")
    rep = json.loads(r.stdout)
    assert rep["tail_ranks"] == [1] and r.returncode == 1
    assert rep["capture"]["present"] is False and rep["placement"]["1"].startswith("capture missing")
    fc = rep["flowchart"]
    assert fc["leaf"] is None and fc["path"] == ["B"] and "capture missing" in fc["unmeasured"]["B"]
    text = _ranks_cli(d).stdout
    assert "capture MISSING" in text and "B not measured" in text


@pytest.mark.slow
def test_bad_run_dir_is_a_usage_error(tmp_path):
    assert _ranks_cli(tmp_path / "nope").returncode == 2
    (tmp_path / "empty").mkdir()
    r = _ranks_cli(tmp_path / "empty")
    assert r.returncode == 2 and "no step logs" in r.stderr and "Traceback" not in r.stderr


def test_tail_split_rule():
    assert ranks.tail_split({0: 10.0, 1: 10.5, 2: 30.0, 3: 9.8}) == ([2], pytest.approx(100 * (30 - 10) / 10))
    tail, pct = ranks.tail_split({0: 10.0, 1: 11.0, 2: 11.5, 3: 10.2})  # jitter: no 1.25x jump
    assert tail == [] and 0 < pct < 25
    assert ranks.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5  # interpolating, as measure.Timing


RECORDED_NCCL = ROOT / "src" / "hwlab" / "recorded" / "runs" / "straggler_nccl_h200"


@pytest.mark.skipif(not RECORDED_NCCL.is_dir(), reason="the NCCL run on the H200 is not recorded yet "
                    "(tools/record_straggler_nccl.sh; see docs/RUNBOOK.md)")
def test_recorded_nccl_run_on_gpus():
    """The same example over NCCL on the lent H200s: GPU ordinals from NVML, CUDA-event clock."""
    rep = ranks.report(RECORDED_NCCL)
    n = rep["n_ranks"]
    assert all(s["clock"] == "CUDA events" for s in rep["per_rank"].values())
    assert all(p["device"]["gpu_source"].startswith("PCI bus id") for p in
               (json.loads(x.read_text()) for x in RECORDED_NCCL.glob("*/rank-*.json")))
    if n > 1:
        assert rep["tail_ranks"] == [n - 1] and rep["flowchart"]["leaf"] == "L"
        assert any(v["routes"] for v in rep["nccl_routes"].values())  # NCCL's chosen transports parsed


NCCL_LINES = """vm:1234:1300 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
vm:1234:1300 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
vm:1234:1300 [1] NCCL INFO Channel 00/0 : 1[1] -> 3[3] via SHM/direct/direct
vm:1234:1300 [1] NCCL INFO Connected all rings
"""


@pytest.mark.slow
def test_nccl_route_lines_are_attributed_to_their_rank(crosslink_run, tmp_path):
    import shutil
    d = tmp_path / "run"
    shutil.copytree(crosslink_run[0], d)
    cap = json.loads(next(d.glob("*/rank-00001.json")).read_text())
    (d / cap["host"] / f"nccl.{cap['pid']}.log").write_text(NCCL_LINES)  # where capture(nccl_log=True) sends it
    extra = tmp_path / "elsewhere.log"
    extra.write_text(NCCL_LINES)
    rep = json.loads(_ranks_cli(d, "--json", "--nccl-log", extra).stdout)
    routes = {Path(k).name: v for k, v in rep["nccl_routes"].items()}
    assert routes[f"nccl.{cap['pid']}.log"] == {"rank": 1, "routes": {"P2P/CUMEM": 2, "SHM": 1}}
    assert routes["elsewhere.log"]["rank"] is None and routes["elsewhere.log"]["routes"]["SHM"] == 1
    assert _ranks_cli(d, "--nccl-log", tmp_path / "missing.log").returncode == 2


def test_a_partners_coinciding_jitter_leaves_a_ranks_spikes_local():
    """The global/local split on its own: a step is global only where most ranks spike. One other
    rank's jitter at the slow rank's spike steps (a busy 2-core host) keeps them local; three of
    four ranks at one step make it global."""
    own = [3, 7, 11, 15, 19, 23]
    stats = {0: {"spike_steps": [5], "spike_period": None},
             1: {"spike_steps": [5, 11, 15, 19, 23], "spike_period": None},  # jitter at rank 2's steps
             2: {"spike_steps": own, "spike_period": 4},
             3: {"spike_steps": [5], "spike_period": None}}
    sp = ranks._spike_summary(stats)
    assert sp["global_steps"] == [5]
    assert sp["local"]["2"] == {"steps": own, "period": 4}
    two = ranks._spike_summary({0: {"spike_steps": [1, 2], "spike_period": None},
                                1: {"spike_steps": [2, 6], "spike_period": None}})
    assert two["global_steps"] == [2]  # with two ranks, both


@pytest.mark.slow
def test_a_healthy_run_has_no_tail_and_no_spikes(tmp_path):
    """The same job without --slow-rank: every rank does the same work, so the report names no
    tail rank and no spike pattern (a busy host's odd preempted step is a rank's own tail, and
    preemptions every rank sees are the host's), exit 0. Steps of tens of ms (--size 512), long
    against the host's scheduler slice as a real job's steps are."""
    d = tmp_path / "healthy"
    _torchrun(d, "--size", "512")
    r = _ranks_cli(d, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    rep = json.loads(r.stdout)
    assert rep["n_ranks"] == 4 and rep["tail_ranks"] == [] and rep["mapping_warnings"] == []
    assert rep["spikes"]["global_steps"] == [] and rep["spikes"]["local"] == {}
    text = _ranks_cli(d)
    assert text.returncode == 0 and "no tail, no spikes" in text.stdout


def test_a_ranks_own_tail_is_no_spike_pattern():
    """The spike rule on its own: two uneven excursions in 21 steps are the
    series' own tail; the same height every fourth step is a pattern; so are three evenly spaced."""
    from hwlab.core import tails

    base = [1.8 + 0.05 * (i % 3) for i in range(21)]
    own = list(base)
    own[9], own[16] = 6.6, 4.7  # preempted twice, unevenly
    s = tails.spikes(own)
    assert s["at"] == [9, 16] and not s["recurring"]
    every4 = [6.0 if i % 4 == 0 else v for i, v in enumerate(base)]
    s = tails.spikes(every4)
    assert s["recurring"] and s["periodic"] and s["period_steps"] == 4
    some = list(base)
    for i in (1, 2, 9, 17):
        some[i] = 6.0  # four uneven ones in 21 steps: under a quarter, the series' own tail
    assert not tails.spikes(some)["recurring"]
    for i in (5, 12):
        some[i] = 6.0  # six in 21 steps, still uneven: over a quarter, a pattern
    s = tails.spikes(some)
    assert not s["periodic"] and s["recurring"]


def test_excursions_every_rank_shows_are_the_hosts_not_a_ranks_spikes():
    """Four ranks on a busy host, each preempted by about one scheduler slice at its own steps:
    no rank's spikes stand out, so none are reported; the same with one rank whose spikes rise
    ten times higher (an injected pause) reports that rank only."""
    def st(steps, excess):
        return {"spike_steps": steps, "spike_period": None, "spike_candidates": steps,
                "spike_excess_ms": [excess] * len(steps), "n_steps": 21}
    host = {0: st([4, 7, 8, 18, 20, 21], 8.0), 1: st([5, 6, 8, 9, 13, 15], 8.2),
            2: st([15, 17, 18, 19, 21, 22], 7.5), 3: st([4, 10, 11, 14, 16, 19], 8.1)}
    assert ranks._spike_summary(host)["local"] == {}
    host[2] = st([3, 7, 11, 15, 19, 23], 80.0)
    assert list(ranks._spike_summary(host)["local"]) == ["2"]


@pytest.mark.slow
def test_two_rank_straggler_walks_to_the_rank_tail(tmp_path):
    """Two gloo ranks under torchrun, rank 0 slowed: B must not take the straggler's own stall as the
    device's (a median over two ranks includes it), and the tail is a percent of the median step,
    as K's rule reads (the on-time rank's own time is small: a ratio to it runs into thousands)."""
    for attempt in range(2):
        d = tmp_path / f"two{attempt}"
        _torchrun(d, "--slow-rank", "0", n=2)
        r = _ranks_cli(d, "--json")
        rep = json.loads(r.stdout)
        assert r.returncode == 1 and rep["tail_ranks"] == [0], r.stdout[-2000:]
        on_time = rep["per_rank"]["1"].get("slowdown_vs_floor") or 0.0
        # the on-time rank runs at 1.1-1.3x its probe floor here; its startup probe and its steps are
        # measured at different moments of a shared 2-core host, and once in a clean-clone CI run it
        # read over B's 1.5x line. One fresh run is taken then, never more, and only from just over the
        # line: a B that counted the straggler's own stall (over 10x) fails at once
        if not (1.5 <= on_time < 2.0):
            break
    fc = rep["flowchart"]
    assert fc["path"] == ["B", "D", "K", "L"] and fc["leaf"] == "L"
    pr = rep["per_rank"]
    step = rep["median_step_ms"]
    want = 100 * (pr["0"][f"{rep['basis']}_ms"] - pr["1"][f"{rep['basis']}_ms"]) / step
    assert rep["rank_tail_pct"] == pytest.approx(want) and 10 <= rep["rank_tail_pct"] <= 100
    assert fc["evidence"]["slowdown_vs_floor"] == pytest.approx(pr["1"]["slowdown_vs_floor"])  # the on-time rank


def test_tail_pct_is_a_percent_of_the_median_step():
    from hwlab.core import tails
    own = {0: 41.7, 1: 1.6}  # the slow rank's own time; the other spends the step waiting for it
    tail, pct = tails.tail_split(own)
    assert tail == [0] and pct > 2000  # the split's own ratio: over the on-time rank's small own time
    assert tails.tail_pct_of_step(own, tail, 46.0) == pytest.approx(100 * (41.7 - 1.6) / 46.0)
    assert tails.tail_pct_of_step({0: 10.0, 1: 10.5, 2: 10.2}, [], 12.0) == pytest.approx(100 * 0.3 / 12.0)
