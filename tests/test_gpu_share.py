"""Measurements that know the GPU is shared, from constructed NVML states (tests/data/gpu_share/, each
labelled "constructed": built from the H200's real snapshot with a neighbour added, not captured):
a second compute process marks the measurement SHARED and the walk and the checkpoint say so; a quiet
GPU does not; a container's unmatched pids are judged by count; a MIG 1g.18gb slice scales the
datasheet peaks and keys the ceiling cache by the slice. MPS clients (their own NVML list), a
neighbour seen only in the driver's per-process utilisation, no process listed at all (unknown) and
a MIG slice addressed by index give SHARED, SHARED, unknown and the slice's own peaks."""
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hwlab.core import ceilings, evidence, gpu_share, specs
from hwlab.core.measure import Measurement, bench
from hwlab.core.roofline import evidence_from_measurement
from hwlab.course import checkpoint as C
from hwlab.diagnosis import flowchart
from hwlab.labs import bandwidth as lab

DATA = Path(__file__).parent / "data" / "gpu_share"


class NotSupported(Exception):
    """Stands for pynvml.NVMLError_NotSupported."""


class FakeNvml:
    """pynvml as the kit calls it, answering from a constructed state; each process-list read moves
    to the next sample (the last one repeats)."""

    def __init__(self, state: dict):
        self.state, self.i = state, -1

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.state["devices"][str(i)]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.state["devices"][uuid]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def _sample(self):
        return self.state["samples"][min(max(self.i, 0), len(self.state["samples"]) - 1)]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.i += 1
        return [SimpleNamespace(pid=_pid(p), usedGpuMemory=int(p["used_mib"] * 2**20))
                for p in self._sample()["processes"]]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=_pid(p), usedGpuMemory=int(p["used_mib"] * 2**20))
                for p in self._sample().get("mps", [])]

    def nvmlDeviceGetProcessUtilization(self, h, since_us):
        got = self.state.get("process_util")
        if got is None:
            raise NotSupported("no per-process utilisation sample")
        return [SimpleNamespace(pid=_pid(p), smUtil=p["smUtil"], memUtil=p["memUtil"]) for p in got]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return len(h.get("mig_slices", []))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        return self.state["devices"][h["mig_slices"][i]]

    def nvmlDeviceGetUtilizationRates(self, h):
        u = self._sample()["util"]
        if u is None:
            raise NotSupported("utilisation is not supported on a MIG device")
        return SimpleNamespace(**u)

    def nvmlDeviceGetMigMode(self, h):
        if h["mig_mode"] is None:
            raise NotSupported("not a whole GPU")
        return h["mig_mode"]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return h["is_mig"]


def _pid(p: dict) -> int:
    return os.getpid() if p["pid"] == "SELF" else p["pid"]


def _watch(name: str, monkeypatch, seconds: float = 0.35) -> dict | None:
    state = json.loads((DATA / name).read_text())
    assert state["constructed"]  # labelled: a constructed state, not a capture
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", state["cuda_visible_devices"])
    with gpu_share.Watch(0, interval_s=0.05, pynvml=FakeNvml(state)) as w:
        time.sleep(seconds)  # the measurement
    return w.result


def test_a_second_process_marks_the_measurement_shared(monkeypatch):
    share = _watch("second_process_h200.json", monkeypatch)
    assert share["shared"] is True and share["pids_matched"] is True and share["n_samples"] >= 3
    assert share["others"] == [{"pid": 424242, "used_mib": pytest.approx(30534.0)}]
    assert share["util_gpu_pct_max"] == 100.0 and share["mig_mode"] is False
    line = gpu_share.note(share)
    assert line.startswith("SHARED GPU") and "pid 424242 (30,534 MiB)" in line and "up to 100%" in line


def test_a_quiet_gpu_is_not_shared_and_a_cpu_claims_nothing(monkeypatch):
    quiet = _watch("quiet_h200.json", monkeypatch)
    assert quiet["shared"] is False and quiet["others"] == [] and gpu_share.note(quiet) == ""
    m = bench("cpu copy", lambda a: a.clone(), lambda: (torch.randn(1 << 12),), n_bytes=2 * 4 << 12, n_rep=3)
    assert m.gpu_share is None  # no NVML read on a CPU: unknown, never "quiet"


def test_a_container_that_hides_our_pid_is_judged_by_count(monkeypatch):
    share = _watch("container_two_processes_h200.json", monkeypatch)
    assert share["pids_matched"] is False and share["shared"] is True
    assert [o["pid"] for o in share["others"]] == [91001, 91002]
    one = gpu_share.judge([{"processes": [{"pid": 91001, "used_mib": 10.0}]}], pids={7})
    assert one["shared"] is False  # one unmatched process is taken to be this one


