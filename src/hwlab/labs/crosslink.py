"""Lab 3, cross-link tensor parallelism: a TP block, per-rank step times, stragglers, a real slow link.

The block is Megatron-style: a column-parallel linear (each rank holds ``ffn/tp`` columns of
W1), GELU, a row-parallel linear (``ffn/tp`` rows of W2) and one all-reduce of the partial
outputs inside the TP group. Every step ends with a small all-reduce over all ranks (the
data-parallel sync), so a slow TP group holds every rank: the seed's signature, a local rank
tail plus collective wait everywhere else, while each card alone is fine.

Each rank records per step: compute time, time inside the TP all-reduce (its transfer plus
waiting for the slowest member), time inside the DP sync (waiting for the slowest group), and
the step total. :func:`straggler_report` names the tail ranks and by how much.

The slow link on a CPU machine is real: ranks run as separate processes speaking gloo over
TCP; the ranks of one "island" run inside a network namespace reached through a veth pair
rate-limited with ``tbf`` (:class:`SlowLink`), so traffic between islands really crosses a
slower link. That needs root and iproute2; elsewhere the lab says so and skips.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DP_SYNC_ELEMS = 1024


# ---------------------------------------------------------------- the block
def make_weights(hidden: int, ffn: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, ffn, generator=g, dtype=torch.float32) / hidden ** 0.5
    w2 = torch.randn(ffn, hidden, generator=g, dtype=torch.float32) / ffn ** 0.5
    return w1.to(dtype), w2.to(dtype)


def shard(w1, w2, tp_rank: int, tp: int):
    """Column shard of W1 and the matching row shard of W2 for TP rank ``tp_rank`` of ``tp``."""
    ffn = w1.shape[1]
    if ffn % tp:
        raise ValueError(f"ffn={ffn} must divide by tp={tp}")
    k = ffn // tp
    return w1[:, tp_rank * k:(tp_rank + 1) * k].contiguous(), w2[tp_rank * k:(tp_rank + 1) * k].contiguous()


def block_reference(x, w1, w2):
    """The unsharded block in float64."""
    return torch.nn.functional.gelu(x.double() @ w1.double()) @ w2.double()


def block_partial(x, w1s, w2s):
    """This rank's partial output; the sum over the TP group is the block's output."""
    return torch.nn.functional.gelu(x @ w1s) @ w2s


# ---------------------------------------------------------------- one rank
def parse_groups(text: str) -> list[list[int]]:
    """'0,1;2,3' -> [[0, 1], [2, 3]]"""
    groups = [[int(r) for r in g.split(",") if r.strip()] for g in text.split(";") if g.strip()]
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(len(flat))) or len({len(g) for g in groups}) != 1:
        raise ValueError(f"groups {text!r} must cover ranks 0..N-1 once, in equal sizes")
    return groups


def run_rank(rank: int, world: int, groups: list[list[int]], init_method: str, *, steps: int = 20,
             warmup: int = 3, hidden: int = 512, ffn: int = 2048, batch: int = 256,
             backend: str = "gloo", device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """Run the TP block on one rank; returns per-step timings (ms) and a correctness check."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=300))
    try:
        pgs = [dist.new_group(g) for g in groups]  # every rank creates every group, same order
        gi = next(i for i, g in enumerate(groups) if rank in g)
        tp_group, members = pgs[gi], groups[gi]
        tp, tp_rank = len(members), members.index(rank)
        dev = torch.device(device)
        w1, w2 = make_weights(hidden, ffn, seed)
        w1s, w2s = (t.to(dev) for t in shard(w1, w2, tp_rank, tp))
        gen = torch.Generator().manual_seed(seed + 1000 + gi)  # same input within a TP group
        xs = [torch.randn(batch, hidden, generator=gen).to(dev) for _ in range(4)]
        sync = torch.ones(DP_SYNC_ELEMS, device=dev)
        # correctness first: the all-reduced output equals the unsharded block
        y = block_partial(xs[0], w1s, w2s)
        dist.all_reduce(y, group=tp_group)
        ref = block_reference(xs[0].cpu(), w1, w2)
        rel = (torch.linalg.vector_norm(y.double().cpu() - ref) / torch.linalg.vector_norm(ref)).item()

        def now():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return time.perf_counter()

        rec = {"compute_ms": [], "tp_allreduce_ms": [], "dp_sync_ms": [], "step_ms": []}
        for i in range(warmup + steps):
            t0 = now()
            y = block_partial(xs[i % len(xs)], w1s, w2s)
            t1 = now()
            dist.all_reduce(y, group=tp_group)
            t2 = now()
            dist.all_reduce(sync)  # the data-parallel sync every step ends with
            t3 = now()
            if i >= warmup:
                rec["compute_ms"].append((t1 - t0) * 1e3)
                rec["tp_allreduce_ms"].append((t2 - t1) * 1e3)
                rec["dp_sync_ms"].append((t3 - t2) * 1e3)
                rec["step_ms"].append((t3 - t0) * 1e3)
        return {"rank": rank, "group": members, "host": socket.gethostname(),
                "netns": _current_netns(), "rel_err": rel, "bytes_per_allreduce": y.numel() * y.element_size(),
                **rec}
    finally:
        dist.destroy_process_group()


