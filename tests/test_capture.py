"""hwlab.core.capture: the mapping warning on recorded topology captures, a real capture written and
refused twice, rank variables from torchrun and SLURM, the NCCL log location, and hwlab.core.steplog."""
import json
import os
from pathlib import Path

import pytest

from hwlab.core import capture, steplog, topology
from hwlab.errors import UserInputError

REC = Path(capture.__file__).parents[1] / "recorded" / "topology"


def _topo(name):
    return topology.parse_topo_matrix((REC / name).read_text(), source=name)


def _ranks(groups, gpus, host="n0"):
    return [{"rank": r, "host": host, "device": {"gpu": gpus[r]}, "tp_group": next(g for g in groups if r in g)}
            for r in range(len(gpus))]


def test_warns_when_tp_group_crosses_sys_on_recorded_pcie_box():
    t = _topo("pcie4_2socket_pix_sys.txt")
    gpus = [f"GPU{i}" for i in range(4)]
    bad = capture.mapping_findings(_ranks([[0, 2], [1, 3]], gpus), {"n0": t})
    assert len(bad) == 2
    assert all("crosses SYS" in w and "slowest link is PIX" in w for w in bad)
    assert "[['GPU0', 'GPU1'], ['GPU2', 'GPU3']]" in bad[0]  # the chooser's regrouping
    assert capture.mapping_findings(_ranks([[0, 1], [2, 3]], gpus), {"n0": t}) == []


def test_same_groups_but_ordinals_swapped_is_the_seeds_fault():
    """Ranks 0,1 grouped (looks right) but the GPU ordinals behind them sit on two sockets."""
    t = _topo("pcie4_2socket_pix_sys.txt")
    gpus = ["GPU0", "GPU2", "GPU1", "GPU3"]
    w = capture.mapping_findings(_ranks([[0, 1], [2, 3]], gpus), {"n0": t})
    assert len(w) == 2 and "ranks [0, 1]" in w[0] and "(GPU0, GPU2)" in w[0]


def test_no_warning_where_every_link_is_the_same_and_on_dgx1_best_partition():
    h100 = _topo("h100x8_nvswitch_4socket.txt")
    gpus = [f"GPU{i}" for i in range(8)]
    assert capture.mapping_findings(_ranks([[0, 7], [1, 6], [2, 5], [3, 4]], gpus), {"n0": h100}) == []
    dgx = _topo("dgx1_v100_hybrid_cube_mesh.txt")
    # TP=4 inside each NVLink quad: fine; across the quads some pairs are SYS: warned
    assert capture.mapping_findings(_ranks([[0, 1, 2, 3], [4, 5, 6, 7]], gpus), {"n0": dgx}) == []
    w = capture.mapping_findings(_ranks([[0, 1, 2, 5], [3, 4, 6, 7]], gpus), {"n0": dgx})
    assert len(w) == 2 and all("crosses SYS" in x for x in w)


def test_group_spanning_nodes_and_missing_records():
    t = _topo("pcie4_2socket_pix_sys.txt")
    recs = _ranks([[0, 1]], ["GPU0", "GPU1"])
    recs[1]["host"] = "n1"
    w = capture.mapping_findings(recs, {"n0": t, "n1": t})
    assert len(w) == 1 and "spans nodes" in w[0]
    assert capture.mapping_findings(recs[:1], {"n0": t}) == []  # rank 1's record missing: no guess


def test_rank_env_torchrun_and_slurm():
    e = capture.rank_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "2,3",
                          "NCCL_DEBUG": "INFO", "HOME": "/x"})
    assert (e["rank"], e["local_rank"], e["world_size"]) == (5, 1, 8)
    assert e["env"] == {"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1", "NCCL_DEBUG": "INFO",
                        "RANK": "5", "WORLD_SIZE": "8"}
    s = capture.rank_env({"SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NTASKS": "4", "SLURM_NODEID": "0"})
    assert (s["rank"], s["local_rank"], s["world_size"], s["node_rank"]) == (3, 3, 4, 0)


def test_cpu_lists_and_numa_binding():
    assert capture.cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert capture.parse_cpu_list("0-11,24-35") == set(range(12)) | set(range(24, 36))
    assert capture.numa_binding({0, 1}, "0-11").startswith("bound within")
    assert capture.numa_binding({0, 20}, "0-11").startswith("not bound")
    assert capture.numa_binding({20}, "0-11").startswith("bound to CPUs off")
    assert capture.numa_binding({0}, None).startswith("unknown")


