"""Comparing a node's record with its baseline (:mod:`hwlab.diagnosis.baseline` records both).

:func:`compare` classifies every deviation of a new record from a baseline into
``hardware`` (``host`` on a CPU baseline) / ``topology`` / ``runtime`` / ``workload`` with the tolerance that flagged it and
what to check next. Tolerances (why):

* bandwidth and TFLOP/s probes: a drop of more than ``TOL_RATE_PCT`` (10%) — run-to-run
  spread of these probes on one card is 1-3%, machines of one kind differ by up to ~5%;
* latency-type probes (launch overhead): a rise of more than ``TOL_LATENCY_PCT`` (100%) — they
  measure the host's Python/driver launch path, which moves with the load on a shared host CPU
  far more than the device probes do; only a doubling is a signal there;
* and, for every probe, beyond the spread both runs measured (:func:`hwlab.core.spread.judge_rise`):
  the bands p10-p90 must not overlap, each run needs ``spread.MIN_REPEATS`` repeats and a band
  no wider than ``spread.NOISY_SPREAD_PCT`` of its median. A change past the tolerance but
  inside that spread is *within spread (borderline)*: reported, never a hardware verdict,
  and it does not make the comparison fail (exit 0);
* a **CPU baseline** (no GPU in the record) times this host's CPU, which other processes and
  the frequency governor move: a change beyond spread there is a ``host`` change with advice
  for a host, never GPU node advice ("drain and swap"). It is listed but does not fail the
  comparison (exit 0): two records of one shared CPU host minutes apart differ beyond their
  spread whenever the load changed between them, which says nothing about the machine's health;
* temperature more than ``TOL_TEMP_C`` (10 C) hotter, any new throttle reason but the power
  cap (:data:`hwlab.core.system.BAD_CARD_REASONS`), any increase of uncorrected ECC errors or
  pending row remaps: hardware. A new power cap alone is a *note*: a healthy card under load
  reads it; it does not fail the comparison;
* any change of link class, PCIe width/generation or NUMA affinity: topology (a different GPU
  count makes the records not comparable, below);
* any change of driver, CUDA, torch, triton or NCCL version, or of FP8 hit / fallback rate by
  more than ``TOL_HIT_PP`` (5 percentage points): runtime.

The workload class has no probe of its own: when every part matches and the service is still
slow, the difference is in the workload (shape buckets, caches, fallbacks); compare says so.

Before any of that, :func:`comparability` decides whether the two records can be compared at
all: a different GPU model, GPU count, driver or CUDA major version, or different probe sizes
and parameters (a ``--quick`` record against a full one) make every figure differ for reasons
that say nothing about the node's health. Such a pair is its own class, *not comparable*: the
differences are listed, and no deviation or node advice ("drain and swap") is given. Minor
driver/CUDA versions stay comparable and are reported as runtime deviations.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hwlab.errors import UserInputError
from hwlab.core.evidence import Evidence, load
from hwlab.core.measure import Measurement
from hwlab.core.spread import BEYOND, BORDERLINE, Band, judge_rise
from hwlab.core.system import BAD_CARD_REASONS, THROTTLE_REASONS

TOL_RATE_PCT = 10.0
TOL_LATENCY_PCT = 100.0
TOL_TEMP_C = 10.0
TOL_HIT_PP = 5.0
BASELINE_KIND = "baseline"


# ---------------------------------------------------------------- compare
@dataclass
class Deviation:
    category: str  # hardware | host | topology | runtime | missing | borderline | note
    what: str
    baseline: Any
    now: Any
    rule: str
    next_step: str

    def __str__(self) -> str:
        return f"[{self.category}] {self.what}: {self.baseline} -> {self.now} ({self.rule}); next: {self.next_step}"


@dataclass
class Comparison:
    deviations: list[Deviation] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    #: True when the baseline holds no GPU: its probes timed this host's CPU
    cpu: bool = False
    #: why the two records cannot be compared (empty: comparable); see :func:`comparability`
    not_comparable: list[str] = field(default_factory=list)
    #: the probes both records measured (compared)
    probes_compared: list[str] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not self.not_comparable

    @property
    def missing(self) -> list[str]:
        """The baseline's probes the new record did not measure: not compared, so not matched."""
        return [d.what for d in self.deviations if d.category == "missing"]

    @property
    def failed(self) -> bool:
        return self.comparable and bool([d for d in self.deviations if d.category not in NOT_FAILURES])

    @property
    def undecided(self) -> bool:
        """Nothing failed, but some baseline probes were not measured now: no verdict on those."""
        return self.comparable and not self.failed and bool(self.missing)

    @property
    def ok(self) -> bool:
        return self.comparable and not self.failed and not self.missing

    def categories(self) -> set[str]:
        return {d.category for d in self.deviations}

    @property
    def verdict(self) -> str:
        if not self.comparable:
            return "not comparable"
        if self.undecided:
            return "incomplete"
        return "ok" if self.ok else ",".join(sorted(self.categories() - NOT_FAILURES))

    def summary(self, max_reasons: int | None = None) -> str:
        """The verdict in words. ``max_reasons``: of the reasons two records are not comparable, name
        that many and count the rest (two different machines differ in every probe's parameters)."""
        if not self.comparable:
            reasons = self.not_comparable[:max_reasons]
            more = len(self.not_comparable) - len(reasons)
            return ("NOT COMPARABLE: " + "; ".join(reasons) + (f"; and {more} more" if more else "")
                    + ". No node advice: compare "
                    "a record with a baseline of the same GPU model and count, driver/CUDA major "
                    "and probe sizes (record both with or both without --quick)."
                    + (" After a driver or CUDA upgrade: record a new baseline now, and compare the job "
                       "itself before and after: hwlab examine --trace BEFORE.json.gz --out before.json, the "
                       "same for AFTER, and set their parts side by side"
                       if any("driver" in r.lower() or "cuda" in r.lower() for r in self.not_comparable) else ""))
        head = ["CPU baseline (no GPU in these records): the probes timed this host's CPU, so a change "
                "is the host's load, not a fault; no GPU node advice applies."] if self.cpu else []
        if self.undecided:
            gone = [d for d in self.deviations if d.category == "missing"]
            n_base = len(gone) + len(self.probes_compared)
            return "\n".join(head + [
                f"NOT A FULL MATCH: {len(gone)} of {n_base} baseline probes were not measured now, so they "
                "were not compared: " + ", ".join(f"{d.what} ({d.next_step})" for d in gone) + ". The "
                f"{len(self.probes_compared)} compared ({', '.join(self.probes_compared)}) match within "
                "tolerance or within spread. Re-record the new run with every probe to decide."]
                + [str(d) for d in self.deviations if d.category != "missing"])
        if self.ok:
            soft = [str(d) for d in self.deviations]
            return "\n".join(head + ["matches the baseline within tolerance or within spread" +
                                     (", or changed with the host's load" if "host" in self.categories() else "")
                                     + " (" + ", ".join(self.checked)
                                     + "). If the service is still slow, the difference is in the workload: "
                                     "shape buckets, caches, fallbacks."] + soft)
        return "\n".join(head + [str(d) for d in self.deviations])

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "comparable": self.comparable, "ok": self.ok, "cpu_baseline": self.cpu,
                "not_comparable": self.not_comparable, "checked": self.checked, "probes_compared": self.probes_compared, "missing": self.missing,
                "deviations": [d.__dict__ for d in self.deviations]}


