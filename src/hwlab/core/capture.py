"""Startup capture for a real job: call :func:`capture` at the top of a ``torchrun``/SLURM script.

It writes, into a run directory, what the seed's 0.72x case says to save at startup ("print and
save ``nvidia-smi topo -m``, the rank-to-device mapping and the NCCL route log"):

``RUN_DIR/<host>/node.json``          (local rank 0) topology: ``nvidia-smi topo -m`` parsed, else
                                      NVML's model, else ``absent`` with the reason; NVML snapshot
                                      (clocks, temperatures, ECC, driver), versions
``RUN_DIR/<host>/topo.txt``           the raw ``nvidia-smi topo -m`` text (or the injected file's)
``RUN_DIR/<host>/rank-00003.json``    one per rank: RANK/LOCAL_RANK/WORLD_SIZE, CUDA_VISIBLE_DEVICES,
                                      the GPU it drives (matched by PCI bus id to nvidia-smi's
                                      ordinal), its NUMA node, the process's CPU affinity, versions,
                                      where NCCL's route lines go, the optional probe baseline
``RUN_DIR/mapping.json``              (global rank 0, when a process group is up) every rank's
                                      host and GPU, the TP groups and the mapping warnings

Every file is written atomically and never over an existing one: one run directory per run.

**Mapping warning.** A TP group (given, or inferred from this rank's process groups: the
smallest group of more than one and fewer than all ranks) warns when its slowest link is
slower than the worst link of the partition :func:`hwlab.core.mapping.choose_tp_groups` finds for
the GPUs this job uses on that node: the mapping, not the machine, is then what is slow.

**NCCL routes.** NCCL prints its chosen transports ("via P2P/IPC", "via SHM", "via NET/IB") only
with ``NCCL_DEBUG=INFO``, to each rank's stdout unless ``NCCL_DEBUG_FILE`` is set.
``capture(nccl_log=True)`` sets both (file ``RUN_DIR/<host>/nccl.<pid>.log``) when they are
unset; it must run before the first NCCL communicator exists. ``hwlab ranks`` reads those files.

**Probe baseline** (``probe=True``, seconds): one GEMM and one copy on this rank's device with
:mod:`hwlab.core.probes`, the single-device rates the step log's work is compared against.
"""
from __future__ import annotations

import os
import socket
import sys
from datetime import datetime, timezone
from itertools import combinations
from pathlib import Path
from typing import Any

# torch is imported where a rank captures (its device, its process group): reading a run's capture
# (`hwlab ranks`) needs no torch
from hwlab.core import mapping, probes, system, topology
from hwlab.errors import UserInputError
from hwlab.core.store import RecordExistsError, write_json_atomic, write_text_atomic
from hwlab.core.topology import Topology, link_rank
from hwlab.core.store import read_user_json

SCHEMA = "hwlab.capture"
SCHEMA_VERSION = 1
ABSENT = topology.ABSENT
_ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MASTER_ADDR", "MASTER_PORT",
             "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID",
             "OMP_NUM_THREADS")


def rank_env(env: dict[str, str] | None = None) -> dict[str, Any]:
    """Rank, local rank, world size and node rank from torchrun's or SLURM's variables."""
    env = dict(os.environ if env is None else env)

    def pick(*keys: str, default: int | None = 0) -> int | None:
        for k in keys:
            if env.get(k, "").strip().lstrip("-").isdigit():
                return int(env[k])
        return default
    return {"rank": pick("RANK", "SLURM_PROCID"), "local_rank": pick("LOCAL_RANK", "SLURM_LOCALID"),
            "world_size": pick("WORLD_SIZE", "SLURM_NTASKS", default=1),
            "local_world_size": pick("LOCAL_WORLD_SIZE", default=None),
            "node_rank": pick("GROUP_RANK", "NODE_RANK", "SLURM_NODEID", default=None),
            "env": {k: env[k] for k in sorted(env) if k in _ENV_KEYS or k.startswith("NCCL_")}}


def cpu_list(cpus: set[int] | list[int]) -> str:
    """{0,1,2,3,8} -> '0-3,8' (nvidia-smi's CPU Affinity notation)."""
    s, out = sorted(cpus), []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(f"{s[i]}-{s[j]}" if j > i else f"{s[i]}")
        i = j + 1
    return ",".join(out)


