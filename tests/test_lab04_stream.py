"""Lab 4's serving stream (continuous batching, per-row KV lengths), its per-path performance
report and the flowchart's measured B/D/K: the kernels in the interpreter, the stream live on
the CPU at tiny sizes, and the recorded H200 stream re-derived from its per-step data."""
import math

import pytest
import torch

import hwlab  # noqa: F401  (interpreter before triton)
from hwlab.diagnosis import flowchart
from hwlab.core.evidence import recorded
from hwlab.labs import fp8 as L
from hwlab.labs.fp8 import kernels as K

SMALL = [L.StreamSpec(24, 3, 6, (2, 5), seed=11)]


# ---------------------------------------------------------------- kernels with per-row lengths
@pytest.mark.parametrize("dt", [torch.float16, K.FP8])
def test_per_row_attention_matches_each_row_alone(dt):
    g = torch.Generator().manual_seed(5)
    B, H, T, D = 3, 2, 200, 16
    kc, vc = torch.randn(B, H, T, D, generator=g).to(dt), torch.randn(B, H, T, D, generator=g).to(dt)
    # positions past each row's length hold huge values: a row reading past its length is wrong
    lens = torch.tensor([1, 200, 70], dtype=torch.int32)
    for b, n in enumerate(lens.tolist()):
        kc[b, :, n:] = torch.full((H, T - n, D), 300.0).to(dt)
        vc[b, :, n:] = torch.full((H, T - n, D), 300.0).to(dt)
    q = torch.randn(B, H, 1, D, generator=g).half()
    s = torch.tensor(0.5)
    out = K.decode_attention(q, kc, vc, s, lens, use_triton=True, tile=K.AttnTile(64, 16))
    ref_rows = K.decode_attention_ref(q, kc, vc, s, lens)
    for b, n in enumerate(lens.tolist()):
        alone = K.decode_attention_ref(q[b:b + 1], kc[b:b + 1], vc[b:b + 1], s, n).float()
        assert (out[b:b + 1].float() - alone).abs().max() < 2e-3, (b, n)
        assert (ref_rows[b:b + 1].float() - alone).abs().max() < 1e-6
        assert alone.abs().max() < 50  # the poisoned tail was never read


def test_per_row_kv_store_writes_each_row_at_its_position():
    g = torch.Generator().manual_seed(6)
    B, H, T, D = 3, 2, 12, 16
    k, v = torch.randn(B, H, 1, D, generator=g).half(), torch.randn(B, H, 1, D, generator=g).half()
    pos = torch.tensor([0, 11, 5], dtype=torch.int32)
    for dt in (torch.float16, K.FP8):
        kc, vc = torch.zeros(B, H, T, D).to(dt), torch.zeros(B, H, T, D).to(dt)
        s = torch.tensor(0.01 if dt == K.FP8 else 1.0)
        K.kv_store(k, v, kc, vc, s, pos, use_triton=True)
        for b, p in enumerate(pos.tolist()):
            rel = (kc[b, :, p].float() * s - k[b, :, 0].float()).norm() / k[b, :, 0].float().norm()
            assert rel < (0.15 if dt == K.FP8 else 1e-6)  # e4m3; the interpreter truncates
            mask = torch.ones(T, dtype=torch.bool)
            mask[p] = False
            assert kc[b, :, mask].float().abs().max() == 0  # nothing else touched
    with pytest.raises(ValueError, match="int32 tensor"):
        K.kv_store(k, v, kc, vc, s, pos.long(), use_triton=True)
    with pytest.raises(ValueError, match="int32 tensor"):
        K.decode_attention(k, kc, vc, s, pos[:2], use_triton=True)


# ---------------------------------------------------------------- the stream, live on the CPU
@pytest.mark.slow
@pytest.mark.parametrize("path", L.SERVING_PATHS)
def test_continuous_batching_matches_decoding_each_request_alone(path):
    m = L.Decoder(L.TINY, path, device="cpu")
    assert L.stream.check_rows_step(m, 40) <= L.stream.ROWS_CHECK_TOL_FP8_ACT
    assert L.stream.check_rows_step(m, L.KV_FP8_FROM_CTX) <= L.stream.ROWS_CHECK_TOL_FP8_ACT  # fixed: FP8 KV cache


