"""The seed's minimal incident record, filled from evidence and a diagnosis.

Fields (the seed's table): machine and topology (GPU model, driver, topology, rank mapping),
symptom scope (single card / multi-GPU / training / inference / a bucket), key evidence
(trace, NCCL wait, bandwidth, fallback, temperature), fix (mapping change, node swap,
dispatch change, kernel rollback), re-verification (which probe or bucket proves recovery).

Where each field comes from (:func:`machine_facts`): the run's evidence record first (its
NVML snapshot: GPU model, driver, clocks, temperature, throttle reasons; its topology; its
rank-to-device map); a record that lacks the snapshot takes it from the kit's doctor record of
the same host and GPU, and says so; with no record at all, this machine now
(:func:`hwlab.core.system.snapshot`, :func:`hwlab.core.topology.from_nvml`). A CPU machine is recorded as
``"no GPU: <cpu model>"``, topology ``"none: CPU only"``, never as unknown. Key evidence holds
the measured metrics that decided the walk (each step's metric, value, rule and what measured
it; a by-hand answer is marked as such), the GPUs' clocks/temperature/throttle state, and for
multi-rank runs the per-rank collective wait when given. The re-verification names the probe
and holds its re-measured metrics and the leaf they walk to, as data.

Written as Markdown and JSON side by side, each under a new numbered name: an earlier
record is never overwritten.
"""
from __future__ import annotations

import platform
import sys
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hwlab.core import system, topology
from hwlab.errors import UserInputError
from hwlab.core.evidence import RECORDED_DIR, Evidence, EvidenceError, load as load_evidence, machine_info
from hwlab.diagnosis.flowchart import Diagnosis, diagnose
from hwlab.core.store import RecordExistsError, write_json_atomic, write_text_atomic
from hwlab.core.store import read_user_json


def _now() -> datetime:
    """Now, or ``SOURCE_DATE_EPOCH`` (the reproducible-builds convention) where it is set: two
    readings of the same traces then print the same bytes."""
    import os
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return datetime.fromtimestamp(int(epoch), timezone.utc) if epoch.isdigit() else datetime.now(timezone.utc)

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
    opened_at: str = field(default_factory=lambda: _now().isoformat(timespec="seconds"))
    #: metric -> {value, rule, how ("measured" | "by hand"), source, question}: what decided the walk
    measured: dict[str, Any] = field(default_factory=dict)
    #: per GPU: model, SM/memory clocks, temperature, power, clock-event (throttle) reasons
    gpu_state: list[dict[str, Any]] = field(default_factory=list)
    #: rank -> collective (e.g. NCCL) wait in ms, for multi-rank runs where it was measured
    collective_wait_ms: dict[str, float] | None = None
    #: {probe, measured: {metric: value}, path, leaf, fully_measured}: the re-verification as data
    reverify_result: dict[str, Any] | None = None

    def to_markdown(self) -> str:
        ev = "\n".join(f"  - {e}" for e in self.key_evidence) or "  - (none attached)"
        status = {True: "recovered (re-verified)", False: "NOT recovered", None: "not yet re-verified"}[self.reverified]
        if self.reverified is None and (self.reverify_result or {}).get("borderline"):
            status = "not re-verified: the re-check is borderline (one re-run from the other branch)"
        m = self.machine
        rv = self.reverify
        if self.reverify_result:
            r = self.reverify_result
            rv += (f"; re-measured with {r['probe']}: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in r["measured"].items())
                   + f" -> {r['leaf']} ({' -> '.join(r['path'])})"
                   + ("; BORDERLINE at " + "; ".join(r["borderline"]) if r.get("borderline") else ""))
        rows = [("machine and topology", f"{m.get('gpu_model', m.get('device', '?'))} on {m.get('host', '?')}, "
                 f"driver {m.get('driver', '?')} ({m.get('source', '?')}); topology: {self.topology}; "
                 f"rank mapping: {self.rank_mapping}"),
                ("symptom scope", f"{self.symptom_scope}: {self.symptom}"), ("key evidence", "see below"),
                ("fix", self.fix), ("re-verification", rv)]
        title = " ".join(str(self.title).split())  # a heading is one line
        return (f"# Incident: {title}\n\nopened {self.opened_at} · status: **{status}**\n\n"
                f"| field | content |\n|---|---|\n" + "".join(table_row(k, v) for k, v in rows) + "\n"
                f"## Key evidence\n{ev}\n\n## Diagnosis (flowchart path {' -> '.join(self.diagnosis_path)})\n\n"
                f"```\n{self.diagnosis}\n```\n")


def md_cell(text: Any) -> str:
    """Text as one Markdown table cell: a backslash and a ``|`` are escaped (GFM reads ``\\|`` as a
    literal pipe, and an escaped backslash before it as its own pair), line breaks become ``<br>``
    (a newline would end the row)."""
    t = str(text).replace("\\", "\\\\").replace("|", "\\|")
    return t.replace("\r\n", "<br>").replace("\r", "<br>").replace("\n", "<br>")


