"""Recorded evidence: a versioned JSON record of one run, for replay on machines without a GPU.

A record holds the machine it ran on (device name, host, NVML snapshot, versions), the
ceilings measured in the same run, and the probe/lab results as :class:`Measurement`
dicts plus any lab-specific payload under ``extra``. It is written atomically and never
over an existing file (:mod:`hwlab.store`).

Anything shown from a record is labelled with :attr:`Evidence.label`,
``"recorded on <device>, <date>"``, so a CPU machine never passes a recorded H200 figure
off as its own.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import UserInputError
from .measure import Measurement
from .store import write_json_atomic

SCHEMA = "hwlab.evidence"
SCHEMA_VERSION = 1
#: where the kit's own recorded runs live (shipped inside the package); HWLAB_RECORDED_DIR
#: points elsewhere (the GPU refresh executes notebooks against freshly recorded runs)
RECORDED_DIR = Path(os.environ.get("HWLAB_RECORDED_DIR") or Path(__file__).parent / "recorded")


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

    from .measure import device_name, device_of

    dev = device_of(device)
    info = {"device": device_name(dev), "is_gpu": dev.type == "cuda",
            "host": socket.gethostname()}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(sm_count=p.multi_processor_count, total_mem_gib=p.total_memory / 2**30,
                    l2_bytes=int(getattr(p, "L2_cache_size", 0)), cc=f"{p.major}.{p.minor}")
    return info


def load(path: str | os.PathLike) -> Evidence:
    """Load and validate a record; every failure names the file and what to do."""
    p = Path(path)
    if p.is_dir():
        raise EvidenceError(f"{p} is a folder: pass an evidence .json file")
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvidenceError(f"evidence file {p} does not exist") from None
    except UnicodeDecodeError:
        raise EvidenceError(f"{p} is not text (binary data): pass an hwlab evidence .json") from None
    except OSError as e:
        raise EvidenceError(f"cannot read evidence file {p} ({e.strerror or e})") from None
    if not raw.strip():
        raise EvidenceError(f"evidence file {p} is empty: re-record it")
    try:
        d = json.loads(raw)
    except json.JSONDecodeError as e:
        raise EvidenceError(f"evidence file {p} is not valid JSON (line {e.lineno}, column "
                            f"{e.colno}: {e.msg}); it may be truncated. Re-record it.") from None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise EvidenceError(f"{p} is not an hwlab evidence record (schema {SCHEMA!r} missing)")
    v = d.get("schema_version")
    if v != SCHEMA_VERSION:
        raise EvidenceError(f"{p} has schema version {v}; this hwlab reads version "
                            f"{SCHEMA_VERSION}. Upgrade hwlab or re-record.")
    for key in ("kind", "machine", "results", "recorded_at"):
        if key not in d:
            raise EvidenceError(f"{p} lacks the field {key!r}")
    for key, typ in (("machine", dict), ("results", list), ("recorded_at", str), ("kind", str)):
        if not isinstance(d[key], typ):
            raise EvidenceError(f"{p}: the field {key!r} should be a {typ.__name__}, "
                                f"not {type(d[key]).__name__}; re-record it")
    try:
        results = [Measurement.from_dict(r) for r in d["results"]]
    except (TypeError, ValueError, AttributeError) as e:
        raise EvidenceError(f"{p}: a result is malformed ({e})") from None
    return Evidence(kind=d["kind"], machine=d["machine"], results=results,
                    ceilings=d.get("ceilings") or {}, versions=d.get("versions") or {},
                    snapshot=d.get("snapshot"), extra=d.get("extra") or {},
                    recorded_at=d["recorded_at"], path=p)


def recorded(kind: str, device: str = "h200") -> Evidence:
    """The kit's own recorded run of ``kind`` on ``device`` (e.g. ``recorded('doctor')``)."""
    p = RECORDED_DIR / device / f"{kind}.json"
    if not p.exists():
        have = sorted(x.stem for x in (RECORDED_DIR / device).glob("*.json"))
        raise EvidenceError(f"no recorded {kind!r} run for {device} (have: {', '.join(have) or 'none'})")
    return load(p)