def test_mps_clients_are_read_from_their_own_list(monkeypatch):
    share = _watch("mps_h200.json", monkeypatch)
    assert share["shared"] is True and share["pids_matched"] is True
    assert [o["pid"] for o in share["others"]] == [424242]


def test_a_neighbour_between_two_reads_is_seen_in_the_drivers_utilisation_samples(monkeypatch):
    share = _watch("brief_neighbour_h200.json", monkeypatch)
    assert share["shared"] is True and share["others"] == [{"pid": 515151, "used_mib": None}]
    assert "pid 515151" in gpu_share.note(share)


def test_no_process_listed_at_all_is_unknown_not_quiet(monkeypatch):
    share = _watch("no_processes_h200.json", monkeypatch)
    assert share["shared"] is None and share["n_samples"] >= 2 and gpu_share.note(share) == ""


def test_a_mig_slice_addressed_by_index_is_found_and_keeps_its_own_peaks(monkeypatch):
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    share = _watch("mig_by_index_h200.json", monkeypatch)
    assert share["device"] == "NVIDIA H200 MIG 1g.18gb" and share["mig_device"] is True
    assert share["shared"] is False and share["util_gpu_pct_max"] is None
    whole, sl = specs.lookup("NVIDIA H200"), specs.lookup(share["device"])
    assert sl.hbm_gbps == pytest.approx(whole.hbm_gbps / 8)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "MIG-5d0b4a1e-8f5e-5c39-9a5e-3f1a1c2b7d10")
    assert _watch("mig_by_index_h200.json", monkeypatch)["uuid"] == "MIG-5d0b4a1e-8f5e-5c39-9a5e-3f1a1c2b7d10"


def _shared_lab01(share):
    rec = evidence.recorded("lab01_bandwidth")
    res = lab.result_from_evidence(rec)
    m = res.measurements["unfused"]
    m.gpu_share = share
    return m, evidence_from_measurement(m, ceiling_gbps=res.params["ceiling_gbps"],
                                        bytes_moved=m.params.get("bytes_moved"),
                                        **{k: v for k, v in res.evidence["unfused"].items()
                                           if k not in ("slowdown_vs_floor", "dram_pct_estimated", "metric_spreads")})


def test_the_walk_on_a_shared_measurement_says_so_beside_every_answer(monkeypatch):
    share = _watch("second_process_h200.json", monkeypatch)
    m, ev = _shared_lab01(share)
    assert "SHARED GPU" in m.summary()
    d = flowchart.diagnose(ev)
    assert d.leaf_id and d.steps
    lines = d.explain().splitlines()
    step_lines = [ln for ln in lines if ln[:2] in {f"{s.question}." for s in d.steps}]
    assert len(step_lines) == len(d.steps) and all("[SHARED GPU" in ln for ln in step_lines)
    assert any(ln.startswith("=>") and "[SHARED GPU" in ln for ln in lines)
    assert "pid 424242" in lines[-1] and "quiet GPU" in lines[-1]
    assert d.compact().count("SHARED") == len(d.steps) and d.to_dict()["shared"]["others"][0]["pid"] == 424242
    quiet = flowchart.diagnose({k: v for k, v in ev.items() if k != "gpu_shared"})
    assert quiet.leaf_id == d.leaf_id and "SHARED" not in quiet.explain() and quiet.shared is None


def test_a_checkpoint_graded_on_a_shared_run_says_the_figure_may_differ(monkeypatch):
    share = _watch("second_process_h200.json", monkeypatch)
    _, ev = _shared_lab01(share)
    walk = flowchart.diagnose(ev)
    wrong_leaf = next(x for x in ("L", "G", "J") if x != walk.leaf_id)
    assert "SHARED GPU" in C.render_evidence(ev).splitlines()[-1]
    res = C.check(C.Checkpoint("01", walk, ev), C.Answer(wrong_leaf, "x", 1.0), record=False)
    assert res.status == C.WRONG and "SHARED GPU" in res.messages[-1] and "quiet run" in res.messages[-1]
    quiet_ev = {k: v for k, v in ev.items() if k != "gpu_shared"}
    res = C.check(C.Checkpoint("01", flowchart.diagnose(quiet_ev), quiet_ev), C.Answer(wrong_leaf, "x", 1.0),
                  record=False)
    assert not any("SHARED" in msg for msg in res.messages) and "SHARED" not in C.render_evidence(quiet_ev)


