"""Record Nsight Compute's raw CSV reports of Lab 1's and Lab 2's kernels, for notebook 09 and exercise 05.

The refresh (tools/refresh_gpu_evidence.py) keeps ncu's readings summarised per case (DRAM %, sector
amplification, the occupancy rows); a learner reading a report needs ncu's own rows: sectors *and*
requests (sectors per request), local-memory (spill) traffic, registers and achieved occupancy per
kernel. This runs the kit's ncu targets (the same child processes the refresh profiles, through
:func:`hwlab.core.ncu.command`, metrics :data:`hwlab.core.ncu.REPORT_METRICS`) and writes ncu's stdout
unchanged, one file per target:

    PYTHONPATH=src python3 tools/record_ncu_h200.py --out OUT     # on the H200 (run kind nvidia-h200)

writes OUT/ncu/lab01_<case>.csv, OUT/ncu/lab02_<config>.csv and OUT/ncu/MANIFEST.json (command, exit
status, ncu version per file). Copy OUT/ncu/ to src/hwlab/recorded/h200/ncu/ and commit it; notebook 09
and exercise 05 then read it through :func:`hwlab.course.reading_facts.ncu_report`. A metric this ncu
does not know makes ncu fail: the manifest keeps its message and the exit status says so.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hwlab.core import ncu  # noqa: E402
from hwlab.core.store import write_json_atomic, write_text_atomic  # noqa: E402

#: Lab 1's cases at the refresh's size, and Lab 2's recorded tiles (labs/registers/tiles presets)
LAB01_CASES = ("unfused", "fused", "strided", "coalesced")
LAB01_ARGS = ["--rows", "8192", "--cols", "8192", "--dtype", "float16"]
LAB02_CONFIGS = ("128,128,64,4,3", "128,256,64,8,3", "64,64,32,4,3", "256,256,64,8,3", "256,256,64,4,2")
NVTX_RANGE = "hwlab_case"  # both labs' ncu targets launch their kernel inside this range
TIMEOUT_S = 300.0


def targets() -> list[tuple[str, list[str]]]:
    out = [(f"lab01_{c}", ["-m", "hwlab.labs.bandwidth", "--ncu-case", c, *LAB01_ARGS]) for c in LAB01_CASES]
    out += [(f"lab02_{c.replace(',', 'x')}", ["-m", "hwlab.labs.registers", "--compile", "matmul", "--mode", "gpu",
                            "--ncu-launch", "--config", c]) for c in LAB02_CONFIGS]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="a folder; the reports go to OUT/ncu/")
    p.add_argument("--only", nargs="*", help="target names (lab01_strided, lab02_256x256x64x4x2, ...)")
    p.add_argument("--overwrite", action="store_true", help="replace the reports already in OUT/ncu/")
    a = p.parse_args(argv)
    out = Path(a.out) / "ncu"
    if out.exists() and any(out.iterdir()) and not a.overwrite:
        print(f"{out} already holds reports: pass another --out, or --overwrite to replace them", file=sys.stderr)
        return 2
    if not ncu.available():
        print("ncu is not on PATH: run this on the GPU machine with Nsight Compute installed", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    manifest, rc = {"ncu_version": version[-1] if version else None, "files": {}}, 0
    for name, args in targets():
        if a.only and name not in a.only:
            continue
        cmd = ncu.command(args, ncu.REPORT_METRICS, NVTX_RANGE)
        print("ncu:", name, flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
        write_text_atomic(out / f"{name}.csv", r.stdout, overwrite=True)
        manifest["files"][f"{name}.csv"] = {"command": cmd, "returncode": r.returncode,
                                            "rows": len(ncu.parse_csv(r.stdout)), "stderr_tail": r.stderr[-800:]}
        rc = rc or (r.returncode != 0)
    write_json_atomic(out / "MANIFEST.json", manifest, overwrite=True)
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