def parse_cpu_list(text: str) -> set[int]:
    """'0-11,24-35' -> the CPU numbers; '' or 'N/A' -> empty."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit():
                out.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.add(int(part))
    return out


def node_topology(topo_file: str | os.PathLike | None = None) -> tuple[Topology | None, str | None, str]:
    """(model, raw text, source): an injected saved capture, else ``nvidia-smi topo -m``, else NVML
    (the core's one capture with its fallbacks, :func:`hwlab.core.topology.capture`)."""
    cap = topology.capture(topo_file)
    return cap.topo, cap.text, cap.source


def _bus(domain: int, bus: int, dev: int) -> str:
    return f"{domain:08x}:{bus:02x}:{dev:02x}.0"


def _norm_bus(b: str) -> str:
    b = b.lower()
    return b[-12:] if len(b) >= 12 else b  # NVML pads the domain to 8 hex digits, sysfs to 4


def device_of_rank(local_rank: int, snap: dict[str, Any], topo: Topology | None, cuda_index: int | None,
                   env: dict[str, str]) -> dict[str, Any]:
    """The GPU this rank drives, named by nvidia-smi's ordinal, and how that was established."""
    import torch
    d: dict[str, Any] = {"cuda_index": cuda_index, "gpu": None, "gpu_source": None, "pci_bus_id": None,
                         "name": None}
    if cuda_index is not None:
        p = torch.cuda.get_device_properties(cuda_index)
        d["name"] = p.name
        if hasattr(p, "pci_bus_id"):  # torch >= 2.1 exposes the PCI location
            d["pci_bus_id"] = _bus(getattr(p, "pci_domain_id", 0), p.pci_bus_id, getattr(p, "pci_device_id", 0))
        for g in snap.get("gpus", []):
            b = g.get("pci_bus_id")
            if d["pci_bus_id"] and isinstance(b, str) and _norm_bus(b) == _norm_bus(d["pci_bus_id"]):
                d["gpu"], d["gpu_source"] = f"GPU{g['index']}", "PCI bus id matched to NVML's ordinal"
                break
        else:
            cvd = [x.strip() for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
            if cvd and all(x.isdigit() for x in cvd) and env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
                d["gpu"], d["gpu_source"] = f"GPU{cvd[cuda_index]}", "CUDA_VISIBLE_DEVICES (PCI bus order)"
            else:
                d["gpu"] = f"GPU{cuda_index}"
                d["gpu_source"] = ("assumed: CUDA index (no NVML to match the bus id; CUDA's default "
                                   "order may differ from nvidia-smi's)")
    elif topo is not None and f"GPU{local_rank}" in topo.gpus:
        d["gpu"], d["gpu_source"] = f"GPU{local_rank}", "assumed from LOCAL_RANK (no CUDA device in this process)"
    numa, src = None, None
    if d["gpu"] and topo is not None and topo.numa_affinity.get(d["gpu"]) is not None:
        numa, src = topo.numa_affinity[d["gpu"]], "topology"
    elif d["pci_bus_id"]:
        try:
            v = int(Path(f"/sys/bus/pci/devices/{d['pci_bus_id'][-12:]}/numa_node").read_text())
            numa, src = (v, "sysfs") if v >= 0 else (None, "sysfs: no NUMA node")
        except (OSError, ValueError):
            pass
    d["numa_node"], d["numa_source"] = numa, src
    d["gpu_local_cpus"] = topo.cpu_affinity.get(d["gpu"]) if topo is not None and d["gpu"] else None
    return d


def numa_binding(affinity: set[int], gpu_local_cpus: str | None) -> str:
    """Is the process pinned to the CPUs near its GPU? (host-side copies and launches cross sockets if not)."""
    local = parse_cpu_list(gpu_local_cpus or "")
    if not local:
        return "unknown (no CPU affinity for this GPU in the topology)"
    if affinity <= local:
        return "bound within the GPU's NUMA node"
    if affinity & local:
        return f"not bound: {len(affinity - local)} of {len(affinity)} allowed CPUs are off the GPU's NUMA node"
    return "bound to CPUs off the GPU's NUMA node (every host-side access crosses sockets)"


def infer_tp_group(rank: int, world: int) -> list[int] | None:
    """The smallest process group holding this rank with more than one and fewer than all ranks."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    groups = [sorted(ranks) for ranks in dist.distributed_c10d._world.pg_group_ranks.values()
              if rank in ranks and 1 < len(ranks) < world]
    return min(groups, key=len) if groups else None


def _sub_topology(topo: Topology, gpus: list[str]) -> Topology:
    return Topology(gpus=gpus, links={(a, b): topo.links[(a, b)] for a in gpus for b in gpus},
                    cpu_affinity={g: topo.cpu_affinity.get(g, "") for g in gpus},
                    numa_affinity={g: topo.numa_affinity.get(g) for g in gpus}, source=topo.source)


def mapping_findings(ranks: list[dict[str, Any]], topos: dict[str, Topology | None]) -> list[str]:
    """Warnings for TP groups that cross a slower link than the job's GPUs allow on their node.

    ``ranks``: rank records (``rank``, ``host``, ``device.gpu``, ``tp_group``); ``topos``: each
    host's topology. The bar is the worst link of :func:`hwlab.core.mapping.choose_tp_groups` over the
    GPUs this job uses on that host (a regrouping can reach it); a group spanning hosts is
    reported as crossing the network.
    """
    by_rank = {r["rank"]: r for r in ranks}
    groups = sorted({tuple(sorted(r["tp_group"])) for r in ranks if r.get("tp_group")})
    out: list[str] = []
    for grp in groups:
        members = [by_rank.get(x) for x in grp]
        if any(m is None for m in members):
            continue  # a rank's record is missing: hwlab ranks says which
        hosts = {m["host"] for m in members}
        if len(hosts) > 1:
            out.append(f"TP group ranks {list(grp)} spans nodes {sorted(hosts)}: its all-reduce crosses "
                       "the network every layer; keep TP groups inside one node")
            continue
        host = hosts.pop()
        topo = topos.get(host)
        gpus = [m["device"].get("gpu") for m in members]
        if topo is None or None in gpus or len(set(gpus)) < len(gpus):
            continue
        used = sorted({r["device"]["gpu"] for r in ranks if r["host"] == host and r["device"].get("gpu")},
                      key=topo.gpus.index)
        sub = _sub_topology(topo, used)
        slowest = topo.slowest_link(gpus)
        try:
            chosen = mapping.choose_tp_groups(sub, len(grp))
            bar = mapping.evaluate(sub, chosen).worst
        except ValueError:  # the job's GPUs do not split into groups of this size
            chosen = None
            bar = min((sub.slowest_link(c) for c in combinations(sub.gpus, len(grp))), key=link_rank)
        if link_rank(slowest) > link_rank(bar):
            hint = f"; hwlab.core.mapping.choose_tp_groups gives {chosen}" if chosen else ""
            out.append(f"TP group ranks {list(grp)} on {host} ({', '.join(gpus)}) crosses {slowest}, but this "
                       f"node's GPUs can form groups of {len(grp)} whose slowest link is {bar}{hint}")
    return out


def _probe_baseline(cuda_index: int | None, dtype: str | None = None) -> list[dict[str, Any]]:
    """One GEMM (``dtype``: bf16 on a GPU, fp32 on a CPU by default; use your job's) and one copy
    on this rank's device (small: well under a second each on a GPU)."""
    import torch
    dev = torch.device("cuda", cuda_index) if cuda_index is not None else torch.device("cpu")
    gpu = dev.type == "cuda"
    g = probes.gemm(size=4096 if gpu else 256, dtype=dtype or ("bf16" if gpu else "fp32"), device=dev, n_rep=20)
    c = probes.hbm_copy(size_mib=256 if gpu else 16, device=dev, impl="torch", n_rep=20)
    return [g.to_dict(), c.to_dict()]


def capture(run_dir: str | os.PathLike, *, tp_groups: list[list[int]] | None = None, tp: int | None = None,
            topo_file: str | os.PathLike | None = None, probe: bool = False, probe_dtype: str | None = None,
            nccl_log: bool = False, device: int | None = None, quiet: bool = False,
            nvml_sample_s: float | None = None) -> dict[str, Any]:
    """Write this rank's startup capture (and its node's, on local rank 0); return the rank record.

    ``tp_groups``: TP groups as lists of global ranks; or ``tp``: consecutive ranks form groups
    of ``tp`` (Megatron's default order); neither: inferred from the process groups, if any.
    ``topo_file``: use a saved ``nvidia-smi topo -m`` instead of this node's (labelled
    "injected"). ``device``: the CUDA index this rank uses (default ``LOCAL_RANK % device_count``).
    ``probe_dtype``: the GEMM probe's dtype (fp32, tf32, bf16, fp16, fp8): the one your step's
    matmuls run in, so that the step log's declared FLOPs are held against the right rate.
    Call after ``init_process_group`` to get the all-rank mapping warning at startup; before it,
    each rank's record is written and ``hwlab ranks`` checks the mapping later.
    ``nvml_sample_s`` (with ``probe=True``): sample this rank's GPU through NVML while the probe runs
    (:mod:`hwlab.core.nvml_sampler`), kept as ``rec["nvml_during_probe"]``: what utilisation, SM activity
    and PCIe/NVLink counters read on a known load, or why NVML is absent.
    """
    import torch
    import torch.distributed as dist
    info = rank_env()
    rank, local_rank, world = info["rank"], info["local_rank"], info["world_size"]
    host = socket.gethostname()
    node_dir = Path(run_dir) / host
    rank_path = node_dir / f"rank-{rank:05d}.json"
    if rank_path.exists():
        raise UserInputError(f"{rank_path} already exists: give each run its own run directory")
    if nccl_log and not os.environ.get("NCCL_DEBUG_FILE"):
        node_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("NCCL_DEBUG", "INFO")
        os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,GRAPH")
        os.environ["NCCL_DEBUG_FILE"] = str(node_dir / "nccl.%p.log")
    topo, text, topo_source = node_topology(topo_file)
    snap = system.snapshot()
    if device is None and torch.cuda.is_available():
        device = local_rank % torch.cuda.device_count()
    dev = device_of_rank(local_rank, snap, topo, device, os.environ)
    affinity = os.sched_getaffinity(0)
    if tp_groups is not None:
        group, gsrc = next((sorted(g) for g in tp_groups if rank in g), None), "given"
    elif tp:
        group, gsrc = list(range(rank - rank % tp, rank - rank % tp + tp)), f"consecutive ranks, tp={tp}"
    else:
        group, gsrc = infer_tp_group(rank, world), "inferred from process groups"
    debug_file = os.environ.get("NCCL_DEBUG_FILE")
    nccl = {"NCCL_DEBUG": os.environ.get("NCCL_DEBUG"),
            "route_lines": (f"in {debug_file} (%h = host, %p = pid {os.getpid()})" if debug_file else
                            "this rank's stdout (NCCL_DEBUG_FILE unset)")
            if os.environ.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE") else
            "not logged: set NCCL_DEBUG=INFO (or capture(nccl_log=True)) to see NCCL's chosen routes"}
    rec: dict[str, Any] = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
        "taken_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host, "pid": os.getpid(), **{k: v for k, v in info.items()},
        "device": dev, "cpu_affinity": cpu_list(affinity), "cpu_affinity_n": len(affinity),
        "numa_binding": (numa_binding(affinity, dev["gpu_local_cpus"]) if topo_file is None else
                         "unknown (the topology was injected from another machine)"),
        "versions": snap["versions"],
        "topology_source": topo_source, "tp_group": group, "tp_group_source": gsrc if group else None,
        "nccl": nccl, "probe": None, "warnings": [],
    }
    up = dist.is_available() and dist.is_initialized()
    if probe:
        if up:
            dist.barrier()  # ranks probe together: the same contention as the job's own steps
        if nvml_sample_s:
            from hwlab.core.nvml_sampler import NvmlSampler, summarise
            dev_idx = [device if device is not None else local_rank] if torch.cuda.is_available() else None
            with NvmlSampler(interval_s=nvml_sample_s, devices=dev_idx) as smp:
                rec["probe"] = _probe_baseline(device, probe_dtype)
            rec["nvml_during_probe"] = summarise(smp.result())
        else:
            rec["probe"] = _probe_baseline(device, probe_dtype)
    if local_rank == 0:
        node = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "node", "host": host,
                "taken_at": rec["taken_at"], "topology_source": topo_source,
                "topology": topo.to_dict() if topo else None, "snapshot": snap}
        try:
            write_json_atomic(node_dir / "node.json", node)
            if text:
                write_text_atomic(node_dir / "topo.txt", text)
        except RecordExistsError:
            raise UserInputError(f"{node_dir} already holds a node capture: give each run its own "
                                 "run directory") from None
    if up:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, {"rank": rank, "host": host, "device": dev, "tp_group": group,
                                          "topology": topo.to_dict() if topo and local_rank == 0 else None})
        topos = {r["host"]: Topology.from_dict(r["topology"]) for r in everyone if r["topology"]}
        rec["warnings"] = [w for w in mapping_findings(everyone, topos) if group and f"ranks {group}" in w]
        if rank == 0:
            write_json_atomic(Path(run_dir) / "mapping.json", {
                "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "mapping",
                "ranks": [{k: r[k] for k in ("rank", "host", "device", "tp_group")} for r in everyone],
                "warnings": mapping_findings(everyone, topos)})
    rec["warnings"] += [f"rank {rank}: CPU affinity {rec['numa_binding']}"] if rec["numa_binding"].startswith("bound to CPUs off") else []
    write_json_atomic(rank_path, rec)
    if not quiet:
        for w in rec["warnings"] if group is None or rank == min(group) else []:
            print(f"hwlab capture: WARNING {w}", file=sys.stderr)
        if local_rank == 0:
            print(f"hwlab capture: rank {rank} on {host} -> {dev['gpu'] or 'no GPU'} (topology: {topo_source}); "
                  f"written to {node_dir}", file=sys.stderr)
    return rec