def _current_netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- straggler analysis
@dataclass
class StragglerReport:
    per_rank: dict[int, dict[str, float]]
    tail_ranks: list[int]
    tail_pct: float  # slowest rank's (compute + TP all-reduce) over the median rank's, in %
    step_ms: float   # median step time (all ranks finish a step together)
    #: share of communication hidden under compute. None here: this block issues its
    #: collectives after its compute (blocking), so there is nothing to overlap; an overlapped
    #: variant (async all-reduce under the next micro-batch) is not built yet
    overlap_pct: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"per_rank": self.per_rank, "tail_ranks": self.tail_ranks, "tail_pct": self.tail_pct,
                "step_ms": self.step_ms, "overlap_pct": self.overlap_pct, "notes": self.notes}

    def flowchart_evidence(self, single_gpu_slow: bool = False, e2e_slowdown: float | None = None):
        return {"single_gpu_slow": single_gpu_slow, "multi_gpu_or_service_slow": True
                if e2e_slowdown is None else None, "e2e_slowdown": e2e_slowdown,
                "rank_tail_pct": self.tail_pct}


#: a rank is in the tail when its own work (compute + TP all-reduce) sits above the largest
#: jump in the sorted per-rank times, and that jump is at least TAIL_JUMP (1.25x): on a busy
#: CPU host ranks jitter by ~10-20%, a slow link costs several times more. The flowchart's
#: rank-tail threshold (10%) is then applied to how far the tail sits above the other ranks.
TAIL_JUMP = 1.25


def straggler_report(results: list[dict[str, Any]]) -> StragglerReport:
    """Median per-rank times; tail ranks split off by the largest jump in their own work."""
    per = {}
    for r in results:
        med = {k: statistics.median(r[k]) for k in ("compute_ms", "tp_allreduce_ms", "dp_sync_ms", "step_ms")}
        med["own_ms"] = med["compute_ms"] + med["tp_allreduce_ms"]
        steps = sorted(r["step_ms"])
        med["step_p10_ms"] = steps[int(0.1 * (len(steps) - 1))]
        med["step_p90_ms"] = steps[int(0.9 * (len(steps) - 1))]
        per[r["rank"]] = med
    order = sorted(per, key=lambda k: per[k]["own_ms"])
    own = [per[k]["own_ms"] for k in order]
    jumps = [(own[i + 1] / own[i] if own[i] > 0 else 1.0, i) for i in range(len(own) - 1)]
    tail: list[int] = []
    base = statistics.median(own)
    if jumps:
        ratio, i = max(jumps)
        if ratio >= TAIL_JUMP:
            tail = sorted(order[i + 1:])
            base = statistics.median(own[:i + 1])
    tail_pct = 100.0 * (max(own) - base) / base if base > 0 else 0.0
    notes = []
    if tail:
        waiting = sorted(k for k in per if k not in tail)
        notes.append(f"ranks {tail} finish their TP all-reduce late; ranks {waiting} wait for them "
                     f"in the DP sync ({statistics.median(per[k]['dp_sync_ms'] for k in waiting):.1f} ms median)")
    step = statistics.median(v["step_ms"] for v in per.values())
    return StragglerReport(per, tail, tail_pct, step, None, notes)


