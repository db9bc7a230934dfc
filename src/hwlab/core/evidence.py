"""Recorded evidence: a versioned JSON record of one run, for replay on machines without a GPU.

A record holds the machine it ran on (device name, host, NVML snapshot, versions), the
ceilings measured in the same run, and the probe/lab results as :class:`Measurement`
dicts plus any lab-specific payload under ``extra``. It is written atomically and never
over an existing file (:mod:`hwlab.core.store`).

Anything shown from a record is labelled with :attr:`Evidence.label`,
``"recorded on <device>, <date>"``, so a CPU machine never passes a recorded H200 figure
off as its own.

Records carry ``schema_version``. When what a field means changes, the version goes up and a
named migration (``MIGRATIONS[v]`` turns version ``v`` into ``v + 1``) brings an older record
to :data:`SCHEMA_VERSION` once, in :func:`load`; readers never patch old figures themselves.
``scripts/migrate_evidence.py`` rewrites files in the current version.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from collections.abc import Callable

from hwlab.errors import UserInputError
from hwlab.core.measure import Measurement
from hwlab.core.store import read_user_json, write_json_atomic
from hwlab.core import record_shape, validate

SCHEMA = "hwlab.evidence"
#: 1: first format. 2: Lab 4 profiles count the marked quant/dequant ranges once (host
#: timeline) and say so in ``ranges_counted_on`` (:func:`migrate_v1_to_v2`).
SCHEMA_VERSION = 2
EVIDENCE_HINT = "pass an hwlab evidence .json (re-record it if it was one)"
#: where the kit's own recorded runs live (shipped inside the package); HWLAB_RECORDED_DIR
#: points elsewhere (the GPU refresh executes notebooks against freshly recorded runs)
RECORDED_DIR = Path(os.environ.get("HWLAB_RECORDED_DIR") or Path(__file__).parents[1] / "recorded")
#: the kit's recorded profiler traces, one folder per run (torch.profiler files of every rank),
#: shipped inside the package like the runs above but never moved by HWLAB_RECORDED_DIR: the
#: notebooks and exercises read these exact runs, wherever the learner's working folder is
TRACES_DIR = Path(__file__).parents[1] / "recorded" / "traces"


class EvidenceError(UserInputError):
    """An evidence file that cannot be used; the message says which and why."""


@dataclass
class Evidence:
    kind: str
    machine: dict[str, Any]
    results: list[Measurement] = field(default_factory=list)
    ceilings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    snapshot: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    recorded_at: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    path: Path | None = None

    @property
    def device(self) -> str:
        return self.machine.get("device", "unknown device")

    @property
    def is_gpu(self) -> bool:
        return bool(self.machine.get("is_gpu"))

    @property
    def label(self) -> str:
        return f"recorded on {self.device}, {self.recorded_at[:10]}"

    def result(self, name: str) -> Measurement:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no result named {name!r} in {self.path or self.kind} "
                       f"(has: {', '.join(r.name for r in self.results)})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": self.kind,
            "recorded_at": self.recorded_at, "machine": self.machine,
            "versions": self.versions, "ceilings": self.ceilings,
            "results": [r.to_dict() for r in self.results],
            "snapshot": self.snapshot, "extra": self.extra,
        }

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        p = write_json_atomic(path, self.to_dict(), overwrite=overwrite)
        self.path = p
        return p


def machine_info(device: Any = None) -> dict[str, Any]:
    """What a record says about the machine: device name, whether it is a GPU, host."""
    import socket

    import torch

    from hwlab.core.measure import device_name, device_of

    dev = device_of(device)
    info = {"device": device_name(dev), "is_gpu": dev.type == "cuda",
            "host": socket.gethostname()}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(sm_count=p.multi_processor_count, total_mem_gib=p.total_memory / 2**30,
                    l2_bytes=int(getattr(p, "L2_cache_size", 0)), cc=f"{p.major}.{p.minor}")
    return info


def migrate_v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: Lab 4's profile counts of marked quant/dequant ranges, counted once.

    Lab 4's decode profile (``hwlab.labs.fp8.profile``) counts the ranges it marks around each
    quantize and dequantize. On a GPU, torch.profiler also mirrors every host range onto the
    device timeline; version 1 counted both copies, so on a GPU record each count is twice the
    number of ranges that ran. Version 2 counts the host timeline only and says so in
    ``ranges_counted_on``. This halves ``quant_ranges``, ``dequant_ranges`` and
    ``dequant_requant_per_token`` of every torch.profiler profile in a GPU record that lacks
    ``ranges_counted_on`` (a CPU profile has no device timeline: its counts stand). A doubled
    count is even; an odd one means the record is not what this migration assumes, and it is
    refused. Returns a new dict; ``d`` is left as it was."""
    out = copy.deepcopy(d)
    machine = out.get("machine")
    on_gpu = isinstance(machine, dict) and bool(machine.get("is_gpu"))

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            if ("dequant_requant_per_token" in node and "ranges_counted_on" not in node
                    and node.get("source") == "torch.profiler kernel names"):
                if on_gpu:
                    for k in ("quant_ranges", "dequant_ranges"):
                        if k in node:
                            if node[k] % 2:
                                raise ValueError(f"{k} = {node[k]} is odd, not a doubled count")
                            node[k] //= 2
                    node["dequant_requant_per_token"] = node["dequant_requant_per_token"] / 2
                node["ranges_counted_on"] = "host timeline"
            for v in node.values():
                fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)

    fix(out.get("extra"))
    out["schema_version"] = 2
    return out


#: ``MIGRATIONS[v]`` turns a version-``v`` record into version ``v + 1``
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: migrate_v1_to_v2}


