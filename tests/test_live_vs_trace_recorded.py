"""The trace reader held to the live walk on a GPU: each live examination recorded on a lent GPU
(``src/hwlab/recorded/runs/live_vs_trace_<machine>/``, ``tools/record_live_vs_trace.py``) is read
again here, on a CPU, from the trace its own profiler wrote, with the live record as ``--baseline``
(its measured ceilings and its cache). The GPU's L2, ceilings and kernels are not this machine's, so
a rule of the trace reader that only holds on the CPU the tests run on fails here."""
import gzip
import json
from pathlib import Path

import pytest

from hwlab.core.profiling import KIT_CACHE_BYTES_KEY
from hwlab.examine.from_trace import examine_trace

RUNS = Path(__file__).resolve().parents[1] / "src" / "hwlab" / "recorded" / "runs"
#: flowchart questions a live examination answers on figures no trace holds -> the metric it lacks
ONLY_LIVE = {"D": "e2e_slowdown"}
CASES = sorted(p for d in RUNS.glob("live_vs_trace_*") for p in d.glob("*.examine.json"))


def _agree(p_leaf, p_alts, q_leaf, q_alts) -> bool:
    return p_leaf == q_leaf or q_leaf in (p_alts or []) or p_leaf in (q_alts or [])


def test_a_gpu_recording_is_here():
    assert CASES, "no recorded live_vs_trace_<machine>/ run: tools/record_live_vs_trace.py on a GPU makes one"


@pytest.mark.parametrize("rec", CASES, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_the_trace_of_a_recorded_gpu_examination_reads_as_the_live_walk(rec, tmp_path):
    live = json.loads(rec.read_text())
    gz = rec.with_name(rec.name.replace(".examine.json", ".pt.trace.json.gz"))
    trace = tmp_path / gz.name[:-3]
    trace.write_bytes(gzip.decompress(gz.read_bytes()))
    assert json.loads(trace.read_text())[KIT_CACHE_BYTES_KEY] == live["counts"]["cache_bytes"]
    assert live["on_gpu"], "a GPU recording"
    tx = examine_trace(trace, baseline=str(rec))
    assert tx.on_gpu and tx.ceilings.source == "measured"
    assert tx.ceilings.cache_bytes == live["counts"]["cache_bytes"]  # the recording machine's, not this one's
    lp = {p["name"]: p for p in live["parts"]["parts"]}
    tp = {p.name: p for p in tx.parts.parts}
    walked = {n for n, p in lp.items() if p.get("leaf")}
    assert walked and walked <= set(tp), (sorted(lp), sorted(tp))
    for name in walked:
        p, q = lp[name], tp[name]
        assert abs(p["share_pct"] - q.share_pct) <= 5.0, (name, p["share_pct"], q.share_pct)
        if q.leaf_id is None and q.walk is not None and q.walk.undecided is not None:
            # what a trace cannot know: D is answered live on the wall clock per call against the device
            # time (e2e_slowdown), which no profiler trace holds; the trace's walk must stop there, on
            # the live walk's own path, and name what would decide it
            stop = q.walk.undecided.id
            assert stop in ONLY_LIVE, (name, stop, q.walk.path)
            assert p["path"][:len(q.walk.path)] == q.walk.path, (name, p["path"], q.walk.path)
            assert ONLY_LIVE[stop] in q.walk.explain(), q.walk.explain()
            continue
        assert _agree(p["leaf"], p.get("alternatives"), q.leaf_id, q.alternatives), (
            name, p.get("walk"), q.walk and q.walk.path)


def _fused_addmm_flops_per_call(trace: dict) -> float:
    """2*M*N*K of every aten::addmm (and the MLP's addmm fused with its activation) inside the encoder
    fast path's layer op, per examined call, from the raw JSON (bias [N], input [M, K], weight [K, N])."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    layers = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "aten::_transformer_encoder_layer_fwd"]
    calls = [e for e in ev if e.get("cat") == "user_annotation" and e.get("name") == "hwlab::examine_call"]
    tot = 0
    for e in ev:
        if e.get("name") in ("aten::addmm", "aten::_addmm_activation") and any(a <= e["ts"] <= b for a, b in layers):
            (_, (m, k), (_, n), *_) = e["args"]["Input Dims"]
            tot += 2 * m * n * k
    return tot / len(calls)


def test_the_encoder_fast_path_recorded_on_a_gpu_is_counted_inside_its_layers(tmp_path):
    """The H100 examination of examples/encoder_fastpath.py: its GEMM part's FLOPs are the addmm ops
    inside the fused layers (re-derived from the raw trace), live and read again from the trace, and
    the whole call's count holds them (the counter alone sees one op with none)."""
    rec = next((c for c in CASES if c.name.startswith("encoder_fastpath")), None)
    if rec is None:
        pytest.skip("no recorded encoder_fastpath examination")
    live = json.loads(rec.read_text())
    gz = rec.with_name(rec.name.replace(".examine.json", ".pt.trace.json.gz"))
    raw = json.loads(gzip.decompress(gz.read_bytes()))
    want = _fused_addmm_flops_per_call(raw)
    assert want > 0
    lg = next(p for p in live["parts"]["parts"] if p["name"].startswith("gemm"))
    assert lg["flops"] == pytest.approx(want, rel=1e-6) and lg["leaf"] == "I"
    assert live["counts"]["n_flops"] >= lg["flops"]
    trace = tmp_path / gz.name[:-3]
    trace.write_bytes(gzip.decompress(gz.read_bytes()))
    tx = examine_trace(trace, baseline=str(rec))
    tg = next(p for p in tx.parts.parts if p.name.startswith("gemm"))
    assert tg.flops == pytest.approx(want, rel=1e-6) and tg.leaf_id == "I"
    assert tx.evidence["matmul_flops"] == pytest.approx(live["counts"]["n_flops"], rel=1e-6)
