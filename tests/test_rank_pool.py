"""`hwlab ranks --traces` read in parallel: each rank reduced to its summary in a worker
(hwlab.traces.rank_summary, hwlab.traces.rank_pool), the report the same bytes with any number
of workers or on a real Dask cluster; a bad, too-large or failing rank named and the rest read."""
import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from hwlab import cli
from hwlab.traces import kineto, rank_pool, rank_summary
from hwlab.traces.rank_reading import by_rank, device_outside, rank_steps

ROOT = Path(__file__).resolve().parents[1]
REC = ROOT / "src" / "hwlab" / "recorded" / "traces"
DATA = ROOT / "tests" / "data" / "traces"
SHARED = Path(os.environ.get("HWLAB_TRACE_DATA", ROOT / ".." / "shared" / "data"))
FOLDERS = [REC / "slow_rank", REC / "slow_link", REC / "h200_nccl_one_rank", DATA / "sendrecv_identity",
           DATA / "device_lag", DATA / "training_two_ranks", SHARED / "traces"]


def _files(folder):
    return kineto.discover_traces(folder)[0]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_a_summary_gives_the_rows_and_facts_of_the_whole_trace(folder):
    if not folder.is_dir():
        pytest.skip(f"{folder} is not here (real traces: set HWLAB_TRACE_DATA)")
    assert _files(folder)
    for f in _files(folder):
        whole = kineto.read_trace(f)
        red = rank_summary.reduce_trace(kineto.read_trace(f))
        assert red.kernels == [] and red.kernel_launch_us == []  # the kernels stay in the worker
        assert red.n_kernels == len(whole.kernels) and red.on_gpu == whole.on_gpu
        assert red.fingerprint == whole.fingerprint
        assert [(c.name, c.ts_us, c.dur_us, c.pg, c.seq) for c in red.collectives] == \
            [(c.name, c.ts_us, c.dur_us, c.pg, c.seq) for c in whole.collectives]
        by_rank([whole], [], [])  # what the report does first: a trace without steps gets one
        by_rank([red], [], [])
        assert red.steps == whole.steps
        assert rank_steps(red) == rank_steps(whole) and device_outside(red) == device_outside(whole)


