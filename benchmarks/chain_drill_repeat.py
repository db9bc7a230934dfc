"""Repeat the chain drill's fixed cases on the GPU to see their run-to-run spread."""
import json, sys
from hwlab.labs import drillruns
out = []
for i in range(4):
    for case in ("coalesced", "fused"):
        ev, src = drillruns.observe("chain", case, live=True)
        row = {"i": i, "case": case, **{k: ev[k] for k in ("slowdown_vs_floor", "dram_pct_estimated", "e2e_slowdown")}}
        print(row, flush=True); out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)