# ---------------------------------------------------------------- a real slow link
class SlowLinkUnavailable(RuntimeError):
    pass


class SlowLink:
    """A network namespace behind a veth pair, both ends shaped with ``tbf`` to ``rate``.

    Ranks started with :meth:`wrap` inside the namespace reach the host side only through the
    shaped veth; ranks inside it talk to each other over the namespace's own loopback. Names
    are unique per instance; :meth:`close` (or the context manager) removes everything.
    """

    def __init__(self, rate: str = "200mbit", burst: str = "64kb", latency: str = "100ms"):
        if os.geteuid() != 0:
            raise SlowLinkUnavailable("needs root to create a network namespace (ip netns)")
        if not (shutil.which("ip") and shutil.which("tc")):
            raise SlowLinkUnavailable("needs iproute2 (ip, tc)")
        tag = secrets.token_hex(3)
        self.ns = f"hwslow{tag}"
        self.host_if, self.ns_if = f"vh{tag}", f"vs{tag}"
        octet = 100 + int(tag[:2], 16) % 100
        self.host_ip, self.ns_ip = f"10.{octet}.{int(tag[2:4], 16)}.1", f"10.{octet}.{int(tag[2:4], 16)}.2"
        self.rate, self.burst, self.latency = rate, burst, latency
        self._up = False

    def _sh(self, *cmd: str) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SlowLinkUnavailable(f"{' '.join(cmd)} failed: {r.stderr.strip()}")

    def open(self) -> "SlowLink":
        try:
            self._sh("ip", "netns", "add", self.ns)
            self._up = True
            self._sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            self._sh("ip", "link", "set", self.ns_if, "netns", self.ns)
            self._sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            self._sh("ip", "link", "set", self.host_if, "up")
            self._sh("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
            self._sh("ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
            self._sh("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
            if self.rate:
                tbf = ["root", "tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency]
                self._sh("tc", "qdisc", "add", "dev", self.host_if, *tbf)
                self._sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "add", "dev", self.ns_if, *tbf)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._up:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)  # removes both veth ends
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
            self._up = False

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd]


# ---------------------------------------------------------------- launching ranks
def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run_ranks(world: int, rank_args: list[str], *, nccl: bool = False, slow: SlowLink | None = None,
               slow_ranks: tuple[int, ...] = (), extra_env: dict[str, str] | None = None,
               timeout_s: float = 600.0, workdir: Path | None = None) -> list[tuple[dict, str]]:
    """Start ``world`` processes of this module's rank entry point (``rank_args`` added to each),
    wait for all, and return each rank's result JSON with its log. Every process is killed if
    one overruns ``timeout_s``; a rank that fails raises with the end of its log."""
    import tempfile

    host = slow.host_ip if slow else "127.0.0.1"
    init = f"tcp://{host}:{_free_port(host)}"
    workdir = Path(workdir or tempfile.mkdtemp(prefix="hwlab-ranks-"))
    procs = []
    for r in range(world):
        out = workdir / f"rank{r}.json"
        cmd = [sys.executable, "-m", "hwlab.labs.crosslink", "--rank", str(r), "--world", str(world),
               "--init", init, "--out", str(out), *rank_args]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(extra_env or {}))
        if nccl:
            cmd += ["--backend", "nccl", "--device", f"cuda:{r}"]
            env.update(NCCL_SAFE_ENV, NCCL_DEBUG="INFO")
        elif slow:
            env["GLOO_SOCKET_IFNAME"] = slow.ns_if if r in slow_ranks else slow.host_if
            if r in slow_ranks:
                cmd = slow.wrap(cmd)
        else:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        procs.append((r, out, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True)))
    done, errors = [], []
    deadline = time.time() + timeout_s
    for r, out, p in procs:
        try:
            log, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for _, _, q in procs:
                q.kill()
            raise TimeoutError(f"rank {r} did not finish in {timeout_s:.0f} s")
        if p.returncode != 0 or not out.exists():
            errors.append(f"rank {r} exited {p.returncode}: {log[-800:]}")
        else:
            done.append((json.loads(out.read_text()), log))
    if errors:
        raise RuntimeError("; ".join(errors))
    return done


