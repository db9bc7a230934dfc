"""The learner's working copy of the kit's notebooks, outside the checkout (``hwlab lab``).

Top floor (serves people). Why a copy: Jupyter saves outputs into the notebook it serves, and the
committed notebooks must stay output-free and paired with their ``.py`` (tests and ``git pull``
depend on it). So ``hwlab lab`` serves a copy the learner owns:

* **where**: ``$HWLAB_HOME/work/<checkout name>-<hash of its path>/``, ``$HWLAB_HOME`` defaulting
  to ``${XDG_DATA_HOME:-~/.local/share}/hwlab``: one copy per checkout, so two clones never share
  (or overwrite) a learner's work.
* **what**: ``notebooks/`` and ``exercises/`` (``.ipynb`` only, not the paired ``.py``) and
  ``examples/`` (to examine from a terminal and edit; notebook 08 reads the package's own copy,
  :func:`hwlab.core.evidence.example`, so a copy without them still runs). Not ``solutions/``: a
  learner should meet the exercise before its answer; an instructor opens the checkout's.
* **unpaired**: each copied notebook loses its ``jupytext.formats`` pairing, so no save in the
  copy writes a ``.py`` anywhere, and names the kit's ``hwlab`` kernel where the venv has it.
* **made once, never overwritten**: the first start copies; later starts copy only files that
  are missing. ``refresh`` (``hwlab lab --refresh``) replaces only the files the learner has not
  modified (their bytes still match what was copied) whose source changed in the checkout; where
  the learner modified a file whose source changed, the kit's new version is written beside it as
  ``NAME.kit-YYYYMMDD.ipynb`` and the learner's file is kept. A manifest
  (``.hwlab-copy.json``) records what was copied, as SHA-256 of source and copy.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from hwlab.core.store import DestinationError, check_folder, publish, read_user_json, temp_beside
from hwlab.errors import UserInputError

#: folders copied, and the file names taken from each
KIT_FILES = {"notebooks": "*.ipynb", "exercises": "*.ipynb", "examples": "*.py"}
MANIFEST = ".hwlab-copy.json"
_MANIFEST_HINT = "delete it and start again (your notebooks are kept; the manifest is made anew)"
KERNEL_NAME = "hwlab"
#: the name the kernel picker and the notebook show: the kit and its Python, never a machine path
KERNEL_DISPLAY_NAME = f"hwlab (Python {sys.version_info[0]}.{sys.version_info[1]})"


@dataclass
class CopyReport:
    root: Path
    made: bool = False                       # the copy was created by this call
    copied: list[str] = field(default_factory=list)       # new in the copy
    replaced: list[str] = field(default_factory=list)     # refreshed, not modified by the learner
    kept: dict[str, str] = field(default_factory=dict)    # learner-modified -> where the kit's new version went
    stale: list[str] = field(default_factory=list)        # changed in the checkout, not refreshed
    adopted: list[str] = field(default_factory=list)      # the kit's copy, missing from the manifest


def hwlab_home() -> Path:
    if os.environ.get("HWLAB_HOME"):
        try:  # Python 3.12+ raises for a ~user with no home; earlier ones leave '~user' as it is
            home = Path(os.environ["HWLAB_HOME"]).expanduser()
        except RuntimeError:
            home = Path(os.environ["HWLAB_HOME"])
        if str(home).startswith("~"):  # ~user of no such user: never a folder named '~user' under the cwd
            raise UserInputError(f"HWLAB_HOME={os.environ['HWLAB_HOME']}: no such user's home to expand: "
                                 "set HWLAB_HOME to a folder you can write to")
        return home
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "hwlab"


def home_setting() -> str:
    """How the working copies' home was chosen, for a refusal to name."""
    if os.environ.get("HWLAB_HOME"):
        return f"HWLAB_HOME={os.environ['HWLAB_HOME']}"
    return f"HWLAB_HOME unset, so {hwlab_home()}"


def check_home(root: Path) -> Path:
    """Make sure the working copy's folder ``root`` (under the home) exists and takes new files,
    before anything is copied or written: any failure (a home the kernel answers with ENOENT, EACCES,
    EROFS, ENOTDIR, ENOSPC..., a file in the way, a ``~user`` that does not exist) is one line that
    names ``HWLAB_HOME``, whatever the errno, since setting it is the fix."""
    try:
        check_folder(root, what="working copy")
    except (DestinationError, OSError) as e:
        why = str(e).split(": choose a folder")[0].split(": pass a folder")[0]
        raise UserInputError(f"{why} ({home_setting()}): set HWLAB_HOME to a folder you can write to") from None
    return root


