"""``hwlab bundle`` (the archive, its manifest, the environment filter, the destination rules) and
the NVML sampler with NVML absent and with a recorded-shape fake (the pattern tests/test_system.py
uses for NVML)."""
import json
import os
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hwlab.cli import bundle
from hwlab.core import evidence, nvml_sampler
from hwlab.cli import main
from hwlab.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
TRACES = evidence.TRACES_DIR / "slow_rank"


class NoNvml:
    def nvmlInit(self):
        raise RuntimeError("NVML Shared Library Not Found")


def _members(path):
    with tarfile.open(path) as t:
        return {m.name.split("/", 1)[1]: t.extractfile(m).read() for m in t.getmembers()}


def test_env_filter_keeps_only_the_prefixes_and_hides_credentials():
    env = {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1",
           "HOME": "/root", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HWLAB_API_TOKEN": "tok123", "PATH": "/bin"}
    out = bundle.filtered_env(env)
    assert set(out) == {"NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "HWLAB_API_TOKEN"}
    assert out["HWLAB_API_TOKEN"] == "<redacted>" and out["NCCL_DEBUG"] == "INFO"


def test_bundle_writes_the_archive_with_its_manifest_and_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "zz-never-in-the-bundle-zz")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    run = tmp_path / "run"
    run.mkdir()
    for p in sorted(TRACES.glob("*.gz")):
        (run / p.name).write_bytes(p.read_bytes())
    # a trace named as another tool names it (not by rank or "trace"): found by its content
    (run / "control.json.gz").write_bytes(sorted(TRACES.glob("*.gz"))[0].read_bytes())
    (run / "notes.json").write_text('{"not": "a trace"}')
    big = run / "big.pt.trace.json"
    big.write_bytes(b" " * 10)  # replaced below by a sparse file over the per-file limit
    with open(big, "r+b") as f:
        f.truncate(bundle.SMALL_FILE_BYTES + 1)
    out = tmp_path / "b.tar.gz"
    man = bundle.build(out, run_dir=run, doctor=False, pynvml=NoNvml())
    files = _members(out)
    blob = b"".join(files.values())
    assert b"zz-never-in-the-bundle-zz" not in blob and b"AWS_SECRET" not in blob
    assert json.loads(files["env.json"])["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert json.loads(files["nccl.json"])["nccl_env"] == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert json.loads(files["MANIFEST.json"]) == json.loads(json.dumps(man))
    # one manifest format wherever it is written: the same schema as the bundle recorded on the H200
    h200 = json.loads((Path(bundle.__file__).parents[1] / "recorded" / "runs" / "bundle_h200" / "MANIFEST.json").read_text())
    assert man["schema"] == h200["schema"]
    st = {p["part"]: p for p in man["parts"]}
    traces = [k for k in files if k.startswith("run/") and k.endswith(".gz")]
    assert len(traces) == 5 and "run/control.json.gz" in traces and "run/notes.json" not in files
    assert st["trace: big.pt.trace.json"]["status"] == "listed"
    assert st["trace: big.pt.trace.json"]["n_bytes"] == bundle.SMALL_FILE_BYTES + 1
    assert "run/big.pt.trace.json" not in files
    missing = {p["part"]: p for p in man["parts"] if p["status"] == "missing"}
    assert "NCCL_DEBUG=INFO" in missing["NCCL debug log with topology"]["how_to_get"]
    assert "INIT,ENV,GRAPH" in missing["NCCL debug log with topology"]["how_to_get"]
    assert "NVML GPU state" in missing and "hwlab doctor" in missing
    assert json.loads(files["ranks.json"])["finding"]["rank"] == 2  # the run's report went in
    assert "SLOW RANK" in files["ranks.txt"].decode()


def test_bundle_checks_the_destination_first_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "b.tar.gz"
    out.write_text("keep me")
    t0 = time.perf_counter()
    assert main(["bundle", str(out)]) == 2  # refused before any gathering
    assert time.perf_counter() - t0 < 5 and out.read_text() == "keep me"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0]
    assert main(["bundle", str(tmp_path)]) == 2  # a folder
    assert main(["bundle", str(tmp_path / "x.zip")]) == 2
    assert main(["bundle", str(tmp_path / "y.tar.gz"), "--run-dir", str(tmp_path / "nope")]) == 2
    assert not (tmp_path / "y.tar.gz").exists()
    with pytest.raises(UserInputError):
        bundle.build(out, doctor=False, pynvml=NoNvml())
    assert out.read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_bundle_cli_json(tmp_path, capsys):
    out = tmp_path / "c.tar.gz"
    assert main(["bundle", str(out), "--no-doctor", "--json"]) == 0
    man = json.loads(capsys.readouterr().out)
    assert man["archive"] == str(out) and out.is_file()
    assert any(p["status"] == "missing" and "run" in p["part"] for p in man["parts"])


# ------------------------------------------------------------------ NVML sampler
def test_sampler_without_nvml_says_why():
    s = nvml_sampler.NvmlSampler(interval_s=0.01, pynvml=NoNvml())
    with s:
        time.sleep(0.03)
    res = s.result()
    assert res["status"]["available"] is False and "Not Found" in res["status"]["reason"] and res["samples"] == []
    summ = nvml_sampler.summarise(res)
    assert summ["available"] is False and summ["flags"] == []


class FakeNvml:
    """The calls the sampler makes, shaped like pynvml's answers; per-GPU util / SM / PCIe / NVLink."""
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139

    def __init__(self, gpus):
        self.gpus, self.kib = gpus, {i: 0 for i in range(len(gpus))}

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= self.gpus[h]["nvlinks"]:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1

    def nvmlGpmQueryDeviceSupport(self, h):
        if self.gpus[h]["sm"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace()

    def nvmlGpmSampleGet(self, h, s):
        s.gpu = h
        return s

    def nvmlGpmSampleFree(self, s):
        pass

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=None, nvmlReturn=0, value=None)])

    def nvmlGpmMetricsGet(self, mg):
        mg.metrics[0].value = self.gpus[mg.sample2.gpu]["sm"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.gpus[h]["util"])

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return self.gpus[h]["pcie_kbps"]

    def nvmlDeviceGetFieldValues(self, h, ids):
        self.kib[h] += self.gpus[h]["nvlink_kib_per_call"]
        return [SimpleNamespace(value=SimpleNamespace(ullVal=self.kib[h])) for _ in ids]