def launch(world: int, groups: list[list[int]], *, slow: SlowLink | None = None,
           slow_ranks: tuple[int, ...] = (), steps: int = 20, hidden: int = 1024, ffn: int = 2048,
           batch: int = 256, timeout_s: float = 600.0, workdir: Path | None = None,
           nccl: bool = False, extra_env: dict[str, str] | None = None) -> list[dict]:
    """Start ``world`` ranks of the TP block as processes and collect their results.

    gloo (default): ``slow_ranks`` run inside the slow link's namespace; without ``slow`` all
    ranks share loopback. ``nccl=True``: rank r drives ``cuda:r`` over NCCL with multicast
    kept off; ``extra_env`` (e.g. :data:`FORCE_SLOW_ROUTE`) steers NCCL, and each result
    carries the transports NCCL reported choosing (``routes``)."""
    if nccl and needs_gpus(world):
        raise RuntimeError(f"NCCL TP block {needs_gpus(world)}")
    gtxt = ";".join(",".join(map(str, g)) for g in groups)
    args = ["--groups", gtxt, "--steps", str(steps), "--hidden", str(hidden), "--ffn", str(ffn),
            "--batch", str(batch)]
    results = []
    for res, log in _run_ranks(world, args, nccl=nccl, slow=slow, slow_ranks=slow_ranks,
                               extra_env=extra_env, timeout_s=timeout_s, workdir=workdir):
        if nccl:
            res["routes"] = nccl_routes(log)
        results.append(res)
    return sorted(results, key=lambda d: d["rank"])


def island_topology(world: int, slow_ranks: tuple[int, ...]):
    """The ranks as a topology: loopback pairs are 'NODE', pairs across the veth are 'SYS'."""
    from ..topology import Topology

    names = [f"GPU{r}" for r in range(world)]
    t = Topology(gpus=names, source="gloo ranks: host loopback vs rate-limited veth")
    for a in range(world):
        for b in range(world):
            t.links[(names[a], names[b])] = ("X" if a == b else
                                              "SYS" if (a in slow_ranks) != (b in slow_ranks) else "NODE")
        t.numa_affinity[names[a]] = 1 if a in slow_ranks else 0
    return t