def copy_root(checkout: Path) -> Path:
    """The working copy of ``checkout`` (the folder that holds ``notebooks/``)."""
    real = checkout.resolve()
    key = hashlib.sha256(str(real).encode()).hexdigest()[:12]
    return hwlab_home() / "work" / f"{real.name}-{key}"


def kit_kernel() -> dict | None:
    """The kernelspec metadata of the kit's ``hwlab`` kernel in this venv, or None without one."""
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME / "kernel.json"
    try:
        k = json.loads(spec.read_text())
    except (OSError, ValueError):
        return None
    return {"name": KERNEL_NAME, "display_name": k.get("display_name", KERNEL_NAME),
            "language": k.get("language", "python")}


def ensure_kit_kernel(state_dir: Path) -> tuple[dict, Path | None]:
    """The kit's ``hwlab`` kernel for ``hwlab lab``: the venv's (``scripts/setup.sh`` installs it
    there), or, in an install without one (``pip install '.[lab]'``), a kernelspec written under the
    server's state folder that runs this Python, so the learner is offered the kit's kernel alone
    either way. Returns its metadata and the Jupyter data folder to put on ``JUPYTER_PATH`` (None
    when the venv has it)."""
    kernel = kit_kernel()
    if kernel is not None:
        return kernel, None
    data_dir = state_dir / "jupyter-data"
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": KERNEL_DISPLAY_NAME, "language": "python", "metadata": {"debugger": True}}
    path = data_dir / "kernels" / KERNEL_NAME / "kernel.json"
    data = (json.dumps(spec, indent=1) + "\n").encode()
    if not path.exists() or path.read_bytes() != data:
        _write_new(path, data, replace=True)
    return {"name": KERNEL_NAME, "display_name": spec["display_name"], "language": "python"}, data_dir


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kit_files(checkout: Path) -> dict[str, Path]:
    out = {}
    for folder, pattern in KIT_FILES.items():
        for p in sorted((checkout / folder).glob(pattern)):
            if p.is_file():
                out[f"{folder}/{p.name}"] = p
    return out


def learner_version(src: Path, kernel: dict | None) -> bytes:
    """The bytes the copy gets for ``src``: a notebook unpaired and on the kit's kernel."""
    data = src.read_bytes()
    if src.suffix != ".ipynb":
        return data
    nb = json.loads(data)
    meta = nb.setdefault("metadata", {})
    jt = meta.get("jupytext")
    if isinstance(jt, dict):
        jt.pop("formats", None)
        if not jt:
            meta.pop("jupytext")
    if kernel:
        meta["kernelspec"] = dict(kernel)
        # what the kernel reports when it starts (ipykernel's language_info for this Python), so opening
        # the notebook and starting its kernel changes nothing: it opens unmodified
        meta["language_info"] = language_info()
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()


def language_info() -> dict:
    """The ``language_info`` an ipykernel running this Python reports."""
    import platform

    return {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
            "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
            "pygments_lexer": "ipython3", "version": platform.python_version()}


