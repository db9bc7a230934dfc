"""Record two processes measuring the copy ceiling on one GPU at once: both must be marked SHARED.

    python tools/record_shared_gpu.py --out OUTDIR [--size-mib 2048] [--seconds 4] [--force]

On a CUDA machine (about a minute): one process measures the copy ceiling alone (the quiet
reference), then two processes measure it at the same moment (a shared start time, each timing for
``--seconds``), each through ``hwlab.core.measure.bench`` and so through its NVML watch
(:mod:`hwlab.core.gpu_share`). Writes ``OUTDIR/shared_gpu.json`` (never over an existing file
without ``--force``): the machine, the quiet measurement, the pair, and for each of the pair whether
it was marked SHARED and which pids NVML showed beside it. Copy it to ``src/hwlab/recorded/<device>/``
to commit it; ``tests/test_gpu_share.py`` re-reads it there.

Exit codes: 0 recorded and both of the pair marked SHARED; 1 recorded but a mark is missing (a
finding: the watch missed the neighbour); 2 no CUDA GPU here, or OUTDIR cannot take the file
(nothing written); 3 a measuring process failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

NAME = "shared_gpu.json"


def child(a) -> int:
    import torch

    from hwlab.core import probes

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context exists before the start: NVML lists this process
    time.sleep(max(0.0, a.start_at - time.time()))
    per_call_s = 2 * a.size_mib * 2**20 / 3e12  # a few TB/s: enough repeats for about --seconds
    m = probes.hbm_copy(size_mib=a.size_mib, device="cuda", impl="torch",
                        n_rep=max(50, int(a.seconds / per_call_s)))
    Path(a.child_out).write_text(json.dumps({"pid": os.getpid(), "started_at": a.start_at,
                                             "measurement": m.to_dict()}))
    return 0


def _run(n: int, a, tmp: Path, tag: str) -> list[dict]:
    start = time.time() + 15.0  # CUDA init and allocation in each process happen before this
    outs = [tmp / f"{tag}-{i}.json" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "--start-at", str(start),
                               "--size-mib", str(a.size_mib), "--seconds", str(a.seconds),
                               "--child-out", str(o)]) for o in outs]
    if any(p.wait(timeout=120) != 0 for p in procs):
        raise RuntimeError(f"a measuring process of the {tag} run failed (its error is above)")
    return [json.loads(o.read_text()) for o in outs]


def summary(quiet: dict, pair: list[dict]) -> dict:
    """The record: each measurement's copy rate and SHARED mark, and the pids seen beside it."""
    def row(r: dict) -> dict:
        m, share = r["measurement"], r["measurement"].get("gpu_share") or {}
        return {"pid": r["pid"], "copy_gbps": m["derived"]["gbps"], "shared": share.get("shared"),
                "others_seen": [o["pid"] for o in share.get("others", [])], "measurement": m}
    q, p = row(quiet), [row(r) for r in pair]
    return {"quiet": q, "pair": p,
            "both_marked_shared": all(r["shared"] is True for r in p),
            "each_saw_the_other": all(p[1 - i]["pid"] in p[i]["others_seen"] for i in range(2)),
            "pair_copy_pct_of_quiet": [100.0 * r["copy_gbps"] / q["copy_gbps"] for r in p]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for shared_gpu.json")
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=4.0, help="timed phase of each process")
    ap.add_argument("--force", action="store_true", help="replace OUTDIR/shared_gpu.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    if not a.out:
        print("record_shared_gpu: give --out OUTDIR", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("record_shared_gpu: no CUDA GPU here: run it on the GPU node; nothing recorded", file=sys.stderr)
        return 2
    out = Path(a.out) / NAME
    if out.exists() and not a.force:
        print(f"record_shared_gpu: {out} exists: choose another --out or pass --force", file=sys.stderr)
        return 2
    from hwlab.core.store import check_folder, write_json_atomic

    try:
        check_folder(out.parent, what="--out folder")
    except Exception as e:  # DestinationError: one line saying what to do
        print(f"record_shared_gpu: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            quiet = _run(1, a, Path(tmp), "quiet")[0]
            pair = _run(2, a, Path(tmp), "pair")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"record_shared_gpu: {e}", file=sys.stderr)
            return 3
    rec = {"schema": "hwlab.shared_gpu", "device": torch.cuda.get_device_name(0),
           "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "conditions": f"copy of {a.size_mib} MiB fp32 (torch copy_), each process timing about "
                         f"{a.seconds:g} s; the pair started at one agreed time",
           **summary(quiet, pair)}
    write_json_atomic(out, rec, overwrite=a.force)
    for r in [rec["quiet"], *rec["pair"]]:
        print(f"pid {r['pid']}: {r['copy_gbps']:,.0f} GB/s, shared={r['shared']}, beside {r['others_seen']}")
    print(f"written {out}")
    return 0 if rec["both_marked_shared"] else 1


if __name__ == "__main__":
    sys.exit(main())
