import math

import pytest
import torch

from hwlab.core import measure as M
from hwlab.core import measure_graph as G


def test_timing_quantiles_and_spread():
    t = M.Timing(samples_ms=[1.0, 2.0, 3.0, 4.0, 100.0], timer="cpu-perf-counter", n_warmup=0)
    assert t.median_ms == 3.0
    assert t.p10_ms == pytest.approx(1.4)
    assert t.p90_ms == pytest.approx(61.6)
    assert t.spread_pct == pytest.approx(100 * (61.6 - 1.4) / 3.0)


def test_measurement_units():
    m = M.Measurement(name="x", t_ms=2.0, t_p10_ms=1.9, t_p90_ms=2.2, n_bytes=8 * 10**9,
                      n_flops=4 * 10**12, device="d", timer="t", n_rep=5,
                      ceiling_gbps=5000.0, ceiling_tflops=1000.0)
    assert m.gbps == pytest.approx(4000.0)          # 8 GB in 2 ms
    assert m.tflops == pytest.approx(2000.0)        # 4 TFLOP in 2 ms
    assert m.pct_of_bw_ceiling == pytest.approx(80.0)
    assert m.pct_of_flops_ceiling == pytest.approx(200.0)
    assert m.arithmetic_intensity == pytest.approx(500.0)
    assert "80% of 5,000 GB/s" in m.summary()
    back = M.Measurement.from_dict(m.to_dict())
    assert back == m


def test_rel_error_and_check_close():
    r = torch.randn(1000, dtype=torch.float64)
    assert M.rel_error(r, r) == 0.0
    noisy = r + 1e-3 * torch.randn(1000, dtype=torch.float64)
    assert 1e-4 < M.rel_error(noisy, r) < 1e-2
    with pytest.raises(M.CorrectnessError, match="exceeds tolerance"):
        M.check_close(noisy, r, tol=1e-5)
    nan = r.clone()
    nan[3] = float("nan")
    assert M.rel_error(nan, r) == math.inf
    with pytest.raises(M.CorrectnessError):
        M.check_close(nan, r, tol=1.0)
    with pytest.raises(M.CorrectnessError, match="shape"):
        M.rel_error(r[:10], r)


@pytest.mark.parametrize("chunk", [1, 7, 1000, 4096])
def test_rel_error_by_chunks_equals_the_whole_sum(chunk):
    # the path a GPU takes (sums on the device, a chunk at a time), run here on CPU tensors
    r = torch.randn(40, 25, dtype=torch.bfloat16)
    out = (r.double() + 1e-2 * torch.randn(40, 25, dtype=torch.float64)).to(torch.bfloat16)
    assert M.rel_error_chunked(out, r, chunk) == pytest.approx(M.rel_error(out, r), rel=1e-12)
    bad = out.clone()
    bad[39, 24] = float("inf")  # in the last chunk
    assert M.rel_error_chunked(bad, r, chunk) == math.inf
    assert M.rel_error_chunked(torch.zeros(3), torch.zeros(3), chunk) == 0.0


def test_refuses_zero_inputs_but_accepts_poisoned_outputs():
    with pytest.raises(M.InputError, match="constant"):
        M.refuse_constant_inputs([torch.randn(10), torch.zeros(100)])
    out = M.poison_(torch.empty(100))
    assert torch.isnan(out).all()
    M.refuse_constant_inputs([torch.randn(10), out])  # NaN poison is not "constant data"


@pytest.mark.parametrize("bytes_per_set,l2,expected", [
    (10 * 2**20, 60 * 2**20, 12),      # 2 x 60 MiB / 10 MiB
    (200 * 2**20, 60 * 2**20, 1),      # already past 2x L2
    (1024, 60 * 2**20, M.MAX_ROTATING_SETS),
    (1024, None, 1),                   # unknown cache (CPU): no rotation
])
def test_rotating_sets(bytes_per_set, l2, expected):
    assert M.n_rotating_sets(bytes_per_set, l2) == expected


def test_bench_checks_before_timing_and_rejects_a_wrong_kernel():
    calls = []

    def wrong(x):
        calls.append(1)
        return x * 2.0001

    with pytest.raises(M.CorrectnessError):
        M.bench("wrong", wrong, lambda: (torch.randn(4096),), n_bytes=1,
                reference=lambda x: x * 2, tol=1e-6, device="cpu")
    assert len(calls) == 1  # checked once, never timed


def test_bench_uses_fresh_inputs_and_reports_cpu():
    seen = []

    def make():
        t = torch.randn(256)
        seen.append(t)
        return (t,)

    m = M.bench("double", lambda x: x * 2, make, n_bytes=2 * 256 * 4, reference=lambda x: x * 2,
                tol=1e-6, device="cpu", n_rep=7, n_warmup=1)
    assert m.timer == "cpu-perf-counter" and m.device.startswith("CPU")
    assert m.n_rep == 7 and m.rel_err == 0.0
    assert m.t_p10_ms <= m.t_ms <= m.t_p90_ms
    assert len({id(t) for t in seen}) == len(seen)


def test_time_fn_stops_at_the_time_budget():
    import time

    t = M.time_fn(lambda: time.sleep(0.02), [()], torch.device("cpu"), n_warmup=0,
                  n_rep=1000, max_total_s=0.1)
    assert 3 <= len(t.samples_ms) < 20


