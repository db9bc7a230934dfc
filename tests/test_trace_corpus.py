"""Opt-in: the public trace corpus (tests/data/trace_corpus/) against its readings.

Runs where ``HWLAB_TRACE_CORPUS`` names a folder holding MANIFEST.json's files (each checked
against its sha256). Per trace: the kit's one kernel classification of the raw kernel events gives
the dominant part the reading names, at least the GEMM-class share the reading counted among the
longest kernels (within 2 points), communication found exactly where the reading found it (at least
its share where the reading gives one, and led by NCCL / RCCL kernels only where the reading says
NCCL: DeepEP or multimem communication is not NCCL's), and the reading's tensor-core / MFMA answer (where a
reading names a ``kit_gap``, the kit's known misreading of it, that check is an expected failure that fails once
the gap is gone); ``examine --trace`` answers, stops honestly (too little to
diagnose) or refuses with a line, never anything else."""
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from public_traces import MANIFEST, corpus_dir, sha256_ok

from hwlab.core.kernel_classes import classify_kernel
from hwlab.errors import UserInputError

READINGS = json.loads((MANIFEST.parent / "READINGS.json").read_text())["readings"]
NCCL_RULES = ("nccl", "rccl", "msccl")  # the rules (name fragments) of NCCL-family kernels
DEVICE_CATS = {"kernel": None, "Kernel": None, "gpu_memcpy": "gpu_memcpy", "Memcpy": "gpu_memcpy",
               "gpu_memset": "gpu_memset", "Memset": "gpu_memset"}
pytestmark = [pytest.mark.slow, pytest.mark.skipif(corpus_dir() is None, reason="set HWLAB_TRACE_CORPUS to the "
                                                   "folder holding tests/data/trace_corpus/MANIFEST.json's traces")]


def _trace(reading) -> Path:
    f = corpus_dir() / reading["file"]
    if not f.is_file():
        pytest.skip(f"{f} not in the corpus folder")
    assert sha256_ok(f, reading["file"]), f"{f}: sha256 differs from the manifest"
    return f


def _shares(f: Path):
    raw = f.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)  # some sources commit plain JSON
    per, tc_us, comm_us, total = Counter(), Counter(), Counter(), 0.0
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS:
            continue
        k = classify_kernel(str(e.get("name", "")), DEVICE_CATS[e["cat"]])
        us = float(e.get("dur", 0.0))
        per[k.part] += us
        total += us
        if k.gemm_class:
            tc_us[k.tensor_core] += us
        if k.cls == "communication":
            comm_us[k.rule in NCCL_RULES] += us
    return {p: 100.0 * v / total for p, v in per.items()} if total else {}, tc_us, comm_us


@pytest.mark.parametrize("reading", READINGS, ids=[r["file"].split("/")[-1][:40] for r in READINGS])
def test_each_corpus_trace_reads_as_its_reading(reading):
    shares, tc_us, comm_us = _shares(_trace(reading))
    dominant = max(shares, key=shares.get) if shares else None
    assert dominant in reading["dominant_part"], shares
    assert shares.get("gemm", 0.0) >= reading["gemm_class_pct_at_least"] - 2.0, shares
    assert (shares.get("communication", 0.0) > 0) == (reading["communication"] != "none"), shares
    assert shares.get("communication", 0.0) >= reading.get("communication_pct_at_least", 0.0) - 2.0, shares
    if comm_us:  # NCCL / RCCL leads the communication time exactly where the reading found NCCL
        assert (comm_us[True] > comm_us[False]) == (reading["communication"] == "nccl"), dict(comm_us)
    if reading["gemm_tensor_cores"] is not None and tc_us:
        got = max(tc_us, key=tc_us.get)
        if "kit_gap" in reading:  # a misreading reported to the lead: it must still hold, else the field goes
            assert got is not reading["gemm_tensor_cores"], f"kit_gap no longer holds, remove it: {reading['kit_gap']}"
            pytest.xfail(reading["kit_gap"])
        assert got is reading["gemm_tensor_cores"], dict(tc_us)


@pytest.mark.parametrize("reading", READINGS, ids=[r["file"].split("/")[-1][:40] for r in READINGS])
def test_examine_answers_or_stops_honestly_on_each_corpus_trace(reading):
    from hwlab.examine.from_trace import NothingToDiagnose, examine_trace
    f = _trace(reading)
    try:
        ex = examine_trace(f)
    except NothingToDiagnose as nothing:
        assert nothing.to_dict()["leaf"] is None
        return
    except UserInputError as e:  # a refusal is one line saying what to do
        assert "\n" not in str(e) and str(e)
        return
    names = {p.name for p in ex.parts.parts}
    assert "triton/compiled" not in names or any(k.startswith("triton") for w in ex.works for it in w.items
                                                 for k in [str(it["kernel"])])
    json.loads(ex.to_json())


RANK_SETS = json.loads((MANIFEST.parent / "READINGS.json").read_text()).get("rank_sets", [])


@pytest.mark.parametrize("rank_set", RANK_SETS, ids=[r["folder"].split("/")[-1] for r in RANK_SETS])
def test_ranks_reads_each_rank_set_as_its_reading(rank_set):
    """``ranks --traces`` on a corpus rank set: as many ranks and hosts as the reading found from
    the content (PIDs, device ids, collective end times), and the reading's last arriver named in the
    vote and the finding."""
    from hwlab.diagnosis import ranks_traces
    folder = corpus_dir() / rank_set["folder"]
    files = sorted(p for p in folder.glob("*") if p.is_file())
    if not files:
        pytest.skip(f"{folder} not in the corpus folder")
    rel = {str(p.relative_to(corpus_dir())) for p in files}
    assert rel <= {r["file"] for r in READINGS}, "a file of the set is not in the manifest"
    assert all(sha256_ok(p, str(p.relative_to(corpus_dir()))) for p in files)
    rep = ranks_traces.report(folder)
    c = rep["collectives"]
    assert len(rep["per_rank"]) == rank_set["ranks"]
    assert (rank_set["hosts"] == 1) == (len(rep["hosts"]) == 1 or bool(c["one_host_by_content"]))
    assert c["one_clock"] and c["last_arriver"]["rank"] == rank_set["last_arriver"]
    # the finding names the reading's straggler and says what it measured; one rank's late start
    # (its own work not longer) is not the link's: the walk does not end at L
    f = rep["finding"]
    assert f.get("rank") == rank_set["last_arriver"] and f["late_pct_of_step"] >= ranks_traces.RANK_TAIL_PCT
    if f["kind"] == "late_rank":
        assert rep["flowchart"]["leaf"] != "L" and "before its recorded step" in f["why"]
