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
* **a working copy**: it serves the learner's copy of the notebooks, outside the checkout
  (:mod:`hwlab.cli.workcopy`: made on first start, never overwritten, ``--refresh`` on request),
  so Run All + save never writes into the committed notebooks.
* **no news pop-up**: JupyterLab's news fetch and update check are off for this server
  (``--LabApp.news_url=None``, ``NeverCheckForUpdate``, and the ``fetchNews``/``checkForUpdates``
  setting defaults in a config folder of the copy, on ``JUPYTER_CONFIG_PATH``).
* **stopping**: SIGTERM or SIGHUP to ``hwlab lab`` stops its Jupyter server (SIGTERM, then
  SIGKILL after 10 s) before it exits, and on Linux the server is also told to exit if
  ``hwlab lab`` dies without a word (``PR_SET_PDEATHSIG``): no orphaned server keeps serving.
* **what the learner sees**: JupyterLab opens notebook 00 alone (the server's default workspace
  is rewritten at every start, :func:`hwlab.cli.workcopy.fresh_workspace`, so a restart does
  not reopen every tab and start a kernel for each); only the kit's ``hwlab`` kernel is offered
  (``KernelSpecManager.allowed_kernelspecs``, no native ``python3``): the venv's, or for an install
  without it one written under the copy's ``.hwlab/`` (:func:`hwlab.cli.workcopy.ensure_kit_kernel`);
  nbgrader's authoring UI (its lab extension and server extensions) is off unless
  ``--instructor`` is given.
* **kernel**: the notebooks run in this venv's Python. ``JUPYTER_PATH`` puts this venv's
  ``share/jupyter`` first for this server only, so its kernels (``python3``, which the notebooks
  name, and the kit's ``hwlab`` that ``scripts/setup.sh`` installs with ``--sys-prefix``) are the
  ones used even where the user has kernels of those names elsewhere; nothing outside the copy
  changes.
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

from hwlab.cli import workcopy
from hwlab.errors import EXIT_OK, UserInputError

PORT_TRIES = 50


def free_port(ip: str, first: int, tries: int = PORT_TRIES) -> int:
    """The first port from ``first`` that nobody listens on at ``ip``."""
    for port in range(first, min(first + tries + 1, 65536)):
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            try:
                s.bind((ip, port))
            except socket.gaierror as e:  # not an address nor a name this machine resolves
                raise UserInputError(f"--ip {ip} is not an address or host name this machine knows ({e.strerror}): "
                                     "pass one of its addresses, e.g. 127.0.0.1 or 0.0.0.0") from None
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:  # a real address, but not one of this machine's
                    raise UserInputError(f"--ip {ip} is not an address of this machine: pass one of its "
                                         "addresses, e.g. 127.0.0.1 or 0.0.0.0") from None
                continue
            return port
    raise UserInputError(f"no free port in {first}..{first + tries} on {ip}: pass --port with "
                         "another start")


def command(root: Path, *, ip: str, port: int, token: str, no_browser: bool,
            as_root: bool, instructor: bool = False, workspaces_dir: Path | None = None) -> list[str]:
    """The ``jupyter lab`` command line serving ``root`` (the working copy's ``notebooks/``;
    arguments spelled for jupyter_server 2 and JupyterLab 4)."""
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={root.parent}",
           f"--ServerApp.ip={ip}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if workspaces_dir is not None:
        cmd.append(f"--LabApp.workspaces_dir={workspaces_dir}")
    if no_browser:
        cmd.append("--no-browser")
    if as_root:
        cmd.append("--allow-root")
    # the kit's kernel alone: the venv's, or the one run() writes beside the copy (workcopy.ensure_kit_kernel)
    cmd += [f"--MappingKernelManager.default_kernel_name={workcopy.KERNEL_NAME}",
            f"--KernelSpecManager.allowed_kernelspecs={workcopy.KERNEL_NAME}",
            "--KernelSpecManager.ensure_native_kernel=False"]
    if not instructor:
        cmd += [f"--ServerApp.jpserver_extensions={name}=False"
                for name in workcopy.NBGRADER_SERVER_EXTENSIONS if importlib.util.find_spec(name.split(".")[0])]
    cmd.append(str(Path(root.name) / "00_start_here.ipynb"))
    return cmd


def find_notebooks() -> Path | None:
    """The kit's notebooks/ folder: from the working folder upwards, then beside the package."""
    for base in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[3]]:
        if (base / "notebooks" / "00_start_here.ipynb").exists():
            return base / "notebooks"
    return None