def test_a_slow_first_call_does_not_use_up_the_warm_up():
    """A first call that compiles for longer than the whole warm-up (0.3 s here, the warm-up 0.2 s)
    must not shorten it: warm-up then runs its full time on the steady calls, and the timed phase
    covers its minimum length (the compile must not inflate the per-call estimate). Under load every
    call gets slower, which lengthens both phases, so the bounds below hold on a busy machine."""
    import time as _time
    calls = []

    def fn(x):
        calls.append(_time.perf_counter())
        if len(calls) == 1:
            _time.sleep(0.3)  # the "compile"
        else:
            _time.sleep(0.001)
        return x

    t = M.time_fn(fn, [(torch.ones(2),)], torch.device("cpu"), n_warmup=5, n_rep=5,
                  warmup_s=0.2, min_run_s=0.2)
    n_timed = len(t.samples_ms)
    warm = calls[1:len(calls) - n_timed]
    assert warm and warm[-1] - calls[1] >= 0.15, f"warm-up after the compile lasted {warm[-1] - calls[1]:.3f} s"
    assert sum(t.samples_ms) >= 0.5 * 200, f"timed phase {sum(t.samples_ms):.0f} ms of a 200 ms minimum"


def test_a_minimum_run_without_warm_up_is_sized_by_the_first_call():
    """No warm-up (a function already warm: n_warmup=1, warmup_s=0) and a minimum run: the run is
    sized by the first, synchronised call, not by an empty warm-up (which made it fill the whole
    time budget: thousands of calls of a 45 ms model on a GPU)."""
    import time as _time

    def fn(x):
        _time.sleep(0.005)
        return x

    t = M.time_fn(fn, [(torch.ones(2),)], torch.device("cpu"), n_warmup=1, n_rep=1, warmup_s=0.0,
                  min_run_s=0.05, max_total_s=5.0)
    # at least the 5 ms each call sleeps: 0.05 s / 5 ms = 10 calls at most (fewer if the host is slow)
    assert 1 <= len(t.samples_ms) <= 10, len(t.samples_ms)


def test_size_that_does_not_fit_is_refused_before_allocating():
    with pytest.raises(M.InsufficientMemoryError, match="choose a smaller size"):
        M.require_memory(1 << 50, torch.device("cpu"), "a 1 PiB probe")


def test_one_quantile_definition_linear_weighted_and_nearest():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert M.quantile(xs, 0.5) == 3.0 and M.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert M.quantile(xs, 0.1) == pytest.approx(1.4) and M.quantile(xs, 0.0) == 1.0 and M.quantile(xs, 1.0) == 5.0
    # a weight is a count: the same as repeating the sample
    assert M.quantile([1.0, 10.0], 0.5, [3, 1]) == M.quantile([1.0, 1.0, 1.0, 10.0], 0.5) == 1.0
    assert M.quantile([1.0, 10.0], 0.9, [3, 1]) == pytest.approx(M.quantile([1.0, 1.0, 1.0, 10.0], 0.9))
    assert M.quantile([1.0, 10.0], 0.9, [3, 1]) == pytest.approx(1.0 + 9.0 * 0.7)
    # nearest rank: always one of the samples
    assert M.quantile([1.0, 10.0], 0.5, [99, 1], method="nearest") == 1.0
    assert M.quantile([1.0, 10.0], 0.995, [99, 1], method="nearest") == 10.0
    assert M.quantile([], 0.5) is None and M.quantile([1.0], 0.5, [0]) is None
    t = M.Timing(xs, "cpu-perf-counter", 0)
    assert (t.p10_ms, t.p90_ms) == (M.quantile(xs, 0.1), M.quantile(xs, 0.9))
    with pytest.raises(ValueError, match="weights"):
        M.quantile(xs, 0.5, [1, 2])


def test_graph_time_checks_before_timing_and_falls_back_to_eager_on_cpu():
    """The one CUDA-graph helper: the replay's output is checked before any timing, and on a
    CPU the same steps run eagerly and say so (graphed False)."""
    dev = torch.device("cpu")
    x = torch.randn(64, 64, dtype=torch.float64)
    calls = []

    def step():
        calls.append(1)
        return x @ x

    seen = []
    t, cap = G.graph_time(step, dev, check=lambda out: seen.append(M.rel_error(out, x @ x)), n_warmup=1, n_rep=3)
    assert cap.graphed is False and cap.graph is None and seen == [0.0]
    assert len(t.samples_ms) >= 3 and t.timer == "cpu-perf-counter" and all(s > 0 for s in t.samples_ms)
    assert len(calls) >= 2 + 1 + 3  # captured call, checked replay, warm-up and timed replays
    with pytest.raises(M.CorrectnessError):  # a wrong capture is refused before it is timed
        n_before = len(calls)
        G.graph_time(step, dev, check=lambda out: M.check_close(out, -out, 1e-3), n_rep=3)
    assert len(calls) == n_before + 2  # the capture and the checked replay only: nothing timed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_time_replays_a_cuda_graph():
    dev = torch.device("cuda")
    x = torch.randn(256, 256, device=dev)
    t, cap = G.graph_time(lambda: x @ x, dev, check=lambda out: M.check_close(out, x.double() @ x.double(), 1e-3))
    assert cap.graphed and t.timer == "cuda-event"
