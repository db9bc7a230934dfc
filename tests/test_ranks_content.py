"""``hwlab ranks --traces``: hosts, clocks and arrival read from the traces' content, not their names.

Built rank sets (the fields torch.profiler writes): eight ranks of one host whose file names say
eight hosts, with 0-40 µs of clock jitter; a tie in the arrival vote; two unrelated runs in one
folder. Each expected answer follows from how the set was built (who starts each collective last)."""
import json
import random
from pathlib import Path

import pytest

from hwlab.diagnosis import ranks_traces
from hwlab.errors import UserInputError

N_STEPS, N_COLL = 6, 2  # collectives per step


def _write_rank(folder: Path, r: int, world: int | None, late_by, *, jitter_us: float = 0.0, device="NVIDIA H100 80GB HBM3",
                host: str | None = None, seed: int = 0, coll_name="ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                coll_us: float = 1000.0) -> None:
    """One rank: N_STEPS ProfilerSteps of 10 ms; per step a compute kernel then N_COLL all-reduces.
    ``late_by(step, k)`` -> µs this rank starts collective k of the step late (it arrives last);
    every collective ends at the same instant on every rank (plus jitter)."""
    rnd = random.Random(seed * 1000 + r)
    ev, corr = [], 1
    pid = 4000 + r
    for s in range(N_STEPS):
        t0 = 1_000_000.0 + s * 10_000.0
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{s}", "pid": pid, "tid": 1, "ts": t0,
                   "dur": 9_000.0, "args": {}})
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", "pid": r, "tid": 7,
                   "ts": t0 + 100, "dur": 3_000.0, "args": {"device": r, "stream": 7, "correlation": corr}})
        corr += 1
        for k in range(N_COLL):
            end = t0 + 5_000.0 + k * 1_500.0
            start = end - coll_us + late_by(s, k)
            j = rnd.uniform(0, jitter_us)
            ev.append({"ph": "X", "cat": "kernel", "name": coll_name, "pid": r, "tid": 20,
                       "ts": start + j, "dur": end - start, "args": {"device": r, "stream": 20, "correlation": corr}})
            corr += 1
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": i, "name": device} for i in range(8)],
           "traceEvents": ev}
    if world:
        doc["distributedInfo"] = {"rank": r, "world_size": world, "backend": "nccl"}
    name = f"{host or f'node{r}'}_{pid}.1733359000000000000.pt.trace.json"
    (folder / name).write_text(json.dumps(doc))


def _eight(tmp_path: Path, late_by, jitter_us: float = 0.0, coll_us: float = 1000.0) -> Path:
    d = tmp_path / "eight"
    d.mkdir()
    for r in range(8):
        _write_rank(d, r, 8, lambda s, k, r=r: late_by(r, s, k), jitter_us=jitter_us, coll_us=coll_us)
    return d


def test_one_host_by_content_names_the_last_arriver_despite_jitter(tmp_path):
    # rank 5 starts every collective 300 us late; file names say eight hosts; 0-40 us of jitter
    d = _eight(tmp_path, lambda r, s, k: 300.0 if r == 5 else 0.0, jitter_us=40.0)
    rep = ranks_traces.report(d)
    c = rep["collectives"]
    assert len(rep["hosts"]) == 8 and c["one_host_by_content"] and c["one_clock"]
    assert c["matched"] == N_STEPS * N_COLL  # every collective matched through the jitter
    assert c["last_arriver"]["rank"] == 5 and c["last_arriver"]["arrived_last"] == N_STEPS * N_COLL
    assert "the content says one" in " ".join(rep["notes"])
    # the header and the machine line say one host too, never the eight the file names suggest
    assert rep["machine"]["host"].startswith("one, by content") and "(the file names suggest 8)" in rep["machine"]["host"]
    assert "hosts one, by content" in ranks_traces.render(rep).splitlines()[0]


def test_a_tied_arrival_vote_names_the_tied_ranks_not_the_lowest(tmp_path):
    # ranks 3 and 6 take turns arriving last: each last in half the collectives
    d = _eight(tmp_path, lambda r, s, k: 300.0 if r == (3 if (s * N_COLL + k) % 2 else 6) else 0.0)
    rep = ranks_traces.report(d)
    la = rep["collectives"]["last_arriver"]
    assert la["rank"] is None and la["tied"] == [3, 6]
    assert rep["finding"]["kind"] == "arrival_tie" and [t["rank"] for t in rep["finding"]["tied"]] == [3, 6]
    assert ranks_traces.is_undecided(rep) and "ties" in rep["undecided"]


def test_unrelated_runs_in_one_folder_are_never_ok(tmp_path):
    a = tmp_path / "vendors"
    a.mkdir()
    _write_rank(a, 0, None, lambda s, k: 0.0, device="NVIDIA H100 80GB HBM3", host="boxa")
    _write_rank(a, 1, None, lambda s, k: 0.0, device="AMD Instinct MI300X", host="boxb")
    with pytest.raises(UserInputError, match="different devices"):
        ranks_traces.report(a)
    b = tmp_path / "same_gpu"
    b.mkdir()  # same GPU model, no distributedInfo, no collective in common
    _write_rank(b, 0, None, lambda s, k: 0.0, host="boxa", coll_name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    _write_rank(b, 1, None, lambda s, k: 0.0, host="boxb", coll_name="ncclDevKernel_Broadcast_RING_LL")
    rep = ranks_traces.report(b)
    assert ranks_traces.is_undecided(rep) and "not shown to be one job" in rep["undecided"]


def test_forty_us_of_jitter_still_matches_every_short_collective(tmp_path, monkeypatch):
    """20 µs collectives every rank enters together, each rank's clock read 0-40 µs off: strict
    overlap misses some; the jitter tolerance matches all (and without it, some are dropped)."""
    from hwlab.traces import rank_reading
    d = _eight(tmp_path, lambda r, s, k: 0.0, jitter_us=40.0, coll_us=20.0)
    c = ranks_traces.report(d)["collectives"]
    assert c["one_clock"] and c["methods"] == {rank_reading.BY_OVERLAP: N_STEPS * N_COLL}
    monkeypatch.setattr(rank_reading, "CLOCK_JITTER_US", 0.0)  # strict overlap: not every one on the clock
    c = ranks_traces.report(d)["collectives"]
    assert c["methods"].get(rank_reading.BY_OVERLAP, 0) < N_STEPS * N_COLL
