"""Notebook 09 / exercise 05's checker on the real recordings: the H200 one-rank NCCL trace, the CPU
four-rank gloo traces, the ncu readings of the recorded H200 runs, recorded topology captures and the
H200 NCCL log. A right answer (derived here from the raw file, not from the checker) passes; a wrong
one fails with a message that does not give the right value away. The ncu CSV reader is tested on a
FORMAT fixture (tests/data/ncu_format/), made up and never shown to learners."""
import gzip
import json
import os
import re
import sys
from pathlib import Path

import pytest

from hwlab.core import evidence

from hwlab.traces import trace_events
from hwlab.course import reading_checks as C, reading_facts as F
from hwlab.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
TRACES = evidence.TRACES_DIR
GPU_TRACE = next((TRACES / "h200_nccl_one_rank").glob("*.pt.trace.json.gz"))
TOPO = evidence.RECORDED_DIR / "topology"
NCCL_LOG = evidence.RECORDED_DIR / "runs" / "straggler_nccl_h200" / "vm" / "nccl.764.log"
NB_RANKS, EX_RANKS = TRACES / "slow_rank", TRACES / "slow_link_tbf"


def _says(msg: str, value: float) -> bool:
    """Whether ``msg`` quotes ``value`` as it would be printed (integer, one or two decimals)."""
    nums = set(re.findall(r"\d+(?:\.\d+)?", msg))
    return bool({f"{value:.0f}", f"{value:.1f}", f"{value:.2f}"} & nums)


def _raw(path):
    return json.loads(gzip.open(path, "rt").read())["traceEvents"]


# ---------------------------------------------------------------- the GPU trace
def _gaps_from_raw():
    """The largest idle gap between device activities inside each host ProfilerStep, read from
    the raw events independently of the library."""
    ev = [e for e in _raw(GPU_TRACE) if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    dev = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])
    out = []
    for st in steps:
        inside = [e for e in dev if st["ts"] <= e["ts"] < st["ts"] + st["dur"]]
        out.append(max(b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(inside, inside[1:])))
    return sorted(out)