#: params a probe reports that are results, not settings (left out of the comparability check)
MEASURED_PARAMS = {"us_per_launch"}


def _major(version: Any) -> str | None:
    if version in (None, ""):
        return None
    return str(version).split(".")[0]


def _gpu_count(ev: Evidence) -> int | None:
    if ev.snapshot is not None and isinstance(ev.snapshot.get("gpus"), list):
        return len(ev.snapshot["gpus"])
    return None


def comparability(base: Evidence, now: Evidence) -> list[str]:
    """What makes ``now`` not comparable with ``base``, one phrase each (empty: comparable).

    Checked: GPU model (the record's device name), GPU count (NVML), driver major version, CUDA
    runtime and driver-API major version, and for every probe both ran, its sizes and
    parameters (``params`` minus :data:`MEASURED_PARAMS`)."""
    why: list[str] = []
    if base.device != now.device:
        why.append(f"GPU model differs: {base.device} vs {now.device}")
    n0, n1 = _gpu_count(base), _gpu_count(now)
    if n0 != n1:
        why.append(f"GPU count differs: {n0} vs {n1} (if a GPU vanished from this node, that is "
                   "the finding: check `nvidia-smi -L` and the kernel log for Xid errors)")
    for key, what in (("driver", "driver major version"), ("cuda_runtime", "CUDA runtime major version")):
        a, b = _major(base.versions.get(key)), _major(now.versions.get(key))
        if a != b:
            why.append(f"{what} differs: {base.versions.get(key)} vs {now.versions.get(key)}")
    a, b = base.versions.get("cuda_driver"), now.versions.get("cuda_driver")
    if isinstance(a, int) and isinstance(b, int) and a // 1000 != b // 1000:
        why.append(f"CUDA driver API major version differs: {a // 1000} vs {b // 1000}")
    names0, names1 = [m.name for m in base.results], [m.name for m in now.results]
    if not set(names0) & set(names1):  # nothing to compare is not a match
        def held(names: list[str]) -> str:
            return f"{len(names)} ({', '.join(names)})" if names else "none"
        why.append(f"no probe in common: the baseline holds {held(names0)}, the new record {held(names1)}; "
                   "re-record the empty or partial one with `hwlab baseline record`")
    bm = {m.name: m for m in base.results}
    for m in now.results:
        if m.name not in bm:
            continue
        p0 = {k: v for k, v in bm[m.name].params.items() if k not in MEASURED_PARAMS}
        p1 = {k: v for k, v in m.params.items() if k not in MEASURED_PARAMS}
        if p0 != p1:
            diff = ", ".join(f"{k} {p0.get(k)} vs {p1.get(k)}" for k in sorted(set(p0) | set(p1), key=str)
                             if p0.get(k) != p1.get(k))
            why.append(f"probe {m.name} ran with other parameters: {diff}")
    return why