def migrate(d: dict[str, Any], path: str | os.PathLike = "record") -> dict[str, Any]:
    """``d`` (a record's parsed JSON) in version :data:`SCHEMA_VERSION`, through each migration
    from its own version up; a record from a newer hwlab, or one a migration refuses, raises
    :class:`EvidenceError`."""
    v = d.get("schema_version")
    if v == SCHEMA_VERSION:
        return d
    if not isinstance(v, int) or isinstance(v, bool) or v not in MIGRATIONS:
        raise EvidenceError(f"{path} has schema version {v}; this hwlab reads versions "
                            f"{min(MIGRATIONS)}..{SCHEMA_VERSION}. Upgrade hwlab or re-record.")
    while v < SCHEMA_VERSION:
        try:
            d = MIGRATIONS[v](d)
        except (TypeError, ValueError, AttributeError) as e:
            raise EvidenceError(f"{path}: cannot bring schema version {v} up to date ({e}); "
                                "re-record it") from None
        v = d["schema_version"]
    return d


def load(path: str | os.PathLike) -> Evidence:
    """Load and validate a record, migrating an older version to :data:`SCHEMA_VERSION`; every
    failure is an :class:`EvidenceError` naming the file and what to do."""
    p = Path(path)
    d = read_user_json(p, "evidence file", EVIDENCE_HINT, error=EvidenceError)
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise EvidenceError(f"{p} is not an hwlab evidence record (schema {SCHEMA!r} missing)")
    d = migrate(d, p)
    for key in ("kind", "machine", "results", "recorded_at"):
        if key not in d:
            raise EvidenceError(f"{p} lacks the field {key!r}")
    for key, typ in (("machine", dict), ("results", list), ("recorded_at", str), ("kind", str)):
        if not isinstance(d[key], typ):
            raise EvidenceError(f"{p}: the field {key!r} should be a {typ.__name__}, "
                                f"not {type(d[key]).__name__}; re-record it")
    try:  # every field a reader reads has its type (core.record_shape)
        record_shape.check_evidence(d)
    except record_shape.ShapeError as e:
        raise EvidenceError(f"{p} is corrupt: {e}; re-record it") from None
    try:  # every number checked before anything judges it (hwlab.core.validate)
        for i, r in enumerate(d["results"]):
            if not isinstance(r, dict):
                raise EvidenceError(f"{p} is corrupt: results[{i}] should be an object, not "
                                    f"{type(r).__name__}; re-record it")
            missing = sorted({"name", "t_ms", "n_bytes", "n_flops"} - r.keys())
            if missing:
                raise EvidenceError(f"{p}: a result is malformed (results[{i}] lacks {missing})")
            if not isinstance(r["name"], str) or not r["name"]:
                raise EvidenceError(f"{p} is corrupt: results[{i}].name should be a probe name, not "
                                    f"{str(r['name'])[:40]}; re-record it")
            validate.measurement(r, where=f"results[{i}] ({r.get('name', '?')}) ")
        if d.get("ceilings"):
            if not isinstance(d["ceilings"], dict):
                raise EvidenceError(f"{p} is corrupt: ceilings should be an object; re-record it")
            validate.ceilings(d["ceilings"], d["machine"].get("device"))
        validate.snapshot(d.get("snapshot"))
    except validate.NumberError as e:
        raise EvidenceError(f"{p} is corrupt: {e}; re-record it") from None
    try:
        results = [Measurement.from_dict(r) for r in d["results"]]
    except (TypeError, ValueError, AttributeError) as e:
        raise EvidenceError(f"{p}: a result is malformed ({e})") from None
    return Evidence(kind=d["kind"], machine=d["machine"], results=results,
                    ceilings=d.get("ceilings") or {}, versions=d.get("versions") or {},
                    snapshot=d.get("snapshot"), extra=d.get("extra") or {},
                    recorded_at=d["recorded_at"], path=p)


def recorded_traces(run: str) -> Path:
    """The folder of the kit's recorded traces of ``run`` (e.g. ``recorded_traces('slow_rank')``),
    found through the package, never through the current folder."""
    p = TRACES_DIR / run
    if not p.is_dir():
        have = sorted(x.name for x in TRACES_DIR.iterdir() if x.is_dir()) if TRACES_DIR.is_dir() else []
        raise EvidenceError(f"no recorded traces {run!r} in the package (have: {', '.join(have) or 'none'})")
    return p


#: the examples a learner examines (notebook 08, ``hwlab examine``), shipped inside the package; the
#: checkout's ``examples/`` is a link to this folder
EXAMPLES_DIR = Path(__file__).parents[1] / "examples"


def example(name: str) -> Path:
    """The example file ``name`` (e.g. ``example('unfused_chain.py')``), found through the package,
    never through the current folder."""
    p = EXAMPLES_DIR / name
    if not p.is_file():
        have = sorted(x.name for x in EXAMPLES_DIR.glob("*.py")) if EXAMPLES_DIR.is_dir() else []
        raise EvidenceError(f"no example {name!r} in the package (have: {', '.join(have) or 'none'})")
    return p


def recorded(kind: str, device: str = "h200") -> Evidence:
    """The kit's own recorded run of ``kind`` on ``device`` (e.g. ``recorded('doctor')``)."""
    p = RECORDED_DIR / device / f"{kind}.json"
    if not p.exists():
        have = sorted(x.stem for x in (RECORDED_DIR / device).glob("*.json"))
        raise EvidenceError(f"no recorded {kind!r} run for {device} (have: {', '.join(have) or 'none'})")
    return load(p)
