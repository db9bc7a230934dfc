"""Lab 3 on CPUs: the mapping chooser on real captures, the TP block over real gloo process
groups, straggler detection, and a real rate-limited link in a network namespace."""
import os
import shutil
import subprocess
from itertools import combinations
from pathlib import Path

import pytest

from hwlab import mapping as M
from hwlab import topology as T
from hwlab.evidence import recorded
from hwlab.flowchart import diagnose
from hwlab.labs import crosslink as C

CAPTURES = Path(T.__file__).parent / "recorded" / "topology"


def cap(name):
    return T.parse_topo_matrix((CAPTURES / name).read_text())


MULTI = ["dgx1_v100_hybrid_cube_mesh.txt", "h100x8_nvswitch_4socket.txt", "b300x8_nvswitch_8nic.txt",
         "rtx4090x8_pcie_2socket.txt", "pcie4_2socket_pix_sys.txt"]


@pytest.mark.parametrize("name", MULTI)
@pytest.mark.parametrize("tp", [2, 4])
def test_chooser_reaches_the_best_possible_slowest_link(name, tp):
    t = cap(name)
    groups = M.choose_tp_groups(t, tp)
    assert sorted(g for grp in groups for g in grp) == sorted(t.gpus)
    best = min((t.slowest_link(c) for c in combinations(t.gpus, tp)), key=T.link_rank)
    worst = M.evaluate(t, groups).worst
    assert T.link_rank(worst) == T.link_rank(best)
    # never across SYS when a group inside one socket or NVLink island exists
    if T.link_rank(best) < T.link_rank("SYS"):
        assert all(t.slowest_link(g) != "SYS" for g in groups)


def test_chooser_fixes_a_reordered_mapping():
    t = cap("pcie4_2socket_pix_sys.txt")
    naive = M.naive_groups(t, 2, order=[0, 2, 1, 3])  # ordinals reordered after a swap
    bad, good = M.evaluate(t, naive), M.evaluate(t, M.choose_tp_groups(t, 2))
    assert bad.worst == "SYS" and len(bad.crossings) == 2
    assert good.worst == "PIX" and good.crossings == []
    assert good.step_us < bad.step_us
    dgx = cap("dgx1_v100_hybrid_cube_mesh.txt")
    assert M.evaluate(dgx, M.choose_tp_groups(dgx, 2)).slowest == ["NV2"] * 4
    assert "NV1" in M.evaluate(dgx, M.naive_groups(dgx, 2)).slowest


def test_numa_breaks_ties_when_every_link_is_sys():
    t = cap("rtx4090x8_pcie_2socket.txt")
    for g in M.choose_tp_groups(t, 4):
        assert len({t.numa_affinity[x] for x in g}) == 1


def test_cost_model_and_nccl_tests_definitions():
    assert M.allreduce_us(1 << 20, 1, "SYS") == 0.0
    s, n = 64 << 20, 4
    t = M.allreduce_us(s, n, "NV4")
    gbps, lat = M.LINK_MODEL["NV"]
    assert t == pytest.approx(2 * 3 / 4 * s / (gbps * 4 * 1e3) + 6 * lat)
    algbw, busbw = M.algbw_busbw(s, n, t)
    assert busbw == pytest.approx(algbw * 1.5)
    assert M.allreduce_us(s, n, "SYS") > M.allreduce_us(s, n, "PIX") > M.allreduce_us(s, n, "NV12")
    with pytest.raises(ValueError, match="cannot be split"):
        M.choose_tp_groups(cap("pcie4_2socket_pix_sys.txt"), 3)
    with pytest.raises(ValueError, match="distinct GPUs"):
        M.evaluate(cap("pcie4_2socket_pix_sys.txt"), [[0, 0], [1, 2]])


def test_straggler_report_on_synthetic_ranks():
    def rank(r, own_tp):
        return {"rank": r, "compute_ms": [5.0] * 5, "tp_allreduce_ms": [own_tp] * 5,
                "dp_sync_ms": [1.0] * 5, "step_ms": [30.0] * 5}
    rep = C.straggler_report([rank(0, 2.0), rank(1, 2.2), rank(2, 20.0), rank(3, 21.0)])
    assert rep.tail_ranks == [2, 3] and rep.tail_pct > 100
    assert diagnose({"single_gpu_slow": False, "e2e_slowdown": 2.0, "rank_tail_pct": rep.tail_pct}).leaf_id == "L"
    calm = C.straggler_report([rank(0, 2.0), rank(1, 2.2), rank(2, 2.1), rank(3, 2.3)])
    assert calm.tail_ranks == [] and calm.tail_pct < 10


