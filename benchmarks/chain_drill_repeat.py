"""Repeat the chain drill's fixed cases (coalesced, fused) four times in one process, on the GPU.

    PYTHONPATH=src python benchmarks/chain_drill_repeat.py OUT.json

Research, kept as it ran on the H200 (2026-12-03, third session): the drills of that session's
refresh read two fixed runs slow (results/refresh_h200_issue16/drills_call2_first_run.json), and
this asks whether the chain's measurement moves from run to run in one process. It did on the first
coalesced run only (1.25x, then 1.06x three times; fused 1.01-1.02x every time):
results/refresh_h200_issue16/chain_drill_repeat.json.
"""
import json
import sys

from hwlab.labs import drillruns

out = []
for i in range(4):
    for case in ("coalesced", "fused"):
        ev, src = drillruns.observe("chain", case, live=True)
        row = {"i": i, "case": case, **{k: ev[k] for k in ("slowdown_vs_floor", "dram_pct_estimated", "e2e_slowdown")}}
        print(row, flush=True)
        out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)
