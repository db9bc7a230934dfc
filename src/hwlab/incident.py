"""The seed's minimal incident record, filled from evidence and a diagnosis.

Fields (the seed's table): machine and topology (GPU model, driver, topology, rank mapping),
symptom scope (single card / multi-GPU / training / inference / a bucket), key evidence
(trace, NCCL wait, bandwidth, fallback, temperature), fix (mapping change, node swap,
dispatch change, kernel rollback), re-verification (which probe or bucket proves recovery).

Written as Markdown and JSON side by side, each under a new numbered name: an earlier
record is never overwritten.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .evidence import Evidence
from .flowchart import Diagnosis
from .store import RecordExistsError, write_json_atomic, write_text_atomic

SCOPES = ("single-card", "multi-GPU", "training", "inference", "bucket")


@dataclass
class Incident:
    title: str
    machine: dict[str, Any]
    topology: str
    rank_mapping: str
    symptom_scope: str
    symptom: str
    key_evidence: list[str]
    diagnosis_path: list[str]
    diagnosis: str
    fix: str
    reverify: str
    reverified: bool | None = None
    opened_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def to_markdown(self) -> str:
        ev = "\n".join(f"  - {e}" for e in self.key_evidence) or "  - (none attached)"
        status = {True: "recovered (re-verified)", False: "NOT recovered", None: "not yet re-verified"}[self.reverified]
        return (f"# Incident: {self.title}\n\nopened {self.opened_at} · status: **{status}**\n\n"
                f"| field | content |\n|---|---|\n"
                f"| machine and topology | {self.machine.get('device', '?')} on {self.machine.get('host', '?')}, "
                f"driver {self.machine.get('driver', '?')}; topology: {self.topology}; rank mapping: {self.rank_mapping} |\n"
                f"| symptom scope | {self.symptom_scope}: {self.symptom} |\n"
                f"| key evidence | see below |\n"
                f"| fix | {self.fix} |\n"
                f"| re-verification | {self.reverify} |\n\n"
                f"## Key evidence\n{ev}\n\n## Diagnosis (flowchart path {' -> '.join(self.diagnosis_path)})\n\n"
                f"```\n{self.diagnosis}\n```\n")


def from_diagnosis(title: str, evidence: Evidence | None, diagnosis: Diagnosis, *, symptom_scope: str,
                   symptom: str, fix: str, reverify: str, rank_mapping: str = "n/a",
                   extra_evidence: list[str] | None = None, reverified: bool | None = None) -> Incident:
    """Fill the record: machine/topology/versions from ``evidence``, evidence lines from the
    diagnosis steps (metric = value against its rule) and the record's measurements."""
    if symptom_scope not in SCOPES:
        raise ValueError(f"symptom_scope must be one of {SCOPES}, not {symptom_scope!r}")
    machine = dict(evidence.machine) if evidence else {}
    if evidence:
        machine["driver"] = evidence.versions.get("driver", machine.get("driver"))
        machine["recorded"] = evidence.label
    topo = "unknown"
    if evidence and (evidence.extra.get("topology") or {}).get("gpus"):
        t = evidence.extra["topology"]
        topo = f"{len(t['gpus'])} GPU(s), links {sorted(set(t['links'].values()) - {'X'}) or ['single GPU']}"
    lines = [f"{s.question}: {s.metric} = {s.value} (rule {s.criterion})" for s in diagnosis.steps]
    if evidence:
        lines += [f"{m.name}: {m.summary()}" for m in evidence.results[:6]]
    lines += extra_evidence or []
    return Incident(title, machine, topo, rank_mapping, symptom_scope, symptom, lines, diagnosis.path,
                    diagnosis.explain(), fix, reverify, reverified)


def save(inc: Incident, folder: str | Path) -> tuple[Path, Path]:
    """Write ``incident-<date>-<nnn>.md`` and ``.json``; the number is the first unused one."""
    folder = Path(folder)
    day = inc.opened_at[:10]
    for n in range(1, 1000):
        md, js = folder / f"incident-{day}-{n:03d}.md", folder / f"incident-{day}-{n:03d}.json"
        if md.exists() or js.exists():
            continue
        try:
            write_json_atomic(js, asdict(inc))
        except RecordExistsError:
            continue
        write_text_atomic(md, inc.to_markdown())
        return md, js
    raise RecordExistsError(f"{folder} already holds 999 incident records for {day}")


def load(path: str | Path) -> Incident:
    return Incident(**json.loads(Path(path).read_text()))