def load_run(run_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
    """(rank records, node records by host, problems) from a run directory; unreadable files are
    reported in ``problems`` and skipped."""
    ranks, nodes, problems = [], {}, []
    for p in sorted(Path(run_dir).glob("*/rank-*.json")) + sorted(Path(run_dir).glob("*/node.json")):
        try:
            d = read_user_json(p, "capture record", f"an {SCHEMA} record")
            if not isinstance(d, dict) or d.get("schema") != SCHEMA:
                raise ValueError(f"not an {SCHEMA} record")
            _check_record(d, node=p.name == "node.json")
        except (OSError, ValueError) as e:  # UserInputError is a ValueError
            problems.append(f"{p}: skipped ({e})")
            continue
        if p.name == "node.json":
            nodes[d["host"]] = d
        else:
            ranks.append(d)
    return ranks, nodes, problems


def _check_record(d: dict[str, Any], *, node: bool) -> None:
    """Raise ValueError (the record is skipped and named) where a capture record holds what
    :func:`capture` never writes in the fields the ranks report reads: the host a non-empty
    text; a rank record's rank, pid and tensor-parallel group whole numbers, its GPU a name
    (``GPU3``) or null, its probe results named and their rates finite numbers; a node
    record's topology one :class:`Topology` can hold (every GPU pair's link named)."""
    from hwlab.core.validate import MAX_RANKS, number

    if not isinstance(d.get("host"), str) or not d["host"]:
        raise ValueError("host should be a name")
    if node:
        t = d.get("topology")
        if t is not None:
            if not (isinstance(t, dict) and isinstance(t.get("gpus"), list) and isinstance(t.get("links"), dict)
                    and all(isinstance(g, str) for g in t["gpus"])
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in t["links"].items())):
                raise ValueError("its topology is not one hwlab.core.capture writes")
            topo = Topology.from_dict(t)
            if any((a, b) not in topo.links for a, b in combinations(topo.gpus, 2)):
                raise ValueError("its topology lacks a GPU pair's link")
        return
    number(d.get("rank"), "rank", lo=0.0, hi=MAX_RANKS - 1, whole=True)
    number(d.get("pid"), "pid", lo=0.0, whole=True, hi=2.0**63)
    dev = d.get("device")
    if not isinstance(dev, dict) or not (dev.get("gpu") is None or isinstance(dev["gpu"], str)):
        raise ValueError("device.gpu should be a GPU name (GPU3) or null")
    grp = d.get("tp_group")
    if grp is not None:
        if not isinstance(grp, list):
            raise ValueError("tp_group should be a list of ranks")
        for r in grp:
            number(r, "tp_group rank", lo=0.0, hi=MAX_RANKS - 1, whole=True)
    for i, pr in enumerate(d.get("probe") or []):
        if not (isinstance(pr, dict) and isinstance(pr.get("name"), str) and isinstance(pr.get("derived", {}), dict)):
            raise ValueError(f"probe[{i}] is not a probe result")
        for k, v in pr.get("derived", {}).items():
            if v is not None:
                number(v, f"probe[{i}].derived.{k}", lo=0.0)

