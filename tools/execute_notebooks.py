"""Execute every notebook (notebooks/, solutions/, exercises/) with nbclient on this machine.

    python tools/execute_notebooks.py --out OUTDIR [--only 04_fp8,notebooks/07,exercises/ex01]

Writes the executed copies to OUTDIR (``<folder>__<name>.ipynb``) and a JSON summary of what
ran, how long, and which raised. On a GPU machine the executed copies are the "outputs recorded
on the H200" the repo may keep on purpose (see docs/executed-h200/). Each cell is watched
(tools/nbwatch.py): a stall (no message, idle kernel for ``--idle-limit`` s) writes its stacks to
test-artifacts/nbwatch/ and the notebook is executed once more in a fresh kernel; the copy's
``hwlab_executed["stalls"]`` and the summary say so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nbwatch import execute_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default="", help="comma-separated parts of 'folder/name' to run, e.g. "
                   "'04_fp8,notebooks/07,exercises/ex01' (default: all)")
    p.add_argument("--timeout", type=int, default=180,
                   help="seconds per cell (the longest cell runs well under a minute on the H200): a hung cell "
                        "is recorded as an error and the next notebook runs, inside one device call")
    p.add_argument("--idle-limit", type=float, default=60.0,
                   help="seconds without a message while the kernel sits idle before a cell counts as "
                        "stalled (its stacks are dumped and the notebook runs once more in a fresh kernel)")
    p.add_argument("--working-copy", action="store_true",
                   help="run notebooks/ and exercises/ from a fresh working copy made by `hwlab lab`'s own code "
                        "(under $HWLAB_HOME, a temporary folder by default), as a learner runs them; solutions, "
                        "which `hwlab lab` leaves out, from the checkout")
    a = p.parse_args(argv)
    copy = _working_copy() if a.working_copy else None
    # the executed copies carry the solutions' checkpoint answers, graded by the checker (hwlab.nb.answer)
    os.environ.setdefault("HWLAB_CHECKPOINT_ANSWERS", str(ROOT / "solutions" / "checkpoints.json"))
    a.out.mkdir(parents=True, exist_ok=True)
    summary, failed = [], 0
    for folder in ("notebooks", "solutions", "exercises"):
        base = copy if copy is not None and folder != "solutions" else ROOT
        for path in sorted((base / folder).glob("*.ipynb")):
            wanted = [w for w in a.only.split(",") if w]
            if wanted and not any(w in f"{folder}/{path.name}" for w in wanted):
                continue
            nb = nbformat.read(path, as_version=4)
            t0 = time.time()
            err = None
            try:
                execute_notebook(nb, cwd=path.parent, cell_timeout_s=a.timeout, idle_limit_s=a.idle_limit,
                                 label=f"{folder}__{path.stem}")
            except CellExecutionError as e:
                err = str(e)[-1500:]
                failed += 1
            except Exception as e:  # noqa: BLE001  (a timeout or a dead kernel: recorded, the next notebook runs)
                err = f"{type(e).__name__}: {str(e)[-1400:]}"
                failed += 1
            stalls = nb.metadata.pop("hwlab_nbwatch", {}).get("stalls", [])
            nb.metadata["hwlab_executed"] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                             "seconds": round(time.time() - t0, 1), "error": err,
                                             "stalls": stalls}
            nbformat.write(nb, a.out / f"{folder}__{path.name}")
            summary.append({"notebook": f"{folder}/{path.name}", "seconds": round(time.time() - t0, 1),
                            "from": "working copy" if base is copy else "checkout",
                            "ok": err is None, "error": err, "stalls": stalls})
            print(f"{'ok ' if err is None else 'ERR'} {folder}/{path.name} {time.time() - t0:.0f} s"
                  + (f" (after {len(stalls)} stall(s), retried in a fresh kernel)" if stalls else ""), flush=True)
            # after each notebook: a call cut at its time limit still returns what finished
            (a.out / "notebooks_summary.json").write_text(json.dumps(summary, indent=2))
    (a.out / "notebooks_summary.json").write_text(json.dumps(summary, indent=2))
    return 1 if failed else 0


def _working_copy() -> Path:
    """A fresh working copy of the labs made by ``hwlab lab``'s code (hwlab.cli.workcopy)."""
    import tempfile

    sys.path.insert(0, str(ROOT / "src"))
    from hwlab.cli import workcopy

    os.environ.setdefault("HWLAB_HOME", tempfile.mkdtemp(prefix="hwlab-home-"))
    root = workcopy.copy_root(ROOT)
    workcopy.prepare(ROOT, root=root, kernel=workcopy.kit_kernel())
    print(f"working copy: {root}", flush=True)
    return root


if __name__ == "__main__":
    sys.exit(main())
