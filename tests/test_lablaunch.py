"""``hwlab lab`` serves the learner's working copy, never the checkout; SIGTERM ends its server."""
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hwlab.cli import workcopy

ROOT = Path(__file__).resolve().parents[1]


def _kit(tmp_path: Path) -> Path:
    """A small checkout of the kit's shape: two notebooks paired by jupytext, an exercise, a
    solution and an example."""
    co = tmp_path / "checkout"
    for rel in ("notebooks/00_start_here.ipynb", "notebooks/01_bandwidth_bound.ipynb",
                "exercises/ex01_bandwidth_bound.ipynb", "solutions/ex01_bandwidth_bound.ipynb"):
        (co / rel).parent.mkdir(parents=True, exist_ok=True)
        (co / rel).write_bytes((ROOT / rel).read_bytes())
    (co / "notebooks" / "01_bandwidth_bound.py").write_text("# paired\n")
    (co / "examples").mkdir()
    (co / "examples" / "unfused_chain.py").write_text("def f():\n    pass\n")
    return co


KERNEL = {"name": "hwlab", "display_name": "hwlab (test)", "language": "python"}


def test_first_start_copies_unpaired_notebooks_on_the_kit_kernel_and_no_solutions(tmp_path):
    co = _kit(tmp_path)
    rep = workcopy.prepare(co, root=tmp_path / "copy", kernel=KERNEL)
    assert rep.made
    assert sorted(rep.copied) == ["examples/unfused_chain.py", "exercises/ex01_bandwidth_bound.ipynb",
                                  "notebooks/00_start_here.ipynb", "notebooks/01_bandwidth_bound.ipynb"]
    nb = json.loads((tmp_path / "copy" / "notebooks" / "01_bandwidth_bound.ipynb").read_text())
    assert "formats" not in nb["metadata"].get("jupytext", {})  # no save in the copy writes a .py
    assert nb["metadata"]["kernelspec"]["name"] == "hwlab"
    src = json.loads((co / "notebooks" / "01_bandwidth_bound.ipynb").read_text())
    assert [c["source"] for c in nb["cells"]] == [c["source"] for c in src["cells"]]
    assert not (tmp_path / "copy" / "solutions").exists()
    assert not (tmp_path / "copy" / "notebooks" / "01_bandwidth_bound.py").exists()


def test_later_starts_never_overwrite_and_refresh_keeps_the_learners_edits(tmp_path):
    co, copy = _kit(tmp_path), tmp_path / "copy"
    workcopy.prepare(co, root=copy, kernel=None)
    mine = copy / "notebooks" / "01_bandwidth_bound.ipynb"
    mine.write_text(mine.read_text().replace('"cells": [', '"cells": [{"cell_type": "markdown", '
                                             '"metadata": {}, "source": "my notes"},', 1))
    learner_bytes = mine.read_bytes()
    for rel in ("notebooks/00_start_here.ipynb", "notebooks/01_bandwidth_bound.ipynb"):
        p = co / rel  # the checkout moves on (a git pull)
        nb = json.loads(p.read_text())
        nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "new in the kit"})
        p.write_text(json.dumps(nb))
    untouched_before = (copy / "notebooks" / "00_start_here.ipynb").read_bytes()

    rep = workcopy.prepare(co, root=copy)  # a plain start: nothing replaced, the change is named
    assert not rep.made and not rep.replaced and sorted(rep.stale) == [
        "notebooks/00_start_here.ipynb", "notebooks/01_bandwidth_bound.ipynb"]
    assert mine.read_bytes() == learner_bytes
    assert (copy / "notebooks" / "00_start_here.ipynb").read_bytes() == untouched_before

    rep = workcopy.prepare(co, root=copy, refresh=True)
    assert rep.replaced == ["notebooks/00_start_here.ipynb"]
    assert "new in the kit" in (copy / "notebooks" / "00_start_here.ipynb").read_text()
    assert mine.read_bytes() == learner_bytes  # the learner's work is kept ...
    side = copy / rep.kept["notebooks/01_bandwidth_bound.ipynb"]
    assert side.name.startswith("01_bandwidth_bound.kit-") and "new in the kit" in side.read_text()
    again = workcopy.prepare(co, root=copy, refresh=True)  # ... and a second refresh adds nothing
    assert not (again.replaced or again.kept or again.copied or again.stale)


