"""Record the CPU-only runs the notebooks show when they cannot run them live.

    sudo .venv/bin/python benchmarks/record_cpu_evidence.py --out src/hwlab/recorded/cpu

* ``lab03_slowlink``  six gloo ranks, two behind a rate-limited veth (needs root + iproute2):
                      naive (reordered) vs topology-aware TP groups, and a gloo collectives table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hwlab.evidence import Evidence, machine_info
from hwlab.labs import crosslink


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--force", action="store_true", help="replace existing records")
    a = p.parse_args(argv)
    exp = crosslink.slowlink_experiment()
    coll = crosslink.collectives(4, sizes=(1 << 16, 1 << 20, 1 << 22))
    ev = Evidence(kind="lab03_slowlink", machine=machine_info("cpu"), results=[],
                  extra={"experiment": exp, "collectives_gloo_loopback": coll})
    path = ev.save(a.out / "lab03_slowlink.json", overwrite=a.force)
    print(f"{path}: naive {exp['naive']['report']['step_ms']:.1f} ms, aware "
          f"{exp['aware']['report']['step_ms']:.1f} ms ({exp['speedup_aware_over_naive']:.2f}x), "
          f"tail {exp['naive']['report']['tail_ranks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