def test_a_mig_1g_slice_scales_the_peaks_and_keys_its_own_ceilings(monkeypatch):
    share = _watch("mig_1g18gb_h200.json", monkeypatch)
    assert share["shared"] is False and share["mig_device"] is True and share["util_gpu_pct_max"] is None
    whole, sl = specs.lookup("NVIDIA H200"), specs.lookup(share["device"])
    assert specs.mig_fractions("1g.18gb", whole) == (1, 1)
    assert sl.hbm_gbps == pytest.approx(whole.hbm_gbps / 8) and sl.l2_mib == pytest.approx(whole.l2_mib / 8)
    assert sl.bf16_tflops == pytest.approx(whole.bf16_tflops / 7) and sl.fp8_tflops == pytest.approx(whole.fp8_tflops / 7)
    assert specs.MIG_SOURCE in sl.sources and "1/7" in specs.MIG_SOURCE
    big = specs.lookup("NVIDIA H200 MIG 3g.71gb")
    assert big.hbm_gbps == pytest.approx(whole.hbm_gbps / 2) and big.bf16_tflops == pytest.approx(whole.bf16_tflops * 3 / 7)
    assert specs.lookup("NVIDIA H200") is whole  # a whole GPU keeps its datasheet peaks
    dev = torch.device("cuda", 0)  # only named: nothing runs on it
    assert ceilings.mig_slice_key(dev) == "-" + share["uuid"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert ceilings.mig_slice_key(dev) == ""


def test_a_shared_measurement_round_trips_and_a_shared_ceiling_is_not_cached(monkeypatch):
    share = _watch("second_process_h200.json", monkeypatch)
    m = Measurement("hbm_copy[torch]", 1.0, 0.99, 1.01, 10**9, 0, "NVIDIA H200", "cuda-event", 50, gpu_share=share)
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))).gpu_share == share
    band = {"t_ms": 1.0, "t_p10_ms": 0.99, "t_p90_ms": 1.01, "n_rep": 50, "params": {}}
    fresh = ceilings.Ceilings("NVIDIA H200", copy_gbps=2000.0, bands={"copy": {**band, "gpu_share": share}})
    prev = ceilings.Ceilings("NVIDIA H200", copy_gbps=4000.0, bands={"copy": band})
    used, cacheable, kept = ceilings.to_cache(fresh, prev)
    assert used.copy_gbps == 4000.0 and "SHARED" in kept[0]["why"] and "424242" in kept[0]["why"]
    used, cacheable, kept = ceilings.to_cache(fresh, None)
    assert cacheable is False


TOOL = Path(__file__).resolve().parents[1] / "tools" / "record_shared_gpu.py"
RECORDED_DIR = Path(__file__).resolve().parents[1] / "src" / "hwlab" / "recorded"


@pytest.mark.slow
def test_the_shared_gpu_recorder_says_no_gpu_and_writes_nothing_on_a_cpu(tmp_path):
    import subprocess
    import sys
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the recorder would measure")
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(TOOL.parents[1] / "src")})
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def _child(pid: int, other: int | None, gbps_t_ms: float) -> dict:
    procs = [{"pid": pid, "used_mib": 4714.3}] + ([{"pid": other, "used_mib": 4714.3}] if other else [])
    share = gpu_share.judge([{"processes": procs, "util_gpu_pct": 100.0}], pids={pid})
    m = Measurement("hbm_copy[torch]", gbps_t_ms, gbps_t_ms, gbps_t_ms, 2 * 2**31, 0, "NVIDIA H200",
                    "cuda-event", 100, gpu_share=share)
    return {"pid": pid, "measurement": json.loads(json.dumps(m.to_dict()))}


def test_the_recorder_summary_needs_both_marks_and_each_pid_beside_the_other():
    import importlib.util
    spec = importlib.util.spec_from_file_location("record_shared_gpu", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    quiet = _child(10, None, 1.0)
    s = tool.summary(quiet, [_child(11, 12, 2.0), _child(12, 11, 2.0)])  # constructed: each sees the other
    assert s["quiet"]["shared"] is False and s["both_marked_shared"] and s["each_saw_the_other"]
    assert s["pair_copy_pct_of_quiet"] == [pytest.approx(50.0)] * 2
    s = tool.summary(quiet, [_child(11, 12, 2.0), _child(12, None, 2.0)])
    assert not s["both_marked_shared"] and not s["each_saw_the_other"]


@pytest.mark.parametrize("machine", ["h200", "h100"])
def test_the_recorded_pair_on_a_gpu_was_marked_shared(machine):
    recorded = RECORDED_DIR / "runs" / f"shared_gpu_{machine}" / "shared_gpu.json"
    if not recorded.exists():
        pytest.skip(f"no recorded shared_gpu.json on the {machine} yet: tools/record_shared_gpu.py there makes it")
    rec = json.loads(recorded.read_text())
    assert machine.upper() in rec["device"] and rec["quiet"]["measurement"]["timer"] == "cuda-event"
    assert rec["quiet"]["shared"] is False
    assert all(r["shared"] is True for r in rec["pair"]) and rec["each_saw_the_other"]
    for r in rec["pair"]:  # the mark is re-derived from what NVML showed, not taken from the record's flag
        share = r["measurement"]["gpu_share"]
        assert [o["pid"] for o in share["others"]] == r["others_seen"] and r["others_seen"]
