"""One rank of the TP block, or of the collectives probe (started by the launcher)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hwlab.labs.crosslink.staged import run_collectives
from hwlab.labs.crosslink.stragglers import parse_groups, run_rank


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="one rank of the TP block (started by hwlab.labs.crosslink.launch)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--spec", help="JSON: mappings, phases, steps, sizes (see hwlab.labs.crosslink.stragglers)")
    p.add_argument("--collectives", help="comma-separated message sizes: measure collectives instead")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(a.device))
    if a.collectives:
        res = run_collectives(a.rank, a.world, a.init, [int(x) for x in a.collectives.split(",")],
                              backend=a.backend, device=a.device)
    else:
        spec = json.loads(a.spec)
        mappings = {k: parse_groups(v) for k, v in spec.pop("mappings").items()}
        phases = spec.pop("phases")
        res = run_rank(a.rank, a.world, a.init, mappings, phases, backend=a.backend, device=a.device, **spec)
    Path(a.out).write_text(json.dumps(res))


main()
