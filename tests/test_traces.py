"""``hwlab ranks --traces`` on real torch.profiler traces: recorded CPU runs of
examples/profiled_torchrun.py (4 gloo ranks under torchrun; the injected behaviours are the
example's flags: ``--slow-rank 2``; a large all-reduce payload with every rank on time; neither),
the streaming reader on its own, and one live torchrun run (slow)."""
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from public_traces import MI250, PYTORCH18, public_trace  # noqa: F401

from hwlab.core import evidence
from hwlab.diagnosis import flowchart, ranks_traces as R
from hwlab.traces import rank_reading as RR
from hwlab.traces import kineto, trace_stream

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"  # synthetic fixtures (make_fixtures.py)
REC = evidence.TRACES_DIR  # the kit's recorded runs, shipped in the package
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "profiled_torchrun.py"


def _files(name):
    return sorted((REC / name).glob("*.pt.trace.json.gz"))


def _load(p):
    return json.loads(gzip.open(p, "rt").read())


def _write(obj, p):
    p = Path(p)
    if p.name.endswith(".gz"):
        with gzip.open(p, "wt") as f:
            json.dump(obj, f)
    else:
        p.write_text(json.dumps(obj))
    return p


# ------------------------------------------------------------------ the reader
def test_reader_keeps_rank_steps_and_gloo_collectives():
    ranks = set()
    for p in _files("slow_rank"):
        t = kineto.read_trace(p)
        raw = _load(p)
        assert t.rank == raw["distributedInfo"]["rank"] and t.rank_source == kineto.RANK_FROM_TRACE
        assert t.world_size == 4 and t.backend == "gloo" and not t.on_gpu
        want_steps = sorted(int(e["name"].split("#")[1]) for e in raw["traceEvents"]
                            if e.get("name", "").startswith("ProfilerStep#"))
        assert sorted(s[0] for s in t.steps) == want_steps
        gloo = [e for e in raw["traceEvents"] if e.get("name", "").startswith("gloo:")]
        assert len(t.collectives) == len(gloo) and {c.name for c in t.collectives} == {"allreduce"}
        assert all(c.on == "cpu" and c.n_bytes == 4096 * 4 for c in t.collectives)  # the example's default numel
        assert t.n_events == len(raw["traceEvents"])
        ranks.add(t.rank)
    assert ranks == {0, 1, 2, 3}


def test_reader_is_the_same_at_any_chunk_size_and_plain_or_gzip(tmp_path, monkeypatch):
    p = _files("slow_link")[0]
    ref = kineto.read_trace(p)
    plain = _write(_load(p), tmp_path / "x.pt.trace.json")
    for chunk in (7, 64, 1000):  # chunk edges fall inside numbers, strings and keys
        monkeypatch.setattr(trace_stream, "CHUNK_CHARS", chunk)
        for q in (p, plain):
            t = kineto.read_trace(q)
            assert (t.rank, t.steps, t.host_ops, t.n_events) == (ref.rank, ref.steps, ref.host_ops, ref.n_events)
            assert [c.to_dict() for c in t.collectives] == [c.to_dict() for c in ref.collectives]