def _write_new(path: Path, data: bytes, *, replace: bool = False) -> None:
    """Write atomically through the kit's one temp-file handling (:func:`hwlab.core.store.temp_beside`,
    :func:`~hwlab.core.store.publish`): a failure or SIGTERM mid-write removes the temporary file and
    leaves ``path`` as it was. Without ``replace`` an existing file is never touched; with it only
    a regular file is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_beside(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
        publish(tmp, path, overwrite=replace)


def _beside(path: Path, day: str) -> Path:
    cand = path.with_name(f"{path.stem}.kit-{day}{path.suffix}")
    n = 2
    while cand.exists():
        cand = path.with_name(f"{path.stem}.kit-{day}-{n}{path.suffix}")
        n += 1
    return cand


def prepare(checkout: Path, *, refresh: bool = False, root: Path | None = None,
            kernel: dict | None = None) -> CopyReport:
    """Make (first start), complete (missing files) or ``refresh`` the working copy; see the
    module docstring for what is never overwritten."""
    root = root or copy_root(checkout)
    check_home(root)
    rep = CopyReport(root=root, made=not (root / MANIFEST).exists())
    man_path = root / MANIFEST
    man = read_user_json(man_path, "working-copy manifest", _MANIFEST_HINT) if not rep.made else {"files": {}}
    files = man.get("files") if isinstance(man, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise UserInputError(f"working-copy manifest {man_path} is not one hwlab wrote: {_MANIFEST_HINT}")
    day = datetime.now(timezone.utc).strftime("%Y%m%d")
    for rel, src in kit_files(checkout).items():
        data = learner_version(src, kernel)
        src_sha, dst = _sha(src.read_bytes()), root / rel
        rec = files.get(rel)
        if not dst.exists():
            _write_new(dst, data)
            files[rel] = {"source_sha256": src_sha, "copy_sha256": _sha(data)}
            rep.copied.append(rel)
            continue
        if rec is None and _sha(dst.read_bytes()) == _sha(data):
            # the kit's version, copied by a start that stopped before its manifest was written (a
            # full disk, a signal): recorded now, so --refresh keeps it up to date
            files[rel] = {"source_sha256": src_sha, "copy_sha256": _sha(data)}
            rep.adopted.append(rel)
            continue
        if rec is None or rec.get("source_sha256") == src_sha:
            continue  # the learner's own file of that name, or the source did not change
        if not refresh:
            rep.stale.append(rel)
            continue
        if _sha(dst.read_bytes()) == rec.get("copy_sha256"):
            _write_new(dst, data, replace=True)
            files[rel] = {"source_sha256": src_sha, "copy_sha256": _sha(data)}
            rep.replaced.append(rel)
        else:
            side = _beside(dst, day)
            _write_new(side, data)
            rec["source_sha256"] = src_sha  # this version is delivered (beside); not stale again
            rep.kept[rel] = str(side.relative_to(root))
    if rep.made or rep.copied or rep.replaced or rep.kept or rep.adopted:
        man.update(checkout=str(checkout.resolve()),
                   updated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        man.setdefault("made_at", man["updated_at"])
        _write_new(man_path, (json.dumps(man, indent=1, sort_keys=True) + "\n").encode(), replace=True)
    return rep


def news_off(config_dir: Path) -> Path:
    """A Jupyter config folder whose ``labconfig/default_setting_overrides.json`` sets JupyterLab's
    news fetch and update check off (``@jupyterlab/apputils-extension:notification``: with
    ``fetchNews`` at its default "none" JupyterLab asks every new user whether to fetch news).
    These are defaults: a choice the user saved in their own settings still wins."""
    path = config_dir / "labconfig" / "default_setting_overrides.json"
    want = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                           "checkForUpdates": False}}
    data = (json.dumps(want, indent=1) + "\n").encode()
    if not path.exists() or path.read_bytes() != data:
        _write_new(path, data, replace=True)
    return config_dir


#: nbgrader's authoring and exchange UI: hidden from learners, kept for ``hwlab lab --instructor``
NBGRADER_LABEXTENSION = "@jupyter/nbgrader"
NBGRADER_SERVER_EXTENSIONS = tuple(f"nbgrader.server_extensions.{x}" for x in (
    "formgrader", "assignment_list", "course_list", "validate_assignment"))
FIRST_NOTEBOOK = "notebooks/00_start_here.ipynb"


def learner_page_config(config_dir: Path, *, instructor: bool) -> Path:
    """``labconfig/page_config.json`` of the server's config folder: for a learner it disables
    nbgrader's lab extension (the Nbgrader menu, Create Assignment, Formgrader), for an
    instructor it is removed, so nothing is disabled."""
    path = config_dir / "labconfig" / "page_config.json"
    if instructor:
        path.unlink(missing_ok=True)
        return path
    data = (json.dumps({"disabledExtensions": {NBGRADER_LABEXTENSION: True}}, indent=1) + "\n").encode()
    if not path.exists() or path.read_bytes() != data:
        _write_new(path, data, replace=True)
    return path


def fresh_workspace(workspaces_dir: Path, notebook: str = FIRST_NOTEBOOK) -> Path:
    """The server's default JupyterLab workspace, written at every start: one tab, ``notebook``.
    JupyterLab restores the tabs of the last session from this file, and each restored notebook
    starts a kernel; rewriting it means a restart opens the first notebook alone, not every tab
    the learner had open (their notebooks and outputs stay in the copy)."""
    widget = f"notebook:{notebook}"
    ws = {"data": {"layout-restorer:data": {"main": {"dock": {"type": "tab-area", "currentIndex": 0,
                                                              "widgets": [widget]},
                                                     "current": widget}},
                   widget: {"data": {"path": notebook, "factory": "Notebook"}}},
          "metadata": {"id": "default"}}
    # JupyterLab's file name for the workspace "default" (jupyterlab_server's slugify)
    path = workspaces_dir / f"default-{hashlib.sha256(b'default').hexdigest()[:4]}.jupyterlab-workspace"
    _write_new(path, json.dumps(ws).encode(), replace=True)
    return path

