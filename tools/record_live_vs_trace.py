"""Record one live examination per example and its own profiler trace, on the machine it runs on,
so a CPU test can read the trace again and hold the trace reader to the live walk on a machine
unlike the CPU that runs the tests (a GPU's L2, its measured ceilings, its kernels).

    PYTHONPATH=src python3 tools/record_live_vs_trace.py --out DIR [--only gemm_plus_chain,...]

Writes, per example, ``DIR/<name>.examine.json`` (the live examination's record: ceilings,
counts with the cache it judged against, parts and walks) and ``DIR/<name>.pt.trace.json.gz``
(the Chrome trace its profiler wrote, with the kit's keys: the unprofiled median and the cache),
plus ``DIR/README.md`` saying what ran, where and when. Nothing is written over an existing file.
Copy the folder to ``src/hwlab/recorded/runs/live_vs_trace_<machine>/``;
``tests/test_live_vs_trace_recorded.py`` re-reads each trace with its record as ``--baseline``.
"""
from __future__ import annotations

import argparse
import gzip
import importlib
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: examples with a GEMM part and a memory-bound part (the split the trace reader must agree on)
EXAMPLES = ("gemm_plus_chain", "row_gather")


def record(name: str, out: Path) -> str:
    from hwlab.core.store import check_destination
    from hwlab.examine import examine

    rec_path, trace_path = out / f"{name}.examine.json", out / f"{name}.pt.trace.json.gz"
    for p in (rec_path, trace_path):
        check_destination(p)  # never over an existing file, checked before measuring
    sys.path.insert(0, str(ROOT / "src" / "hwlab" / "examples"))
    try:
        m = importlib.import_module(name)
    finally:
        sys.path.pop(0)
    t0 = time.perf_counter()
    ex = examine(getattr(m, name), make_inputs=m.inputs)
    wall_s = time.perf_counter() - t0
    rec_path.write_text(ex.to_json())
    with open(ex.trace_path, "rb") as src, gzip.open(trace_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    parts = ", ".join(f"{p.name} {p.share_pct:.0f}% {p.leaf_id or '-'}" for p in ex.parts.parts)
    return (f"- `{name}`: {ex.measurement.device}, examined in {wall_s:.1f} s; leaf {ex.leaf_id}; "
            f"cache {ex.counts.get('cache_bytes')} B; parts: {parts}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in (a.only.split(",") if a.only else EXAMPLES) if n]
    import torch

    from hwlab.core.system import versions

    lines = [f"# Live examinations and their own traces ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             f"Recorded by `tools/record_live_vs_trace.py` on "
             f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'a CPU'}; versions: {versions()}.",
             ""]
    rc = 0
    for n in names:
        try:
            lines.append(record(n, out))
        except Exception as e:  # one example failing is recorded; the others still run
            rc = 1
            lines.append(f"- `{n}`: FAILED ({type(e).__name__}: {e})")
        print(lines[-1], flush=True)
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