LATENCY_PROBES = {"launch_overhead"}
#: categories reported but not failing the comparison (exit 0); ``host`` only exists on a CPU baseline
NOT_FAILURES = {"missing", "borderline", "host", "note"}
NEXT = {
    "note": "if the probes also fell beyond their spread, look for another job on the card (nvidia-smi) "
            "and re-record when it is idle",
    "host": "a CPU baseline times this host: check its load (top), the CPU frequency governor and "
            "other tenants, then re-record both on an idle host",
    "borderline": "re-run both records (more repeats, an idle machine) before reading it as a change",
    "hardware": "check clocks/throttle reasons, ECC and temperature in `hwlab doctor`; drain and swap the node if it persists",
    "topology": "diff `nvidia-smi topo -m` and the rank-to-device map; rebuild TP groups with hwlab.core.mapping",
    "runtime": "diff versions and the dispatch path (profiler kernel names); pin the known-good stack",
}


def _probe_value(m: Measurement) -> tuple[float, str]:
    if m.name in LATENCY_PROBES:
        return m.params.get("us_per_launch", m.t_ms), "us"
    if m.n_flops and m.n_flops / max(m.n_bytes, 1) > 50:
        return m.tflops, "TFLOP/s"
    return m.gbps, "GB/s"


def _band(m: Measurement) -> Band:
    """A probe's median time and its p10-p90 band (a rate's drop is its time's rise; the two
    records ran the same sizes, :func:`comparability` checks that)."""
    return Band(m.t_ms, m.t_p10_ms, m.t_p90_ms, m.n_rep)



def _rule_text(j, base_value: float, now_value: float, unit: str, latency: bool) -> str:
    """A deviation said one way: the judged change is a rise of the probe's time per run (the spread
    rules compare times); a rate probe names its figure falling first, then the time's rise."""
    rise = f"time per run up {j.change_pct:.1f}%"
    rule = (f"{rise} {j.reason[len('rise '):].split(' ', 1)[1]}" if j.reason.startswith("rise ")
            else f"{rise}; {j.reason}")
    if latency or not base_value:
        return rule
    return f"{unit} down {100.0 * (1.0 - now_value / base_value):.1f}%: {rule}"