@pytest.fixture
def one_rank(monkeypatch):
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS"):
        monkeypatch.setenv(k, "x")  # recorded first, so the undo removes what capture() sets
        monkeypatch.delenv(k)


def test_real_capture_writes_files_and_refuses_a_second_run(tmp_path, one_rank):
    rec = capture.capture(tmp_path, tp_groups=[[0]], topo_file=REC / "pcie4_2socket_pix_sys.txt", quiet=True)
    host = rec["host"]
    assert (tmp_path / host / "rank-00000.json").exists() and (tmp_path / host / "node.json").exists()
    assert (tmp_path / host / "topo.txt").read_text() == (REC / "pcie4_2socket_pix_sys.txt").read_text()
    on_disk = json.loads((tmp_path / host / "rank-00000.json").read_text())
    assert on_disk["cpu_affinity"] == capture.cpu_list(os.sched_getaffinity(0))
    assert on_disk["topology_source"].startswith("injected from")
    assert on_disk["versions"]["python"] and on_disk["probe"] is None
    import torch
    if not torch.cuda.is_available():
        assert on_disk["device"]["gpu"] == "GPU0" and "assumed from LOCAL_RANK" in on_disk["device"]["gpu_source"]
        assert on_disk["device"]["numa_node"] == 0  # from the injected topology's NUMA column
    assert "NCCL_DEBUG=INFO" in on_disk["nccl"]["route_lines"]  # says how to turn the log on
    with pytest.raises(UserInputError, match="already exists"):
        capture.capture(tmp_path, quiet=True)
    ranks, nodes, problems = capture.load_run(tmp_path)
    assert [r["rank"] for r in ranks] == [0] and host in nodes and problems == []


def test_no_topology_is_stated_not_guessed(tmp_path, one_rank, monkeypatch):
    monkeypatch.setattr(capture.topology, "capture_topo_text", lambda: None)
    monkeypatch.setattr(capture.topology, "from_nvml", lambda: None)
    rec = capture.capture(tmp_path, quiet=True)
    assert rec["topology_source"].startswith("absent")
    node = json.loads((tmp_path / rec["host"] / "node.json").read_text())
    assert node["topology"] is None and not (tmp_path / rec["host"] / "topo.txt").exists()


def test_nccl_log_goes_into_the_run_dir(tmp_path, one_rank):
    rec = capture.capture(tmp_path, nccl_log=True, quiet=True, topo_file=REC / "h200x1_vm.txt")
    assert os.environ["NCCL_DEBUG"] == "INFO"
    assert os.environ["NCCL_DEBUG_FILE"] == str(tmp_path / rec["host"] / "nccl.%p.log")
    assert str(tmp_path) in rec["nccl"]["route_lines"]


def test_probe_baseline_is_a_real_measurement(tmp_path, one_rank):
    rec = capture.capture(tmp_path, probe=True, quiet=True, topo_file=REC / "h200x1_vm.txt")
    names = [p["name"] for p in rec["probe"]]
    assert names[0].startswith("gemm") and names[1].startswith("hbm_copy")
    assert all(p["derived"]["gbps"] > 0 for p in rec["probe"]) and rec["probe"][0]["derived"]["tflops"] > 0


def test_steplog_writes_steps_and_collectives_and_never_overwrites(tmp_path):
    import time
    with steplog.StepLog(tmp_path, rank=3, n_flops=123) as log:
        for i in range(4):
            with log.step():
                time.sleep(0.001)
                with log.collective("allreduce"):
                    time.sleep(0.001)
    path = steplog.log_path(tmp_path, 3)
    header, steps, problems = steplog.read_log(path)
    assert header["rank"] == 3 and header["n_flops_per_step"] == 123 and problems == []
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    for s in steps:
        assert s["colls"][0][0] == "allreduce" and 0 < s["colls"][0][1] <= s["step_ms"]
        assert "gpu_step_ms" not in s  # host clock only without CUDA events
    with pytest.raises(UserInputError, match="already exists"):
        steplog.StepLog(tmp_path, rank=3)
    with open(path, "a") as f:
        f.write('{"step": 4, "step_ms": 1.0, "col')  # a crash mid-line
    header, steps, problems = steplog.read_log(path)
    assert len(steps) == 4 and len(problems) == 1 and "truncated" in problems[0]


def test_steplog_refuses_misuse(tmp_path):
    log = steplog.StepLog(tmp_path, rank=0)
    with pytest.raises(RuntimeError, match="inside"):
        with log.collective():
            pass
    with pytest.raises(RuntimeError, match="nest"):
        with log.step():
            with log.step():
                pass
    log.close()