def test_the_copy_lives_outside_the_checkout_one_per_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("HWLAB_HOME", str(tmp_path / "home"))
    a, b = workcopy.copy_root(ROOT), workcopy.copy_root(tmp_path / "other" / ROOT.name)
    assert a != b and a.parent == b.parent == tmp_path / "home" / "work"
    assert ROOT.resolve() not in a.resolve().parents


def test_news_off_sets_the_lab_setting_defaults(tmp_path):
    cfg = workcopy.news_off(tmp_path / "cfg")
    got = json.loads((cfg / "labconfig" / "default_setting_overrides.json").read_text())
    assert got["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def test_an_install_without_the_kit_kernel_gets_one_beside_the_copy_and_only_it_is_offered(tmp_path, monkeypatch):
    """``pip install '.[lab]'`` installs no ``hwlab`` kernelspec (scripts/setup.sh does): ``hwlab lab``
    then writes one under the copy's state folder that runs this Python, puts it on the server's
    JUPYTER_PATH, and the server command offers it alone. Read back by jupyter_client, as the
    server reads it."""
    pytest.importorskip("jupyter_client")
    from jupyter_client.kernelspec import KernelSpecManager

    from hwlab.cli import lablaunch

    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv-without-the-kernel"))
    assert workcopy.kit_kernel() is None
    kernel, data = workcopy.ensure_kit_kernel(tmp_path / "state")
    assert kernel["name"] == workcopy.KERNEL_NAME and data == tmp_path / "state" / "jupyter-data"
    spec = KernelSpecManager(kernel_dirs=[str(data / "kernels")]).get_kernel_spec(workcopy.KERNEL_NAME)
    assert spec.argv[0] == sys.executable and spec.argv[1:3] == ["-m", "ipykernel_launcher"]
    before = (data / "kernels" / "hwlab" / "kernel.json").stat().st_mtime_ns
    assert workcopy.ensure_kit_kernel(tmp_path / "state") == (kernel, data)  # a restart rewrites nothing
    assert (data / "kernels" / "hwlab" / "kernel.json").stat().st_mtime_ns == before
    cmd = lablaunch.command(tmp_path / "copy" / "notebooks", ip="127.0.0.1", port=8888, token="t",
                            no_browser=True, as_root=False)
    assert f"--KernelSpecManager.allowed_kernelspecs={workcopy.KERNEL_NAME}" in cmd
    assert "--KernelSpecManager.ensure_native_kernel=False" in cmd


# ---------------------------------------------------------------- the real server
def _digest(paths) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def _checkout_files():
    return [p for d in ("notebooks", "exercises", "solutions", "examples") for p in sorted((ROOT / d).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts]


def _api(base: str, token: str, path: str, method: str = "GET", body: dict | None = None):
    req = urllib.request.Request(f"{base}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read() or b"null")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_a_save_in_jupyter_lands_in_the_copy_and_sigterm_ends_the_server(tmp_path):
    """Start ``hwlab lab`` for real, save notebook 01 through Jupyter's contents API (what Run All
    + save does), check the checkout is byte-identical and the copy holds the save; the served
    notebook runs on the kit's kernel where the venv has it, the news prompt's setting is off;
    then SIGTERM ``hwlab lab`` alone and check its server process is gone and the port closed."""
    pytest.importorskip("jupyterlab")
    before = _digest(_checkout_files())
    home = tmp_path / "home"
    env = dict(os.environ, HWLAB_HOME=str(home), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    log = open(tmp_path / "lab.log", "w+")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        first = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "hwlab", "lab", "--no-browser", "--port", str(first)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    server_pid = None
    try:
        t0, url = time.monotonic(), None
        while url is None and time.monotonic() - t0 < 60 and proc.poll() is None:
            m = re.search(r"JupyterLab: (http://\S+)", (tmp_path / "lab.log").read_text())
            url = m.group(1) if m else time.sleep(0.5)
        assert url, (tmp_path / "lab.log").read_text()
        base, token = url.split("/lab?token=")
        port = int(base.rsplit(":", 1)[1])
        while time.monotonic() - t0 < 180:
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                time.sleep(1)
        infos = list((tmp_path / "rt").glob("jpserver-*.json"))
        assert infos, (tmp_path / "lab.log").read_text()[-3000:]
        server_pid = json.loads(infos[0].read_text())["pid"]
        assert server_pid != proc.pid

        rel = "notebooks/01_bandwidth_bound.ipynb"
        status, model = _api(base, token, f"/api/contents/{rel}?content=1")
        assert status == 200
        nb = model["content"]
        if (Path(sys.prefix) / "share" / "jupyter" / "kernels" / "hwlab").is_dir():
            assert nb["metadata"]["kernelspec"]["name"] == "hwlab"
        cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "a learner's output\n"}]
        cell["execution_count"] = 1
        status, _ = _api(base, token, f"/api/contents/{rel}", "PUT",
                         {"type": "notebook", "format": "json", "content": nb})
        assert status == 200
        status, settings = _api(base, token, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
        props = settings["schema"]["properties"]  # the defaults this server gives the news prompt
        assert props["fetchNews"]["default"] == "false" and props["checkForUpdates"]["default"] is False

        assert _digest(_checkout_files()) == before, "hwlab lab wrote into the checkout"
        copies = list((home / "work").glob(f"*/{rel}"))
        assert len(copies) == 1 and "a learner's output" in copies[0].read_text()

        proc.send_signal(signal.SIGTERM)  # hwlab lab alone, not its process group
        proc.wait(timeout=60)
        for _ in range(60):
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the Jupyter server (pid {server_pid}) outlived hwlab lab's SIGTERM")
        assert not _port_open(port)
    finally:
        if proc.poll() is None:
            proc.kill()
        if server_pid:
            try:
                os.kill(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


# ---------------------------------------------------------------- what the learner's lab offers
from lab_server import LabServer as _Lab  # noqa: E402  (tests/lab_server.py)


def _tabs(workspace: dict) -> list[str]:
    return workspace["data"]["layout-restorer:data"]["main"]["dock"]["widgets"]


@pytest.mark.slow
def test_the_learners_lab_opens_00_offers_only_hwlab_hides_nbgrader_and_restarts_on_one_tab(tmp_path):
    """Through the real server's REST API: the kernels offered, the page config JupyterLab's page
    is built from (which lab extensions are disabled), nbgrader's formgrader route, and the
    workspace JupyterLab restores its tabs from, before and after a restart in which the learner
    had opened several notebooks. ``--instructor`` brings nbgrader's UI back."""
    pytest.importorskip("jupyterlab")

    has_nbgrader = __import__("importlib").util.find_spec("nbgrader") is not None
    home = tmp_path / "home"
    lab = _Lab(tmp_path, home)
    try:
        _, specs = lab.api("/api/kernelspecs")
        # the venv's kit kernel, or the one hwlab lab writes beside the copy: the only one offered either way
        assert set(specs["kernelspecs"]) == {"hwlab"} and specs["default"] == "hwlab", specs["kernelspecs"].keys()
        _, ws = lab.api("/lab/api/workspaces/default")
        assert _tabs(ws) == ["notebook:notebooks/00_start_here.ipynb"]
        assert ws["data"]["layout-restorer:data"]["main"]["current"] == "notebook:notebooks/00_start_here.ipynb"
        disabled = lab.page_config()["disabledExtensions"]
        assert "@jupyter/nbgrader" in disabled, disabled
        if has_nbgrader:
            assert lab.status_of("/formgrader") == 404  # nbgrader's server extension is not loaded
        # the learner opens four notebooks; JupyterLab saves that layout to the workspace
        opened = [f"notebook:notebooks/{n}" for n in ("00_start_here.ipynb", "01_bandwidth_bound.ipynb",
                                                      "02_registers_occupancy.ipynb", "03_cross_link_tp.ipynb")]
        ws["data"]["layout-restorer:data"]["main"]["dock"]["widgets"] = opened
        for w in opened[1:]:
            ws["data"][w] = {"data": {"path": w.split(":", 1)[1], "factory": "Notebook"}}
        lab.api("/lab/api/workspaces/default", "PUT", ws)
        assert len(_tabs(lab.api("/lab/api/workspaces/default")[1])) == 4
    finally:
        lab.stop()

    lab = _Lab(tmp_path, home, "--instructor")  # a restart (as the instructor, on the same copy)
    try:
        _, ws = lab.api("/lab/api/workspaces/default")
        assert _tabs(ws) == ["notebook:notebooks/00_start_here.ipynb"]  # one tab, so one kernel
        assert "@jupyter/nbgrader" not in lab.page_config()["disabledExtensions"]
        if has_nbgrader:
            assert lab.status_of("/formgrader") != 404
        assert set(lab.api("/api/kernelspecs")[1]["kernelspecs"]) == {"hwlab"}
    finally:
        lab.stop()