@pytest.mark.slow
def test_the_check_fails_when_rows_read_the_wrong_length(monkeypatch):
    rows = L.KVCache.rows

    def swapped(self, n):  # each row attends over another row's length
        v = rows(self, n)
        v.row_len = v.row_len.flip(0)
        return v

    monkeypatch.setattr(L.KVCache, "rows", swapped)
    with pytest.raises(AssertionError, match="disagrees with decoding each request alone"):
        L.stream.check_rows_step(L.Decoder(L.TINY, "bf16", device="cpu"), 40)


def test_percentile_is_nearest_rank_and_token_weighted():
    assert L.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert L.percentile([1.0, 10.0], 50, [99, 1]) == 1.0 and L.percentile([1.0, 10.0], 99.5, [99, 1]) == 10.0
    assert L.percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert L.percentile([], 50) is None


@pytest.fixture(scope="module")
def cpu_stream():
    return L.run_stream(L.TINY, SMALL, device="cpu")


@pytest.mark.slow
def test_stream_schedule_batches_change_and_every_token_is_served(cpu_stream):
    reqs = L.make_requests(SMALL[0])
    assert len({r.prompt_len for r in reqs}) > 1 and len({r.out_len for r in reqs}) > 1  # mixed lengths
    schedules = set()
    for p, v in cpu_stream["paths"].items():
        st = v["buckets"][0]["stream"]
        ns = [s["n"] for s in st["steps"]]
        assert max(ns) == SMALL[0].max_batch and min(ns) < max(ns)  # the batch drains as requests finish
        # every token after a request's first (from its prefill) comes from exactly one decode step
        assert sum(ns) + len(reqs) == st["n_tokens"] == sum(r.out_len for r in reqs)
        assert all(0 < s["kv_positions"] <= s["n"] * SMALL[0].max_len for s in st["steps"])
        assert all(r["ttft_ms"] > 0 for r in st["requests"]) and st["timer"] == "cpu perf_counter"
        assert st["rows_check_rel_err"] <= L.stream.ROWS_CHECK_TOL_FP8_ACT
        schedules.add(tuple((s["n"], s["kv_positions"]) for s in st["steps"]))
    assert len(schedules) == 1  # every path serves the same sequence of batches


def _tpot(st, q):
    return L.percentile([s["t_ms"] for s in st["steps"]], q, [s["n"] for s in st["steps"]])


def _check_report(res, copy_gbps):
    """Re-derive every path's report and the walk from the per-step and per-bucket data."""
    cfg = L.ModelConfig(**res["config"])
    for p in res["paths"]:
        rep = L.performance_report(res, p)
        assert rep["weight_bytes"] == res["paths"][p]["weight_bytes"]
        for i, (r, b) in enumerate(zip(rep["buckets"], res["paths"][p]["buckets"])):
            st, pr = b["stream"], b["profile"]
            assert r["tpot_ms_p50"] == _tpot(st, 50) and r["tpot_ms_p99"] == _tpot(st, 99)
            assert r["tpot_ms_p50"] <= r["tpot_ms_p99"] <= r["itl_ms_p99"]
            assert r["ttft_ms_p99"] == L.percentile([x["ttft_ms"] for x in st["requests"]], 99)
            assert r["dq_rq_per_token"] == (pr["quant_ranges"] + pr["dequant_ranges"]) / pr["batch"]
            assert (r["dq_per_token"], r["rq_per_token"]) == (pr["dequant_ranges"] / pr["batch"], pr["quant_ranges"] / pr["batch"])
            base = res["paths"]["bf16"]["buckets"][i]["stream"]
            assert r["tpot_p99_change_pct"] == pytest.approx(100 * (_tpot(st, 99) / _tpot(base, 99) - 1))
    walk = L.flowchart_evidence({"stream": res}, copy_gbps)
    for key, e in walk.items():
        p, _, ctx, xb = key.split()
        b = next(x for x in res["paths"][p]["buckets"] if x["profile"]["ctx"] == int(ctx))
        pr, st = b["profile"], b["stream"]
        kv8, B = pr["kv_fp8"], pr["batch"]
        floor_us = L.step_bytes(cfg, L.PATHS[p], B, B * (int(ctx) + 1), kv8) / copy_gbps / 1e3
        assert e["slowdown_vs_floor"] == pytest.approx(pr["breakdown"]["total_us"] / floor_us)
        pred = [L.step_bytes(cfg, L.PATHS[p], s["n"], s["kv_positions"], kv8, promised=True) / copy_gbps / 1e6
                * e["slowdown_vs_floor"] for s in st["steps"]]
        assert e["e2e_slowdown"] == pytest.approx(_tpot(st, 50) / L.percentile(pred, 50, [s["n"] for s in st["steps"]]))
        assert e["rank_tail_pct"] == 0.0 and e["n_ranks"] == 1
        assert not {"single_gpu_slow", "multi_gpu_or_service_slow", "rank_tail"} & set(e)  # nothing by hand
        assert set(e["metric_sources"]) >= {"slowdown_vs_floor", "e2e_slowdown", "rank_tail_pct"}
        d = flowchart.diagnose(e)
        assert d.steps[0].metric == "slowdown_vs_floor"  # B answered by the measured metric
    return walk


