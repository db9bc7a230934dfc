"""``hwlab lab`` started for real, as a learner starts it, for tests that talk to its server
(tests/test_lablaunch.py through the REST API, tests/test_browser.py through Chromium)."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class LabServer:
    """``hwlab lab`` started for real on a free port under ``home`` (HWLAB_HOME); stop() is SIGTERM."""

    def __init__(self, tmp_path: Path, home: Path, *args: str):
        self.env = dict(os.environ, HWLAB_HOME=str(home), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
                        JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
                        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
        self.env.pop("JUPYTERLAB_WORKSPACES_DIR", None)
        self.log_path = tmp_path / f"lab{len(list(tmp_path.glob('lab*.log')))}.log"
        self.log = open(self.log_path, "w+")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "hwlab", "lab", "--no-browser", "--port", str(first),
                                      *args], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        t0, url = time.monotonic(), None
        while url is None and time.monotonic() - t0 < 60 and self.proc.poll() is None:
            m = re.search(r"JupyterLab: (http://\S+)", self.log_path.read_text())
            url = m.group(1) if m else time.sleep(0.5)
        assert url, self.log_path.read_text()
        self.base, self.token = url.split("/lab?token=")
        while time.monotonic() - t0 < 180:
            try:
                self.api("/api/status")
                break
            except OSError:
                time.sleep(1)
        else:
            self.stop()
            pytest.fail(self.log_path.read_text()[-3000:])

    def api(self, path, method="GET", body=None):
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")

    def page_config(self) -> dict:
        req = urllib.request.Request(f"{self.base}/lab", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            html = r.read().decode()
        m = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
        return json.loads(m.group(1))

    def status_of(self, path) -> int:
        req = urllib.request.Request(f"{self.base}{path}", headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