def test_reader_reports_progress_on_long_reads(monkeypatch, tmp_path):
    monkeypatch.setattr(trace_stream, "PROGRESS_EVERY_BYTES", 4000)
    monkeypatch.setattr(trace_stream, "CHUNK_CHARS", 2000)
    plain = _write(_load(_files("clean")[0]), tmp_path / "x.pt.trace.json")
    seen = []
    kineto.read_trace(plain, progress=lambda done, total: seen.append((done, total)))
    size = plain.stat().st_size
    assert len(seen) >= 2 and all(t == size and 0 < d <= size for d, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_reader_refuses_truncated_files_and_streams(tmp_path):
    text = gzip.open(_files("clean")[0], "rt").read()
    cut = tmp_path / "cut.pt.trace.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(kineto.TraceError, match="truncated|malformed"):
        kineto.read_trace(cut)
    fifo = tmp_path / "pipe.pt.trace.json"
    os.mkfifo(fifo)
    with pytest.raises(kineto.UserInputError, match="not a regular file"):
        kineto.read_trace(fifo)  # refused before opening: a FIFO would block


def test_rank_from_file_names_when_the_trace_has_none(tmp_path):
    raw = _load(_files("slow_rank")[0])
    raw.pop("distributedInfo")
    for name, rank, how in (("server-TP-3.trace.json.gz", 3, "-TP-N"), ("job_rank5.trace.json", 5, "rankN"),
                            ("worker-rank-12.json", 12, "rankN")):
        t = kineto.read_trace(_write(raw, tmp_path / name))
        assert t.rank == rank and how in t.rank_source
    t = kineto.read_trace(_write(raw, tmp_path / "myhost_4242.1796.pt.trace.json"))
    assert t.rank is None and t.pid is not None and t.host == raw.get("host_name", "myhost")
    assert kineto.coll_key("ncclDevKernel_AllReduce_Sum_f32_RING_LL"[14:23]) == "allreduce"
    assert not kineto.is_trace_name("rank-00001.json") and not kineto.is_trace_name("nvml-rank-1.json")


def test_interval_arithmetic():
    assert RR._union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    # comm 0-10, busy 2-4 and 8-12: 2+2 of the 10 hidden, 6 exposed
    assert RR._minus([(0, 10)], [(2, 4), (8, 12)]) == pytest.approx(6.0)
    assert RR._minus([(0, 10)], []) == pytest.approx(10.0)


# ------------------------------------------------------------------ the analysis
def test_slow_rank_is_named_by_arrival_and_checked_against_the_single_device_branch():
    rep = R.report(REC / "slow_rank")
    f = rep["finding"]
    assert f["kind"] == "slow_rank" and f["rank"] == 2 and rep["tail_ranks"] == [2]
    pr = rep["per_rank"]
    # the collective is a barrier: every rank's step is as long, only arrival tells them apart
    steps = [s["step_ms"] for s in pr.values()]
    assert max(steps) / min(steps) < 1.1
    assert pr["2"]["pct_arrived_last"] >= 50 and pr["2"]["total_wait_ms"] < min(
        pr[r]["total_wait_ms"] for r in "013")
    assert f["busy_over_peers"] < R.SINGLE_DEVICE_SLOW and "counter-example" in f["single_device_branch"]
    assert rep["collectives"]["last_by_start_agrees_pct"] >= 50  # the one-clock cross-check
    fc = rep["flowchart"]
    assert fc["path"] == ["B", "D", "K", "L"] and fc["unmeasured"] == {}
    for s in pr.values():  # the split adds up: busy + exposed + idle = step, per step median aside
        assert 0 <= s["exposed_comm_ms"] <= s["comm_ms"] + 1e-9 and s["idle_ms"] >= -1e-9
    assert R.has_finding(rep)


def test_slow_link_names_the_link_not_a_rank():
    rep = R.report(REC / "slow_link")
    f = rep["finding"]
    assert f["kind"] == "slow_link" and rep["tail_ranks"] == [] and "link" in f["names"]
    assert "rank 0-3" not in f["names"] and "ranks 0-3" in f["names"]
    assert f["collective_floor_pct"] >= R.LINK_FLOOR_PCT and f["busbw_gbps"] > 0
    assert "not separated" in f["verdict"]  # no link rate given: slow link vs big payload not told apart
    assert rep["flowchart"]["leaf"] == "L" and rep["flowchart"]["evidence"]["rank_tail_pct"] < 10
    bw = f["busbw_gbps"]
    assert R.report(REC / "slow_link", link_gbps=bw * 4)["finding"]["verdict"] == "slow link"
    assert "communication-bound" in R.report(REC / "slow_link", link_gbps=bw)["finding"]["verdict"]


def test_clean_run_names_nothing():
    rep = R.report(REC / "clean")
    assert rep["finding"]["kind"] == "clean" and rep["tail_ranks"] == [] and not R.has_finding(rep)
    assert rep["flowchart"]["leaf"] != "L"


def test_some_ranks_only_and_several_hosts_without_a_common_clock(tmp_path):
    for p in _files("slow_rank")[:2]:
        shutil.copy(p, tmp_path)
    rep = R.report(tmp_path)
    assert rep["ranks_present"] == "2 of 4 ranks" and "2 of 4 ranks" in R.render(rep)
    # every rank on its own host, each host clock offset by seconds: arrival from durations still names rank 2
    d = tmp_path / "hosts"
    d.mkdir()
    for i, p in enumerate(_files("slow_rank")):
        raw = _load(p)
        raw["host_name"] = f"node{i}"
        for e in raw["traceEvents"]:
            if "ts" in e:
                e["ts"] += 7e6 * (3 - i)  # later ranks' clocks behind
        _write(raw, d / f"node{i}_{100 + i}.1.pt.trace.json.gz")
    rep = R.report(d)
    assert rep["collectives"]["one_clock"] is False and any("4 hosts" in n for n in rep["notes"])
    assert rep["finding"]["kind"] == "slow_rank" and rep["finding"]["rank"] == 2


def test_flowchart_k_takes_the_collective_floor():
    d = flowchart.diagnose({"slowdown_vs_floor": 1.0, "e2e_slowdown": 3.0, "rank_tail_pct": 2.0,
                            "collective_floor_pct": 60.0})
    assert d.path == ["B", "D", "K", "L"]
    d = flowchart.diagnose({"slowdown_vs_floor": 1.0, "e2e_slowdown": 3.0, "rank_tail_pct": 2.0,
                            "collective_floor_pct": 5.0})
    assert d.leaf_id == "M"


# ------------------------------------------------------------------ the CLI
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hwlab", "ranks", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


@pytest.mark.slow
def test_cli_exit_codes_json_and_detection(tmp_path):
    r = _cli("--traces", REC / "slow_rank", "--json")
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    assert rep["finding"]["rank"] == 2
    r = _cli(REC / "clean")  # a folder of traces given as the run directory: detected
    assert r.returncode == 0 and "no slow rank and no slow link" in r.stdout
    r = _cli("--traces", REC / "slow_link")
    assert r.returncode == 1 and "LINK:" in r.stdout and "SLOW RANK" not in r.stdout
    r = _cli("--traces", tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "tensorboard_trace_handler" in r.stderr
    r = _cli(REC / "clean", "--traces", REC / "clean")
    assert r.returncode == 2 and "not both" in r.stderr
    r = _cli("--traces", REC / "clean", "--link-gbps", "-1")
    assert r.returncode == 2


@pytest.mark.slow
def test_live_torchrun_traces_name_the_slowed_rank(tmp_path):
    d = tmp_path / "tr"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "4", str(EXAMPLE), "--trace-dir", str(d),
           "--slow-rank", "1", "--steps", "8"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    r = _cli("--traces", d, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and rep["finding"]["kind"] == "slow_rank" and rep["finding"]["rank"] == 1


# ------------------------------------------------------------------ recorded on the H200
H200 = REC / "h200_nccl_one_rank"


def test_h200_one_rank_nccl_trace_kernels_and_collective_metadata():
    """Recorded on the H200 (tools/record_traces_h200.sh: world size 1, nccl backend, three sum
    all-reduces, one averaging all-reduce, an all-gather and a broadcast per step). A one-rank
    communicator launches a kernel only for the averaging all-reduce (NCCL's one-rank kernel); the
    metadata torch tags on it is read from the raw trace here and compared with the reader's."""
    p = next(H200.glob("*.pt.trace.json.gz"))
    raw = _load(p)
    t = kineto.read_trace(p)
    assert t.rank == 0 and t.world_size == 1 and t.backend == "nccl" and t.on_gpu
    assert raw["distributedInfo"]["nccl_version"].count(".") == 2
    tagged = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    assert tagged and len(t.collectives) == len(tagged)
    steps = {int(e["name"].split("#")[1]) for e in raw["traceEvents"]
             if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"}
    assert len(t.collectives) == len(steps)  # one kernel-launching collective per step
    for c, e in zip(t.collectives, sorted(tagged, key=lambda e: e["ts"])):
        a = e["args"]
        assert c.on == "gpu" and c.stream == a["stream"] and c.name == kineto.coll_key(a["Collective name"])
        assert c.n_bytes == a["In msg nelems"] * kineto.DTYPE_BYTES[a["dtype"]]
        assert c.pg == a["Process Group Name"] and c.group_size == a["Group size"] == 1
        assert c.meta_source == "kernel args" and kineto._ONE_RANK in c.kernel
    # the matmuls are kernels too, not collectives
    gemms = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "gemm" in e["name"]]
    assert len(t.kernels) == len([e for e in raw["traceEvents"] if e.get("cat") == "kernel"]) - len(tagged)
    assert gemms and len(t.kernels) >= len(gemms)


def test_h200_one_rank_report_and_nvml_samples():
    rep = R.report(H200)
    assert rep["n_ranks"] == 1 and rep["backends"] == ["nccl"] and rep["finding"]["kind"] == "clean"
    pr = rep["per_rank"]["0"]
    assert pr["device"] == "GPU kernels" and pr["busy_ms"] > 0 and pr["comm_ms"] > 0
    assert "K" in rep["flowchart"]["unmeasured"]  # one rank: no tail to measure, and it says so
    nv = rep["nvml"]["0"]
    assert nv["available"] and nv["gpus"]["0"]["nvlink"] == "absent"  # a one-GPU machine
    assert nv["gpus"]["0"]["pcie_tx_mbps"]["n"] >= 2


# ------------------------------------------------------------------ the kit's rate-limited link
def test_rate_limited_link_is_named_and_its_bus_bandwidth_matches_the_shaped_rate():
    """Recorded with examples/profiled_slowlink.py --rate 100mbit (ranks 2-3 behind a tbf-shaped veth,
    root + netns): every all-reduce crosses the link. The bus bandwidth the report derives from the
    collective's bytes and the last arriver's time must come out at the rate tc was given."""
    rep = R.report(REC / "slow_link_tbf")
    f = rep["finding"]
    assert f["kind"] == "slow_link" and rep["tail_ranks"] == [] and "link" in f["names"]
    shaped_gbps = 100e6 / 8 / 1e9  # 100 Mbit/s
    assert 0.5 * shaped_gbps <= f["busbw_gbps"] <= 1.05 * shaped_gbps
    assert R.report(REC / "slow_link_tbf", link_gbps=shaped_gbps)["finding"]["verdict"].startswith(
        "communication-bound")  # the link runs at its (low) rate
    assert R.report(REC / "slow_link_tbf", link_gbps=1.0)["finding"]["verdict"] == "slow link"


def _netns_ok():
    import shutil as sh
    return hasattr(os, "geteuid") and os.geteuid() == 0 and bool(sh.which("ip") and sh.which("tc"))


@pytest.mark.slow
@pytest.mark.skipif(not _netns_ok(), reason="the rate-limited link needs root and iproute2")
def test_live_rate_limited_link_names_the_link(tmp_path):
    d = tmp_path / "tr"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "profiled_slowlink.py"), "--trace-dir", str(d),
                        "--rate", "100mbit", "--", "--numel", "262144", "--steps", "6"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stderr[-2000:]
    r = _cli("--traces", d, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and rep["finding"]["kind"] == "slow_link" and rep["tail_ranks"] == []


def test_spreads_over_steps_and_the_borderline_rule():
    def row(step, own, step_ms=10.0):
        return {"step": step, "own_ms": own, "step_ms": step_ms}
    # rank 1 is the slowest; its own time over rank 0's, per step, in % of a 10 ms median step: 0, 10, 20
    rows = {0: [row(1, 2.0), row(2, 2.0), row(3, 2.0)], 1: [row(1, 2.0), row(2, 3.0), row(3, 4.0)]}
    sp = R._spreads(rows, 1, 10.0)
    assert sp["rank_tail_pct"]["n_steps"] == 3
    assert sp["rank_tail_pct"]["p10"] == pytest.approx(2.0) and sp["rank_tail_pct"]["p90"] == pytest.approx(18.0)
    # e2e per step: median step over the median own time: 10/2, 10/2.5, 10/3
    assert sp["e2e_slowdown"]["p90"] == pytest.approx(5.0 - 0.2 * (5.0 - 4.0))



@pytest.mark.parametrize("run", ["slow_rank", "slow_link", "clean"])
def test_the_walk_carries_each_metrics_spread_over_steps(run):
    """The walk's own steps carry the p10-p90 over steps (not a note beside a walk that says "spread
    not recorded"), and a step whose spread holds the threshold is borderline."""
    rep = R.report(REC / run)
    d = flowchart.diagnose(rep["flowchart"]["evidence"])
    seen = 0
    for st in d.steps:
        sp = rep["spreads"].get(st.metric)
        if sp is None:
            assert st.spread is None
            continue
        seen += 1
        assert st.spread == pytest.approx((sp["p10"], sp["p90"])) and "over steps" in st.spread_what
        crit = next(c for q in flowchart.QUESTIONS.values() for c in q.criteria if c.metric == st.metric)
        assert st.borderline == (crit.holds(sp["p10"]) != crit.holds(sp["p90"]))
    assert seen >= 1, d.explain()


def test_draft_incident_is_worded_for_what_the_traces_found(tmp_path):
    from hwlab.diagnosis import incident
    rank = R.report(REC / "slow_rank")["incident_draft"]["record"]
    link = R.report(REC / "slow_link_tbf")["incident_draft"]["record"]
    assert "rank 2" in rank["title"] and "arrived last" in rank["symptom"] and rank["diagnosis_path"][-1] == "L"
    assert "link" in link["title"] and "rank" not in link["title"] and "no rank arrives late" in link["symptom"]
    md, js = incident.save(incident.Incident(**link), tmp_path)  # the record round-trips through the writer
    assert json.loads(js.read_text())["title"] == link["title"]


def test_reader_memory_stays_bounded_on_a_large_trace(tmp_path, monkeypatch):
    """A trace padded with many events the analysis does not keep (CUDA runtime calls, as real traces
    hold millions of): the reader's peak allocation stays near its chunk buffer, far under the file."""
    import tracemalloc
    raw = _load(_files("slow_rank")[0])
    pad = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1.0,
           "dur": 1.0, "args": {"External id": 1, "cbid": 211, "correlation": 12345}}
    p = tmp_path / "big.pt.trace.json"
    with open(p, "w") as f:
        f.write('{"distributedInfo": ' + json.dumps(raw["distributedInfo"]) + ', "traceEvents": [')
        f.write(",".join(json.dumps(e) for e in raw["traceEvents"]))
        f.write(("," + json.dumps(pad)) * 30_000)
        f.write("]}")
    size = p.stat().st_size
    monkeypatch.setattr(trace_stream, "CHUNK_CHARS", 1 << 16)
    tracemalloc.start()
    t = kineto.read_trace(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert size > 4e6 and t.n_events == len(raw["traceEvents"]) + 30_000 and t.rank == raw["distributedInfo"]["rank"]
    assert peak < size / 5, (peak, size)


def test_the_topology_link_from_a_startup_capture_judges_the_bus_bandwidth(tmp_path, monkeypatch):
    """Traces beside a real startup capture (hwlab.core.capture, one record per rank, the recorded 2-socket
    PCIe box injected as topology): the link the ranks span comes from the topology, and its rate is
    the kit's link model for that class, labelled an estimate; the shaped link falls far under it."""
    from hwlab.core import capture, mapping, topology
    topo_file = ROOT / "src" / "hwlab" / "recorded" / "topology" / "pcie4_2socket_pix_sys.txt"
    for p in _files("slow_link_tbf"):
        shutil.copy(p, tmp_path)
    for r in range(4):
        monkeypatch.setenv("RANK", str(r))
        monkeypatch.setenv("LOCAL_RANK", str(r))
        monkeypatch.setenv("WORLD_SIZE", "4")
        capture.capture(tmp_path, tp_groups=[[0, 1, 2, 3]], topo_file=topo_file, quiet=True)
    rep = R.report(tmp_path)
    f = rep["finding"]
    cell = topology.parse_topo_matrix(topo_file.read_text()).slowest_link(["GPU0", "GPU1", "GPU2", "GPU3"])
    assert cell in f["names"] and rep["link_gbps"] == mapping.link_gbps_us(cell)[0]
    assert rep["link_gbps_source"].startswith("estimate") and f["verdict"] == "slow link"
    assert R.report(tmp_path, link_gbps=f["busbw_gbps"])["link_gbps_source"] == "given (--link-gbps)"


# ------------------------------------------------------------------ partial and foreign traces (issue 44)
SENDRECV = DATA / "sendrecv_identity"


def _tb_named(src, dst):
    """The fixture's traces copied under tensorboard_trace_handler names (host_pid.ns.pt.trace.json.gz),
    so that what a test checks is the analysis, not the discovery by content."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(sorted(Path(src).glob("*.gz"))):
        shutil.copy(p, dst / f"gpuhost_{4000 + i}.1733357000000000000.pt.trace.json.gz")
    return dst


def test_truncated_second_rank_makes_the_answer_undecided_naming_the_rank_and_file(tmp_path):
    rep = R.report(_tb_named(DATA / "truncated_rank", tmp_path))
    text = R.render(rep)
    assert "UNDECIDED" in text and "no slow rank and no slow link" not in text
    assert rep["missing_ranks"] == [1] and R.is_undecided(rep)
    assert "ranks 1 of world size 2" in rep["undecided"] and "gpuhost_4001" in rep["undecided"]
    assert [Path(u["file"]).name for u in rep["unreadable"]] == ["gpuhost_4001.1733357000000000000.pt.trace.json.gz"]
    rep = R.report(DATA / "truncated_rank")  # as Kineto names them
    assert rep["missing_ranks"] == [1] and "rank-1.Dec_05_00_20_00.1102" in rep["undecided"]
    assert "undecided" in rep["incident_draft"]["record"]["title"]


def test_discovery_reads_traces_by_content_and_lists_what_it_skipped():
    d = DATA / "named_by_others"
    traces, skipped = kineto.discover_traces(d)
    assert sorted(p.name for p in traces) == ["control.json.gz", "rank-0.Jul_15_10_52_41.1074.pt.trace.json.gz"]
    why = {p.name: w for p, w in skipped}
    assert set(why) == {"empty_trace.json.gz", "model_et.json", "rank-00000.json", "steps-rank-00000.jsonl"}
    assert "empty" in why["empty_trace.json.gz"] and "execution trace" in why["model_et.json"]
    assert "hwlab.capture" in why["rank-00000.json"] and ".json" in why["steps-rank-00000.jsonl"]
    rep = R.report(d)
    assert rep["n_ranks"] == 2 and sorted(s["file"] for s in rep["per_rank"].values()) == sorted(p.name for p in traces)
    assert {Path(s["file"]).name for s in rep["skipped"]} == set(why)
    text = R.render(rep)
    assert all(f"not a trace: {Path(s['file'])}" in text for s in rep["skipped"])
    # a name with a date is not read as a tensorboard host_pid name
    assert kineto.read_trace(traces[1]).host is None


def _waits(rep):
    return sorted((c["name"], c["seq"], c["last"], round(c["skew_ms"], 3)) for c in rep["collectives"]["per_collective"])


def test_sendrecv_kernels_are_matched_by_process_group_and_sequence_number(tmp_path):
    """Every NCCL kernel is named SendRecv; the host ops around each launch say all_to_all,
    all_reduce, all_gather, and the two ranks issue them in different orders. The fixture's waits:
    rank 0 waits 32 ms in each all_to_all, rank 1 0.25 ms in each all_reduce, rank 0 2 ms in each
    all_gather (make_fixtures.ORDER / ENDS)."""
    rep = R.report(_tb_named(SENDRECV, tmp_path))
    assert _waits(rep) == [("allgather", 2, 1, 2.0), ("allgather", 4, 1, 2.0), ("allreduce", 1, 0, 0.25),
                           ("allreduce", 2, 0, 0.25), ("alltoall", 1, 1, 32.0), ("alltoall", 3, 1, 32.0)]
    c = rep["collectives"]
    assert c["methods"] == {RR.BY_ID: 6} and c["unmatched"] == {"0": 0, "1": 0}
    t = kineto.read_trace(next(SENDRECV.glob("rank-0*")))
    assert {x.meta_source for x in t.collectives} == {"record_param_comms (by correlation id)"}
    assert {x.host_op for x in t.collectives} == {"nccl:all_to_all", "nccl:all_reduce", "nccl:all_gather"}


def test_without_sequence_numbers_pairs_must_overlap_and_the_rest_are_counted(tmp_path):
    """Sequence numbers stripped (older torch) and rank 1's first all_reduce kernel dropped (a sampled
    trace): pairing is by name and order, kept only where the two ranks overlap on one clock; the
    all_reduce without a partner is counted unmatched, not paired with the next one."""
    for p in sorted(SENDRECV.glob("*.gz")):
        raw = _load(p)
        r = raw["distributedInfo"]["rank"]
        drop = None
        for e in raw["traceEvents"]:
            e.get("args", {}).pop("Seq", None)
            if r == 1 and e["name"] == "nccl:all_reduce" and drop is None:
                drop = (e["ts"], e["ts"] + 40.0)
        if drop:
            corr = {e["args"]["correlation"] for e in raw["traceEvents"] if e["cat"] == "cuda_runtime"
                    and drop[0] <= e["ts"] <= drop[1]}
            raw["traceEvents"] = [e for e in raw["traceEvents"] if not (e["cat"] == "kernel" and
                                                                          e["args"].get("correlation") in corr)]
        _write(raw, tmp_path / f"gpuhost_{4000 + r}.1733357000000000000.pt.trace.json.gz")
    rep = R.report(tmp_path)
    assert {w[3] for w in _waits(rep) if w[0] == "alltoall"} == {32.0}
    assert ("allreduce", None, 0, 0.25) in _waits(rep) and len(_waits(rep)) == 5
    c = rep["collectives"]
    assert c["methods"] == {RR.BY_OVERLAP: 5} and c["unmatched"] == {"0": 1, "1": 0}
    assert any("left unmatched" in n for n in rep["notes"])


def test_a_folder_mixing_jobs_is_refused_naming_the_files(tmp_path):
    with pytest.raises(kineto.UserInputError, match="world size 2: trace_a.json.gz; world size 8: trace_b.json.gz"):
        R.report(DATA / "mixed_jobs")
    # the same world size, recorded 8.5 days apart
    a, b = (_load(p) for p in sorted((DATA / "mixed_jobs").glob("*.gz")))
    b["distributedInfo"]["world_size"], b["distributedInfo"]["rank"] = 2, 1
    _write(a, tmp_path / "a.json.gz")
    _write(b, tmp_path / "b.json.gz")
    with pytest.raises(kineto.UserInputError, match=r"8\.5 days apart.*a\.json\.gz.*b\.json\.gz"):
        R.report(tmp_path)
    b["baseTimeNanoseconds"] = a["baseTimeNanoseconds"] + 30 * 10**9  # 30 s apart: one job
    b["distributedInfo"]["pg_config"] = b["distributedInfo"]["pg_config"][:1] + [
        {"pg_name": "7", "pg_desc": "tp", "pg_size": 2, "ranks": [0, 1]}]  # a group only rank 1 lists: fine
    _write(b, tmp_path / "b.json.gz")
    assert R.report(tmp_path)["n_ranks"] == 2
    b["distributedInfo"]["pg_config"][0]["ranks"] = [0, 1, 2, 3]  # the default group of another job
    _write(b, tmp_path / "b.json.gz")
    with pytest.raises(kineto.UserInputError, match="process group 0 differs.*a.json.gz.*b.json.gz"):
        R.report(tmp_path)


def test_device_work_after_the_step_is_counted_in_the_step_that_launched_it(tmp_path):
    """The device runs behind the host (make_fixtures: each step launches 8 kernels of 2.5 ms in a
    10 ms host step): each step's busy time is the 20 ms its launches caused, by correlation id,
    summed here independently from the raw JSON; the share that ran after the last step is noted."""
    p = next((DATA / "device_lag").glob("*.gz"))
    raw = _load(p)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e["name"].startswith("ProfilerStep#")]
    launch = {e["args"]["correlation"]: e["ts"] for e in raw if e["cat"] == "cuda_runtime"}
    kern = [e for e in raw if e["cat"] == "kernel"]
    per_step = [sum(k["dur"] for k in kern if lo <= launch[k["args"]["correlation"]] < hi) / 1e3 for lo, hi in steps]
    after = sum(max(0.0, k["ts"] + k["dur"] - max(k["ts"], steps[-1][1])) for k in kern)
    after_pct = 100 * after / sum(k["dur"] for k in kern)
    rep = R.report(_tb_named(DATA / "device_lag", tmp_path))
    s = rep["per_rank"]["0"]
    assert s["busy_ms"] == pytest.approx(statistics_median(per_step)) and per_step == [20.0, 20.0]
    assert s["device_outside_steps"]["after_last_step_pct"] == pytest.approx(after_pct) and after > 0
    # idle is the device timeline's own: from the first step's host start to the last kernel's end, the
    # time no kernel ran (2 steps: the median is the mean), never the previous step's work counted again
    span = (steps[0][0], max(k["ts"] + k["dur"] for k in kern))
    union, cur = 0.0, None
    for a, b in sorted((k["ts"], k["ts"] + k["dur"]) for k in kern):
        if cur and a <= cur[1]:
            cur[1] = max(cur[1], b)
        else:
            union += (cur[1] - cur[0]) if cur else 0.0
            cur = [a, b]
    union += cur[1] - cur[0]
    assert 2 * s["idle_ms"] == pytest.approx((span[1] - span[0] - union) / 1e3)
    assert s["own_ms"] >= 0 and s["step_ms"] >= s["busy_ms"]
    assert any("ran outside the host's ProfilerStep windows" in n for n in rep["notes"])


def statistics_median(xs):
    import statistics
    return statistics.median(xs)


def test_training_traces_get_training_actions_and_the_traces_machine():
    rep = R.report(DATA / "training_two_ranks")
    assert rep["flowchart"]["path"] == ["B", "D", "K", "M"]
    text = R.render(rep)
    assert "prefill" not in text and "KV" not in text and "TORCH_LOGS=recompiles" in text
    assert rep["workload"] == "training"
    m = rep["incident_draft"]["record"]["machine"]
    assert m["device"] == "NVIDIA H100 80GB HBM3" and m["host"] == "trainnode3"
    assert "prefill" not in rep["incident_draft"]["markdown"]
    # the same walk for a job that shows no backward op keeps the seed's serving actions
    d = flowchart.diagnose({**rep["flowchart"]["evidence"], "workload": "inference"})
    assert d.leaf_id == "M" and "prefill" in " ".join(d.leaf.actions)


def test_one_ranks_collectives_are_listed_with_bus_bandwidth(tmp_path):
    shutil.copy(next(SENDRECV.glob("rank-0*")), tmp_path / "gpuhost_4000.1733357000000000000.pt.trace.json.gz")
    rep = R.report(tmp_path)
    text = R.render(rep)
    assert "rank 0 collectives" in text and "nothing to match" not in text
    rows = {x["name"]: x for x in rep["collectives_by_rank"]["0"]}
    # make_fixtures: all_to_all of 2^20 floats, 39 ms inside, twice; all_reduce 2^22 floats, 10 ms; group size 2
    a2a, ar = rows["alltoall"], rows["allreduce"]
    assert a2a["count"] == 2 and a2a["n_bytes"] == 4 << 20 and a2a["total_ms"] == pytest.approx(78.0)
    assert a2a["busbw_gbps"] == pytest.approx((4 << 20) / 39e-3 / 1e9 * (2 - 1) / 2)
    assert ar["busbw_gbps"] == pytest.approx((16 << 20) / 10e-3 / 1e9 * 2 * (2 - 1) / 2)
    ag = rows["allgather"]  # nccl-tests counts an all-gather's output bytes
    assert ag["algbw_gbps"] == pytest.approx((1 << 18) * 4 / 19e-3 / 1e9)
    one = R.report(H200)["collectives_by_rank"]["0"]  # recorded on the H200, world size 1
    assert one and all(x["busbw_gbps"] is None and "one rank" in x["busbw_note"] for x in one)


@pytest.mark.slow
def test_live_traces_named_by_other_tools_and_a_missing_rank(tmp_path):
    """Real torch.profiler traces (tensorboard_trace_handler, 2 gloo ranks under torchrun): renamed
    as Kineto's on-demand traces are named, they are all read; with one removed, exit 4 names it."""
    d = tmp_path / "tr"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--trace-dir", str(d),
           "--steps", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    files = sorted(d.glob("*.pt.trace.json*"))
    assert len(files) == 2
    for p in files:
        rank = kineto.read_trace(p).rank
        p.rename(d / f"rank-{rank}.Dec_05_00_20_00.{1100 + rank}.pt.trace.json.gz" if p.name.endswith(".gz")
                 else d / f"rank-{rank}.Dec_05_00_20_00.{1100 + rank}.pt.trace.json")
    r = _cli("--traces", d, "--json")
    rep = json.loads(r.stdout)
    assert rep["n_ranks"] == 2 and rep["missing_ranks"] == [] and r.returncode in (0, 1)
    next(d.glob("rank-1.*")).unlink()
    r = _cli("--traces", d)
    assert r.returncode == 4 and "UNDECIDED: ranks 1 of world size 2" in r.stdout


@pytest.mark.slow
def test_cli_undecided_and_mixed_jobs_exit_codes():
    r = _cli("--traces", DATA / "truncated_rank", "--json")
    assert r.returncode == 4 and json.loads(r.stdout)["missing_ranks"] == [1]
    r = _cli("--traces", DATA / "mixed_jobs")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "trace_b.json.gz" in r.stderr


# ------------------------------------------------------------------ opt-in: traces other tools and jobs wrote
FOREIGN = os.environ.get("HWLAB_FOREIGN_TRACES")
_RUNTIME = ("cuda_runtime", "cuda_driver", "Runtime")


def _raw_per_step(path):
    """An independent reading of one trace: the whole JSON loaded at once (no streaming, no kineto
    module), per ProfilerStep the union of non-NCCL kernel time and of NCCL kernel time, each kernel
    counted in the step whose window holds its runtime launch (correlation id), or clipped to the
    window it ran in when it has no launch event; the whole trace is one step when it has none."""
    op = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with op(path, "rt") as f:
        d = json.load(f)
    ev = [e for e in d["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    steps = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in ev
             if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in ev if e.get("cat") in _RUNTIME
              and "aunch" in e["name"] and "correlation" in (e.get("args") or {})}
    kern = [e for e in ev if e.get("cat") in ("kernel", "Kernel")]
    gloo = [e for e in ev if str(e.get("name", "")).startswith("gloo:") and e.get("cat") in ("user_annotation", "cpu_op")]

    def is_nccl(e):
        n, a = e["name"], e.get("args") or {}
        return n.startswith(("ncclKernel_", "ncclDevKernel_")) or "Collective name" in a or "_onerank_cu_" in n

    if not steps:
        spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in
                 kern + gloo + [e for e in ev if e.get("cat") == "cpu_op"]]
        if not spans:
            return None
        steps = [(min(a for a, _ in spans), max(b for _, b in spans))]

    def union_ms(iv):
        tot, end = 0.0, None
        for a, b in sorted(iv):
            if end is None or a > end:
                tot += b - a
                end = b
            elif b > end:
                tot += b - end
                end = b
        return tot / 1e3

    rows = []
    for lo, hi in sorted(steps):
        busy, comm = [], []
        for k in kern:
            a, b = float(k["ts"]), float(k["ts"]) + float(k.get("dur", 0))
            la = launch.get((k.get("args") or {}).get("correlation"))
            if la is not None:
                part = [(a, b)] if lo <= la < hi else []
            else:
                part = [(max(a, lo), min(b, hi))] if b > lo and a < hi else []
            (comm if is_nccl(k) else busy).extend(part)
        for g in gloo:
            a, b = float(g["ts"]), float(g["ts"]) + float(g.get("dur", 0))
            if b > lo and a < hi:
                comm.append((max(a, lo), min(b, hi)))
        rows.append({"busy_ms": union_ms(busy), "comm_ms": union_ms(comm), "on_gpu": bool(kern)})
    return rows


@pytest.mark.skipif(not FOREIGN, reason="set HWLAB_FOREIGN_TRACES to a folder of traces other tools wrote "
                    "(e.g. HolisticTraceAnalysis' tests/data) to run this check")
def test_foreign_traces_are_all_read_and_per_rank_figures_equal_a_raw_sum(tmp_path):
    """Every file under HWLAB_FOREIGN_TRACES is either read as a trace or listed as skipped with a
    reason; each trace read alone gives per-rank busy and communication medians equal to the
    independent raw-JSON reading above; each folder is analysed as one job or refused naming its files."""
    import statistics
    root = Path(FOREIGN)
    folders = sorted({p.parent for p in root.rglob("*") if p.is_file()})
    n_read = n_checked = 0
    for folder in folders:
        traces, skipped = kineto.discover_traces(folder, depth=0)
        files = sorted(p for p in folder.iterdir() if p.is_file())
        assert sorted(traces + [p for p, _ in skipped]) == files and all(w for _, w in skipped)
        for p, w in skipped:
            print(f"skipped {p.relative_to(root)}: {w}")
        for p in traces:
            one = tmp_path / f"{n_read}-{folder.name}-{p.name}"
            one.mkdir()
            shutil.copy(p, one / p.name)
            try:
                rep = R.report(one)
            except kineto.UserInputError as e:  # a truncated or malformed file: one line naming it
                assert p.name in str(e) and "\n" not in str(e)
                n_read += 1
                continue
            n_read += 1
            raw = _raw_per_step(p)
            if raw is None:
                continue
            (s,) = rep["per_rank"].values()
            assert s["n_steps"] == len(raw), p
            assert s["own_ms"] >= 0 and s["idle_ms"] >= 0, p  # on the device clock, never negative
            assert s["comm_ms"] == pytest.approx(statistics.median(r["comm_ms"] for r in raw), rel=1e-6, abs=1e-6), p
            if raw[0]["on_gpu"]:
                assert s["busy_ms"] == pytest.approx(statistics.median(r["busy_ms"] for r in raw), rel=1e-6, abs=1e-6), p
            n_checked += 1
        if len(traces) > 1:  # the folder as one job: analysed, or refused in one line naming files
            try:
                rep = R.report(folder)
            except kineto.UserInputError as e:
                assert "\n" not in str(e)
                assert "no usable trace" in str(e) or any(p.name in str(e) for p in traces), str(e)
                print(f"{folder.relative_to(root)}: refused: {e}")
                continue
            assert rep["n_ranks"] + len(rep["unreadable"]) + len(rep["problems"]) >= len(traces)
            c = rep["collectives"]
            n_gpu = sum(1 for t in map(kineto.read_trace, traces) for x in t.collectives if x.on == "gpu")
            assert sum(c["methods"].values()) * rep["n_ranks"] + sum(c["unmatched"].values()) == n_gpu
            assert RR.BY_ORDER not in c["methods"]  # one clock here: every pair checked for overlap
            print(f"{folder.relative_to(root)}: {rep['ranks_present']}, matched {c['methods']}, "
                  f"unmatched {c['unmatched']}, undecided: {rep['undecided']}")
    print(f"foreign traces: {n_read} read, {n_checked} checked against the raw-JSON sum")
    # two jobs' traces in one folder (HolisticTraceAnalysis' trace_diff pair, when present): refused
    pair = [root / "trace_diff" / "control" / "control.json.gz", root / "trace_diff" / "test" / "test.json.gz"]
    if all(p.is_file() and p.stat().st_size for p in pair):
        mixed = tmp_path / "mixed"
        mixed.mkdir()
        for p in pair:
            shutil.copy(p, mixed / p.name)
        with pytest.raises(kineto.UserInputError, match="different jobs.*control.json.gz.*test.json.gz|"
                                                         "different jobs.*test.json.gz.*control.json.gz"):
            R.report(mixed)
    assert n_read >= 3 and n_checked >= 3


def test_one_trace_given_twice_is_read_once(tmp_path):
    """A copy of rank 0's trace under another name (a re-upload, a second handler): one rank read
    once, the copy named; the folder is the two-rank job it was, not three ranks."""
    src = sorted((DATA / "training_two_ranks").glob("*.gz"))
    for p in src:
        shutil.copy(p, tmp_path / p.name)
    shutil.copy(src[0], tmp_path / "copy_of_rank0.pt.trace.json.gz")
    rep = R.report(tmp_path)
    assert rep["n_ranks"] == 2 and sorted(rep["per_rank"]) == ["0", "1"]
    assert any("copy_of_rank0" in n and "same trace" in n for n in rep["notes"])
    assert rep["workload"] == "training"


def test_nan_times_are_left_out_and_said(tmp_path):
    """A kernel with a NaN start (JSON's NaN literal, which Python's reader accepts) would shift every
    share; it is left out, counted, and the per-rank figures equal those without it."""
    p = sorted((DATA / "training_two_ranks").glob("*.gz"))[0]
    t = _load(p)
    clean = R.report(_tb_named(DATA / "training_two_ranks", tmp_path / "a"))
    bad = dict(t)
    k = next(e for e in t["traceEvents"] if e.get("cat") == "kernel")
    bad["traceEvents"] = t["traceEvents"] + [{**k, "ts": float("nan")}, {**k, "dur": -5}]
    d = tmp_path / "b"
    d.mkdir()
    for i, q in enumerate(sorted((DATA / "training_two_ranks").glob("*.gz"))):
        _write(bad if q == p else _load(q), d / f"gpuhost_{4000 + i}.1733357000000000000.pt.trace.json.gz")
    rep = R.report(d)
    assert any("NaN, infinite or negative time" in n for n in rep["notes"])
    for r in ("0", "1"):
        for key in ("step_ms", "busy_ms", "own_ms", "idle_ms"):
            assert rep["per_rank"][r][key] == pytest.approx(clean["per_rank"][r][key])


@pytest.mark.slow
def test_json_nested_100k_deep_inside_an_event_is_bad_input(tmp_path):
    """An event whose args nest 100,000 arrays deep exhausts the JSON decoder's stack: one clear line,
    exit 2 (bad input), from both trace readers, never an internal error."""
    ev = '{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"args":' + "[" * 100_000 + "]" * 100_000 + "}"
    f = tmp_path / "deep.pt.trace.json"
    f.write_text('{"schemaVersion":1,"traceEvents":[' + ev + "]}")
    with pytest.raises(kineto.TraceError, match="nested too deeply"):
        kineto.read_trace(f)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for args in (["examine", "--trace", str(f)], ["ranks", "--traces", str(tmp_path)]):
        r = subprocess.run([sys.executable, "-m", "hwlab", *args], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 2 and r.stdout == "" and "nested too deeply" in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_undecided_is_printed_after_the_walk_it_qualifies():
    """Ranks missing: the walk over the present ranks is shown as that, and UNDECIDED follows it (the
    job's answer), never a complete-looking walk under an UNDECIDED line."""
    rep = R.report(DATA / "truncated_rank")
    assert R.is_undecided(rep)
    lines = R.render(rep).splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("flowchart"))
    und = next(i for i, ln in enumerate(lines) if ln.startswith("UNDECIDED:"))
    assert und > head and "present" in lines[head] and "not the job's answer" in lines[head]


@pytest.mark.slow
def test_a_pytorch_18_training_trace_is_read_as_training_with_own_time_never_negative(tmp_path):
    """PyTorch 1.8's categories ("Operator", "Kernel", "Runtime"): the ResNet-50 training run's
    backward ops (CudnnConvolutionBackward, aten::*_backward) make it training; on its device clock
    no step's own time or idle is negative."""
    shutil.copy(public_trace(PYTORCH18), tmp_path / "worker0.pt.trace.json.gz")
    rep = R.report(tmp_path)
    s = rep["per_rank"]["0"]
    assert rep["workload"] == "training" and s["n_kernels"] > 9000 and s["n_steps"] == 6
    assert s["own_ms"] >= 0 and s["idle_ms"] >= 0 and s["step_ms"] >= s["busy_ms"] > 0
    t = kineto.read_trace(tmp_path / "worker0.pt.trace.json.gz")
    assert t.n_backward_ops > 0 and t.workload == "training"
    from hwlab.traces.rank_reading import rank_steps
    assert all(r["own_ms"] >= 0 and r["idle_ms"] >= 0 for r in rank_steps(t))
