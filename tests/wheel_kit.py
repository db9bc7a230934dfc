"""This tree as a user without the checkout has it: its wheel (``pip wheel --no-deps``, built from a
copy of ``src/``, ``pyproject.toml`` and ``README.md``) installed non-editable into a fresh venv
whose only other packages are this venv's (a ``.pth``; ``pip --no-index`` resolves the wheel's
dependency ranges against them, so nothing is downloaded). Used by tests/test_packaging.py and
tests/test_notebooks.py."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)


def build_wheel(tmp: Path) -> Path:
    src = tmp / "src-copy"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    r = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "-q", "-w", tmp / "dist", src)
    assert r.returncode == 0, r.stderr[-2000:]
    return next((tmp / "dist").glob("hwlab-*.whl"))


def install_in_fresh_venv(wheel: Path, venv: Path) -> Path:
    """Install ``wheel`` into a new venv at ``venv``; returns the venv's python."""
    r = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    purelib = _run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    (Path(purelib) / "hwlab_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = _run(sys.executable, "-m", "pip", "--python", py, "install", "--no-index", "-q", wheel)
    assert r.returncode == 0, r.stderr[-2000:]
    return py