def _die_with_parent() -> None:  # runs in the child before exec (Linux only)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(cmd: list[str], cwd: Path, env: dict) -> int:
    """Run the server; SIGTERM/SIGHUP to this process stop it first (see the module docstring)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)

    def stop(signum, _frame):
        raise _Stop(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    except (KeyboardInterrupt, _Stop):
        return EXIT_OK
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class _Stop(Exception):
    """A stop signal arrived."""


def _say_copy(rep: workcopy.CopyReport, refresh: bool) -> None:
    if rep.made:
        print(f"your working copy (made now; the checkout is never written): {rep.root}")
    else:
        print(f"your working copy: {rep.root}")
    if rep.copied and not rep.made:
        print(f"  added from the checkout: {', '.join(rep.copied)}")
    if rep.replaced:
        print(f"  refreshed (you had not modified them): {', '.join(rep.replaced)}")
    for rel, side in rep.kept.items():
        print(f"  kept your {rel}; the kit's new version is beside it: {side}")
    if rep.stale:
        print(f"  changed in the checkout since your copy: {', '.join(rep.stale)} "
              "(hwlab lab --refresh takes the new versions; files you modified are kept)")
    elif refresh and not (rep.replaced or rep.kept or rep.copied):
        print("  already up to date with the checkout")


@contextlib.contextmanager
def _copy_failure(work: Path):
    """A write into the working copy that fails after its home was checked (a disk that fills, a
    size limit, a mount turned read-only) is one line: what failed, that the copy is kept as far as
    it got (every file lands whole or not at all, :func:`hwlab.cli.workcopy._write_new`) and that
    the next start completes it. Nothing needs rescuing: every file is the kit's, still in the
    checkout, and the server's settings are rewritten at every start."""
    try:
        yield
    except OSError as e:
        if isinstance(e, UserInputError):
            raise
        where = f" {e.filename}" if e.filename else ""
        raise UserInputError(f"could not write{where} in the working copy {work} ({e.strerror or e}): free space "
                             "or lift the limit there, or set HWLAB_HOME to a folder you can write to; the files "
                             "already copied are kept whole and `hwlab lab` completes the copy when run again "
                             "(the checkout is never written)") from None


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
    checkout = root.parent
    work = workcopy.copy_root(checkout)
    if not a.dry_run:  # the home takes the copy, or one line naming HWLAB_HOME, before anything is written
        workcopy.check_home(work)
    instructor = bool(getattr(a, "instructor", False))
    state = work / ".hwlab"
    cmd = command(work / "notebooks", ip=a.ip, port=port, token=token, no_browser=a.no_browser,
                  as_root=as_root, instructor=instructor, workspaces_dir=state / "workspaces")
    if a.dry_run:
        print(f"would serve the working copy {work} "
              f"({'exists' if (work / workcopy.MANIFEST).exists() else 'made on first start'})")
    else:
        with _copy_failure(work):
            kernel, kernel_data = workcopy.ensure_kit_kernel(state)
            rep = workcopy.prepare(checkout, refresh=a.refresh, root=work, kernel=kernel)
        _say_copy(rep, a.refresh)
        if kernel_data is not None:
            print(f"the kit's Jupyter kernel 'hwlab' (this Python) written to {kernel_data}: "
                  "scripts/setup.sh installs it inside the venv instead")
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
        ([str(kernel_data)] if kernel_data is not None else []) + [str(Path(sys.prefix) / "share" / "jupyter")] +
        [x for x in env.get("JUPYTER_PATH", "").split(os.pathsep) if x])
    with _copy_failure(work):
        cfg = workcopy.news_off(state / "jupyter-config")
        workcopy.learner_page_config(cfg, instructor=instructor)
        workcopy.fresh_workspace(state / "workspaces")
    if instructor:
        print("instructor: nbgrader's menus and formgrader are shown")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        [str(cfg)] + [x for x in env.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if x])
    return serve(cmd, work, env)