def compare(base: Evidence, now: Evidence) -> Comparison:
    """Classify what changed between a baseline and a new record (see the module doc)."""
    c = Comparison()
    for ev in (base, now):
        if ev.kind != BASELINE_KIND:
            raise UserInputError(f"{ev.path or 'a record'} is a {ev.kind!r} record: compare takes two "
                                 "baseline records (hwlab baseline record)")
    c.not_comparable = comparability(base, now)
    if c.not_comparable:  # no deviations, no advice: the figures differ for other reasons
        return c
    # hardware (host on a CPU baseline): probes, judged against both runs' spread
    c.cpu = base.machine.get("is_gpu") is False
    bm = {m.name: m for m in base.results}
    for m in now.results:
        if m.name not in bm:
            continue
        b, unit = _probe_value(bm[m.name])
        v, _ = _probe_value(m)
        c.checked.append(m.name)
        c.probes_compared.append(m.name)
        latency = m.name in LATENCY_PROBES
        tol = TOL_LATENCY_PCT if latency else TOL_RATE_PCT
        j = judge_rise(_band(bm[m.name]), _band(m), tol)
        if j.status == BEYOND:
            cat = "host" if c.cpu else "hardware"
            nxt = NEXT[cat] + ("; check host CPU load and governor" if latency and cat == "hardware" else "")
        elif j.status == BORDERLINE:
            cat, nxt = "borderline", NEXT["borderline"]
        else:
            continue
        c.deviations.append(Deviation(cat, f"{m.name} ({unit})", round(b, 3), round(v, 3),
                                      _rule_text(j, b, v, unit, latency), nxt))
    for name in sorted(set(bm) - {m.name for m in now.results}):
        c.deviations.append(Deviation("missing", name, "recorded", "absent", "part not measured now",
                                      (now.extra.get("missing") or {}).get(name, "re-run hwlab baseline record")))
    # hardware: system state
    bg = (base.snapshot or {}).get("gpus", [])
    ng = (now.snapshot or {}).get("gpus", [])
    for g0, g1 in zip(bg, ng):
        tag = f"GPU{g1.get('index')}"
        t0, t1 = g0.get("temperature_c"), g1.get("temperature_c")
        if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) and t1 > t0 + TOL_TEMP_C:
            c.deviations.append(Deviation("hardware", f"{tag} temperature C", t0, t1, f"> +{TOL_TEMP_C:.0f} C", NEXT["hardware"]))
        r0 = set(g0.get("clock_event_reasons") or []) if isinstance(g0.get("clock_event_reasons"), list) else set()
        r1 = set(g1.get("clock_event_reasons") or []) if isinstance(g1.get("clock_event_reasons"), list) else set()
        if (r1 - r0) & BAD_CARD_REASONS:
            c.deviations.append(Deviation("hardware", f"{tag} clock event reasons", sorted(r0), sorted(r1),
                                          "new throttle reason", NEXT["hardware"]))
        elif (r1 - r0) & THROTTLE_REASONS:  # the power cap alone: normal under load, said, not failed
            c.deviations.append(Deviation("note", f"{tag} clock event reasons", sorted(r0), sorted(r1),
                                          "power cap: a healthy card under load reads it", NEXT["note"]))
        e0, e1 = g0.get("ecc_errors_volatile"), g1.get("ecc_errors_volatile")
        u0, u1 = (e.get("uncorrected", 0) if isinstance(e, dict) else None for e in (e0, e1))
        if isinstance(u0, (int, float)) and isinstance(u1, (int, float)) and u1 > u0:  # null: not read
            c.deviations.append(Deviation("hardware", f"{tag} uncorrected ECC", u0, u1,
                                          "any increase", NEXT["hardware"]))
        for key in ("pcie_gen_max", "pcie_width_max", "numa_node"):
            if g0.get(key) != g1.get(key):
                c.deviations.append(Deviation("topology", f"{tag} {key}", g0.get(key), g1.get(key), "any change", NEXT["topology"]))
        c.checked.append(f"{tag} state")
    if len(bg) != len(ng):
        c.deviations.append(Deviation("topology", "GPU count", len(bg), len(ng), "any change", NEXT["topology"]))
    # topology: links and NUMA
    t0, t1 = base.extra.get("topology") or {}, now.extra.get("topology") or {}
    if t0 and t1:
        c.checked.append("topology")
        for k, v in t0.get("links", {}).items():
            if t1.get("links", {}).get(k) != v:
                c.deviations.append(Deviation("topology", f"link {k}", v, t1.get("links", {}).get(k),
                                              "any change", NEXT["topology"]))
        if t0.get("numa_affinity") != t1.get("numa_affinity"):
            c.deviations.append(Deviation("topology", "NUMA affinity", t0.get("numa_affinity"),
                                          t1.get("numa_affinity"), "any change", NEXT["topology"]))
    # runtime: versions and the FP8 path
    for k in ("driver", "cuda_runtime", "torch", "triton", "nccl"):
        a, b = base.versions.get(k), now.versions.get(k)
        if a != b:
            c.deviations.append(Deviation("runtime", f"{k} version", a, b, "any change", NEXT["runtime"]))
    c.checked.append("versions")
    r0, r1 = base.extra.get("runtime_path") or {}, now.extra.get("runtime_path") or {}
    for k in ("hit_rate_pct", "fallback_rate_pct"):
        a, b = r0.get(k), r1.get(k)
        if a is not None and b is not None and abs(a - b) > TOL_HIT_PP:
            c.deviations.append(Deviation("runtime", f"FP8 {k}", round(a, 1), round(b, 1),
                                          f"change > {TOL_HIT_PP:.0f} pp", NEXT["runtime"]))
    for k in ("default_dtype", "float32_matmul_precision"):
        if r0.get(k) != r1.get(k):
            c.deviations.append(Deviation("runtime", k, r0.get(k), r1.get(k), "any change", NEXT["runtime"]))
    c.checked.append("runtime path")
    return c


def fleet_table(paths: list[str | os.PathLike], base: Evidence | None = None) -> list[dict[str, Any]]:
    """One row per node record: its probes and, against ``base``, its deviation categories."""
    rows = []
    for p in paths:
        ev = load(p)
        row: dict[str, Any] = {"host": ev.machine.get("host"), "device": ev.device, "recorded_at": ev.recorded_at}
        for m in ev.results:
            v, unit = _probe_value(m)
            row[f"{m.name} ({unit})"] = round(v, 2)
        if base is not None:
            cmp_ = compare(base, ev)
            row["verdict"] = cmp_.verdict
            if not cmp_.comparable:
                row["not_comparable"] = cmp_.not_comparable
        rows.append(row)
    return rows
