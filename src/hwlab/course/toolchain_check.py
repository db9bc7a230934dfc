"""Telling a broken toolchain apart from a wrong answer: Triton missing or outside the versions the
kit uses, or its bundled ptxas missing or failing, is reported as ``"environment problem"`` with the
fix, never as a wrong answer (:func:`toolchain_problem`)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from hwlab.course.exercise import ExerciseResult

#: Triton versions whose private compile API and bundled ptxas the kit uses (pyproject.toml)
TRITON_RANGE = ((3, 6), (3, 9))
FIX = ("run `bash scripts/setup.sh` (it installs the kit's pinned versions), or "
       "`pip install 'triton>=3.6,<3.9'` into this kernel's environment, then restart the kernel")

#: the status of an answer the toolchain, not the learner, kept from being graded
ENV = "environment problem"


def environment_problem(name: str, what: str) -> ExerciseResult:
    return ExerciseResult(name, ENV, f"not your answer: {what}. Fix: {FIX}.")


def _triton_version() -> tuple[int, int] | None:
    try:
        import triton
    except ImportError:
        return None
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


def _ptxas() -> Path:
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def toolchain_problem(static_compile: bool = False) -> str | None:
    """What is wrong with the Triton toolchain, or None. ``static_compile``: also the bundled
    ptxas the sm_90a report runs (exercise 02 on any machine; every kernel on a GPU)."""
    v = _triton_version()
    if v is None:
        return "Triton is not installed in this environment"
    lo, hi = TRITON_RANGE
    if not lo <= v < hi:
        return (f"Triton {v[0]}.{v[1]} is installed; the kit's compile reports need Triton "
                f">= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]}")
    if static_compile or torch.cuda.is_available():
        p = _ptxas()
        if not p.exists():
            return f"Triton's bundled ptxas is missing ({p})"
        try:
            r = subprocess.run([str(p), "--version"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            return f"Triton's bundled ptxas does not run ({e})"
        if r.returncode != 0:
            return f"Triton's bundled ptxas fails ({(r.stderr or r.stdout).strip()[-200:]})"
    return None


def toolchain_words(text: str) -> bool:
    """Whether a compile failure's text names the toolchain (then it is an environment problem)."""
    t = text.lower()
    return any(w in t for w in ("ptxas", "no such file", "importerror", "modulenotfounderror",
                                "attributeerror", "ships no", "gputarget", "astsource"))