def test_a_trace_without_steps_is_summarised_over_the_step_the_report_gives_it(tmp_path):
    src = _files(REC / "slow_rank")[0]
    d = json.loads(gzip.open(src).read())
    d["traceEvents"] = [e for e in d["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(d))
    whole, red = kineto.read_trace(f), rank_summary.read_reduced(str(f))
    assert not whole.steps and not red.steps
    notes_w, notes_r = [], []
    by_rank([whole], [], notes_w)
    by_rank([red], [], notes_r)
    assert red.steps == whole.steps and len(red.steps) == 1 and notes_r == notes_w
    assert rank_steps(red) == rank_steps(whole)
    assert len(red.host_ops) <= 2 < len(whole.host_ops)  # only the two ends of the span are kept


def _json_out(capsys, monkeypatch, *args) -> tuple[int, str]:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    rc = cli.main(["ranks", *map(str, args), "--json"])
    return rc, capsys.readouterr().out


def _job(tmp_path, n_ranks=6) -> Path:
    """An n-rank job from the recorded 4-rank slow-rank traces: each rank a copy of a recorded rank
    with its own rank number and world size (the same bytes per rank otherwise)."""
    srcs = _files(REC / "slow_rank")
    job = tmp_path / "job"
    job.mkdir()
    for r in range(n_ranks):
        d = json.loads(gzip.open(srcs[r % len(srcs)]).read())
        d["distributedInfo"] = {**d.get("distributedInfo", {}), "rank": r, "world_size": n_ranks}
        for e in d["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += 1000.0 * r  # each rank its own first event: no two are one trace given twice
        (job / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(d).encode(), 1))
    return job


def test_two_workers_print_the_same_bytes_as_one(tmp_path, capsys, monkeypatch):
    job = _job(tmp_path)
    rc1, one = _json_out(capsys, monkeypatch, "--traces", job, "--workers", 1)
    rc2, two = _json_out(capsys, monkeypatch, "--traces", job, "--workers", 2)
    assert rc1 == rc2 and one == two
    rep = json.loads(one)
    assert rep["n_ranks"] == 6 and sorted(rep["per_rank"], key=int) == [str(r) for r in range(6)]
    # each rank's figures are its own trace's (the summary is not one rank copied to all)
    files = sorted(job.iterdir())
    for f in files[:2]:
        t = kineto.read_trace(f)
        assert rep["per_rank"][str(t.rank)]["n_kernels"] == len(t.kernels)


def test_a_bad_a_too_large_and_a_gone_rank_are_named_and_the_others_read(tmp_path, capsys, monkeypatch):
    job = _job(tmp_path)
    bad = job / "rank2.json.gz"
    bad.write_bytes(gzip.compress(gzip.decompress(bad.read_bytes())[:5000]))  # truncated
    big = job / "rank4.json"  # the same trace, stored uncompressed with 2 MB of white space
    big.write_bytes(gzip.decompress((job / "rank4.json.gz").read_bytes()) + b" " * 2_000_000)
    (job / "rank4.json.gz").unlink()
    limit_mb = max(f.stat().st_size for f in job.iterdir() if f != big) // 10**6 + 1
    assert big.stat().st_size > limit_mb * 10**6
    rc, out = _json_out(capsys, monkeypatch, "--traces", job, "--workers", 2, "--max-trace-mb", limit_mb)
    rep = json.loads(out)
    assert rc == 4 and rep["missing_ranks"] == [2, 4]
    assert sorted(Path(u["file"]).name for u in rep["unreadable"]) == ["rank2.json.gz", "rank4.json"]
    assert "limit per rank" in next(u["why"] for u in rep["unreadable"] if u["file"].endswith("rank4.json"))
    assert sorted(rep["per_rank"], key=int) == ["0", "1", "3", "5"]
    # a file gone between listing and reading is named, not the end of the reading
    files = [str(f) for f in sorted(job.iterdir())] + [str(job / "rank9.json.gz")]
    outs = rank_pool.reduce_all(files, workers=2)
    assert outs[-1][0] == "bad" and "rank9.json.gz" in outs[-1][1] and outs[0][0] == "ok"


def _dies_on_rank1(path, max_bytes=None):
    """A worker whose process dies on rank 1's file, every time (as an out-of-memory kill would)."""
    with open(path + ".tries", "a") as f:
        f.write("x")
    if path.endswith("rank1.json.gz"):
        os._exit(9)
    return rank_pool.reduce_one(path, max_bytes)


def _raises_once_on_rank3(path, max_bytes=None):
    """A worker that raises on rank 3's first try only (a passing fault: the retry reads it)."""
    tries = Path(path + ".tries")
    with open(tries, "a") as f:
        f.write("x")
    if path.endswith("rank3.json.gz") and tries.read_text() == "x":
        raise RuntimeError("transient")
    return rank_pool.reduce_one(path, max_bytes)


def _raises_on_rank0(path, max_bytes=None):
    if path.endswith("rank0.json.gz"):
        raise ValueError("a bug in the reader")
    return rank_pool.reduce_one(path, max_bytes)


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_worker_that_dies_or_raises_is_retried_once_then_named(tmp_path, workers):
    job = _job(tmp_path)
    files = [str(f) for f in sorted(job.glob("*.json.gz"))]
    ref = [rank_pool.reduce_one(f)[1] for f in files]
    if workers > 1:  # a process that dies can only be survived in a pool
        outs = rank_pool.reduce_all(files, workers=workers, reduce=_dies_on_rank1)
        assert outs[1][0] == "failed" and "died" in outs[1][1] and "tried 2 times" in outs[1][1]
        assert Path(files[1] + ".tries").read_text() == "xx"
        for i in (0, 2, 3, 4, 5):
            assert outs[i][0] == "ok" and rank_steps(outs[i][1]) == rank_steps(ref[i])
    for f in files:
        Path(f + ".tries").unlink(missing_ok=True)
    outs = rank_pool.reduce_all(files, workers=workers, reduce=_raises_once_on_rank3)
    assert [k for k, _ in outs] == ["ok"] * 6 and Path(files[3] + ".tries").read_text() == "xx"
    assert rank_steps(outs[3][1]) == rank_steps(ref[3])
    outs = rank_pool.reduce_all(files, workers=workers, reduce=_raises_on_rank0)
    assert outs[0][0] == "failed" and "ValueError: a bug in the reader" in outs[0][1]
    assert [k for k, _ in outs[1:]] == ["ok"] * 5


def test_progress_counts_ranks_and_bytes_and_estimates_the_time_left(tmp_path):
    job = _job(tmp_path, 4)
    files = sorted(job.iterdir())
    calls = []
    rank_pool.reduce_all(files, workers=2, progress=lambda *a: calls.append(a))
    sizes = sum(f.stat().st_size for f in files)
    assert [c[0] for c in calls] == [1, 2, 3, 4] and all(c[1] == 4 and c[3] == sizes for c in calls)
    assert [c[2] for c in calls] == sorted(c[2] for c in calls) and calls[-1][2] == sizes
    lines = []

    class S:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass
    cb = rank_pool.progress_printer(S())
    cb(1, 4, 100, 400, 3.0)
    cb(4, 4, 400, 400, 12.0)
    text = "".join(lines)
    assert "read 1 of 4 ranks" in text and "about 9 s left (estimate)" in text and "read 4 of 4 ranks" in text


def test_workers_and_scheduler_are_refused_where_they_mean_nothing(capsys):
    assert cli.main(["ranks", "--traces", str(REC / "slow_rank"), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert cli.main(["ranks", str(ROOT / "src/hwlab/recorded/runs/straggler_nccl_h200"), "--workers", "2"]) == 2
    assert "--traces" in capsys.readouterr().err


@pytest.mark.slow
def test_a_dask_local_cluster_gives_the_same_bytes(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")
    job = _job(tmp_path)
    shutil.copy(_files(DATA / "truncated_rank")[-1], job / "zz_truncated.json.gz")  # a bad file among them
    rc1, one = _json_out(capsys, monkeypatch, "--traces", job, "--workers", 1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster:
        rc2, two = _json_out(capsys, monkeypatch, "--traces", job, "--scheduler", cluster.scheduler_address)
    assert rc1 == rc2 and one == two
    assert any(u["file"].endswith("zz_truncated.json.gz") for u in json.loads(one)["unreadable"])


@pytest.mark.slow
def test_an_unreachable_scheduler_is_one_line(capsys):
    pytest.importorskip("distributed")
    rc = cli.main(["ranks", "--traces", str(REC / "slow_rank"), "--scheduler", "tcp://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == 2 and "Dask scheduler" in err and len(err.strip().splitlines()) == 1
