"""``hwlab hub singleuser [--dir NOTEBOOKS] [ARGS...]``: a learner's server under JupyterHub.

Top floor. JupyterHub's spawner (local, Slurm through batchspawner, Kubernetes through KubeSpawner)
runs this as the learner, in place of ``jupyterhub-singleuser`` (``c.Spawner.cmd`` in
``deploy/jupyterhub_config.py``). It does what ``hwlab lab`` does before serving, then becomes
JupyterHub's own single-user server (``exec``: same process, so the spawner's signals, port and
environment apply unchanged):

* the learner's **working copy** of the kit's notebooks (:mod:`hwlab.cli.workcopy`: made on the
  first spawn, completed later, never overwritten), served from its folder;
* the kit's ``hwlab`` **kernel** first on ``JUPYTER_PATH`` and the default kernel; JupyterLab's
  news pop-up and update check off (as ``hwlab lab``);
* the learner is entered on the **class roster** when ``HWLAB_CLASS_DIR`` is set (a drop box,
  :mod:`hwlab.course.dropbox`), so the instructor's summary lists learners who have not answered
  yet. A drop box with wrong modes is reported in the server log and not written; the lab still starts.

Arguments after ``--dir`` go to ``jupyterhub-singleuser`` unchanged (batchspawner adds none; the
hub passes its URL, port and token in the environment).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hwlab.cli import lablaunch, workcopy
from hwlab.errors import UserInputError


def singleuser_command(work: Path, extra: list[str]) -> list[str]:
    """The ``jupyterhub-singleuser`` command serving the working copy ``work`` (jupyter_server 2)."""
    cmd = [sys.executable, "-m", "jupyterhub.singleuser", f"--ServerApp.root_dir={work}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if (Path(sys.prefix) / "share" / "jupyter" / "kernels" / workcopy.KERNEL_NAME).is_dir():
        cmd.append(f"--MappingKernelManager.default_kernel_name={workcopy.KERNEL_NAME}")
    return cmd + extra


def prepare(notebooks: Path) -> tuple[Path, dict]:
    """Make or complete the working copy; returns its folder and the server's environment."""
    checkout = notebooks.parent
    work = workcopy.copy_root(checkout)
    rep = workcopy.prepare(checkout, root=work, kernel=workcopy.kit_kernel())
    print(f"hwlab: working copy {rep.root} ({'made now' if rep.made else 'kept'}"
          f"{', added ' + ', '.join(rep.copied) if rep.copied and not rep.made else ''})", file=sys.stderr)
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join([str(Path(sys.prefix) / "share" / "jupyter")] +
                                          [x for x in env.get("JUPYTER_PATH", "").split(os.pathsep) if x])
    cfg = workcopy.news_off(work / ".hwlab" / "jupyter-config")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        [str(cfg)] + [x for x in env.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if x])
    env.setdefault("JUPYTERHUB_DEFAULT_URL", "/lab/tree/notebooks/00_start_here.ipynb")
    return work, env


def join_class() -> None:
    from hwlab.course import classroom

    try:
        path = classroom.join()
    except (UserInputError, OSError) as e:
        print(f"hwlab: not entered on the class roster: {e}", file=sys.stderr)
        return
    if path is not None:
        print(f"hwlab: entered on the class roster ({classroom.class_dir()})", file=sys.stderr)


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """(``--dir`` value, the rest for jupyterhub-singleuser): argparse's remainder keeps ``--dir``
    when it follows the action, so it is taken out here wherever it stands."""
    rest, folder, it = [], None, iter(args)
    for x in it:
        if x == "--dir":
            folder = next(it, None)
        elif x.startswith("--dir="):
            folder = x.split("=", 1)[1]
        else:
            rest.append(x)
    return folder, rest


def make_private() -> None:
    """umask 077 from here on (inherited by the server and its kernels); the home folder 0700 if
    this user owns it and it lets group or others in."""
    os.umask(0o077)
    home = os.path.expanduser("~")
    try:
        st = os.lstat(home)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077 and not os.path.islink(home):
            os.chmod(home, 0o700)
    except OSError as e:
        print(f"hwlab: could not make {home} private: {e}", file=sys.stderr)


def cmd_hub_singleuser(a) -> int:
    folder, extra = split_args(a.args)
    folder = folder or a.dir
    notebooks = Path(folder) if folder else (Path(os.environ["HWLAB_KIT"]) / "notebooks"
                                           if os.environ.get("HWLAB_KIT") else lablaunch.find_notebooks())
    if notebooks is None or not (notebooks / "00_start_here.ipynb").is_file():
        raise UserInputError(f"no kit notebooks at {notebooks}: set HWLAB_KIT to the kit's checkout "
                             "or pass --dir NOTEBOOKS in c.Spawner.cmd")
    make_private()
    work, env = prepare(notebooks)
    join_class()
    cmd = singleuser_command(work, extra)
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(work)
    os.execve(cmd[0], cmd, env)
    return 3  # not reached: exec replaced this process


def add_parser(sub) -> None:
    h = sub.add_parser("hub", help="under JupyterHub: `hwlab hub singleuser` is the spawner's command (the "
                       "learner's working copy, the hwlab kernel, the class roster, then jupyterhub-singleuser)")
    h.add_argument("action", choices=["singleuser"], help="singleuser: start this learner's server (the hub runs it)")
    h.add_argument("--dir", help="the kit's notebooks/ folder (default: $HWLAB_KIT/notebooks, else found "
                   "from here)")
    h.add_argument("args", nargs=argparse.REMAINDER, help="passed to jupyterhub-singleuser")
    h.set_defaults(fn=cmd_hub_singleuser)
