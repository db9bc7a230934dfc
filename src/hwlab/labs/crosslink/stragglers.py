"""One rank's loop and the launcher that starts every rank as its own process.

A launch runs several *phases* per round, each one step of the TP block under one
configuration, all in the same process group and the same rounds, so a busy machine slows all
of them alike (the comparison is within one run, round by round):

* ``solo``            the block's compute only, then the step-end sync: what the devices alone give
* ``step:<mapping>``  compute, the TP all-reduce inside the mapping's group, the DP sync
* ``ovl_comp``, ``ovl_comm:<mapping>``, ``ovl_both:<mapping>``  the micro-batched block's
  compute alone, its all-reduces alone, and both overlapped (see :mod:`.overlap`)

A ``:regressed`` suffix runs that phase with the regressed kernel (:mod:`.block`). Every phase
ends with the data-parallel sync over all ranks, so a slow TP group holds every rank, and the
next phase starts with all ranks aligned. The order of phases rotates each round.

Each rank records per phase and round: ``compute_ms``, ``comm_ms`` (inside its TP
collectives: transfer plus waiting for the slowest member), ``dp_sync_ms`` (waiting for the
slowest group), ``own_ms`` (its own work: up to its TP collectives done) and ``step_ms``.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hwlab.core.comms import NCCL_SAFE_ENV, needs_gpus, nccl_routes
from hwlab.labs.crosslink.block import block_reference, make_weights, partial_fn, shard
from hwlab.labs.crosslink.overlap import comm_alone, compute_alone, overlapped

DP_SYNC_ELEMS = 1024
TIMERS = ("compute_ms", "comm_ms", "dp_sync_ms", "own_ms", "step_ms")


def parse_groups(text: str) -> list[list[int]]:
    """'0,1;2,3' -> [[0, 1], [2, 3]]"""
    groups = [[int(r) for r in g.split(",") if r.strip()] for g in text.split(";") if g.strip()]
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(len(flat))) or len({len(g) for g in groups}) != 1:
        raise ValueError(f"groups {text!r} must cover ranks 0..N-1 once, in equal sizes")
    return groups


def groups_text(groups: list[list[int]]) -> str:
    return ";".join(",".join(map(str, g)) for g in groups)


def _parse_phase(name: str, mappings: dict) -> tuple[str, str | None, str]:
    parts = name.split(":")
    kind, kernel = parts[0], "healthy"
    if parts[-1] == "regressed":
        kernel, parts = "regressed", parts[:-1]
    mapping = parts[1] if len(parts) > 1 else None
    if kind not in ("solo", "step", "ovl_comp", "ovl_comm", "ovl_both"):
        raise ValueError(f"unknown phase {name!r}")
    if (mapping is None) != (kind in ("solo", "ovl_comp")) or (mapping and mapping not in mappings):
        raise ValueError(f"phase {name!r}: mapping missing or not one of {sorted(mappings)}")
    return kind, mapping, kernel


def run_rank(rank: int, world: int, init_method: str, mappings: dict[str, list[list[int]]],
             phases: list[str], *, steps: int = 20, warmup: int = 3, hidden: int = 1024,
             ffn: int = 2048, batch: int = 256, micro: int = 4, backend: str = "gloo",
             device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """Run every phase for ``warmup + steps`` rounds on one rank; returns per-phase series (ms)."""
    specs = {p: _parse_phase(p, mappings) for p in phases}
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        dev = torch.device(device)
        w1, w2 = make_weights(hidden, ffn, seed)
        groups, shards, inputs, members = {}, {}, {}, {}
        for name in sorted(mappings):  # every rank creates every group, in the same order
            pgs = [dist.new_group(g) for g in mappings[name]]
            gi = next(i for i, g in enumerate(mappings[name]) if rank in g)
            mem = mappings[name][gi]
            groups[name], members[name] = pgs[gi], mem
            shards[name] = tuple(t.to(dev) for t in shard(w1, w2, mem.index(rank), len(mem)))
            gen = torch.Generator().manual_seed(seed + 1000 + min(mem))  # same input within a TP group
            inputs[name] = [torch.randn(batch, hidden, generator=gen).to(dev) for _ in range(2)]
        sync = torch.ones(DP_SYNC_ELEMS, device=dev)
        # the solo and overlap-compute phases use the first mapping's shard and input
        first = sorted(mappings)[0]
        shards[None], inputs[None] = shards[first], inputs[first]

        # correctness first: every mapping's all-reduced output (plain, overlapped, regressed
        # kernel where used) equals the unsharded block in float64
        rel_err: dict[str, float] = {}
        for name, (kind, mapping, kernel) in specs.items():
            if mapping is None or kind == "ovl_comm":
                continue
            x = inputs[mapping][0]
            if kind == "step":
                y = partial_fn(kernel)(x, *shards[mapping])
                dist.all_reduce(y, group=groups[mapping])
            else:
                y = torch.cat(overlapped(x, shards[mapping], groups[mapping], micro, kernel))
            ref = block_reference(x.cpu(), w1, w2)
            rel_err[name] = (torch.linalg.vector_norm(y.double().cpu() - ref) / torch.linalg.vector_norm(ref)).item()

        def now():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return time.perf_counter()

        rec = {p: {k: [] for k in TIMERS} for p in phases}
        order = list(phases)
        for i in range(warmup + steps):
            rot = order[i % len(order):] + order[:i % len(order)]
            for name in rot:
                kind, mapping, kernel = specs[name]
                x = inputs[mapping][i % 2]
                sh = shards[mapping]
                ys = None
                if kind == "ovl_comm":  # the partials to reduce, computed outside the timed region
                    ys = [y.clone() for y in compute_alone(x, sh, micro, kernel)]
                t0 = now()
                if kind in ("solo", "step"):
                    y = partial_fn(kernel)(x, *sh)
                    t1 = now()
                    if kind == "step":
                        dist.all_reduce(y, group=groups[mapping])
                elif kind == "ovl_comp":
                    compute_alone(x, sh, micro, kernel)
                    t1 = now()
                elif kind == "ovl_comm":
                    t1 = t0
                    comm_alone(ys, groups[mapping])
                else:
                    overlapped(x, sh, groups[mapping], micro, kernel)
                    t1 = t0  # compute and communication interleave: own_ms is the overlapped time
                t2 = now()
                dist.all_reduce(sync)  # the data-parallel sync every step ends with
                t3 = now()
                if i >= warmup:
                    r = rec[name]
                    r["compute_ms"].append((t1 - t0) * 1e3)
                    r["comm_ms"].append((t2 - t1) * 1e3)
                    r["dp_sync_ms"].append((t3 - t2) * 1e3)
                    r["own_ms"].append((t2 - t0) * 1e3)
                    r["step_ms"].append((t3 - t0) * 1e3)
        return {"rank": rank, "groups": members, "host": socket.gethostname(), "netns": _current_netns(),
                "rel_err": rel_err, "bytes_per_allreduce": batch * hidden * 4, "phases": rec,
                "params": {"hidden": hidden, "ffn": ffn, "batch": batch, "micro": micro, "steps": steps,
                           "warmup": warmup}}
    finally:
        dist.destroy_process_group()


def _current_netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- launching ranks
def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_processes(world: int, rank_args: list[str], *, nccl: bool = False, slow=None,
                  slow_ranks: tuple[int, ...] = (), extra_env: dict[str, str] | None = None,
                  timeout_s: float = 600.0, workdir: Path | None = None) -> list[tuple[dict, str]]:
    """Start ``world`` processes of the rank entry point (``python -m hwlab.labs.crosslink``,
    ``rank_args`` added to each), wait for all, and return each rank's result JSON with its
    log. Every process is killed if one overruns ``timeout_s``; a rank that fails raises with
    the end of its log. ``slow`` (a :class:`~.slowlink.SlowLink`): ``slow_ranks`` run inside
    its namespace, the rest on the host side of the shaped veth."""
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
                q.wait()
            raise TimeoutError(f"rank {r} did not finish in {timeout_s:.0f} s")
        if p.returncode != 0 or not out.exists():
            errors.append(f"rank {r} exited {p.returncode}: {log[-800:]}")
        else:
            done.append((json.loads(out.read_text()), log))
    if errors:
        raise RuntimeError("; ".join(errors))
    return done


def launch_phases(world: int, mappings: dict[str, list[list[int]]], phases: list[str], *, slow=None,
                  slow_ranks: tuple[int, ...] = (), steps: int = 20, warmup: int = 3, hidden: int = 1024,
                  ffn: int = 2048, batch: int = 256, micro: int = 4, timeout_s: float = 600.0,
                  workdir: Path | None = None, nccl: bool = False,
                  extra_env: dict[str, str] | None = None) -> list[dict]:
    """Start ``world`` ranks running ``phases`` interleaved (see module doc); results by rank."""
    if nccl and needs_gpus(world):
        raise RuntimeError(f"NCCL TP block {needs_gpus(world)}")
    for p in phases:
        _parse_phase(p, mappings)  # refuse a bad phase before starting processes
    for g in mappings.values():
        parse_groups(groups_text(g))
    spec = {"mappings": {k: groups_text(v) for k, v in mappings.items()}, "phases": phases, "steps": steps,
            "warmup": warmup, "hidden": hidden, "ffn": ffn, "batch": batch, "micro": micro}
    results = []
    for res, log in run_processes(world, ["--spec", json.dumps(spec)], nccl=nccl, slow=slow,
                                  slow_ranks=slow_ranks, extra_env=extra_env, timeout_s=timeout_s,
                                  workdir=workdir):
        if nccl:
            res["routes"] = nccl_routes(log)
        results.append(res)
    return sorted(results, key=lambda d: d["rank"])


def phase_view(results: list[dict], phase: str) -> list[dict]:
    """Per-rank results of one phase, flat: ``compute_ms``, ``tp_allreduce_ms``, ``dp_sync_ms``,
    ``own_ms``, ``step_ms`` lists, ``rank``, ``group`` and ``rel_err``."""
    parts = phase.split(":")
    mapping = parts[1] if len(parts) > 1 and parts[1] != "regressed" else None
    out = []
    for r in results:
        p = r["phases"][phase]
        out.append({"rank": r["rank"], "group": r["groups"].get(mapping) if mapping else None,
                    "rel_err": r["rel_err"].get(phase), "compute_ms": p["compute_ms"],
                    "tp_allreduce_ms": p["comm_ms"], "dp_sync_ms": p["dp_sync_ms"], "own_ms": p["own_ms"],
                    "step_ms": p["step_ms"], "netns": r.get("netns")})
    return out


def launch(world: int, groups: list[list[int]], *, slow=None, slow_ranks: tuple[int, ...] = (),
           steps: int = 20, hidden: int = 1024, ffn: int = 2048, batch: int = 256,
           timeout_s: float = 600.0, workdir: Path | None = None, nccl: bool = False,
           extra_env: dict[str, str] | None = None) -> list[dict]:
    """The TP block with one mapping (``groups``): per-rank flat results (see :func:`phase_view`).

    gloo (default): ``slow_ranks`` run inside the slow link's namespace; without ``slow`` all
    ranks share loopback. ``nccl=True``: rank r drives ``cuda:r`` over NCCL with multicast
    kept off; ``extra_env`` (e.g. :data:`hwlab.core.comms.FORCE_SLOW_ROUTE`) steers NCCL, and each
    result carries the transports NCCL reported choosing (``routes``)."""
    res = launch_phases(world, {"m": groups}, ["step:m"], slow=slow, slow_ranks=slow_ranks, steps=steps,
                        hidden=hidden, ffn=ffn, batch=batch, timeout_s=timeout_s, workdir=workdir,
                        nccl=nccl, extra_env=extra_env)
    flat = phase_view(res, "step:m")
    for f, r in zip(flat, res):
        if "routes" in r:
            f["routes"] = r["routes"]
    return flat