def run_collectives(rank: int, world: int, init_method: str, sizes: list[int], *,
                    backend: str = "gloo", device: str = "cpu", n_rep: int = 10) -> dict[str, Any]:
    """Median time of all-reduce and all-to-all at each message size (bytes) on this rank."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    try:
        dev = torch.device(device)
        out: dict[str, Any] = {"rank": rank, "all_reduce": {}, "all_to_all": {}}
        for size in sizes:
            n = max(world, size // 4 // world * world)
            x = torch.randn(n, device=dev)
            y = torch.empty_like(x)
            for op, fn in (("all_reduce", lambda: dist.all_reduce(x)),
                           ("all_to_all", lambda: dist.all_to_all_single(y, x))):
                ts = []
                for i in range(n_rep + 2):
                    dist.barrier()
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    t0 = time.perf_counter()
                    try:
                        fn()
                    except (RuntimeError, NotImplementedError) as e:
                        out[op][size] = {"unsupported": str(e)[:200]}
                        break
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    if i >= 2:
                        ts.append((time.perf_counter() - t0) * 1e3)
                if ts:
                    out[op][size] = statistics.median(ts)
        return out
    finally:
        dist.destroy_process_group()


def busbw_table(rank_results: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """nccl-tests' bus bandwidth from the slowest rank's median time at each size:
    all-reduce busbw = algbw * 2(n-1)/n; all-to-all busbw = algbw * (n-1)/n."""
    rows = []
    ops = ("all_reduce", "all_to_all")
    sizes = sorted({int(s) for r in rank_results for op in ops for s in r[op]})
    for op in ops:
        factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
        for size in sizes:
            vals = [r[op].get(str(size), r[op].get(size)) for r in rank_results]
            if any(v is None or isinstance(v, dict) for v in vals):
                rows.append({"op": op, "bytes": size, "unsupported": True})
                continue
            t_ms = max(vals)
            algbw = size / (t_ms * 1e-3) / 1e9
            rows.append({"op": op, "bytes": size, "t_ms": t_ms, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * factor})
    return rows


def collectives(world: int, sizes=(1 << 16, 1 << 20, 1 << 24), *, nccl: bool = False,
                timeout_s: float = 300.0) -> dict[str, Any]:
    """Launch ``world`` ranks measuring all-reduce / all-to-all busbw (gloo on CPU, NCCL on GPUs)."""
    if nccl and needs_gpus(max(2, world)):
        return {"skipped": f"NCCL collectives {needs_gpus(max(2, world))}"}
    args = ["--groups", ";".join(str(i) for i in range(world)),
            "--collectives", ",".join(map(str, sizes))]
    res = sorted((r for r, _log in _run_ranks(world, args, nccl=nccl, timeout_s=timeout_s)),
                 key=lambda d: d["rank"])
    return {"world": world, "backend": "nccl" if nccl else "gloo", "rows": busbw_table(res, world)}


def _main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="one rank of the TP block (started by hwlab.labs.crosslink.launch)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--groups", required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True)
    p.add_argument("--collectives", help="comma-separated message sizes: measure collectives instead")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(a.device))
    if a.collectives:
        res = run_collectives(a.rank, a.world, a.init, [int(x) for x in a.collectives.split(",")],
                              backend=a.backend, device=a.device)
        Path(a.out).write_text(json.dumps(res))
        return
    res = run_rank(a.rank, a.world, parse_groups(a.groups), a.init, steps=a.steps, hidden=a.hidden,
                   ffn=a.ffn, batch=a.batch, backend=a.backend, device=a.device)
    Path(a.out).write_text(json.dumps(res))


if __name__ == "__main__":
    _main()


# ---------------------------------------------------------------- one GPU: device vs host-staged all-reduce
def single_gpu_tp_step(tp: int = 2, hidden: int = 8192, ffn: int = 32768, batch: int = 512,
                       staged: bool = False, device=None, n_rep: int = 30):
    """The TP block on one GPU with ``tp`` shards computed in turn; their all-reduce either sums
    the partials in device memory, or stages each through pinned host memory over PCIe (what
    NCCL falls back to without peer-to-peer: GPU -> host -> GPU), then sums. Returns a
    Measurement of the whole step; ``params['allreduce_bytes']`` is what crossed the host link."""
    from ..measure import TOL_BY_DTYPE, bench, device_of

    dev = device_of(device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    w1, w2 = make_weights(hidden, ffn, seed=0, dtype=dt)
    shards = [tuple(t.to(dev) for t in shard(w1, w2, r, tp)) for r in range(tp)]
    pin = dev.type == "cuda"
    host_bufs = [torch.empty(batch, hidden, dtype=dt, pin_memory=pin) for _ in range(tp)]
    back = [torch.empty(batch, hidden, dtype=dt, device=dev) for _ in range(tp)]

    def step(x):
        parts = [block_partial(x, a, b) for a, b in shards]
        if staged:
            for p, h, d in zip(parts, host_bufs, back):
                h.copy_(p, non_blocking=pin)   # device -> pinned host (PCIe)
                d.copy_(h, non_blocking=pin)   # pinned host -> device (PCIe)
            parts = back
        out = parts[0].float()
        for p in parts[1:]:
            out += p.float()
        return out

    def ref(x):
        return block_reference(x.float().cpu(), w1.float(), w2.float())

    n_ar = batch * hidden * torch.tensor([], dtype=dt).element_size() * tp
    flops = 2 * 2 * batch * hidden * ffn
    m = bench(f"TP step ({'PCIe-staged' if staged else 'device-memory'} all-reduce, tp={tp})", step,
              lambda: (torch.randn(batch, hidden, device=dev, dtype=dt),), n_bytes=2 * n_ar if staged else n_ar,
              n_flops=flops, reference=ref, tol=TOL_BY_DTYPE["bfloat16"] if dt == torch.bfloat16 else 1e-4,
              device=dev, n_rep=n_rep,
              params={"tp": tp, "hidden": hidden, "ffn": ffn, "batch": batch, "staged": staged,
                      "allreduce_bytes": n_ar})
    return m


# ---------------------------------------------------------------- NCCL route and collectives
ROUTE_PATTERNS = [("P2P/IPC", "NVLink or PCIe peer-to-peer (IPC)"), ("P2P/CUMEM", "peer-to-peer (cuMem)"),
                  ("P2P/direct", "peer-to-peer (direct pointer)"), ("SHM", "staged through host shared memory"),
                  ("NET/IB", "InfiniBand"), ("NET/Socket", "TCP sockets")]


def nccl_routes(log: str) -> dict[str, int]:
    """Count NCCL's chosen transports from an ``NCCL_DEBUG=INFO`` log ('Channel 00/0 : 0[0] ->
    1[1] via P2P/IPC' lines)."""
    import re

    counts: dict[str, int] = {}
    for m in re.finditer(r"Channel \d+/\d+ : \d+\[\w+\] -> \d+\[\w+\] via (\S+)", log):
        via = m.group(1)
        key = next((k for k, _ in ROUTE_PATTERNS if via.startswith(k)), via)
        counts[key] = counts.get(key, 0) + 1
    return counts


