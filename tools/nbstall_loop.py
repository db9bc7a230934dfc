"""Execute notebooks in a loop under the nbwatch watchdog, to catch the idle-kernel stall on purpose.

    python tools/nbstall_loop.py --out DIR --rounds 5 [--burners 2] [--idle-limit 60] \
        [--only exercises/ex01,notebooks/07] [--synthetic usdt,leftovers,native,widget] [--stock-waits]

Each round executes every chosen notebook once, each in a fresh kernel, with ``on_stall="fail"``:
a stall is counted (not retried) and its report (both stacks, the cell's message log) lands in
``DIR/reports``. ``--burners K`` runs K ``python -c 'while 1: pass'`` processes for the whole
loop (a loaded CI machine). ``--synthetic`` adds small notebooks that each isolate one candidate
cause, written to ``DIR/synthetic``:

- ``usdt``: torch.profiler started and stopped 30 times (native ``USDT:`` lines on fd 2 each time,
  unless the kit silences them), interleaved with prints;
- ``leftovers``: a cell leaves a printing thread and a child process writing to the inherited
  stdout/stderr fds behind, and the next cells run while they write;
- ``native``: C ``write(2)`` on fd 1 and 2 from the main thread, many short lines;
- ``widget``: 100 cells that print into an ``ipywidgets.Output`` (as notebooks 01 and 02 do): nbclient
  mirrors the widget and sends its state back on the shell channel for every output it captures.

``--stock-waits`` waits on the kernel's channels as nbclient does (the stall's cause, see
tools/nbwatch.py), to measure the rate before the fix. ``DIR/runs.jsonl`` gets one line per execution; the summary (executions, stalls, cells) is
printed and written to ``DIR/summary.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nbwatch import POLL_SLICE_S, KernelStall, execute_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SYNTHETIC = {
    "usdt": [
        "import torch\nfrom torch.profiler import ProfilerActivity, profile\nx = torch.randn(64, 64)",
        "for i in range(30):\n    with profile(activities=[ProfilerActivity.CPU]) as p:\n        y = x @ x\n"
        "    print('profiled', i, len(p.events()))",
        "print('after the profiles')",
    ],
    "leftovers": [
        "import subprocess, sys, threading, time\n"
        "def chatter():\n    for i in range(100):\n        print('thread line', i); time.sleep(0.05)\n"
        "threading.Thread(target=chatter, daemon=True).start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, time\\nfor i in range(100):\\n"
        "    os.write(1, b\"child out %d\\\\n\" % i); os.write(2, b\"child err %d\\\\n\" % i); time.sleep(0.03)'])\n"
        "print('left a thread and a child behind')",
        "print('next cell while they write')",
        "time.sleep(1); print('a later cell')",
        "child.wait(); time.sleep(2); print('child exited', child.returncode)",
    ],
    "widget": [
        "import ipywidgets as W\nfrom IPython.display import display\nout = W.Output()\ndisplay(out)",
    ] + ["with out:\n    for i in range(20):\n        print('into the Output widget', i)"] * 100,
    "native": [
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "for i in range(2000):\n    libc.write(1 + i % 2, b'native line %d\\n' % i, len(b'native line %d\\n' % i))",
        "print('after native writes')",
    ],
}


def synthetic(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.ipynb"
    nb = new_notebook(cells=[new_code_cell(s) for s in SYNTHETIC[name]],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, path)
    return path


def chosen(only: str, syn: str, out: Path) -> list[Path]:
    paths = [synthetic(s, out / "synthetic") for s in syn.split(",") if s]
    for part in (p for p in only.split(",") if p):
        hits = sorted(ROOT.glob(f"{part}*.ipynb"))
        if not hits:
            raise SystemExit(f"no notebook matches {part!r} (give folder/NN, e.g. exercises/ex01)")
        paths += hits
    return paths


def _slowest_cell(nb) -> dict | None:
    """The cell with the longest request-to-reply time (nbclient's timing metadata)."""
    from datetime import datetime
    best = None
    for i, c in enumerate(nb.cells):
        ex = c.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            s = (datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
                 - datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))).total_seconds()
            if best is None or s > best["s"]:
                best = {"cell_index": i, "s": round(s, 1)}
    return best


def run_one(path: Path, idle_limit_s: float, report_dir: Path, poll_slice_s: float | None) -> dict:
    t0 = time.monotonic()
    row = {"notebook": f"{path.parent.name}/{path.name}"}
    try:
        nb = execute_notebook(path, cwd=path.parent, idle_limit_s=idle_limit_s, on_stall="fail",
                              report_dir=report_dir, cell_timeout_s=600, poll_slice_s=poll_slice_s,
                              env={"HWLAB_CHECKPOINT_ANSWERS": str(ROOT / "solutions" / "checkpoints.json")})
        row["result"] = "ok"
        row["longest_quiet"] = nb.metadata["hwlab_nbwatch"].get("longest_quiet")
        row["slowest_cell"] = _slowest_cell(nb)
        row["usdt_lines"] = sum(o.get("text", "").count("USDT:") for c in nb.cells for o in c.get("outputs", []))
    except KernelStall as e:
        row.update(result="stall", **{k: e.record[k] for k in ("cell_index", "report", "execute_reply_received",
                                                                "status_idle_received")})
    except Exception as e:  # noqa: BLE001  (an error in a cell is not a stall: recorded, the loop goes on)
        row.update(result="error", error=f"{type(e).__name__}: {str(e)[-300:]}")
    row["seconds"] = round(time.monotonic() - t0, 1)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--burners", type=int, default=0)
    p.add_argument("--idle-limit", type=float, default=60.0)
    p.add_argument("--only", default="", help="comma-separated folder/NN prefixes, e.g. exercises/ex01,notebooks/07")
    p.add_argument("--synthetic", default="", help=f"comma-separated, of {sorted(SYNTHETIC)}")
    p.add_argument("--stock-waits", action="store_true",
                   help="wait on the channels as nbclient does (no poll slices): the behaviour before the fix")
    a = p.parse_args(argv)
    paths = chosen(a.only, a.synthetic, a.out)
    burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(a.burners)]
    rows = []
    try:
        with open(a.out / "runs.jsonl", "a") as log:
            for r in range(a.rounds):
                for path in paths:
                    row = run_one(path, a.idle_limit, a.out / "reports", None if a.stock_waits else POLL_SLICE_S)
                    row.update(round=r, burners=a.burners, stock_waits=a.stock_waits,
                               load1=round(os.getloadavg()[0], 2))
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    print(json.dumps(row), flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    summary = {"executions": len(rows), "stalls": sum(r["result"] == "stall" for r in rows),
               "errors": sum(r["result"] == "error" for r in rows), "burners": a.burners,
               "stalled_cells": sorted({(r["notebook"], r["cell_index"]) for r in rows if r["result"] == "stall"})}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 1 if summary["stalls"] else 0


if __name__ == "__main__":
    sys.exit(main())