def test_parse_groups():
    assert C.parse_groups("0,1;2,3") == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="cover ranks"):
        C.parse_groups("0,1;1,2")


def test_tp_block_over_real_gloo_groups_is_correct():
    res = C.launch(4, [[0, 1], [2, 3]], steps=3, hidden=128, ffn=256, batch=32)
    assert [r["rank"] for r in res] == [0, 1, 2, 3]
    for r in res:
        assert r["rel_err"] < 1e-5 and len(r["step_ms"]) == 3 and r["group"] in ([0, 1], [2, 3])


def test_gloo_collectives_busbw():
    out = C.collectives(2, sizes=(1 << 16, 1 << 20))
    rows = {(r["op"], r["bytes"]): r for r in out["rows"]}
    ar = rows[("all_reduce", 1 << 20)]
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * 1 / 2)
    assert ar["algbw_gbps"] == pytest.approx((1 << 20) / (ar["t_ms"] * 1e-3) / 1e9)
    assert ("all_to_all", 1 << 20) in rows


def test_nccl_routes_and_gpu_probes_say_what_they_need():
    log = ("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
           "h:1:1 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct\n"
           "h:1:1 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via SHM/direct/direct\n")
    assert C.nccl_routes(log) == {"P2P/CUMEM": 1, "SHM": 2}
    assert C.FORCE_SLOW_ROUTE == {"NCCL_P2P_DISABLE": "1"}
    import torch
    if torch.cuda.device_count() < 2:
        assert "needs >= 2 GPUs" in C.p2p_matrix_gbps()["skipped"]
        assert "needs >= 2 GPUs" in C.collectives(2, nccl=True)["skipped"]
        with pytest.raises(RuntimeError, match="needs >= 2 GPUs"):
            C.launch(2, [[0, 1]], nccl=True)


def test_single_gpu_staged_step_is_correct_on_this_machine():
    d = C.single_gpu_tp_step(hidden=128, ffn=512, batch=32, n_rep=3)
    s = C.single_gpu_tp_step(hidden=128, ffn=512, batch=32, n_rep=3, staged=True)
    assert d.rel_err <= d.tol and s.rel_err <= s.tol
    assert s.n_bytes == 2 * d.n_bytes  # staged: each partial crosses the host link twice


NETNS_OK = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")


@pytest.mark.netns
@pytest.mark.skipif(not NETNS_OK, reason="needs root and iproute2 (ip, tc) to build a rate-limited veth")
def test_real_slow_link_straggler_and_aware_mapping():
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out = C.slowlink_experiment(steps=10)
    naive, aware = out["naive"], out["aware"]
    # the straggler is found: exactly the ranks of the groups that straddle the slow link
    crossing = sorted(r for g in naive["groups"] if len({r in C.SLOW_RANKS for r in g}) > 1 for r in g)
    assert naive["report"]["tail_ranks"] == crossing
    assert diagnose(naive["flowchart_evidence"]).leaf_id == "L"
    # the aware mapping (from the chooser) keeps TP traffic off the slow link and wins
    assert aware["mapping"]["worst"] != "SYS"
    assert aware["report"]["step_ms"] * 1.5 < naive["report"]["step_ms"]
    # on a 2-core CI box six ranks share the CPU, and one can lag for that reason alone, so
    # the fixed run's own tail is compared with the naive one rather than required to be zero
    # (the recorded run, test_recorded_cpu_slowlink_evidence, checks the fixed leaf)
    assert aware["report"]["tail_pct"] < naive["report"]["tail_pct"] / 2
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before, "the test's namespace was not removed"


def test_recorded_cpu_slowlink_evidence():
    ev = recorded("lab03_slowlink", "cpu")
    exp = ev.extra["experiment"]
    assert exp["naive"]["report"]["step_ms"] > 1.5 * exp["aware"]["report"]["step_ms"]
    assert diagnose(exp["naive"]["flowchart_evidence"]).leaf_id == "L"
    assert diagnose(exp["aware"]["flowchart_evidence"]).leaf_id == "OK"
