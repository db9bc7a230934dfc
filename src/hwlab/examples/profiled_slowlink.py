"""examples/profiled_torchrun.py over the kit's rate-limited link: a real slow link on one machine.

    sudo python examples/profiled_slowlink.py --trace-dir runs/slowlink --rate 100mbit
    hwlab ranks --traces runs/slowlink

Four gloo ranks: 0-1 on the host, 2-3 inside a network namespace behind a veth pair shaped with
``tbf`` (:class:`hwlab.labs.crosslink.slowlink.SlowLink`, root and iproute2). Every all-reduce
crosses the link, so every rank waits inside it, none for another: the report should name the
link, not a rank. Arguments after ``--`` go to examples/profiled_torchrun.py.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

from hwlab.labs.crosslink.slowlink import SlowLink

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace-dir", required=True)
    p.add_argument("--rate", default="100mbit", help="the link's rate, tc syntax (100mbit, 1gbit)")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("rest", nargs="*", help="arguments for profiled_torchrun.py (after --)")
    a = p.parse_args(argv)
    behind = set(range(a.world // 2, a.world))
    with SlowLink(rate=a.rate) as link:
        with socket.socket() as s:
            s.bind((link.host_ip, 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(a.world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), LOCAL_RANK=str(r),
                       MASTER_ADDR=link.host_ip, MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       GLOO_SOCKET_IFNAME=link.ns_if if r in behind else link.host_if)
            cmd = [sys.executable, str(HERE / "profiled_torchrun.py"), "--trace-dir", a.trace_dir, *a.rest]
            procs.append(subprocess.Popen(link.wrap(cmd) if r in behind else cmd, env=env))
        rcs = [q.wait(timeout=600) for q in procs]
    print(f"link {a.rate}: ranks {sorted(behind)} behind it; exit codes {rcs}", file=sys.stderr)
    return max(rcs)


if __name__ == "__main__":
    raise SystemExit(main())
