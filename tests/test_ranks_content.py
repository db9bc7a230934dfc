"""``hwlab ranks --traces``: hosts, clocks and arrival read from the traces' content, not their names.

Built rank sets (the fields torch.profiler writes): eight ranks of one host whose file names say
eight hosts, with 0-40 µs of clock jitter; a straggler by the wait it causes that is not last most
often; ties in the arrival vote; a rank that starts its steps late; unrelated runs in one folder.
Each expected answer follows from how the set was built (who starts each collective last, by how
much, and where each rank's step starts)."""
import json
import random
from pathlib import Path

import pytest

from hwlab.diagnosis import ranks_traces
from hwlab.errors import UserInputError

N_STEPS, N_COLL = 6, 2  # collectives per step


def _write_rank(folder: Path, r: int, world: int | None, late_by, *, jitter_us: float = 0.0, device="NVIDIA H100 80GB HBM3",
                host: str | None = None, seed: int = 0, coll_name="ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                coll_us: float = 1000.0, compute_us: float = 3000.0, step_lag_us: float = 0.0,
                t_shift_us: float = 0.0) -> None:
    """One rank: N_STEPS ProfilerSteps of 10 ms; per step a compute kernel then N_COLL all-reduces.
    ``late_by(step, k)`` -> µs this rank starts collective k of the step late (it arrives last);
    every collective ends at the same instant on every rank (plus jitter). ``step_lag_us``: the
    rank's ProfilerStep and compute kernel start that late, its step ending with the others'.
    ``t_shift_us`` moves the whole recording (another run, recorded later)."""
    rnd = random.Random(seed * 1000 + r)
    ev, corr = [], 1
    pid = 4000 + r
    for s in range(N_STEPS):
        t0 = 1_000_000.0 + t_shift_us + s * 10_000.0
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{s}", "pid": pid, "tid": 1, "ts": t0 + step_lag_us,
                   "dur": 9_000.0 - step_lag_us, "args": {}})
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", "pid": r, "tid": 7,
                   "ts": t0 + 100 + step_lag_us, "dur": compute_us, "args": {"device": r, "stream": 7,
                                                                            "correlation": corr}})
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


def _eight(tmp_path: Path, late_by, jitter_us: float = 0.0, coll_us: float = 1000.0, step_lag=lambda r: 0.0,
           compute_us: float = 3000.0) -> Path:
    d = tmp_path / "eight"
    d.mkdir()
    for r in range(8):
        _write_rank(d, r, 8, lambda s, k, r=r: late_by(r, s, k), jitter_us=jitter_us, coll_us=coll_us,
                    step_lag_us=step_lag(r), compute_us=compute_us)
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
    # ranks 3 and 6 take turns arriving last, 600 us late: each last in half the collectives
    d = _eight(tmp_path, lambda r, s, k: 600.0 if r == (3 if (s * N_COLL + k) % 2 else 6) else 0.0)
    rep = ranks_traces.report(d)
    la = rep["collectives"]["last_arriver"]
    assert la["rank"] is None and la["tied"] == [3, 6]
    f = rep["finding"]
    assert f["kind"] == "arrival_tie" and sorted(t["rank"] for t in f["tied"]) == [3, 6]
    assert all(t["own_ms"] > 0 and t["caused_wait_ms"] > 0 for t in f["tied"])
    assert ranks_traces.is_undecided(rep) and "ties" in rep["undecided"]
    assert "tied within" in ranks_traces.render(rep) and "ranks 3, 6" in rep["undecided"]


def test_the_vote_weighs_each_late_arrival_by_the_wait_it_causes(tmp_path):
    """Rank 2 is last at 7 of 12 collectives by 100 us; rank 5 at the other 5 by 1,300 us. One vote
    per collective names rank 2; the others waited 13x as long for rank 5, which is named."""
    def late(r, s, k):
        if r == 2 and (k == 0 or s == N_STEPS - 1):
            return 100.0
        return 1300.0 if r == 5 and k == 1 and s < N_STEPS - 1 else 0.0
    d = _eight(tmp_path, late, coll_us=1400.0)
    rep = ranks_traces.report(d)
    la = rep["collectives"]["last_arriver"]
    assert la["rank"] == 5 and la["arrived_last"] == N_STEPS - 1 and rep["per_rank"]["2"]["pct_arrived_last"] > 50
    by = la["caused_wait_by_rank_ms"]
    # the others' waits, from how the set was built: 7 ranks x 1.3 ms x 5 collectives against 7 x 0.1 x 7
    assert by["5"] == pytest.approx(7 * 1.3 * (N_STEPS - 1), rel=1e-6)
    assert by["2"] == pytest.approx(7 * 0.1 * (N_COLL * N_STEPS - (N_STEPS - 1)), rel=1e-6)
    f = rep["finding"]
    # its step starts with the others', so the lateness is in its own step: a slow rank, not a late start
    assert f["kind"] == "slow_rank" and f["rank"] == 5 and f["own_tail_pct"] >= ranks_traces.RANK_TAIL_PCT
    assert "the other ranks wait" in f["measured"] and ranks_traces.has_finding(rep)