#: environment that forces NCCL off the peer-to-peer route (through host memory instead)
FORCE_SLOW_ROUTE = {"NCCL_P2P_DISABLE": "1"}
#: keep NVLink multicast off on shared multi-GPU hosts (the device tool's rule)
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def needs_gpus(n: int) -> str | None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None if have >= n else f"needs >= {n} GPUs (this machine has {have})"


def p2p_matrix_gbps(size_mib: int = 256) -> dict[str, Any]:
    """GPU-to-GPU copy bandwidth for every ordered pair (GB/s), or why it cannot run."""
    why = needs_gpus(2)
    if why:
        return {"skipped": why}
    from ..measure import time_fn

    n = torch.cuda.device_count()
    out: dict[str, Any] = {"size_mib": size_mib, "gbps": {}}
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            src = torch.randn(size_mib * 2**18, device=f"cuda:{a}")
            dst = torch.empty_like(src, device=f"cuda:{b}")
            t = time_fn(lambda: dst.copy_(src), [()], torch.device(f"cuda:{a}"), n_rep=10)
            out["gbps"][f"{a}->{b}"] = src.numel() * 4 / (t.median_ms * 1e-3) / 1e9
            assert torch.equal(dst.cpu(), src.cpu())
    return out


# ---------------------------------------------------------------- the CPU experiment end to end
#: six gloo ranks: 0-3 on the host, 4-5 behind the rate-limited veth (a second "island")
SLOW_RANKS = (4, 5)
#: the mapping after a reorder of ordinals: two TP groups straddle the slow link
NAIVE_GROUPS = [[0, 1], [2, 4], [3, 5]]


