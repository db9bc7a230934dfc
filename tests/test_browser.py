"""JupyterLab in a real browser: start it on loopback, open Lab 1 in headless Chromium
(Debian's, driven by Playwright), run all cells, and check that an ipywidgets control and a
plot actually render. The screenshot is kept under test-artifacts/browser/."""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    # serve a copy: JupyterLab autosaves, and the committed notebooks must stay output-free
    kit = tmp_path / "kit"
    shutil.copytree(ROOT / "notebooks", kit / "notebooks")
    # the checkpoint answered as CI answers it (the solutions' file, graded by the checker): the plot
    # after the checkpoint is gated until it passes
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               HWLAB_CHECKPOINT_ANSWERS=str(ROOT / "solutions" / "checkpoints.json"))
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={kit}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
    yield url, token
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_lab01_runs_in_chromium_with_widgets_and_plot(jupyterlab):
    from playwright.sync_api import sync_playwright

    url, token = jupyterlab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/lab/tree/notebooks/01_bandwidth_bound.ipynb?token={token}")
        page.wait_for_selector(".jp-Notebook", timeout=120_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=120_000)
        for _attempt in range(4):  # a click that lands before the kernel is wired up is lost: retry
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()
            try:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.jp-InputPrompt')]"
                    ".some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))", timeout=30_000)
                break
            except Exception:
                page.keyboard.press("Escape")
        try:
            slider = page.wait_for_selector(".widget-slider", state="attached", timeout=240_000)
            img = page.wait_for_selector(".jp-RenderedImage img", state="attached", timeout=240_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "lab01_failure.png"), full_page=True)
            (ARTIFACTS / "lab01_failure.html").write_text(page.content())
            raise
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=240_000)
        assert slider.is_visible()
        box = img.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 100
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
        assert not tracebacks, tracebacks[:1]
        slider.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "lab01_widget.png"))
        img.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "lab01_plot.png"))
        browser.close()


def _chromium(p):
    return p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"])


def _open_lab(page, url: str, name: str) -> list[str]:
    """Load JupyterLab at ``url`` and wait until notebook ``name`` is the current tab and its kernel
    idle; returns the labels of the main area's tabs."""
    page.goto(url)
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel",
                 has_text=name).wait_for(timeout=120_000)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'] >> visible=true").first.wait_for(
        timeout=120_000)
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab .lm-TabBar-tabLabel").all_inner_texts()


def _list_kernels(lab) -> list[dict] | None:
    """``GET /api/kernels``, or None where the server answered 500: jupyter_server 2.21 fails the
    whole listing while a kernel is still starting (its ``last_activity`` not yet set: a TraitError
    that ``list_kernels`` does not catch), which JupyterLab's own poll rides over by asking again."""
    import urllib.error

    try:
        return lab.api("/api/kernels")[1]
    except urllib.error.HTTPError as e:
        if e.code != 500:
            raise
        return None


def _settled_sessions(lab, wait_s: int = 60) -> list[dict]:
    """The server's sessions once none is a tab still connecting: JupyterLab makes a tab's session
    under a temporary path (a UUID) and then moves it to the notebook's, and a listing on a busy host
    can land between the two. A UUID path still there after ``wait_s`` is returned as it is (a
    session left behind, which the caller's comparison then reports)."""
    sessions = lab.api("/api/sessions")[1]
    for _ in range(wait_s):
        if all(str(x.get("path", "")).endswith(".ipynb") for x in sessions):
            break
        time.sleep(1)
        sessions = lab.api("/api/sessions")[1]
    return sessions


def _kernels(lab, at_least: int) -> list[dict]:
    """The server's running kernels, once ``at_least`` have started (JupyterLab starts a notebook's
    kernel after its tab shows), then a few seconds more for any other to start."""
    for _ in range(120):
        if len(_list_kernels(lab) or []) >= at_least:
            break
        time.sleep(1)
    time.sleep(5)
    for _ in range(30):
        got = _list_kernels(lab)
        if got is not None:
            return got
        time.sleep(1)
    return lab.api("/api/kernels")[1]


def _wait_for_saved_tabs(lab, n: int, timeout_s: float = 60.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        layout = lab.api("/lab/api/workspaces/default")[1]["data"].get("layout-restorer:data", {})
        if len(layout.get("main", {}).get("dock", {}).get("widgets", [])) >= n:
            return
        time.sleep(0.5)


def test_hwlab_lab_opens_00_on_the_hwlab_kernel_hides_nbgrader_and_restarts_on_one_tab(tmp_path):
    """``hwlab lab`` as a learner meets it in Chromium: notebook 00 is the one tab (no Launcher), its
    kernel is the kit's, the menu bar has no Nbgrader; after opening three more notebooks and a
    restart of ``hwlab lab``, JupyterLab comes back on notebook 00 alone, with one kernel running."""
    from playwright.sync_api import sync_playwright

    from lab_server import LabServer

    kit_kernel = (Path(sys.prefix) / "share" / "jupyter" / "kernels" / "hwlab").is_dir()
    home = tmp_path / "home"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    lab = LabServer(tmp_path, home)
    try:
        with sync_playwright() as p:
            browser = _chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            tabs = _open_lab(page, f"{lab.base}/lab?token={lab.token}", "00_start_here.ipynb")
            page.screenshot(path=str(ARTIFACTS / "hwlab_lab_first_start.png"))
            assert tabs == ["00_start_here.ipynb"], tabs
            assert page.locator(".jp-Launcher").count() == 0
            assert page.get_by_role("menuitem", name="Nbgrader").count() == 0
            assert page.get_by_role("menuitem", name="Run", exact=True).count() == 1  # the menu bar is there
            kernels = _kernels(lab, 1)
            assert len(kernels) == 1 and (kernels[0]["name"] == "hwlab" or not kit_kernel), kernels
            for n_open, nb in enumerate(("01_bandwidth_bound", "02_registers_occupancy", "03_cross_link_tp"), 2):
                tabs = _open_lab(page, f"{lab.base}/lab/tree/notebooks/{nb}.ipynb?token={lab.token}", f"{nb}.ipynb")
                # JupyterLab saves its layout to the server's workspace a moment later (debounced): the next
                # page load restores only what was saved, so wait for this tab to be in it first
                _wait_for_saved_tabs(lab, n_open)
            # the learner's four tabs, each with its kernel: counted by session (tab -> kernel), since a page
            # load that lands while a kernel is still starting may leave one more kernel behind on a busy host
            assert len(tabs) == 4 and len(_kernels(lab, 4)) >= 4, tabs
            sessions = _settled_sessions(lab)
            assert sorted(Path(x["path"]).name for x in sessions) == sorted(tabs), sessions
            assert all(x["kernel"]["name"] == "hwlab" or not kit_kernel for x in sessions), sessions
            browser.close()
    finally:
        lab.stop()

    lab = LabServer(tmp_path, home)  # hwlab lab started again
    try:
        with sync_playwright() as p:
            browser = _chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _open_lab(page, f"{lab.base}/lab?token={lab.token}", "00_start_here.ipynb")
            time.sleep(5)  # anything else being restored would have opened by now
            tabs = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab .lm-TabBar-tabLabel").all_inner_texts()
            page.screenshot(path=str(ARTIFACTS / "hwlab_lab_restart.png"))
            assert tabs == ["00_start_here.ipynb"], tabs
            assert len(_kernels(lab, 1)) == 1
            browser.close()
    finally:
        lab.stop()
