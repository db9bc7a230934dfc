"""``hwlab lab``: JupyterLab on the kit's notebooks, as a new user or a root shell in a container.

Top floor (talks to people). What it does beyond ``jupyter lab``, and why:

* **root**: JupyterLab refuses to run as root unless told ``--allow-root``; lab machines and
  containers often run as root, so the kit passes it when the effective uid is 0 and says so
  in one line.
* **port**: the first free port from ``--port`` (default 8888) up to 50 further (what Jupyter
  itself tries), chosen here so the printed URL is the one that serves; Jupyter's own retry is
  switched off so it cannot move elsewhere.
* **URL**: a token made here and passed to the server, so the full URL (token included) is
  printed before Jupyter's own log starts.
* **kernel**: the notebooks run in this venv's Python. ``JUPYTER_PATH`` puts this venv's
  ``share/jupyter`` first for this server only, so its kernels (``python3``, which the notebooks
  name, and the kit's ``hwlab`` that ``scripts/setup.sh`` installs with ``--sys-prefix``) are the
  ones used even where the user has kernels of those names elsewhere; nothing on disk changes.
"""
from __future__ import annotations

import importlib.util
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

from hwlab.errors import EXIT_OK, UserInputError

PORT_TRIES = 50


def free_port(ip: str, first: int, tries: int = PORT_TRIES) -> int:
    """The first port from ``first`` that nobody listens on at ``ip``."""
    for port in range(first, min(first + tries + 1, 65536)):
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            try:
                s.bind((ip, port))
            except OSError:
                continue
            return port
    raise UserInputError(f"no free port in {first}..{first + tries} on {ip}: pass --port with "
                         "another start")


def command(root: Path, *, ip: str, port: int, token: str, no_browser: bool,
            as_root: bool) -> list[str]:
    """The ``jupyter lab`` command line (arguments spelled for jupyter_server 2)."""
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={root.parent}",
           f"--ServerApp.ip={ip}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}"]
    if no_browser:
        cmd.append("--no-browser")
    if as_root:
        cmd.append("--allow-root")
    if (Path(sys.prefix) / "share" / "jupyter" / "kernels" / "hwlab").is_dir():
        cmd.append("--MappingKernelManager.default_kernel_name=hwlab")
    cmd.append(str(Path(root.name) / "00_start_here.ipynb"))
    return cmd


def find_notebooks() -> Path | None:
    """The kit's notebooks/ folder: from the working folder upwards, then beside the package."""
    for base in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[3]]:
        if (base / "notebooks" / "00_start_here.ipynb").exists():
            return base / "notebooks"
    return None


def run(a) -> int:
    root = Path(a.dir) if a.dir else find_notebooks()
    if root is None:
        raise UserInputError("cannot find the notebooks/ folder: run from the hwlab checkout or "
                             "pass --dir")
    if not (root / "00_start_here.ipynb").exists():
        raise UserInputError(f"{root} has no 00_start_here.ipynb: pass the kit's notebooks/ folder "
                             "with --dir")
    if importlib.util.find_spec("jupyterlab") is None:
        raise UserInputError("JupyterLab is not installed in this environment: "
                             "pip install 'hwlab[lab]' (or bash scripts/setup.sh)")
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    port = free_port(a.ip, a.port)
    token = secrets.token_hex(24)
    cmd = command(root, ip=a.ip, port=port, token=token, no_browser=a.no_browser, as_root=as_root)
    if as_root:
        print("running as root: passing --allow-root to JupyterLab")
    if port != a.port:
        print(f"port {a.port} is taken: using {port}")
    host = f"[{a.ip}]" if ":" in a.ip else a.ip
    url = f"http://{'127.0.0.1' if a.ip in ('0.0.0.0', '') else host}:{port}/lab?token={token}"
    print(f"JupyterLab: {url}", flush=True)
    if a.dry_run:
        print("would run:", " ".join(cmd))
        return EXIT_OK
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join(
        [str(Path(sys.prefix) / "share" / "jupyter")] +
        [x for x in env.get("JUPYTER_PATH", "").split(os.pathsep) if x])
    try:
        return subprocess.call(cmd, cwd=root.parent, env=env)
    except KeyboardInterrupt:
        return EXIT_OK
