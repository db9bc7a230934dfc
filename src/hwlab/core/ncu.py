"""Nsight Compute (``ncu``) as a counter source, where it is installed.

Counted figures (hardware counters) are kept apart from hwlab's estimates (traffic models
over time): a lab shows both and says which is which. ``--clock-control none`` keeps the
card's clocks as they are (never lock or change a shared card's clocks).
"""
from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys

MEMORY_METRICS = [
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
]
TENSOR_METRIC = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
OCCUPANCY_METRICS = [
    "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks",
    "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
]
#: local-memory (register spill) traffic: sectors loaded and stored from the thread's local memory
LOCAL_METRICS = ["l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"]
#: what a raw report for a reader keeps (tools/record_ncu_h200.py): memory, spills, occupancy
REPORT_METRICS = MEMORY_METRICS + LOCAL_METRICS + OCCUPANCY_METRICS


def available() -> bool:
    return shutil.which("ncu") is not None


def parse_csv(text: str) -> list[dict]:
    """ncu ``--csv`` (details page) -> one dict per kernel launch: metric -> float."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    by_id: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        rec = by_id.setdefault(row["ID"], {"kernel": row.get("Kernel Name", "")})
        val = row.get("Metric Value", "").replace(",", "")
        try:
            rec[row["Metric Name"]] = float(val)
        except ValueError:
            rec[row["Metric Name"]] = val
    return list(by_id.values())


def command(python_args: list[str], metrics: list[str], nvtx_range: str | None = None,
            extra: list[str] | None = None) -> list[str]:
    """The ncu command line that profiles ``python <python_args>`` (CSV on stdout)."""
    cmd = ["ncu", "--clock-control", "none", "--csv", "--metrics", ",".join(metrics), *(extra or [])]
    if nvtx_range:
        cmd += ["--nvtx", "--nvtx-include", f"{nvtx_range}/"]
    return cmd + [sys.executable, *python_args]


def profile(python_args: list[str], metrics: list[str], nvtx_range: str | None = None,
            timeout_s: float = 300.0, extra: list[str] | None = None) -> list[dict]:
    """Profile ``python <python_args>`` under ncu; one dict per kernel in the NVTX range.
    ``extra``: further ncu options (e.g. ``-k regex:...`` to count only some kernels)."""
    cmd = command(python_args, metrics, nvtx_range, extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"ncu failed ({r.returncode}): {r.stderr[-2000:]}")
    return parse_csv(r.stdout)