def test_a_tie_by_wait_is_a_tie_whatever_the_counts(tmp_path):
    """Rank 3 is last at 8 collectives by 450 us, rank 6 at 4 by 900 us: the others waited as long
    for each (a count would name rank 3): a tie, both named, neither chosen."""
    def late(r, s, k):
        i = s * N_COLL + k
        return 450.0 if r == 3 and i < 8 else (900.0 if r == 6 and i >= 8 else 0.0)
    rep = ranks_traces.report(_eight(tmp_path, late))
    la = rep["collectives"]["last_arriver"]
    assert la["rank"] is None and la["tied"] == [3, 6]
    assert rep["per_rank"]["3"]["pct_arrived_last"] == pytest.approx(100 * 8 / 12)
    assert rep["finding"]["kind"] == "arrival_tie" and ranks_traces.is_undecided(rep)


def test_a_rank_that_starts_its_steps_late_is_named_and_the_walk_does_not_blame_the_link(tmp_path):
    """Rank 4 starts each step 2.5 ms late and arrives 1.3 ms late at the first collective; its own
    work is as long as the others'. Named as late, not slow; the walk does not end at L."""
    d = _eight(tmp_path, lambda r, s, k: 1300.0 if r == 4 and k == 0 else 0.0, coll_us=1400.0, compute_us=1000.0,
               step_lag=lambda r: 2500.0 if r == 4 else 0.0)
    rep = ranks_traces.report(d)
    f = rep["finding"]
    assert f["kind"] == "late_rank" and f["rank"] == 4 and f["own_tail_pct"] < ranks_traces.RANK_TAIL_PCT
    assert f["start_lag_ms"] == pytest.approx(2.5) and f["late_pct_of_step"] >= ranks_traces.RANK_TAIL_PCT
    assert f["share_of_wait_pct"] == pytest.approx(100.0)
    assert "before its recorded step" in f["why"] and rep["tail_ranks"] == [4] and ranks_traces.has_finding(rep)
    assert rep["flowchart"]["path"][-1] != "L" and rep["flowchart"]["evidence"]["rank_tail_pct"] < 10
    assert "LATE RANK: rank 4" in ranks_traces.render(rep)


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
    # no distributed info and no collective at all: two single-GPU runs
    c = tmp_path / "no_collectives"
    c.mkdir()
    for r, host in ((0, "boxa"), (1, "boxb")):
        _write_rank(c, r, None, lambda s, k: 0.0, host=host, coll_name="vectorized_elementwise_kernel")
    rep = ranks_traces.report(c)
    assert rep["collectives"]["matched"] == 0 and "no collective was found" in rep["undecided"]
    # no distributed info, the same collective on both, recorded an hour apart: matched by order only,
    # and one of them "arrives" 500 us late at every one -- still not shown to be one job
    e = tmp_path / "an_hour_apart"
    e.mkdir()
    _write_rank(e, 0, None, lambda s, k: 0.0, host="boxa")
    _write_rank(e, 1, None, lambda s, k: 500.0, host="boxb", t_shift_us=3_600e6)
    rep = ranks_traces.report(e)
    assert not rep["collectives"]["one_clock"] and rep["collectives"]["matched"] == N_STEPS * N_COLL
    assert ranks_traces.is_undecided(rep) and "no shared clock" in rep["undecided"]
    # two single-GPU runs that each state world size 1, rank 0: one rank stated twice is not one job
    w = tmp_path / "world_of_one_twice"
    w.mkdir()
    _write_rank(w, 0, 1, lambda s, k: 0.0, host="boxa")
    _write_rank(w, 0, 1, lambda s, k: 0.0, host="boxb", t_shift_us=3_600e6)
    rep = ranks_traces.report(w)
    assert ranks_traces.is_undecided(rep) and "rank 0 is stated by 2 different traces" in rep["undecided"]
    from hwlab import cli
    for folder in (b, c, e, w):  # never "OK": the CLI exits 4 (undecided), never 0
        assert cli.main(["ranks", "--traces", str(folder), "--json"]) == 4


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


def test_the_vote_and_finding_are_the_same_bytes_with_one_or_two_workers(tmp_path, capsys, monkeypatch):
    """The late-rank set (a finding) and a tie (undecided): --json identical at --workers 1 and 2."""
    from hwlab import cli
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the incident's opening time, fixed
    late = _eight(tmp_path, lambda r, s, k: 1300.0 if r == 4 and k == 0 else 0.0, coll_us=1400.0, compute_us=1000.0,
                  step_lag=lambda r: 2500.0 if r == 4 else 0.0)
    tie = tmp_path / "tie"
    late.rename(tmp_path / "late")
    _eight(tmp_path, lambda r, s, k: 600.0 if r == (3 if (s * N_COLL + k) % 2 else 6) else 0.0).rename(tie)
    for folder, rc in ((tmp_path / "late", 1), (tie, 4)):
        outs = []
        for w in (1, 2):
            assert cli.main(["ranks", "--traces", str(folder), "--json", "--workers", str(w)]) == rc
            outs.append(capsys.readouterr().out)
        assert outs[0] == outs[1] and json.loads(outs[0])["finding"]["kind"] in ("late_rank", "arrival_tie")
