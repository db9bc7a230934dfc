"""The hwlab command on this (GPU-less) machine, run as a user runs it: a subprocess."""
import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from hwlab.core.topology import parse_topo_matrix


def hwlab(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "hwlab", *args], capture_output=True,
                          text=True, env=e, timeout=600)


@pytest.mark.slow
def test_doctor_json_on_cpu(tmp_path):
    r = hwlab("doctor", "--json", "--quick", env={"HWLAB_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    if not torch.cuda.is_available():
        assert rep["snapshot"]["nvml"]["available"] is False
        assert rep["machine"]["is_gpu"] is False
        assert any("no CUDA GPU here" in v for v in rep["verdict"])
    assert rep["ceilings"]["copy_gbps"] > 0 and rep["ceilings"]["gemm_tflops"]["fp32"] > 0
    # the ceilings were cached for this machine and are reused next time, unless a band said the
    # measurement was unstable (a busy host): then nothing is cached, and the status says so
    cached = list(tmp_path.glob("ceilings-*.json"))
    if rep["ceilings_status"]["not_cached_unstable"]:
        assert cached == [] and "NOT cached" in rep["ceilings_status"]["label"]
        return
    assert len(cached) == 1
    again = json.loads(hwlab("doctor", "--json", "--quick", env={"HWLAB_CACHE": str(tmp_path)}).stdout)
    assert again["ceilings"] == rep["ceilings"]


@pytest.mark.slow
def test_doctor_human_and_save_never_overwrites(tmp_path):
    out = tmp_path / "doctor.json"
    r = hwlab("doctor", "--quick", "--save", str(out), env={"HWLAB_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "verdict" in r.stdout and "copy bandwidth" in r.stdout
    first = out.read_text()
    r2 = hwlab("doctor", "--quick", "--save", str(out), env={"HWLAB_CACHE": str(tmp_path)})
    assert r2.returncode == 2 and "already exists" in r2.stderr
    assert "Traceback" not in r2.stderr and "verdict" not in r2.stdout  # refused before measuring
    assert out.read_text() == first
    shown = hwlab("evidence", "show", str(out))
    assert shown.returncode == 0 and "RECORDED ON" in shown.stdout


@pytest.mark.slow
def test_probe_commands():
    r = hwlab("probe", "gemm", "-p", "size=64", "-p", "dtype=fp32", "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["name"] == "gemm[fp32]" and m["n_flops"] == 2 * 64**3 and m["derived"]["tflops"] > 0
    assert hwlab("probe", "warp_drive").returncode == 2
    bad = hwlab("probe", "hbm_copy", "-p", "size_mib=-5")
    assert bad.returncode == 2 and "size_mib takes an integer 1..1048576" in bad.stderr
    huge = hwlab("probe", "hbm_copy", "-p", "size_mib=1000000")
    assert huge.returncode == 2 and "choose a smaller size" in huge.stderr


@pytest.mark.slow
def test_topo_from_file_and_malformed(tmp_path):
    from hwlab.core import topology
    cap = next((topology.__file__ and
                __import__("pathlib").Path(topology.__file__).parents[1] / "recorded" / "topology").glob("dgx1*.txt"))
    r = hwlab("topo", "--file", str(cap), "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["links"]["GPU0|GPU3"] == "NV2"
    bad = tmp_path / "bad.txt"
    bad.write_text("        GPU0    GPU1\nGPU0     X      NV4\nGPU1    NVX      X\n")
    r = hwlab("topo", "--file", str(bad))
    assert r.returncode == 2 and "line 3" in r.stderr and "'NVX'" in r.stderr


@pytest.mark.slow
def test_version_and_one_line_usage_errors():
    r = hwlab("--version")
    assert r.returncode == 0 and r.stdout.startswith("hwlab ")
    r = hwlab("frobnicate")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_probe_help_lists_the_schema():
    from hwlab.core.probes import PARAMS

    for name, params in PARAMS.items():
        r = hwlab("probe", name, "--help")
        assert r.returncode == 0
        for p in params:
            assert f"-p {p.name}=" in r.stdout


def test_probe_schema_matches_the_probe_signatures():
    import inspect

    from hwlab.core.probes import PARAMS, PROBES

    assert set(PARAMS) == set(PROBES)
    for name, params in PARAMS.items():
        sig = inspect.signature(PROBES[name])
        for p in params:
            assert sig.parameters[p.name].default == p.default, (name, p.name)


def test_internal_error_is_one_line_and_exit_3(monkeypatch, capsys):
    from hwlab import cli
    from hwlab.core import probes

    def broken(**_):
        raise RuntimeError("boom\nsecond line")
    monkeypatch.setitem(probes.PROBES, "launch_overhead", broken)
    assert cli.main(["probe", "launch_overhead"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "please report" in err and "Traceback" not in err
    assert cli.main(["--debug", "probe", "launch_overhead"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_json_output_is_strict(capsys):
    from hwlab import cli
    from hwlab.cli.console import loads_strict

    assert cli.main(["probe", "launch_overhead", "-p", "n_launches=10", "--json"]) == 0
    d = loads_strict(capsys.readouterr().out)  # refuses NaN / Infinity
    assert d["derived"]["arithmetic_intensity"] is None
    assert "arithmetic_intensity" in next(iter(d["null_reasons"]))


@pytest.mark.slow
def test_doctor_labels_cached_ceilings_with_their_age(tmp_path):
    env = {"HWLAB_CACHE": str(tmp_path)}
    first = json.loads(hwlab("doctor", "--json", "--quick", env=env).stdout)
    st = first["ceilings_status"]
    assert st["cached"] is False
    r = hwlab("doctor", "--quick", env=env)
    if st["cache_file"] is None:  # a busy host: an unstable fresh ceiling is never cached, and says so
        assert st["not_cached_unstable"] and "NOT cached, unstable" in st["label"]
        assert r.returncode == 0 and "measured now" in r.stdout and "cached, measured" not in r.stdout
        return
    assert r.returncode == 0 and "cached, measured" in r.stdout and "old" in r.stdout
    again = json.loads(hwlab("doctor", "--json", "--quick", env=env).stdout)
    assert again["ceilings_status"]["cached"] is True and again["ceilings_status"]["age_s"] >= 0


@pytest.mark.slow
def test_evidence_show_is_labelled_recorded():
    r = hwlab("evidence", "show", "lab01_bandwidth")
    assert r.returncode == 0
    assert "RECORDED ON NVIDIA H200" in r.stdout and "not measured on this machine" in r.stdout
    assert "fused" in r.stdout
    assert hwlab("evidence", "list").stdout.count("recorded on NVIDIA H200") >= 3
    corrupt = hwlab("evidence", "show", __file__.replace(".py", "_nope.json"))
    assert corrupt.returncode == 2 and "does not exist" in corrupt.stderr


@pytest.mark.slow
def test_lab_dry_run():
    r = hwlab("lab", "--dry-run", "--no-browser")
    assert r.returncode == 0 and "jupyter" in r.stdout and "00_start_here.ipynb" in r.stdout
    assert "JupyterLab: http://127.0.0.1:" in r.stdout and "token=" in r.stdout
    assert ("--allow-root" in r.stdout) == (os.geteuid() == 0)


@pytest.mark.slow
def test_lab_takes_the_next_free_port_and_says_so():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        r = hwlab("lab", "--dry-run", "--no-browser", "--port", str(taken))
    assert r.returncode == 0, r.stderr
    assert f"port {taken} is taken" in r.stdout and f":{taken}/lab" not in r.stdout


@pytest.mark.slow
def test_lab_serves_as_this_user_with_the_venvs_kernel(tmp_path):
    """Start JupyterLab for real (as root where the tests run as root), fetch the printed URL,
    and check the kernel the notebooks name runs this venv's Python; then stop it."""
    import re
    import time
    import urllib.request

    pytest.importorskip("jupyterlab")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               HWLAB_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([sys.executable, "-m", "hwlab", "lab", "--no-browser"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        url, lines = None, []
        t0 = time.monotonic()
        while url is None and time.monotonic() - t0 < 60:
            line = proc.stdout.readline()
            lines.append(line)
            m = re.search(r"JupyterLab: (http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "".join(lines)
        if os.geteuid() == 0:
            assert any("running as root" in x for x in lines)
        base, token = url.split("/lab?token=")
        body = None
        while time.monotonic() - t0 < 120:
            try:
                body = urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}", timeout=5).read()
                break
            except OSError:
                time.sleep(1)
        assert body is not None, "JupyterLab did not answer at the printed URL"
        specs = json.loads(body)["kernelspecs"]
        # the learner is offered the kit's kernel alone, and it runs this venv's Python
        assert set(specs) == {"hwlab"}, sorted(specs)
        assert Path(specs["hwlab"]["spec"]["argv"][0]).resolve() == Path(sys.executable).resolve()
        assert urllib.request.urlopen(url, timeout=10).status == 200
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def test_readme_documents_every_command_and_exit_code():
    from pathlib import Path

    from hwlab import cli

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## The CLI", 1)[1].split("\n## ", 1)[0]
    sub = next(a for a in cli.build_parser()._actions if a.dest == "cmd")
    core = ("doctor", "probe", "topo", "evidence", "baseline", "incident", "drill", "lab", "flowchart")
    assert set(core) <= set(sub.choices)
    for name in core:  # commands registered from cli_<name> modules are documented by their owners
        assert f"hwlab {name}" in section, f"README's CLI section does not show `hwlab {name}`"
    for code in ("0", "1", "2", "3", "4", "141"):
        assert f"| {code} |" in section


@pytest.mark.slow
@pytest.mark.parametrize("args", [("flowchart",), ("evidence", "list", "--json")])
def test_a_reader_that_goes_away_ends_it_silently_with_141(args):
    """`hwlab ... | head`: the pipe's read end closed before hwlab writes, as after head's last line."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "hwlab", *args], stdout=w, stderr=subprocess.PIPE,
                           text=True, timeout=600)
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr == "", p.stderr


def test_every_reporting_command_prints_strict_json(tmp_path, monkeypatch, capsys):
    """--json on the commands that report, each parsed by a strict parser (no NaN/Infinity)."""
    from pathlib import Path

    from hwlab import cli
    from hwlab.core import evidence
    from hwlab.cli.console import loads_strict

    monkeypatch.chdir(tmp_path)
    topo = next((Path(evidence.RECORDED_DIR) / "topology").glob("*.txt"))
    base = str(evidence.RECORDED_DIR / "h200" / "baseline.json")
    for argv in (["evidence", "list", "--json"], ["evidence", "show", "doctor", "--json"], ["flowchart", "--json"],
                 ["topo", "--file", str(topo), "--json"], ["baseline", "compare", base, base, "--json"],
                 ["incident", "--title", "t", "--scope", "single-card", "--symptom", "s", "--fix", "f",
                  "--reverify", "r", "--out", "inc", "--json"]):
        assert cli.main(argv) == 0, argv
        loads_strict(capsys.readouterr().out)
    assert len(list((tmp_path / "inc").glob("incident-*.json"))) == 1


def test_progress_plain_lines_with_eta_outside_a_terminal(capsys):
    from hwlab.cli.console import Steps

    with Steps("hwlab x", 3, terminal=False) as st:
        for label in ("copy", "gemm fp32", "launch", "one more than announced"):
            st.step(label)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("hwlab x: [1/3] copy (") and "left" not in lines[0]
    assert lines[1].startswith("hwlab x: [2/3] gemm fp32 (") and "s left)" in lines[1]
    assert lines[3].startswith("hwlab x: [4/4] one more than announced")
    with Steps("hwlab x", 3, enabled=False) as st:
        st.step("quiet")
    assert capsys.readouterr().err == ""