def table_row(*cells: Any) -> str:
    """One Markdown table row of :func:`md_cell` cells."""
    return "| " + " | ".join(md_cell(c) for c in cells) + " |\n"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unnamed CPU"


def _machine_from_nvml(snap: dict[str, Any]) -> dict[str, Any]:
    """:func:`hwlab.core.evidence.machine_info`'s fields from an NVML snapshot (no torch)."""
    names = sorted({g["name"] for g in snap.get("gpus") or [] if isinstance(g.get("name"), str)})
    return {"device": ", ".join(names) if names else f"CPU ({cpu_model()}, {snap.get('cpu_count')} cores)",
            "is_gpu": bool(names), "host": snap.get("host")}


def _doctor_for(ev: Evidence) -> Evidence | None:
    """The kit's doctor record of the same host and GPU as ``ev`` (next to it, or recorded)."""
    cands = []
    if ev.path is not None:
        cands.append(Path(ev.path).parent / "doctor.json")
    cands += sorted(RECORDED_DIR.glob("*/doctor.json"))
    for p in cands:
        try:
            d = load_evidence(p)
        except EvidenceError:
            continue
        if d.snapshot and d.device == ev.device and d.machine.get("host") == ev.machine.get("host"):
            return d
    return None


def _gpu_state(snap: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ("index", "name", "pci_bus_id", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz",
            "mem_clock_max_mhz", "temperature_c", "power_w", "power_limit_w", "clock_event_reasons")
    return [{**{k: g.get(k) for k in keys if g.get(k) is not None}, "taken_at": snap.get("taken_at")}
            for g in snap.get("gpus") or []]


def _topology_text(topo: dict[str, Any] | None) -> str | None:
    if not topo or not topo.get("gpus"):
        return None
    links = sorted(set(topo.get("links", {}).values()) - {"X"})
    numa = topo.get("numa_affinity") or {}
    return (f"{len(topo['gpus'])} GPU(s) ({', '.join(topo['gpus'])}), links {links or ['single GPU: no peer links']}"
            + (f", NUMA {numa}" if numa else "") + (f" [{topo['source']}]" if topo.get("source") else ""))


def machine_facts(evidence: Evidence | None = None) -> tuple[dict[str, Any], str, str, list[dict[str, Any]]]:
    """(machine, topology, default rank mapping, GPU state) from the record, else this machine now."""
    if evidence is None:
        # a draft from records (ranks, incident) loads no torch for this machine's facts: NVML names
        # the GPUs; torch describes the device only where the command loaded it already (it measured)
        snap = system.snapshot(load_torch=False)
        machine = machine_info() if "torch" in sys.modules else _machine_from_nvml(snap)
        t = topology.from_nvml()
        topo = t.to_dict() if t is not None else None
        source = f"this machine, {snap['taken_at']}"
    else:
        snap, machine, topo = evidence.snapshot, dict(evidence.machine), evidence.extra.get("topology")
        source = evidence.label
        if machine.get("is_gpu", True) and not snap and not str(machine.get("device", "")).lower().startswith(("cpu", "no gpu")):
            doc = _doctor_for(evidence)
            if doc is not None:
                snap, topo = doc.snapshot, topo or doc.extra.get("topology")
                source += f"; driver, clocks and topology from the doctor record of the same host ({doc.label})"
    snap = snap or {}
    versions = {**(evidence.versions if evidence else {}), **(snap.get("versions") or {})}
    gpus = _gpu_state(snap)
    out = {"host": machine.get("host") or snap.get("host") or platform.node(), "source": source,
           "device": machine.get("device")}
    is_gpu = machine.get("is_gpu")
    if is_gpu is None:  # a record that does not say: a GPU in its snapshot, or a device not named as a CPU
        is_gpu = bool(gpus) or not str(machine.get("device") or "cpu").lower().startswith(("cpu", "no gpu"))
    if is_gpu:
        names = sorted({g["name"] for g in gpus if g.get("name")}) or [machine.get("device")]
        out["gpu_model"] = ", ".join(f"{n} x{sum(1 for g in gpus if g.get('name') == n) or 1}" for n in names)
        out["driver"] = versions.get("driver") or f"not in {source} (no NVML snapshot)"
        out["cuda"] = versions.get("cuda_runtime") or versions.get("cuda_not_queried")
        topo_text = _topology_text(topo) or (f"1 GPU ({gpus[0].get('pci_bus_id', 'GPU0')}): no peer links"
                                             if len(gpus) == 1 else f"not in {source}")
        mapping = ("1 process: rank 0 -> GPU0" + (f" ({gpus[0]['pci_bus_id']})" if gpus and gpus[0].get("pci_bus_id") else "")
                   if len(gpus) <= 1 else f"{len(gpus)} GPUs; rank mapping not given")
    else:
        cpu = machine.get("device") if evidence is not None and machine.get("device") else cpu_model()
        out["gpu_model"] = cpu if str(cpu).lower().startswith("no gpu") else f"no GPU: {cpu}"
        out["driver"] = "none: no NVIDIA driver (CPU only)"
        topo_text = _topology_text(topo) or "none: CPU only"
        mapping = "1 process on CPU"
    out = {k: v for k, v in out.items() if v is not None}
    return out, topo_text, mapping, gpus


def _state_line(g: dict[str, Any]) -> str:
    bits = [f"GPU{g.get('index', 0)} {g.get('name', '')}".strip()]
    if g.get("taken_at"):
        bits[0] += f" (NVML snapshot {g['taken_at']})"
    if "sm_clock_mhz" in g:
        bits.append(f"SM clock {g['sm_clock_mhz']}/{g.get('sm_clock_max_mhz', '?')} MHz")
    if "temperature_c" in g:
        bits.append(f"{g['temperature_c']} C")
    if "power_w" in g:
        bits.append(f"power {g['power_w']:.0f}/{g.get('power_limit_w', 0):.0f} W")
    reasons = g.get("clock_event_reasons")
    if isinstance(reasons, list):
        bits.append("clock events: " + (", ".join(reasons) or "none (not throttled)"))
    return "state: " + ", ".join(bits)


def from_diagnosis(title: str, evidence: Evidence | None, diagnosis: Diagnosis, *, symptom_scope: str,
                   symptom: str, fix: str, reverify: str, rank_mapping: str | None = None,
                   extra_evidence: list[str] | None = None, reverified: bool | None = None,
                   topology: str | None = None, collective_wait_ms: dict[Any, float] | None = None,
                   reverify_evidence: dict[str, Any] | None = None, reverify_probe: str | None = None) -> Incident:
    """Fill the record: machine/topology/versions from ``evidence`` (or this machine now, see
    :func:`machine_facts`), key evidence from the diagnosis steps and the record. Multi-rank
    runs pass ``collective_wait_ms`` (rank -> wait). ``reverify_evidence``: the flowchart
    evidence the probe re-measured after the fix (``reverify_probe`` names the probe); its walk
    is stored, and ``reverified`` defaults to "it left the diagnosed leaf". A re-check whose walk is
    borderline (a value inside its own spread of a threshold) re-verifies nothing: ``reverified``
    is then None whatever was passed, and the record says the re-check is borderline."""
    if symptom_scope not in SCOPES:
        raise UserInputError(f"symptom_scope must be one of {SCOPES}, not {symptom_scope!r}")
    machine, topo, mapping, gpus = machine_facts(evidence)
    measured = {s.metric: {"question": s.question, "value": s.value, "rule": s.criterion, "how": s.how,
                           "source": s.source} for s in diagnosis.steps}
    lines = [f"{s.question}: {s.metric} = {_fmt(s.value)} (rule {s.criterion}) {s.provenance()}" for s in diagnosis.steps]
    lines += [_state_line(g) for g in gpus]
    waits = None
    if collective_wait_ms:
        waits = {str(k): float(v) for k, v in collective_wait_ms.items()}
        lines.append("collective wait per rank: " + ", ".join(f"rank {k} {v:.1f} ms" for k, v in waits.items()))
    if evidence:
        lines += [f"{m.name}: {m.summary()}" for m in evidence.results[:6]]
    lines += extra_evidence or []
    result = None
    if reverify_evidence is not None:
        after = diagnose(reverify_evidence)
        result = {"probe": reverify_probe or reverify, "measured": after.measured(), "path": after.path,
                  "leaf": after.leaf_id, "fully_measured": after.fully_measured,
                  # a re-check inside its own spread of a threshold is one re-run from failing
                  "borderline": [f"{x.question} ({x.metric} = {_fmt(x.value)}{x.spread_text()})"
                                 for x in after.borderline]}
        if reverified is None:
            reverified = after.leaf_id is not None and after.leaf_id != diagnosis.leaf_id
        if after.borderline and reverified:
            reverified = None
    return Incident(title, machine, topology or topo, rank_mapping or mapping, symptom_scope, symptom, lines,
                    diagnosis.path, diagnosis.explain(), fix, reverify, reverified, measured=measured,
                    gpu_state=gpus, collective_wait_ms=waits, reverify_result=result)


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
    d = read_user_json(path, "incident record", "pass an incident .json written by hwlab")
    if not isinstance(d, dict):
        raise UserInputError(f"incident record {path} should hold a JSON object, not {type(d).__name__}")
    names = {f.name for f in fields(Incident)}
    return Incident(**{k: v for k, v in d.items() if k in names})