@pytest.mark.slow
def test_report_and_walk_rederive_from_a_cpu_run(cpu_stream):
    walk = _check_report(cpu_stream, copy_gbps=10.0)
    # mixed dequantizes its connector and head: more bytes than its FP8 weights promise
    cfg = L.ModelConfig(**cpu_stream["config"])
    assert L.step_bytes(cfg, L.PATHS["mixed"], 2, 50, False) > L.step_bytes(cfg, L.PATHS["mixed"], 2, 50, False, promised=True)
    assert L.step_bytes(cfg, L.PATHS["bf16"], 2, 2 * 33, False) == L.decode_bytes_for(cfg, L.PATHS["bf16"], 2, 32)
    assert set(walk) == {f"{p} ctx 24 x3" for p in L.SERVING_PATHS}
    text = L.format_report(L.performance_report(cpu_stream, "mixed"), "CPU")
    assert "ctx 24 x3" in text and "format conversion" in text


def test_rank_tail_is_computed_from_per_rank_steps():
    assert L.rank_tail_pct({0: [1.0, 1.2, 1.1]}) == 0.0
    assert L.rank_tail_pct({0: [1.0] * 5, 1: [1.0] * 5, 2: [1.5] * 5}) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="at least one rank"):
        L.rank_tail_pct({0: []})


def test_flowchart_evidence_refuses_a_run_without_a_stream():
    with pytest.raises(ValueError, match="no serving stream"):
        L.flowchart_evidence({"paths": {"bf16": {"buckets": [{"ctx": 1}]}}}, 1.0)


# ---------------------------------------------------------------- the recorded H200 stream
@pytest.fixture(scope="module")
def rec():
    ev = recorded("lab04_fp8")
    if "stream" not in ev.extra["run"]:
        pytest.skip("recorded lab04_fp8.json predates the serving stream: refresh_gpu_evidence.py --only lab04")
    assert ev.device == "NVIDIA H200" and ev.is_gpu
    return ev


def test_recorded_stream_rederives(rec):
    res = rec.extra["run"]["stream"]
    copy = rec.ceilings["copy_gbps"]
    walk = _check_report(res, copy)
    for k, e in rec.extra["flowchart_evidence"].items():
        assert walk[k]["slowdown_vs_floor"] == pytest.approx(e["slowdown_vs_floor"])
        assert walk[k]["e2e_slowdown"] == pytest.approx(e["e2e_slowdown"])
        assert rec.extra["flowchart_leaves"][k] == flowchart.diagnose(walk[k]).leaf_id
    for p, rep in rec.extra["stream_reports"].items():  # every recorded field re-derives (new ones may be added)
        again = L.performance_report(res, p)
        assert {k: again[k] for k in rep if k != "buckets"} == {k: v for k, v in rep.items() if k != "buckets"}
        for r, r2 in zip(rep["buckets"], again["buckets"]):
            assert r == {k: r2[k] for k in r}
    for st in (b["stream"] for v in res["paths"].values() for b in v["buckets"]):
        assert st["graph"] and st["timer"] == "cuda events"