def test_gpu_trace_right_reading_passes_and_wrong_ones_teach():
    gaps = _gaps_from_raw()
    row = next(f"GPU {e['pid']} stream {e['tid']}" for e in _raw(GPU_TRACE) if e.get("cat") == "kernel")
    right = {"gap_us": gaps[len(gaps) // 2], "row": row, "sync_call": "cudaDeviceSynchronize"}
    assert C.check_gpu_trace(GPU_TRACE, right).status == "passed"
    assert C.check_gpu_trace(GPU_TRACE, None).status == "not done yet"
    # a GEMM's own duration is not the gap; the host thread is not the stream; an async copy does not block
    kernel_us = next(e["dur"] for e in _raw(GPU_TRACE) if e.get("cat") == "kernel")
    for wrong in ({**right, "gap_us": kernel_us}, {**right, "row": "host tid 852"},
                  {**right, "sync_call": "cudaMemcpyAsync"}, {**right, "gap_us": gaps[-1] * 3}):
        r = C.check_gpu_trace(GPU_TRACE, wrong)
        assert r.status == "wrong", wrong
        assert not _says(r.message, gaps[len(gaps) // 2]) and "cudaDeviceSynchronize" not in r.message
        assert row not in r.message


def test_trace_spans_refuse_what_is_not_a_small_trace(tmp_path, monkeypatch):
    with pytest.raises(UserInputError, match="not a regular file"):
        trace_events.read_spans(tmp_path)
    with pytest.raises(ValueError, match="host-only"):
        F.gpu_trace_facts(next(NB_RANKS.glob("*.json.gz")))
    monkeypatch.setattr(trace_events, "MAX_TRACE_BYTES", 100)
    with pytest.raises(UserInputError, match="streaming"):
        trace_events.read_spans(GPU_TRACE)


# ---------------------------------------------------------------- four ranks
def _gloo_ms(folder):
    """Per rank (from distributedInfo), each gloo:all_reduce span's duration in ms, from the raw files."""
    out = {}
    for p in folder.glob("*.pt.trace.json.gz"):
        d = json.loads(gzip.open(p, "rt").read())
        out[d["distributedInfo"]["rank"]] = sorted(e["dur"] / 1e3 for e in d["traceEvents"]
                                                   if e.get("name") == "gloo:all_reduce")
    return out


def test_rank_wait_right_reading_passes_and_the_late_rank_is_not_given_away():
    ms = _gloo_ms(NB_RANKS)
    med = {r: v[len(v) // 2] for r, v in ms.items()}
    late = min(med, key=med.get)
    early = sorted(v for r, vs in ms.items() if r != late for v in vs)
    right = {"late_rank": late, "wait_ms": early[len(early) // 2], "span": "gloo:all_reduce"}
    assert C.check_rank_wait(NB_RANKS, right).status == "passed"
    for wrong in ({**right, "late_rank": (late + 1) % 4}, {**right, "late_rank": "none"},
                  {**right, "span": "c10d::allreduce_"}, {**right, "wait_ms": med[late]}):
        r = C.check_rank_wait(NB_RANKS, wrong)
        assert r.status == "wrong", wrong
        assert f"rank {late}" not in r.message and not _says(r.message, early[len(early) // 2])
        assert not any(_says(r.message, m) for m in med.values())  # no rank's time inside, tried or not


def test_the_late_rank_agrees_with_hwlab_ranks_on_every_recorded_job():
    from hwlab.diagnosis import ranks_traces
    for name in ("slow_rank", "slow_link", "clean", "slow_link_tbf"):
        assert F.rank_wait_facts(TRACES / name)["late_ranks"] == ranks_traces.report(TRACES / name)["tail_ranks"], name


def test_host_gap_is_graded_on_the_ranks_own_steps():
    path = sorted(EX_RANKS.glob("*.pt.trace.json.gz"))[0]
    f = F.host_gap_facts(path)
    assert C.check_host_gap(path, {"gap_ms": f["gap_ms"]["median"]}).status == "passed"
    r = C.check_host_gap(path, {"gap_ms": f["gap_ms"]["median"] / 4})
    assert r.status == "wrong" and not _says(r.message, f["gap_ms"]["median"])


# ---------------------------------------------------------------- Nsight Compute
def _lab01(case):
    ev = json.loads((evidence.RECORDED_DIR / "h200" / "lab01_bandwidth.json").read_text())
    c, fe = ev["extra"]["counters"][case], ev["extra"]["flowchart_evidence"][case]
    est = fe["dram_pct_estimated"] * ev["ceilings"]["copy_gbps"] / 4800.0  # the H200 datasheet's HBM
    return {"dram_pct": round(c["dram_pct_of_peak"], 2), "sector_amplification": c["sector_amplification"],
            "estimate_pct_of_peak": round(est, 2)}, fe["dram_pct_estimated"]


def test_ncu_lab01_right_reading_passes_and_the_unconverted_estimate_fails():
    right, est_of_ceiling = _lab01("unfused")
    assert C.check_ncu_lab01("unfused", right).status == "passed"
    r = C.check_ncu_lab01("unfused", {**right, "estimate_pct_of_peak": est_of_ceiling})
    assert r.status == "wrong" and not _says(r.message, right["estimate_pct_of_peak"])
    # the strided case (exercise 05): the conversion moves its estimate by less than the reading's tolerance,
    # and the unconverted figure is still refused as unconverted
    right, est_of_ceiling = _lab01("strided")
    assert abs(est_of_ceiling - right["estimate_pct_of_peak"]) < C.NCU_TOL["estimate_pct_of_peak"]
    assert C.check_ncu_lab01("strided", right).status == "passed"
    for unconverted in (est_of_ceiling, round(est_of_ceiling, 2), round(est_of_ceiling, 1)):
        r = C.check_ncu_lab01("strided", {**right, "estimate_pct_of_peak": unconverted})
        assert r.status == "wrong" and "before the conversion" in r.message, unconverted
        assert not _says(r.message, right["estimate_pct_of_peak"])


def test_ncu_lab02_binding_limit_is_the_smallest_limit_row():
    ev = json.loads((evidence.RECORDED_DIR / "h200" / "lab02_registers.json").read_text())
    c = next(c for c in ev["extra"]["configs"] if c["report"]["config"] == "128x128x64 w4 s3")
    n = c["ncu"]
    limits = {k: v for k, v in n.items() if k.startswith("launch__occupancy_limit_")}
    low = min(limits.values())
    right = {"registers": n["launch__registers_per_thread"], "spills": c["report"]["n_spills"],
             "achieved_occupancy_pct": n["sm__warps_active.avg.pct_of_peak_sustained_active"],
             "binding_metric": next(k for k, v in limits.items() if v == low)}
    assert C.check_ncu_lab02("128x128x64 w4 s3", right).status == "passed"
    loose = next(k for k, v in limits.items() if v > low)
    r = C.check_ncu_lab02("128x128x64 w4 s3", {**right, "binding_metric": loose})
    assert r.status == "wrong" and not any(k in r.message for k, v in limits.items() if v == low)


def _raw_ncu_rows(name):
    """metric -> value per kernel ID of a recorded raw report, read with the csv module alone."""
    import csv
    text = (evidence.RECORDED_DIR / "h200" / "ncu" / f"{name}.csv").read_text()
    out = {}
    for r in csv.DictReader([ln for ln in text.splitlines() if ln.startswith('"')]):
        out.setdefault(r["ID"], {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    return out


RAW_CASES, RAW_TILES = ("lab01_strided", "lab01_coalesced"), ("lab02_128x128x64x4x3", "lab02_256x256x64x8x3")


def _raw_right(cases=RAW_CASES, tiles=RAW_TILES):
    """The right reading of the raw rows, from the CSV alone: sectors over requests, local loads + stores."""
    first = {c: next(iter(_raw_ncu_rows(c).values())) for c in cases}
    spr = {c: m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / m["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]
           for c, m in first.items()}
    local = {t: sum(m["l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"] + m["l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"]
                    for m in _raw_ncu_rows(t).values()) for t in tiles}
    spilling = max(local, key=local.get)
    return {"sectors_per_request": spr, "spilling_tile": spilling, "local_sectors": local[spilling]}


def test_raw_ncu_rows_reading_passes_and_wrong_readings_fail_without_the_value():
    right = _raw_right()
    spilling, other = right["spilling_tile"], next(t for t in RAW_TILES if t != right["spilling_tile"])
    assert C.check_ncu_raw(RAW_CASES, RAW_TILES, right).status == "passed"
    assert C.check_ncu_raw(RAW_CASES, RAW_TILES, None).status == "not done yet"
    loads_only = sum(m["l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"] for m in _raw_ncu_rows(spilling).values())
    values = [*right["sectors_per_request"].values(), right["local_sectors"]]
    for wrong in ({**right, "local_sectors": loads_only},  # the store row missed
                  {**right, "spilling_tile": other},
                  {**right, "sectors_per_request": {c: v / 8 for c, v in right["sectors_per_request"].items()}}):
        r = C.check_ncu_raw(RAW_CASES, RAW_TILES, wrong)
        assert r.status == "wrong"
        assert not any(_says(r.message, v) for v in values if v > 2)
    with pytest.raises(ValueError):  # two tiles that both spill, or neither, make no question
        C.check_ncu_raw(RAW_CASES, (other, other), right)


def test_raw_ncu_text_keeps_ncus_own_values_and_only_the_rows_asked_for():
    import csv
    name = RAW_CASES[0]
    text = F.ncu_raw_text(name, ("global_op_ld",))
    raw = (evidence.RECORDED_DIR / "h200" / "ncu" / f"{name}.csv").read_text()
    rows = list(csv.DictReader([ln for ln in raw.splitlines() if ln.startswith('"')]))
    kept = [r for r in rows if "global_op_ld" in r["Metric Name"]]
    assert kept and all(re.search(rf"{re.escape(r['Metric Name'])}\s.*\s{re.escape(r['Metric Value'])}$", text, re.M)
                        for r in kept)
    assert len(text.splitlines()) == 1 + len(kept) and "local_op" not in text
    with pytest.raises(KeyError):
        F.ncu_raw("lab03_nothing")


def test_ncu_csv_reader_on_the_format_fixture():
    rows = F.ncu_report((ROOT / "tests/data/ncu_format/FORMAT_FIXTURE_ncu_csv.csv").read_text())
    assert [r["kernel"] for r in rows] == ["kernel_a", "kernel_b"]
    assert [r["sectors_per_request"] for r in rows] == [4.0, 32.0]  # 400/100 and 3,200/100
    assert [r["local_sectors"] for r in rows] == [0.0, 50.0]
    assert rows[1]["limits"] == {"registers": 1.0, "shared_mem": 2.0} and rows[0]["duration_ns"] == 1000.0


def test_the_raw_ncu_report_names_the_recording_it_waits_for(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RECORDED_DIR", tmp_path)
    assert "tools/record_ncu_h200.py" in F.ncu_report_waits()
    (tmp_path / "h200" / "ncu").mkdir(parents=True)
    (tmp_path / "h200" / "ncu" / "lab01_strided.csv").write_text("")
    assert F.ncu_report_waits() is None


# ---------------------------------------------------------------- topology and NCCL
def test_slow_pairs_on_a_recorded_capture():
    text = (TOPO / "dgx1_v100_hybrid_cube_mesh.txt").read_text()
    # the matrix rows as printed: GPU0's row and GPU1's row, columns GPU4 and GPU5
    cells = {ln.split()[0]: ln.split()[1:9] for ln in text.splitlines() if ln.startswith("GPU")}
    sys_pairs = sorted((a, b) for a in (0, 1, 4, 5) for b in (0, 1, 4, 5) if a < b and cells[f"GPU{a}"][b] == "SYS")
    right = {"pairs": sys_pairs, "link": "SYS"}
    assert C.check_slow_pairs(text, [0, 1, 4, 5], right).status == "passed"
    r = C.check_slow_pairs(text, [0, 1, 4, 5], {"pairs": sys_pairs[:1], "link": "NV1"})
    assert r.status == "wrong" and "SYS" not in r.message and f"GPU{sys_pairs[1][0]}-GPU{sys_pairs[1][1]}" not in r.message


def test_nccl_path_from_the_recorded_h200_log():
    log = NCCL_LOG.read_text()
    gbps, typ = re.search(r"INFO GPU/\S+ :.*NET/\S+ \(\d+/([\d.]+)/(\w+)\)", log).groups()
    assert C.check_nccl_path(log, {"gbps": float(gbps), "type": typ}).status == "passed"
    for wrong in ({"gbps": 48.0, "type": typ}, {"gbps": 5000.0, "type": "LOC"}):
        r = C.check_nccl_path(log, wrong)
        assert r.status == "wrong" and f"{float(gbps):g} GB/s" not in r.message


# ---------------------------------------------------------------- exercise 05 is not notebook 09
def test_notebook_09_answers_fail_exercise_05():
    """Exercise 05 reads other recordings: notebook 09's right answers fail there."""
    ms = _gloo_ms(NB_RANKS)
    med = {r: v[len(v) // 2] for r, v in ms.items()}
    nb_ranks = {"late_rank": min(med, key=med.get), "wait_ms": sorted(med.values())[2], "span": "gloo:all_reduce"}
    assert C.check_rank_wait(NB_RANKS, nb_ranks).status == "passed"
    assert C.check_rank_wait(EX_RANKS, nb_ranks).status == "wrong"
    nb_lab01, _ = _lab01("unfused")
    assert C.check_ncu_lab01("strided", nb_lab01).status == "wrong"
    nb_lab02 = {"registers": 208, "spills": 0, "achieved_occupancy_pct": 12.44,
                "binding_metric": "launch__occupancy_limit_registers"}
    assert C.check_ncu_lab02("128x128x64 w4 s3", nb_lab02).status == "passed"
    assert C.check_ncu_lab02("256x256x64 w4 s2", nb_lab02).status == "wrong"
    nb_topo = {"pairs": [(0, 5), (1, 4)], "link": "SYS"}
    assert C.check_slow_pairs((TOPO / "dgx1_v100_hybrid_cube_mesh.txt").read_text(), [0, 1, 4, 5], nb_topo).passed
    assert C.check_slow_pairs((TOPO / "pcie4_2socket_pix_sys.txt").read_text(), [1, 2, 3], nb_topo).status == "wrong"


# ---------------------------------------------------------------- the notebook, answered
@pytest.mark.slow
def test_notebook_09_answered_right_passes_every_check(tmp_path):
    """Notebook 09 executed (nbclient) with right answers put in its learner cells: every check
    passes and shows the kit's reading; unanswered (tests/test_notebooks.py) it says "not done yet"."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    sys.path.insert(0, str(ROOT / "tools"))
    from nbwatch import execute_notebook
    ms = _gloo_ms(NB_RANKS)
    med = {r: v[len(v) // 2] for r, v in ms.items()}
    late = min(med, key=med.get)
    early = sorted(v for r, vs in ms.items() if r != late for v in vs)
    gaps = _gaps_from_raw()
    lab01, _ = _lab01("unfused")
    log = NCCL_LOG.read_text()
    gbps, typ = re.search(r"INFO GPU/\S+ :.*NET/\S+ \(\d+/([\d.]+)/(\w+)\)", log).groups()
    answers = {
        "MY_TRACE": {"gap_us": gaps[len(gaps) // 2], "row": "GPU 0 stream 7", "sync_call": "cudaDeviceSynchronize"},
        "MY_RANKS": {"late_rank": late, "wait_ms": early[len(early) // 2], "span": "gloo:all_reduce"},
        "MY_NCU_LAB1": lab01,
        "MY_NCU_LAB2": {"registers": 208, "spills": 0, "achieved_occupancy_pct": 12.44,
                        "binding_metric": "launch__occupancy_limit_shared_mem"},
        "MY_TOPO": {"pairs": [(0, 5), (1, 4)], "link": "SYS"},
        "MY_NCCL": {"gbps": float(gbps), "type": typ},
        "MY_NCU_RAW": _raw_right(),
    }
    nb = nbformat.read(ROOT / "notebooks" / "09_reading_tools.ipynb", as_version=4)
    filled = 0
    for c in nb.cells:
        if "learner" in c.metadata.get("tags", []):
            c.source = "\n".join(f"{k} = {answers[k]!r}" for k in answers if re.search(rf"^{k} = None", c.source, re.M))
            filled += c.source.count(" = ")
    assert filled == len(answers)
    execute_notebook(nb, cwd=ROOT / "notebooks", cell_timeout_s=300, label="reading_checks__09_answered")
    out = "\n".join(o.get("text", "") + o.get("data", {}).get("text/markdown", "")
                    for c in nb.cells for o in c.get("outputs", []))
    assert "Traceback" not in out and ": wrong." not in out and "not done yet" not in out
    assert out.count(": passed.") == 7


# ---------------------------------------------------------------- opt-in: other projects' real traces
FOREIGN = os.environ.get("HWLAB_FOREIGN_TRACES")


@pytest.mark.skipif(not FOREIGN, reason="set HWLAB_FOREIGN_TRACES to HolisticTraceAnalysis' tests/data to run")
def test_sync_points_and_streams_on_foreign_traces():
    """HolisticTraceAnalysis' CUDA-event-sync traces (read locally, never committed): every blocking
    call in the raw file is found, every stream with kernels is a device row."""
    found = 0
    for p in sorted(Path(FOREIGN).glob("critical_path/cuda_event_sync*/*.json.gz")):
        raw = [e for e in _raw(p) if e.get("ph") == "X"]
        f = F.gpu_trace_facts(p)
        assert set(f["sync_calls"]) == {e["name"] for e in raw if e["name"] in trace_events.SYNC_CALLS}
        assert set(f["device_rows"]) == {f"GPU {e['pid']} stream {e['tid']}" for e in raw if e.get("cat") == "kernel"}
        found += 1
    assert found, f"no critical_path/cuda_event_sync*/ traces under {FOREIGN}"


# ---------------------------------------------------------------- the recording that waits
def _tool():
    import importlib.util
    spec = importlib.util.spec_from_file_location("record_ncu_h200", ROOT / "tools" / "record_ncu_h200.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_ncu_recording_tool_profiles_the_recorded_cases_and_refuses_before_running(tmp_path, monkeypatch):
    from hwlab.labs.bandwidth import LOADS_PER_ELEMENT
    from hwlab.labs.registers.tiles import TileConfig
    tool = _tool()
    ev = json.loads((evidence.RECORDED_DIR / "h200" / "lab02_registers.json").read_text())
    # the raw reports pair with the recorded summaries: the same Lab 1 cases and Lab 2 tiles
    assert set(tool.LAB01_CASES) == set(LOADS_PER_ELEMENT)
    assert {TileConfig.parse(c).label for c in tool.LAB02_CONFIGS} == {c["report"]["config"] for c in ev["extra"]["configs"]}
    assert all(a[a.index("-m") + 1] in ("hwlab.labs.bandwidth", "hwlab.labs.registers") for _, a in tool.targets())
    from hwlab.core import ncu
    name, args = tool.targets()[0]
    cmd = ncu.command(args, ncu.REPORT_METRICS, tool.NVTX_RANGE)
    assert cmd[:4] == ["ncu", "--clock-control", "none", "--csv"]  # the card's clocks are left alone
    assert cmd[-len(args) - 1:] == [sys.executable, *args] and f"{tool.NVTX_RANGE}/" in cmd
    assert set(ncu.MEMORY_METRICS + ncu.LOCAL_METRICS + ncu.OCCUPANCY_METRICS) <= set(cmd[cmd.index("--metrics") + 1].split(","))
    (tmp_path / "ncu").mkdir()
    (tmp_path / "ncu" / "lab01_strided.csv").write_text("kept")
    assert tool.main(["--out", str(tmp_path)]) == 2  # never replaces a report silently
    assert (tmp_path / "ncu" / "lab01_strided.csv").read_text() == "kept"
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu here
    assert tool.main(["--out", str(tmp_path / "fresh")]) == 2 and not (tmp_path / "fresh" / "ncu" / "MANIFEST.json").exists()


def test_every_ncu_target_runs_as_a_module():
    """ncu launches each target as ``python -m MODULE``: a lab turned into a package needs its __main__."""
    import subprocess
    for mod in sorted({a[a.index("-m") + 1] for _, a in _tool().targets()}):
        r = subprocess.run([sys.executable, "-m", mod, "--help"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert r.returncode == 0 and "usage" in r.stdout, (mod, r.stderr[-500:])


@pytest.mark.parametrize("rel", ["notebooks/09_reading_tools.py", "exercises/ex05_reading_tools.py"])
def test_each_answer_cell_precedes_the_check_that_shows_the_kits_reading(rel):
    """The kit's reading is in the check's result: every check reads MY_* names that a learner cell
    (tagged, marked `# YOUR CODE HERE`) set earlier in the notebook, none set anywhere else."""
    jupytext = pytest.importorskip("jupytext")
    cells = jupytext.read(ROOT / rel).cells
    answered, checks = set(), 0
    for c in cells:
        if c.cell_type != "code":
            continue
        names = set(re.findall(r"\b(MY_[A-Z0-9_]+)\b", c.source))
        if "learner" in c.metadata.get("tags", []):
            assert "# YOUR CODE HERE" in c.source and " = None" in c.source
            answered |= set(re.findall(r"^(MY_[A-Z0-9_]+) = None", c.source, re.M))
        elif "check_" in c.source:
            checks += len(re.findall(r"check\.check_\w+\(", c.source))
            assert names and names <= answered, f"{rel}: a check reads {names - answered} before its answer cell"
        else:
            assert not names, f"{rel}: {names} used outside an answer or check cell"
    assert checks >= 5