def slowlink_experiment(steps: int = 15, rate: str = "200mbit", tp: int = 2) -> dict[str, Any]:
    """Naive (reordered) vs topology-aware TP groups over a real rate-limited link.

    The aware groups come from :func:`hwlab.mapping.choose_tp_groups` on the ranks' topology
    (loopback pairs NODE, veth pairs SYS), not from a hand-written list.
    """
    from ..mapping import choose_tp_groups, evaluate

    world = 6
    topo = island_topology(world, SLOW_RANKS)
    aware = [[int(g[3:]) for g in grp] for grp in choose_tp_groups(topo, tp)]
    out: dict[str, Any] = {"world": world, "slow_ranks": list(SLOW_RANKS), "rate": rate, "tp": tp,
                           "topology": topo.to_dict()}
    # the healthy reference: the same block with every rank on loopback (no slow link)
    base = straggler_report(launch(world, aware, steps=steps))
    out["baseline_all_loopback"] = {"groups": aware, "report": base.to_dict()}
    with SlowLink(rate=rate) as link:
        for name, groups in (("naive", NAIVE_GROUPS), ("aware", aware)):
            res = launch(world, groups, slow=link, slow_ranks=SLOW_RANKS, steps=steps)
            rep = straggler_report(res)
            out[name] = {"groups": groups, "report": rep.to_dict(), "ranks": res,
                         "mapping": evaluate(topo, [[f"GPU{r}" for r in g] for g in groups]).to_dict(),
                         "flowchart_evidence": {"single_gpu_slow": False,
                                                "e2e_slowdown": rep.step_ms / base.step_ms,
                                                "rank_tail_pct": rep.tail_pct}}
    out["speedup_aware_over_naive"] = out["naive"]["report"]["step_ms"] / out["aware"]["report"]["step_ms"]
    return out


# ---------------------------------------------------------------- exercise checkers
def grade_straggler(answer: list[int] | None, report: dict[str, Any]):
    from ..exercise import ExerciseResult, not_done

    if answer is None:
        return not_done("straggler", "List the tail ranks, e.g. [1, 5].")
    want = sorted(report["tail_ranks"])
    if sorted(answer) == want:
        return ExerciseResult("straggler", "passed", f"ranks {want} are the tail: their own work "
                              f"(compute + TP all-reduce) is {report['tail_pct']:.0f}% over the others.")
    return ExerciseResult("straggler", "wrong", f"you named {sorted(answer)}. Compare each rank's "
                          "compute + TP all-reduce time, not its step time (every rank's step "
                          "includes waiting for the slowest).")


def grade_mapping(topo, groups: list[list[int]] | None, tp: int):
    """The learner's TP groups must cover every GPU once, in groups of ``tp``, and their slowest
    link must be as fast as the best any partition can reach on this topology."""
    from ..exercise import ExerciseResult, not_done
    from ..mapping import choose_tp_groups, evaluate
    from ..topology import link_rank

    if groups is None:
        return not_done("mapping", "Give TP groups as lists of GPU ordinals, e.g. [[0, 1], [2, 3]].")
    if any(len(g) != tp for g in groups):
        return ExerciseResult("mapping", "wrong", f"every TP group needs {tp} GPUs")
    try:
        mine = evaluate(topo, groups)
    except ValueError as e:
        return ExerciseResult("mapping", "wrong", str(e))
    if len({g for grp in mine.groups for g in grp}) != topo.n_gpus:
        return ExerciseResult("mapping", "wrong", "every GPU must be in exactly one group")
    best = evaluate(topo, choose_tp_groups(topo, tp))
    if link_rank(mine.worst) > link_rank(best.worst):
        return ExerciseResult("mapping", "wrong", f"a group crosses {mine.worst} ({mine.crossings}); "
                              f"groups whose slowest link is {best.worst} exist on this machine.")
    return ExerciseResult("mapping", "passed", f"slowest link {mine.worst} in every group, the best "
                          f"this topology allows; predicted all-reduce {mine.step_us:,.0f} us.")
