"""The hwlab command on this (GPU-less) machine, run as a user runs it: a subprocess."""
import json
import os
import subprocess
import sys

import pytest
import torch

from hwlab.topology import parse_topo_matrix


def hwlab(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "hwlab.cli", *args], capture_output=True,
                          text=True, env=e, timeout=600)


def test_doctor_json_on_cpu(tmp_path):
    r = hwlab("doctor", "--json", "--quick", env={"HWLAB_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    if not torch.cuda.is_available():
        assert rep["snapshot"]["nvml"]["available"] is False
        assert rep["machine"]["is_gpu"] is False
        assert any("no CUDA GPU here" in v for v in rep["verdict"])
    assert rep["ceilings"]["copy_gbps"] > 0 and rep["ceilings"]["gemm_tflops"]["fp32"] > 0
    # the ceilings were cached for this machine and are reused next time
    cached = list(tmp_path.glob("ceilings-*.json"))
    assert len(cached) == 1
    again = json.loads(hwlab("doctor", "--json", "--quick", env={"HWLAB_CACHE": str(tmp_path)}).stdout)
    assert again["ceilings"] == rep["ceilings"]


def test_doctor_human_and_save_never_overwrites(tmp_path):
    out = tmp_path / "doctor.json"
    r = hwlab("doctor", "--quick", "--save", str(out), env={"HWLAB_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "verdict" in r.stdout and "copy bandwidth" in r.stdout
    first = out.read_text()
    r2 = hwlab("doctor", "--quick", "--save", str(out), env={"HWLAB_CACHE": str(tmp_path)})
    assert r2.returncode == 1 and "already exists" in r2.stderr
    assert out.read_text() == first
    shown = hwlab("evidence", "show", str(out))
    assert shown.returncode == 0 and "RECORDED ON" in shown.stdout


def test_probe_commands():
    r = hwlab("probe", "gemm", "-p", "size=64", "-p", "dtype=fp32", "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["name"] == "gemm[fp32]" and m["n_flops"] == 2 * 64**3 and m["derived"]["tflops"] > 0
    assert hwlab("probe", "warp_drive").returncode == 2
    bad = hwlab("probe", "hbm_copy", "-p", "size_mib=-5")
    assert bad.returncode == 1 and "size_mib must be positive" in bad.stderr
    huge = hwlab("probe", "hbm_copy", "-p", "size_mib=100000000")
    assert huge.returncode == 1 and "choose a smaller size" in huge.stderr


def test_topo_from_file_and_malformed(tmp_path):
    from hwlab import topology
    cap = next((topology.__file__ and
                __import__("pathlib").Path(topology.__file__).parent / "recorded" / "topology").glob("dgx1*.txt"))
    r = hwlab("topo", "--file", str(cap), "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["links"]["GPU0|GPU3"] == "NV2"
    bad = tmp_path / "bad.txt"
    bad.write_text("        GPU0    GPU1\nGPU0     X      NV4\nGPU1    NVX      X\n")
    r = hwlab("topo", "--file", str(bad))
    assert r.returncode == 1 and "line 3" in r.stderr and "'NVX'" in r.stderr


def test_evidence_show_is_labelled_recorded():
    r = hwlab("evidence", "show", "lab01_bandwidth")
    assert r.returncode == 0
    assert "RECORDED ON NVIDIA H200" in r.stdout and "not measured on this machine" in r.stdout
    assert "fused" in r.stdout
    assert hwlab("evidence", "list").stdout.count("recorded on NVIDIA H200") >= 3
    corrupt = hwlab("evidence", "show", __file__.replace(".py", "_nope.json"))
    assert corrupt.returncode == 1 and "does not exist" in corrupt.stderr


def test_lab_dry_run():
    r = hwlab("lab", "--dry-run", "--no-browser")
    assert r.returncode == 0 and "jupyter" in r.stdout and "00_start_here.ipynb" in r.stdout