def test_one_gpu_records_pcie_and_says_nvlink_is_absent():
    fake = FakeNvml([{"nvlinks": 0, "sm": None, "util": 97, "pcie_kbps": 250_000, "nvlink_kib_per_call": 0}])
    s = nvml_sampler.NvmlSampler(interval_s=0.01, pynvml=fake)
    with s:
        time.sleep(0.08)
    res = s.result()
    assert res["status"]["gpus"]["0"]["nvlink"] == "absent" and len(res["samples"]) >= 2
    assert all(x["pcie_tx_mbps"] == 250.0 and "nvlink_tx_mbps" not in x for x in res["samples"])
    summ = nvml_sampler.summarise(res)
    g = summ["gpus"]["0"]
    assert g["util_pct"]["median"] == 97 and g["sm_active_pct"] is None and "NOT_SUPPORTED" in g["sm_active_note"]
    assert summ["flags"] == []  # SM activity unknown: no "SM active low" claim


def test_flags_util_high_sm_low_and_unbalanced_links():
    gpus = [{"nvlinks": 4, "sm": 90.0, "util": 95, "pcie_kbps": 1000, "nvlink_kib_per_call": 50_000},
            {"nvlinks": 4, "sm": 12.0, "util": 95, "pcie_kbps": 1000, "nvlink_kib_per_call": 50_000},
            {"nvlinks": 4, "sm": 88.0, "util": 95, "pcie_kbps": 1000, "nvlink_kib_per_call": 2_000}]
    s = nvml_sampler.NvmlSampler(interval_s=0.01, pynvml=FakeNvml(gpus))
    with s:
        time.sleep(0.1)
    summ = nvml_sampler.summarise(s.result())
    assert {g: v["nvlink"] for g, v in summ["gpus"].items()} == {"0": "present", "1": "present", "2": "present"}
    flags = summ["flags"]
    assert any(f.startswith("GPU1: util high") for f in flags) and not any(f.startswith("GPU0: util") for f in flags)
    assert any(f.startswith("GPU2: nvlink") and "unbalanced" in f for f in flags)
    assert not any(f.startswith(("GPU0: nvlink", "GPU1: nvlink")) for f in flags)


def test_steplog_option_writes_the_samples_and_the_report_reads_them(tmp_path):
    from hwlab.diagnosis import ranks
    from hwlab.core.steplog import StepLog
    log = StepLog(tmp_path, rank=3, nvml_sample_s=0.01)
    for i in range(3):
        with log.step(i):
            time.sleep(0.005)
    log.close()
    files = sorted(tmp_path.glob("*/nvml-rank-*.json"))
    assert [p.name for p in files] == ["nvml-rank-00003.json"]
    d = json.loads(files[0].read_text())
    assert d["rank"] == 3 and d["status"]["available"] in (True, False)
    nv = ranks.nvml_by_rank(files)
    lines = ranks.render_nvml(nv)
    if not d["status"]["available"]:  # this CPU machine: says why, claims nothing
        assert nv["3"]["reason"] == d["status"]["reason"] and lines == [f"NVML rank 3: not sampled ({d['status']['reason']})"]
    else:
        assert lines[0].startswith("NVML rank 3 GPU")


def test_capture_samples_nvml_during_its_probe(tmp_path, monkeypatch):
    from hwlab.core import capture
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    rec = capture.capture(tmp_path, probe=True, nvml_sample_s=0.01, quiet=True)
    nv = rec["nvml_during_probe"]
    assert rec["probe"] and set(nv) >= {"available", "gpus", "flags"}
    if not nv["available"]:  # this machine has no NVML: the reason, no figures
        assert nv["reason"] and nv["gpus"] == {}
    else:
        assert all(g["util_pct"] for g in nv["gpus"].values())
    saved = json.loads(next(tmp_path.glob("*/rank-*.json")).read_text())
    assert saved["nvml_during_probe"] == json.loads(json.dumps(nv))