def test_recorded_stream_every_bucket_profiled(rec):
    res = rec.extra["run"]["stream"]
    n = res["config"]["n_layers"] * 4 + 2
    ctxs = {p: [b["profile"]["ctx"] for b in v["buckets"]] for p, v in res["paths"].items()}
    assert len({tuple(c) for c in ctxs.values()}) == 1 and ctxs["bf16"] == [s.ctx for s in L.default_streams("cuda")]
    for p, v in res["paths"].items():
        for b in v["buckets"]:
            pr = b["profile"]
            assert pr["gemm_calls"] == n and pr["source"] == "torch.profiler kernel names", (p, pr["ctx"])
            assert (pr["fallback_gemms"] > 0) == (p == "mixed") and pr["dequant_ranges"] == pr["fallback_gemms"]
            spec = b["stream"]["spec"]
            assert pr["kv_fp8"] == (p == "fixed" and spec["ctx"] + spec["out_tokens"][1] >= L.KV_FP8_FROM_CTX)
    # the seed's breakdown: the mixed path's time moved into format conversion (dequantized weights)
    for bm, bx in zip(res["paths"]["mixed"]["buckets"], res["paths"]["fixed"]["buckets"]):
        assert bm["profile"]["breakdown"]["us"]["quant/dequant"] > 2 * bx["profile"]["breakdown"]["us"]["quant/dequant"]
    walk = rec.extra["flowchart_evidence"]
    for k, e in walk.items():
        assert e["n_ranks"] == 1 and e["rank_tail_pct"] == 0.0 and math.isfinite(e["e2e_slowdown"])
    # the fallbacks' bytes on top of the promise: mixed is further over its prediction than bf16
    for s in L.default_streams("cuda"):
        key = f"ctx {s.ctx} x{s.max_batch}"
        assert walk[f"mixed {key}"]["e2e_slowdown"] > walk[f"bf16 {key}"]["e2e_slowdown"]


def test_memory_guard_counts_the_stream_before_allocating():
    from hwlab.core.measure import InsufficientMemoryError

    with pytest.raises(InsufficientMemoryError, match="streams"):
        L.run(cfg=L.TINY, streams=[L.StreamSpec(2**34, 64, 1)], device="cpu")


@pytest.mark.slow
def test_refresh_part_lab04_records_the_stream_end_to_end_on_cpu(tmp_path):
    """The device command's own code path (tools/refresh_gpu_evidence.py, part lab04), run
    here at the lab's CPU sizes: the record carries the stream, the reports, the signature and
    the walk, and they re-derive from it."""
    import importlib.util
    import json
    from pathlib import Path

    from hwlab.core.evidence import load

    spec = importlib.util.spec_from_file_location(
        "refresh_gpu_evidence", Path(__file__).parents[1] / "tools" / "refresh_gpu_evidence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    summary: list[str] = []
    mod.part_lab04(tmp_path, summary)
    path = tmp_path / "lab04_fp8.json"
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    ev = load(path)
    assert not ev.is_gpu
    res = ev.extra["run"]["stream"]
    walk = _check_report(res, ev.ceilings["copy_gbps"])
    assert set(ev.extra["flowchart_evidence"]) == set(walk)
    for p, rep in ev.extra["stream_reports"].items():
        assert rep == L.performance_report(res, p)
    assert ev.extra["seed_signature"] == L.seed_signature(ev.extra["run"])
    assert any("lab04 walk mixed" in line for line in summary)
    # the tile every decoder ran with, as asdict(AttnTile), and the teaching kernels' checks
    assert ev.extra["kernel_config"] == {"chunk": 256, "block_t": 16, "num_warps": 1, "num_stages": 2}
    assert ev.extra["kernel_checks"]["decode_attention_fp8"] < K.FP8_CACHE_MATH_REL
