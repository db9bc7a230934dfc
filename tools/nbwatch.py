"""Execute one notebook headlessly: the one way the tests, the executed copies and the nbgrader
course drive a kernel.

    from nbwatch import execute_notebook
    nb = execute_notebook(path, cwd=path.parent, env={"HWLAB_CHECKPOINT_ANSWERS": "..."})

``cwd`` is the folder the kernel starts in (a learner's working copy, not the checkout, when the
test is about the learner); ``env`` adds variables to the kernel's environment only (the caller's
``os.environ`` is left as it was), ``drop_env`` removes some; ``kernel_name`` is a kernelspec name the running Python's
Jupyter sees. ``cell_timeout_s`` bounds one cell.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import nbformat
from nbclient import NotebookClient


def execute_notebook(nb_or_path, *, cwd: Path, env: Mapping[str, str] | None = None,
                     drop_env: tuple[str, ...] = (), kernel_name: str = "python3",
                     cell_timeout_s: int = 900) -> nbformat.NotebookNode:
    """Execute a notebook (a path or a ``NotebookNode``, executed in place) and return it."""
    nb = nbformat.read(nb_or_path, as_version=4) if isinstance(nb_or_path, (str, Path)) else nb_or_path
    kernel_env = {k: v for k, v in os.environ.items() if k not in drop_env}
    kernel_env.update(env or {})
    client = NotebookClient(nb, timeout=cell_timeout_s, kernel_name=kernel_name,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(env=kernel_env, cwd=str(cwd))  # keyword arguments reach the kernel manager's start
    return nb
